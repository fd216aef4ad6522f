"""The hostile-input harness shared by tests/test_hostile_inputs.py (generated files and flags) and
tests/test_hostile_cases.py (the reported cases): run one CLI command in-process and hold it to the contract (exit 0,
or exactly one stderr line `tailsieve CMD: error: …`; never a traceback, a hang or the API key in any output or
written file), count the outcomes, and the small valid inputs the cases start from.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck

from tailsieve.cli import main

SECRET = "sk-hostile-SECRET-4b1d"
CASE_TIMEOUT_S = 30
OUTCOMES: Counter[str] = Counter()
MESSAGES: list[str] = []
SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "database": None}


class Hang(BaseException):
    """A case ran past CASE_TIMEOUT_S (a BaseException, so that the CLI's catch-all does not swallow it)."""


def _alarm(signum: int, frame: object) -> None:
    raise Hang(f"no result within {CASE_TIMEOUT_S} s")


@contextlib.contextmanager
def _env() -> Iterator[None]:
    old = os.environ.get("TAILSIEVE_API_KEY")
    os.environ["TAILSIEVE_API_KEY"] = SECRET
    os.environ.pop("TAILSIEVE_DEBUG", None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TAILSIEVE_API_KEY", None)
        else:
            os.environ["TAILSIEVE_API_KEY"] = old


def run_case(suite: str, argv: Sequence[str], root: Path) -> tuple[int, str]:
    """Run one command; check the contract; count the outcome; return (exit code, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_TIMEOUT_S)
    try:
        with _env(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    stdout, stderr = out.getvalue(), err.getvalue()
    command = argv[0]
    where = f"{suite}: {list(argv)!r}\nstderr: {stderr[-2000:]!r}"
    assert "Traceback" not in stderr and "Traceback" not in stdout, where
    assert SECRET not in stdout and SECRET not in stderr, where
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"{where}\nsecret in {path}"
    if rc == 0:
        OUTCOMES[f"{suite}: success"] += 1
        return rc, stderr
    lines = stderr.splitlines()
    # one error line, last; before it at most one notice of the same command (a resume that moved an unfinished
    # step aside says so before the run fails for another reason)
    assert 1 <= len(lines) <= 2 and all(x.startswith(f"tailsieve {command}: ") for x in lines), where
    assert lines[-1].startswith(f"tailsieve {command}: error: "), where
    assert len(lines) == 1 or ": error: " not in lines[0], where
    assert "internal error" not in lines[-1], where
    OUTCOMES[f"{suite}: error (exit {rc})"] += 1
    MESSAGES.append(f"{suite}\t{lines[-1]}")
    return rc, stderr


@pytest.fixture(scope="module", autouse=True)
def report_outcomes() -> Iterator[None]:
    """Print (and optionally write) the outcome counts after the module's tests."""
    yield
    total = sum(OUTCOMES.values())
    lines = [f"hostile inputs: {total} generated cases"] + [f"  {k}: {v}" for k, v in sorted(OUTCOMES.items())]
    print("\n" + "\n".join(lines), file=sys.__stderr__)
    target = os.environ.get("TAILSIEVE_HOSTILE_REPORT")
    if target:
        Path(target).write_text(json.dumps({"total": total, "outcomes": dict(OUTCOMES), "messages": MESSAGES},
                                           indent=1) + "\n")


def write(root: Path, name: str, data: bytes) -> str:
    path = root / name
    path.write_bytes(data)
    return str(path)


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hostile-") as d:
        yield Path(d)


def small_trace(root: Path) -> str:
    rows = "".join(f"p{i % 7},{(i * 37) % 400 + 1}\n" for i in range(42))
    return write(root, "ok.csv", ("prompt_id,length\n" + rows).encode())


def prompt_file(root: Path) -> str:
    return write(root, "prompts.jsonl", "".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(6)).encode())


ENDPOINTS = "http://127.0.0.1:1,http://127.0.0.1:2"  # refused at once: a valid run fails fast, after every check


def rollout_base(root: Path, prompts: str) -> list[str]:
    return ["rollout", "--endpoints", ENDPOINTS, "--prompts", prompts, "--out", str(root / "out"), "--give-up-after",
            "0", "--steps", "1", "--groups", "2", "--group-size", "1", "--policy", "uniform"]


def refused(suite: str, argv: Sequence[str], root: Path, *expect: str) -> None:
    """`argv` exits non-zero with one line holding every `expect` text, and every file under `root` is unchanged."""
    before = {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    rc, err = run_case(suite, argv, root)
    assert rc != 0, (suite, argv)
    assert all(e in err for e in expect), (suite, argv, err)
    assert {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} == before, (suite, argv)
