"""Speculation settings from flags and files (`model/spec_parse.py`): what each accepts, and the one-line error
naming the flag, file and key for what it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailsieve.errors import ConfigError
from tailsieve.model.spec_parse import load_config_file, parse_spec
from tailsieve.model.speculative import PoolSpec, SpecConfig, SpecMethod

MTP, EAGLE3 = SpecMethod.MTP, SpecMethod.EAGLE3


def test_parse_spec() -> None:
    s = parse_spec("MTP:5, acceptance=0.8,decay=1,draft_cost=0", "--tail-spec")
    assert (s.method, s.depth, s.alpha, s.gamma, s.cost) == (MTP, 5, 0.8, 1.0, 0.0)
    assert parse_spec("none", "--bulk-spec") == SpecConfig()
    assert parse_spec("dflash:default", "x").tokens is None  # the method's own constants
    assert parse_spec("dflash", "x").depth == 15  # the calibrated central profile (block 16)
    for text, needle in [
        ("warp:3", "--tail-spec.method must be one of none, mtp"),
        ("mtp:x", "--tail-spec: tokens must be an integer, got 'x'"),
        ("mtp:3,alpha=0.5",
         "expected key=value with key in acceptance, decay, draft_cost, verify_cost, draft_share, token_cost, "
         "token_cost_slope, acceptance_slope, draft_cpu_s, got 'alpha=0.5'"),
        ("mtp:3,acceptance=high", "--tail-spec: acceptance must be a number, got 'high'"),
        ("mtp:40", "--tail-spec: speculative tokens must be an integer in 0..32, got 40"),
    ]:
        with pytest.raises(ConfigError, match=None) as exc:
            parse_spec(text, "--tail-spec")
        assert needle in str(exc.value), (text, str(exc.value))


def test_config_file_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "sim.toml"
    toml.write_text('[spec.tail]\nmethod = "mtp"\ntokens = 5\nacceptance = 0.9\n\n[spec.bulk]\nmethod = "mtp"\n'
                    "tokens = 1\n", encoding="utf-8")
    pools = load_config_file(toml)
    assert pools == PoolSpec(tail=SpecConfig(MTP, 5, acceptance=0.9), bulk=SpecConfig(MTP, 1))
    js = tmp_path / "sim.json"
    js.write_text('{"spec": {"tail": {"method": "eagle3", "tokens": 4}}}', encoding="utf-8")
    assert load_config_file(js) == PoolSpec(tail=SpecConfig(EAGLE3, 4))
    for text, needle in [
        ('[spec.tail]\nmethod = "warp"\n', "spec.tail.method must be one of"),
        ('[spec.tail]\nmethod = "mtp"\ntokens = "five"\n', "spec.tail.tokens must be an integer in 0..32, got 'five'"),
        ('[spec.bulk]\nalpha = 0.5\n', "unknown key spec.bulk.alpha (valid: method, tokens"),
        ('[spec.middle]\nmethod = "mtp"\n', "unknown key spec.middle"),
        ('[engine]\nx = 1\n', "unknown key engine (valid: spec, launch)"),
        ('[spec.tail]\nmethod = "mtp"\nacceptance = 2\n', "spec.tail: speculative acceptance must be [0, 1], got 2"),
        ("[spec.tail\n", "invalid TOML"),
    ]:
        toml.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError) as exc:
            load_config_file(toml)
        assert needle in str(exc.value) and str(toml) in str(exc.value), (text, str(exc.value))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config_file(tmp_path / "missing.toml")
