"""A fleet too small for a policy the user did not name says that it is the default, and what to give instead
(issue 42: `rollout` with one endpoint said "policy tailsieve needs at least 2 replicas", a policy the user never
asked for). Generated: command × (the default policy, the same policy named) on one replica, each one exact stderr
line, exit 1, nothing on stdout and no output folder written."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tailsieve.cli import main

NEED = "needs at least 2 replicas (a tail and a bulk pool), got R=1"


def _rollout(d: Path) -> list[str]:
    (d / "p.jsonl").write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n")
    return ["rollout", "--endpoints", "http://127.0.0.1:1", "--prompts", str(d / "p.jsonl"), "--out", str(d / "out")]


def _launch(d: Path) -> list[str]:
    (d / "model").mkdir()
    (d / "model" / "config.json").write_text("{}")
    (d / "l.toml").write_text(f'[launch]\nmodel = "{d / "model"}"\nreplicas = 1\n')
    return [*_rollout(d)[:1], "--launch", str(d / "l.toml"), *_rollout(d)[3:]]


Argv = Callable[[Path], list[str]]
# case → (argv of the default run, the --policy that names the default, the default run's error; {d}: the folder)
CASES: dict[str, tuple[Argv, str, str]] = {
    "rollout --endpoints": (_rollout, "tailsieve",
                            f"the default --policy tailsieve {NEED}; give --policy uniform or more --endpoints"),
    "rollout --launch": (_launch, "tailsieve",
                         f"the default --policy tailsieve {NEED}; give --policy uniform or more replicas in "
                         "{d}/l.toml"),
    "simulate --spec": (lambda d: ["simulate", "--spec", "mtp", "--replicas", "1"], "tailsieve",
                        f"the default --policy tailsieve {NEED}; --spec compares it with uniform: give --replicas 2 "
                        "or more"),
    "route": (lambda d: ["route", "--replicas", "1"], "topq-best",
              "--replicas 1: streamrl-oracle, topq-best need at least 2 replicas (a tail pool) and come with the "
              "default --policy; give --replicas 2 or more, or choose with --policy among uniform, uniform-oracle, "
              "seer-oracle"),
}
# what the same command says when the user named the policy (the message that was also the default's before)
NAMED = {"rollout --endpoints": f"policy tailsieve {NEED}", "rollout --launch": f"policy tailsieve {NEED}",
         "simulate --spec": f"policy tailsieve {NEED}",
         "route": "--replicas 1: topq-best need at least 2 replicas (a tail pool); choose another --policy"}


def cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("named", [False, True], ids=["default", "named"])
@pytest.mark.parametrize("case", list(CASES))
def test_one_replica_names_the_default_policy_as_the_default(case: str, named: bool, tmp_path: Path) -> None:
    argv_of, policy, default_msg = CASES[case]
    argv = [*argv_of(tmp_path), *(["--policy", policy] if named else [])]
    rc, out, err = cli(argv)
    command = argv[0]
    want = NAMED[case] if named else default_msg.format(d=tmp_path)
    assert (rc, out, err) == (1, "", f"tailsieve {command}: error: {want}\n")
    assert not (tmp_path / "out").exists()
