"""`tailsieve curves`: the listing names every built-in's source and licence; one curve shows its derivation; the
MoE curves drive `simulate`."""

from __future__ import annotations

import json

import pytest

from tailsieve.cli import main
from tailsieve.model.curves import builtin_curves

MOE = ("a100x4-mixtral-8x7b", "h100x4-mixtral-8x7b")


def test_every_builtin_has_source_licence_and_derivation() -> None:
    licences = {c.name: c.licence for c in builtin_curves().values()}
    assert licences["h100-llama2-70b-tp8"] == "MIT" and licences["cpu-vllm-tiny"].startswith("Apache-2.0")
    assert {licences[n] for n in MOE} == {licences["h100-llama3-8b"]} == {"BSD-3-Clause"}
    for c in builtin_curves().values():
        assert c.source and c.licence and c.derivation and c.extension


def test_listing_shows_name_source_and_licence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curves"]) == 0
    out = capsys.readouterr().out
    for name in MOE:
        assert f"  {name}: argonne-lcf/LLM-Inference-Bench All_results.csv (BSD-3-Clause), Mixtral-8x7B rows" in out
    bsd = sum(c.licence == "BSD-3-Clause" for c in builtin_curves().values())
    assert bsd == 7 and out.count("BSD-3-Clause") == 2 * bsd  # the licence column and the source line
    assert main(["curves", "--json"]) == 0
    listed = {c["name"]: c for c in json.loads(capsys.readouterr().out)["curves"]}
    assert listed["a100x4-mixtral-8x7b"]["tpot_ms"] == [10.2, 23.901, 28.087, 33.931]
    assert listed["h100x4-mixtral-8x7b"]["batch"] == [1, 16, 32, 64]
    assert listed["a100x4-mixtral-8x7b"]["licence"] == "BSD-3-Clause"


def test_one_curve_prints_its_derivation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["curves", "a100x4-mixtral-8x7b"]) == 0
    out = capsys.readouterr().out
    assert "licence: BSD-3-Clause" in out
    assert "derivation: column step_ms_incl_prefill = latency_s / 1024 output tokens" in out
    assert "first row in file order" in out
    assert main(["curves", "h100x4-mixtral-8x7b", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["tpot_ms_at"]["64"] == pytest.approx(11.013) and doc["tpot_ms_at"]["128"] == pytest.approx(
        11.013 + 64 * (11.013 - 8.457) / 32)


def test_simulate_with_the_moe_curves(capsys: pytest.CaptureFixture[str]) -> None:
    """τ depends on concurrency only, so both curves see the same iterations: uniform's step-time ratio is a weighted
    mean of τ_A100(b) / τ_H100(b), between its smallest (b = 1: 10.2 / 5.747) and largest (b = 32) value."""
    mean = {}
    for name in MOE:
        assert main(["simulate", "--curve", name, "--policy", "uniform", "--steps", "3", "--groups", "8",
                     "--replicas", "2", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["curve"] == name
        mean[name] = doc["policies"]["uniform"]["mean_step_s"]
    ratio = mean["a100x4-mixtral-8x7b"] / mean["h100x4-mixtral-8x7b"]
    assert 10.2 / 5.747 <= ratio <= 28.087 / 8.457
