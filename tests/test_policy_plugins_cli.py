"""Every `--policy` resolves the same way (issue 41 item 9): a `pkg.module:Class` plugin is a controller or a peer
policy, whichever its class is, in `simulate` and in `rollout` alike (a peer plugin used to be refused as "not a
subclass of Controller"); an object that is neither is one line naming both kinds. Through the CLI, in-process; the
plugins subclass built-ins, so their numbers must equal the built-ins' exactly."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.peers import PEERS

PLUGIN = """
    from tailsieve.policy.controller import UniformController
    from tailsieve.policy.peers.verl_lif import VerlLeastInFlight


    class MyPeer(VerlLeastInFlight):
        '''verl-lif under another name.'''


    class MyCtl(UniformController):
        '''uniform under another name.'''


    NOT_A_POLICY = 3
"""
SHAPE = ["--groups", "4", "--group-size", "2"]
NEITHER = ("policy '{p}': not a subclass of Controller, nor a peer policy (not a subclass of PeerPolicy)")


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The module `ts_polplug` on sys.path; the registry entries it adds are removed afterwards."""
    (tmp_path / "ts_polplug.py").write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {id(r): set(r) for r in (CONTROLLERS, PEERS)}
    yield tmp_path
    for r in (CONTROLLERS, PEERS):
        for name in set(r) - before[id(r)]:
            r.pop(name)
    sys.modules.pop("ts_polplug", None)


def cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def test_simulate_runs_a_peer_plugin_and_a_controller_plugin_as_the_builtins_they_extend(plugin: Path) -> None:
    rc, out, err = cli(["simulate", "--policy", "ts_polplug:MyPeer,verl-lif,ts_polplug:MyCtl", "--steps", "3",
                        *SHAPE, "--replicas", "2", "--json"])
    assert rc == 0, err
    runs = json.loads(out)["policies"]
    assert set(runs) == {"uniform", "verl-lif", "ts_polplug:MyPeer", "ts_polplug:MyCtl"}
    for name, same in (("ts_polplug:MyPeer", "verl-lif"), ("ts_polplug:MyCtl", "uniform")):
        assert runs[name]["mean_step_s"] == runs[same]["mean_step_s"] > 0, (name, runs)
    assert runs["ts_polplug:MyPeer"]["mean_step_s"] != runs["uniform"]["mean_step_s"]  # it ran as a peer
    assert "ts_polplug:MyPeer" in PEERS and "ts_polplug:MyPeer" not in CONTROLLERS
    assert "ts_polplug:MyCtl" in CONTROLLERS and "ts_polplug:MyCtl" not in PEERS


def test_rollout_runs_a_peer_plugin_on_real_replicas(plugin: Path, tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"what is {i}?"}) + "\n"
                                              for i in range(20)))
    with FakeServer() as a, FakeServer() as b:
        rc, _, err = cli(["rollout", "--endpoints", f"{a.url},{b.url}", "--prompts", str(tmp_path / "p.jsonl"),
                          *SHAPE, "--max-tokens", "16", "--steps", "2", "--policy", "ts_polplug:MyPeer",
                          "--out", str(tmp_path / "out"), "--give-up-after", "0"])
        served = a.started + b.started
    assert rc == 0, err
    assert served == 2 * 4 * 2  # verl-lif: N groups of G, nothing cut or redrawn
    steps = [json.loads(line) for line in (tmp_path / "out" / "ts_polplug:MyPeer" / "steps.jsonl").read_text()
             .splitlines()]
    assert [s["step"] for s in steps] == [0, 1]


@pytest.mark.parametrize("command", ["simulate", "rollout"])
@pytest.mark.parametrize("name", ["ts_polplug:NOT_A_POLICY", "builtins:print"])
def test_a_plugin_that_is_neither_kind_is_one_line_naming_both(plugin: Path, tmp_path: Path, command: str,
                                                               name: str) -> None:
    argv = ["--policy", name, "--steps", "1", *SHAPE]
    if command == "simulate":
        argv = ["simulate", *argv, "--replicas", "2"]
    else:
        (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n")
        argv = ["rollout", *argv, "--endpoints", "http://127.0.0.1:1,http://127.0.0.1:2", "--prompts",
                str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "out")]
    rc, out, err = cli(argv)
    assert (rc, out) == (1, "")
    assert err == f"tailsieve {command}: error: {NEITHER.format(p=name)}\n"
    assert name not in CONTROLLERS and name not in PEERS
