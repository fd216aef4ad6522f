"""Shared CLI flags (`tailsieve.cli.flags`): one definition per flag across commands, one name one meaning, no
abbreviations, and the policy flags checked by the spec and the registries (so a plugin is a valid value)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsieve.cli import build_parser, main
from tailsieve.cli.flags import FLAGS
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


def test_served_model_name_is_one_meaning_and_model_a_deprecated_alias() -> None:
    parsers = sub_parsers()
    for cmd in ("profile", "rollout"):
        a = option(parsers[cmd], "--served-model-name")
        assert a is not None and a.dest == "model"
        alias = option(parsers[cmd], "--model")
        assert alias is not None and alias.help == argparse.SUPPRESS
    assert option(parsers["launch"], "--model").help == "model folder or hub id"  # type: ignore[union-attr]
    with pytest.warns(DeprecationWarning, match="--model is deprecated here, use --served-model-name"):
        args = parsers["profile"].parse_args(["--endpoint", "http://x", "--out", "o.json", "--model", "m"])
    assert args.model == "m"


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
