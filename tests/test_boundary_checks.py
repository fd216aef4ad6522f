"""Training data that lines up, shapes checked at the boundary, every flag checked before anything starts, and
SIGTERM/SIGHUP from the first line (issue 49 items 3-5), each a generated class over the corpus's shapes:

- logprobs without token ids are checked against the usage's token count (a server sending two per token, or one
  too few), streamed or not, one choice or several: a `ReplyError` (the client's `BadReply`: retried or excluded);
- model and data files are checked by their schema (a `speculative` block of the wrong type, a damaged
  `spec_measurements.json`), integers on the command line and in specs are ASCII digits, bounded before conversion,
  duplicate keys are refused, and an unset `--api-key-env` is an error: one line, never an internal error;
- the GRPO examples bound every flag and build the whole rollout config before a model is built or a server starts;
- a long command signalled at its first line or as its work starts ends with one line and 128 + the signal."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cli_inprocess import run
from tailsieve.engines.transport.replies import ReplyError, parse_chunk, parse_full
from tailsieve.engines.transport.stream_replies import StreamAcc

ROOT = Path(__file__).resolve().parents[1]



def one_error_line(rc: int, err: str, *needles: str) -> None:
    lines = err.splitlines()
    assert rc != 0 and len(lines) == 1 and ": error: " in lines[0], err[:600]
    assert "internal error" not in err and "Traceback" not in err and len(lines[0]) <= 300, err[:600]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ------------------------------------------------------------------------------------------------ logprobs

def _full(n: int, tokens: list[int], lp_per_choice: list[int]) -> dict[str, Any]:
    return {"choices": [{"index": i, "text": "x" * tokens[i], "finish_reason": "length",
                         "logprobs": {"token_logprobs": [-0.5] * lp_per_choice[i]}} for i in range(n)],
            "usage": {"prompt_tokens": 3, "completion_tokens": sum(tokens), "total_tokens": 3 + sum(tokens)}}


def _stream(n: int, tokens: list[int], factor: float) -> StreamAcc:
    acc = StreamAcc(n, 64, [0] * n)
    for i in range(n):
        for _ in range(tokens[i]):
            lp = [-0.5] * max(0, round(factor))
            acc.add(parse_chunk({"choices": [{"index": i, "text": "x", "logprobs": {"token_logprobs": lp}}]}, n, 64))
        acc.add(parse_chunk({"choices": [{"index": i, "text": "", "finish_reason": "length"}]}, n, 64))
    acc.add(parse_chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": sum(tokens),
                                                  "total_tokens": 3 + sum(tokens)}}, n, 64))
    return acc


MISALIGNED = {"two logprobs per token": 2.0, "none for the tokens": 0.0}


class TestLogprobsLineUp:
    """Logprobs without ids × streamed or not × one or two choices × how they disagree."""

    @pytest.mark.parametrize("n", [1, 2])
    @pytest.mark.parametrize("how", ["two logprobs per token", "one too few", "one too many"])
    def test_a_full_reply(self, n: int, how: str) -> None:
        tokens = [5, 7][:n]
        lps = [2 * t if how == "two logprobs per token" else t - 1 if how == "one too few" else t + 1 for t in tokens]
        with pytest.raises(ReplyError, match="logprobs"):
            parse_full(_full(n, tokens, lps), n, 64, 0.1)
        assert parse_full(_full(n, tokens, tokens), n, 64, 0.1).choices[0].logprobs is not None  # aligned: kept

    @pytest.mark.parametrize("n", [1, 2])
    @pytest.mark.parametrize("how", list(MISALIGNED))
    def test_a_stream(self, n: int, how: str) -> None:
        tokens = [4, 6][:n]
        acc = _stream(n, tokens, MISALIGNED[how])  # "none": an empty list per event, the tokens without logprobs
        with pytest.raises(ReplyError, match="logprobs"):
            acc.result(True, 0.1, 0.01)
        assert _stream(n, tokens, 1.0).result(True, 0.1, 0.01).choices[0].logprobs is not None


# ------------------------------------------------------------------------------------------------ file schemas

MODEL = {"batch": [1, 2, 4, 8], "tpot_ms": [10.0, 11.0, 12.5, 15.0],
         "speculative": {"concurrency_fit": {"method": "mtp", "tokens": 3, "acceptance": 0.7}}}
MODEL_DAMAGE: dict[str, Any] = {
    "speculative a list": {"speculative": [1]},
    "speculative a string": {"speculative": "mtp"},
    "speculative a number": {"speculative": 3},
    "concurrency_fit a list": {"speculative": {"concurrency_fit": [1, 2]}},
    "concurrency_fit a string": {"speculative": {"concurrency_fit": "x"}},
}
MEASUREMENTS = {
    "empty file": "",
    "empty object": "{}",
    "a list": "[1]",
    "no measurements": '{"measurements": []}',
    "an entry not an object": '{"measurements": [1]}',
    "an entry without keys": '{"measurements": [{}]}',
    "an entry of the wrong type": None,  # filled from the shipped file below
    "a duplicate key": '{"measurements": [], "measurements": [1]}',
}


class _Data:
    """A stand-in for `importlib.resources.files("tailsieve")` that serves one damaged data file."""

    def __init__(self, text: str) -> None:
        self.text = text

    def joinpath(self, name: str) -> _Data:
        return self

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.text

    def read_bytes(self) -> bytes:
        return self.text.encode("utf-8")


class TestShapesAtBoundary:
    """Model files and the shipped measurement file against their schema; integers and keys in flags and specs."""

    @pytest.mark.parametrize("damage", list(MODEL_DAMAGE))
    @pytest.mark.parametrize("command", ["plan --spec", "simulate --tail-spec"])
    def test_a_model_file_off_its_schema(self, damage: str, command: str, tmp_path: Path) -> None:
        path = tmp_path / "model.json"
        path.write_text(json.dumps(MODEL | MODEL_DAMAGE[damage]))
        argv = (["plan", "--curve", str(path), "--spec", "mtp", "--steps", "2", "--spec-depths", "0,1"]
                if command == "plan --spec" else ["simulate", "--tail-spec", str(path), "--steps", "2"])
        rc, _, err = run(argv)
        one_error_line(rc, err, "speculative")

    @pytest.mark.parametrize("damage", list(MEASUREMENTS))
    def test_a_damaged_measurement_file(self, damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
        from tailsieve.model import spec_calibration, spec_records

        text = MEASUREMENTS[damage]
        if text is None:
            from importlib import resources

            doc = json.loads(resources.files("tailsieve").joinpath("data/spec_measurements.json").read_text())
            doc["measurements"][0]["value"] = "fast"
            text = json.dumps(doc)
        monkeypatch.setattr(spec_records, "resources", type("R", (), {"files": staticmethod(lambda _: _Data(text))}))
        spec_records.measurements.cache_clear()
        for fn in vars(spec_calibration).values():
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()
        try:
            rc, _, err = run(["plan", "--spec", "mtp", "--steps", "2", "--spec-depths", "0,1"])
        finally:
            spec_records.measurements.cache_clear()
            for fn in vars(spec_calibration).values():
                if hasattr(fn, "cache_clear"):
                    fn.cache_clear()
        one_error_line(rc, err, "spec_measurements.json")

    @pytest.mark.parametrize(("argv", "needle"), [
        (["simulate", "--steps", "٣"], "--steps"),
        (["simulate", "--steps", "1_0"], "--steps"),
        (["simulate", "--groups", "９"], "--groups"),
        (["simulate", "--steps", "3" * 5000], "--steps"),
        (["simulate", "--tail-spec", "mtp:٣", "--steps", "2"], "tokens"),
        (["simulate", "--tail-spec", "mtp:1_0", "--steps", "2"], "tokens"),
        (["simulate", "--tail-spec", "mtp:" + "7" * 5000, "--steps", "2"], "tokens"),
        (["simulate", "--curve", "family:" + "9" * 5000, "--steps", "2"], "family"),
        (["simulate", "--curve", "family:٣", "--steps", "2"], "family"),
        (["plan", "--spec", "mtp", "--spec-depths", "0,٣", "--steps", "2"], "--spec-depths"),
        (["plan", "--spec", "mtp", "--spec-depths", "0..1_0", "--steps", "2"], "--spec-depths"),
        (["launch", "--dry-run", "--model", "facebook/opt-125m", "--ports", "8000,٨٠٠١"], "--ports"),
        (["simulate", "--tail-spec", "mtp:3,acceptance=٠.5", "--steps", "2"], "acceptance"),
    ], ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else v)
    def test_integers_are_ascii_digits_bounded_before_conversion(self, argv: list[str], needle: str) -> None:
        rc, _, err = run(argv)
        one_error_line(rc, err, needle)

    @pytest.mark.parametrize("where", ["--tail-spec", "--bulk-spec", "config file", "model file"])
    def test_a_duplicate_key_is_refused(self, where: str, tmp_path: Path) -> None:
        if where.endswith("-spec"):
            argv = ["simulate", where, "mtp:3,acceptance=0.5,acceptance=0.9", "--steps", "2"]
        elif where == "config file":
            (tmp_path / "c.json").write_text('{"spec": {"tail": {"method": "mtp", "tokens": 3, "tokens": 5}}}')
            argv = ["simulate", "--config", str(tmp_path / "c.json"), "--steps", "2"]
        else:
            (tmp_path / "m.json").write_text('{"batch": [1, 2], "tpot_ms": [10, 11], "batch": [1, 4]}')
            argv = ["simulate", "--curve", str(tmp_path / "m.json"), "--steps", "2"]
        rc, _, err = run(argv)
        one_error_line(rc, err, "twice")

    @pytest.mark.parametrize("command", ["rollout", "profile"])
    def test_an_unset_api_key_variable_is_an_error(self, command: str, tmp_path: Path) -> None:
        os.environ.pop("I49_NO_SUCH_KEY", None)
        (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "x"}\n')
        argv = (["rollout", "--endpoints", "http://127.0.0.1:9", "--prompts", str(tmp_path / "p.jsonl"), "--steps",
                 "1", "--out", str(tmp_path / "out"), "--give-up-after", "0"] if command == "rollout"
                else ["profile", "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path / "c.json")])
        rc, _, err = run([*argv, "--api-key-env", "I49_NO_SUCH_KEY"])
        one_error_line(rc, err, "--api-key-env", "I49_NO_SUCH_KEY")
        assert not (tmp_path / "out").exists() and not (tmp_path / "c.json").exists()


# ------------------------------------------------------------------------------------------------ examples

def _example(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


GRPO_BAD = {
    "--rho nan": ["--rho", "nan"], "--rho 2": ["--rho", "2"], "--rho -0.5": ["--rho", "-0.5"],
    "--q -1": ["--policy", "static", "--q", "-1", "--m", "1"], "--m 5": ["--policy", "static", "--q", "1", "--m", "5"],
    "--m -1": ["--policy", "static", "--q", "1", "--m", "-1"], "--lr nan": ["--lr", "nan"], "--lr inf": ["--lr", "inf"],
    "--lr -1": ["--lr", "-1"], "--lr 0": ["--lr", "0"], "--threads 100000": ["--threads", "100000"],
    "--max-tokens 1e9": ["--max-tokens", "1e9"], "--max-tokens 100000": ["--max-tokens", "100000"],
    "--groups 100000": ["--groups", "100000"], "--group-size 1000": ["--group-size", "1000"],
    "--steps ٣": ["--steps", "٣"], "--seed -1": ["--seed", "-1"], "--seed 2**40": ["--seed", str(2**40)],
}


class TestFlagsBeforeAnythingStarts:
    """The GRPO example: every bad flag is one line and exit 2 before a model is built or a replica starts."""

    @pytest.mark.parametrize("case", list(GRPO_BAD))
    def test_the_grpo_example(self, case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        train = _example(ROOT / "examples" / "grpo_cpu" / "train.py", "i49_grpo_train")
        started: list[str] = []
        monkeypatch.setattr(train, "run", lambda a: started.append("run") or ([], None))
        monkeypatch.setattr(train, "missing_modules", lambda names: [])
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = train.main([*GRPO_BAD[case], "--workdir", str(tmp_path / "w")])
            except SystemExit as exc:
                rc = exc.code
        assert rc == 2 and err.getvalue().count("\n") == 1 and "error: " in err.getvalue(), err.getvalue()
        assert started == [] and not (tmp_path / "w").exists()

    @pytest.mark.parametrize("case", ["--lr nan", "--lr inf", "--steps ٣", "--max-tokens 100000", "--seed -1"])
    def test_the_trl_example(self, case: str) -> None:
        train = _example(ROOT / "examples" / "trl_grpo" / "train.py", "i49_trl_train")
        argv = GRPO_BAD[case]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as caught:
            train.parse(argv)
        assert caught.value.code == 2 and err.getvalue().count("\n") == 1, err.getvalue()


# ------------------------------------------------------------------------------------------------ signals

DRIVER = """
import os, signal, sys, time, importlib
sig = getattr(signal, sys.argv[1])
where = sys.argv[2]
import tailsieve.cli as cli
if where == "first line":
    def early():
        os.kill(os.getpid(), sig)
        time.sleep(5)
    cli.ascii_safe = early
