"""Shared CLI flags (`tailsieve.cli.flags`): one definition per flag across commands, one name one meaning, no
abbreviations, the policy flags checked by the spec and the registries (so a plugin is a valid value), and the
controller's flags derived from `ControllerConfig`'s fields (one per field, its type and help, checked as parsed)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path

import pytest

from tailsieve.cli import build_parser, main
from tailsieve.cli.flags import FLAGS, controller_config, policy_names_given
from tailsieve.cli.rollout_cmd import build_configs
from tailsieve.cli.sim_args import build_config
from tailsieve.policy.control_state import ControllerConfig
from tailsieve.policy.controller_knobs import Knob, knobs
from tailsieve.policy.paper_config import PaperConfig
from tailsieve.policy.ranking import RANKINGS


def sub_parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


@pytest.mark.parametrize("flag", ["--groups", "--group-size", "--rho", "--seed", "--ranking", "--max-redraws",
                                  "--kv-ms-per-1k", "--curve"])
def test_a_shared_flag_has_one_type_and_help_in_every_command(flag: str) -> None:
    users = {name: a for name, p in sub_parsers().items() if name in ("simulate", "plan", "rollout")
             and (a := option(p, flag)) is not None}
    assert len(users) >= 2, users
    assert {a.help for a in users.values()} == {FLAGS[flag]["help"]}
    assert {a.type for a in users.values()} == {FLAGS[flag].get("type")}


def test_served_model_name_is_one_meaning() -> None:
    parsers = sub_parsers()
    for cmd in ("profile", "rollout"):
        a = option(parsers[cmd], "--served-model-name")
        assert a is not None and a.dest == "model"
    assert option(parsers["launch"], "--model").help == "model folder or hub id"  # type: ignore[union-attr]


def test_no_flag_is_read_as_an_abbreviation(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="2"):
        main(["launch", "--mod", "x", "--dry-run"])  # once, `--mod` would have been read as `--model`
    assert capsys.readouterr().err == "tailsieve launch: error: unrecognized arguments: --mod x\n"
    with pytest.raises(SystemExit, match="2"):
        main(["simulate", "--max-red", "2"])
    assert "unrecognized arguments: --max-red 2" in capsys.readouterr().err


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "ts_cli_plug.py").write_text(textwrap.dedent('''
        def newest_first(cut):
            return sorted(cut, key=lambda o: -o.ref.uid)
    '''), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "ts_cli_plug:newest_first"
    RANKINGS.pop("ts_cli_plug:newest_first", None)
    sys.modules.pop("ts_cli_plug", None)


def test_a_plugin_ranking_runs_in_simulate(plugin: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--policy", "static", "--q", "1", "--m", "1", "--replicas", "2", "--groups", "8",
            "--group-size", "2", "--steps", "4", "--rho", "0.25", "--json"]
    assert main([*argv, "--ranking", plugin]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranking"] == plugin
    assert main([*argv, "--ranking", "stream-order"]) == 0
    assert json.loads(capsys.readouterr().out)["ranking"] == "stream-order"
    assert main([*argv, "--ranking", "ts_cli_plug:nope"]) == 1
    assert capsys.readouterr().err == ("tailsieve simulate: error: candidate ranking plugin 'ts_cli_plug:nope': module "
                                       "'ts_cli_plug' has no attribute 'nope'\n")


# ---- the controller's flags, derived from ControllerConfig (issue 40) -------------------------------------------


def parsed(cmd: str, *argv: str) -> argparse.Namespace:
    return sub_parsers()[cmd].parse_args(list(argv))


@pytest.mark.parametrize("cmd", ["simulate", "plan", "rollout"])
def test_every_controller_field_is_a_flag_with_its_type_and_help(cmd: str) -> None:
    parser = sub_parsers()[cmd]
    every = [(f, "") for f in fields(ControllerConfig) if f.name != "paper"]
    every += [(f, "paper") for f in fields(PaperConfig)]
    for f, _ in every:  # the paper's own knobs (`ControllerConfig.paper`) by their flat names
        a = option(parser, "--" + f.name.replace("_", "-"))
        assert a is not None, f"{cmd} has no flag for ControllerConfig.{f.name}"
        assert a.dest == f.name and a.default == argparse.SUPPRESS and a.help is not None
        assert a.help.startswith(f.metadata["help"]) and f"(default: {f.default}" in a.help
        value = {"int": "3", "float": "0.5", "int | None": "2"}[str(f.type)]
        assert type(a.type(value)) is {"int": int, "float": float, "int | None": int}[str(f.type)]  # type: ignore[misc]
    assert option(parser, "--m0").type("none") is None  # type: ignore[union-attr,misc]
    assert [(k.name, k.section) for k in knobs()] == [(f.name, s) for f, s in every]


@pytest.mark.parametrize(("cmd", "argv", "message"), [
    ("simulate", ["--z", "-1"], "tailsieve simulate: error: --z must be >= 0 and finite, got -1.0"),
    ("simulate", ["--horizon", "0"], "tailsieve simulate: error: --horizon must be >= 1, got 0"),
    ("plan", ["--history-steps", "0"], "tailsieve plan: error: --history-steps must be >= 1, got 0"),
    ("plan", ["--ema", "1.5"], "tailsieve plan: error: --ema must lie in [0, 1], got 1.5"),
    ("rollout", ["--prompts", "p", "--out", "o", "--move-cost-s", "inf"],
     "tailsieve rollout: error: --move-cost-s must be >= 0 and finite, got inf"),
    ("rollout", ["--prompts", "p", "--out", "o", "--m0", "-2"], "tailsieve rollout: error: --m0 must be >= 0, got -2"),
    ("simulate", ["--z", "x"], "tailsieve simulate: error: argument --z: invalid float value: 'x'"),
    ("simulate", ["--m0", "half"], "tailsieve simulate: error: argument --m0: invalid int or none value: 'half'"),
])
def test_a_bad_controller_value_is_one_line_and_exit_2(cmd: str, argv: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([cmd, *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err == message + "\n"


def test_controller_flags_reach_the_config() -> None:
    args = parsed("simulate", "--history-steps", "4", "--z", "1.5", "--q0", "3", "--m0", "none")
    assert build_config(args, ["uniform", "tailsieve"]).controller == ControllerConfig(q0=3, m0=None, history_steps=4,
                                                                                        z=1.5)
    assert build_config(parsed("simulate"), ["uniform"]).controller == ControllerConfig()  # unset: the defaults
    args = parsed("plan", "--horizon", "3", "--momentum", "0.25")
    assert build_config(args, ["static", "tailsieve"]).controller == ControllerConfig(horizon=3,
                                                                                         paper=PaperConfig(momentum=0.25))
    args = parsed("rollout", "--prompts", "p", "--out", "o", "--policy", "tailsieve,uniform", "--gain", "0.1",
                  "--max-q-step", "4", "--m-radius", "1", "--ema", "0.5", "--move-cost-s", "12")
    want = ControllerConfig(paper=PaperConfig(gain=0.1, max_q_step=4, m_radius=1), ema=0.5, move_cost_s=12.0)
    assert {n: c.controller for n, c in build_configs(args).items()} == {"tailsieve": want, "uniform": want}
    assert controller_config(args, ControllerConfig(q0=5)) == replace(want, q0=5)  # over another base


def test_a_flag_of_a_new_field_needs_no_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    from tailsieve.cli import flags as flags_module

    more = (*knobs(), Knob("patience", int, False, 3, "steps to wait"))
    monkeypatch.setattr(flags_module, "knobs", lambda: more)
    p = argparse.ArgumentParser()
    flags_module.add_controller_flags(p)
    a = option(p, "--patience")
    assert a is not None and a.help == "steps to wait (default: 3)" and a.type("4") == 4  # type: ignore[misc]


@pytest.mark.parametrize(("values", "default", "want"), [
    (None, "all", ["all"]),
    ("tailsieve", "x", ["tailsieve"]),
    (" tailsieve , verl-lif,,uniform ", "x", ["tailsieve", "verl-lif", "uniform"]),
    (["tailsieve,uniform", "uniform", "static"], "x", ["tailsieve", "uniform", "static"]),
    (["tailsieve", "tailsieve"], "x", ["tailsieve"]),
    ([" , ", ""], "x", []),
])
def test_policy_names_given_splits_strips_and_dedupes(values, default, want):
    assert policy_names_given(values, default) == want