else:
    mod = importlib.import_module(f"tailsieve.cli.{sys.argv[3]}_cmd")
    real = mod.run
    def run(args):
        os.kill(os.getpid(), sig)
        time.sleep(5)
        return real(args)
    mod.run = run
sys.exit(cli.main(sys.argv[3:]))
"""
LONG = {"profile": ["profile", "--endpoint", "http://127.0.0.1:9", "--out", "OUT/c.json"],
        "simulate": ["simulate", "--steps", "5", "--plot", "OUT/s.png"],
        "plan": ["plan", "--spec", "mtp", "--steps", "5"],
        "rollout": ["rollout", "--endpoints", "http://127.0.0.1:9", "--prompts", "OUT/p.jsonl", "--out", "OUT/r"],
        "launch": ["launch", "--model", "facebook/opt-125m", "--out", "OUT/l"],
        "oracle": ["oracle"], "route": ["route"], "analyze": ["analyze"]}


class TestSignalsFromFirstLine:
    """SIGTERM and SIGHUP × every long command, at `main`'s first line and as the command starts its work."""

    # the first line is the same for every command: two of them stand for all
    @pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
    @pytest.mark.parametrize(("command", "where"), [*((c, "command start") for c in LONG), ("profile", "first line"),
                                                    ("rollout", "first line")])
    def test_one_line_and_128_plus_the_signal(self, command: str, where: str, sig: str, tmp_path: Path) -> None:
        (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "x"}\n')
        argv = [a.replace("OUT", str(tmp_path)) for a in LONG[command]]
        proc = subprocess.run([sys.executable, "-c", DRIVER, sig, where, *argv], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        signum = getattr(signal, sig)
        assert proc.returncode == 128 + signum, (proc.returncode, proc.stderr[-800:])
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and f"interrupted by {sig}" in lines[0] and "Traceback" not in proc.stderr, lines
