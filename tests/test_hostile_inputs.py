"""Hostile inputs from files and flags (issue 15): generated curve, trace, prompt, TOML/JSON config and resume-state
files and flag values, run through the CLI in-process. Every case either succeeds (exit 0) or exits non-zero with
exactly one stderr line `tailsieve CMD: error: …`; never a traceback or an internal error, never a hang (an alarm
per case), never the API key in any output or written file. Outcome counts are printed at the end of the module
(`pytest -s`) and written to $TAILSIEVE_HOSTILE_REPORT when set.
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
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, composite

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
    assert len(lines) == 1, where
    assert lines[0].startswith(f"tailsieve {command}: error: "), where
    assert "internal error" not in lines[0], where
    OUTCOMES[f"{suite}: error (exit {rc})"] += 1
    MESSAGES.append(f"{suite}\t{lines[0]}")
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


# ------------------------------------------------------------------------------------------------- value strategies

HOSTILE_NUMBERS = ("nan", "NaN", "inf", "-inf", "Infinity", "-0", "0", "-1", "-5", "1e300", "-1e300", "1e-320",
                   str(2**31), str(2**53 + 1), str(2**62), str(2**63), str(2**64), str(-(2**63) - 1), "9" * 5000,
                   "0x10", "1_000", " 5 ", "", "abc", "１２", "1.5", "2.0", "1e3", "[1, 2]", "{}", "true", "null")
number_text = st.one_of(st.sampled_from(HOSTILE_NUMBERS), st.integers(-(2**70), 2**70).map(str),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr))
small_count = st.integers(1, 400).map(str)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6))
json_value = st.recursive(json_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                          max_size=3), max_leaves=8)
MUTATIONS = ("none", "none", "none", "bom", "badbyte", "truncate", "longfield", "deep", "nul")


@composite
def mutated(draw: DrawFn, text: str) -> bytes:
    """The file's bytes, possibly damaged: a BOM, an invalid byte, a cut, a 140k field, deep nesting, a NUL."""
    data = text.encode("utf-8", "surrogatepass")
    kind = draw(st.sampled_from(MUTATIONS))
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "badbyte":
        at = draw(st.integers(0, len(data)))
        return data[:at] + b"\xff" + data[at:]
    if kind == "truncate":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if kind == "longfield":
        return data + b"1," + b"7" * 140_000 + b"\n"
    if kind == "deep":
        n = draw(st.sampled_from((70, 1500, 5000)))
        return data + b'{"length": ' + b"[" * n + b"]" * n + b"}\n"
    if kind == "nul":
        return data.replace(b",", b"\x00,", 1)
    return data


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


# -------------------------------------------------------------------------------------------------------- curves


@composite
def curve_csv(draw: DrawFn) -> bytes:
    header = draw(st.sampled_from(("batch,tpot_ms", "tpot_ms,batch", "batch,tpot_ms,extra", "b,t", "batch", "")))
    batches = draw(st.lists(st.integers(1, 512), max_size=6, unique=True))
    rows = [[str(b), str(draw(st.floats(0.5, 80)))] for b in sorted(batches)]
    if rows and draw(st.booleans()):  # one hostile cell
        rows[draw(st.integers(0, len(rows) - 1))][draw(st.integers(0, 1))] = draw(number_text)
    body = "".join(f"{a},{b}\n" for a, b in rows)
    return draw(mutated(header + "\n" + body))


@composite
def curve_json(draw: DrawFn) -> bytes:
    batches = sorted(draw(st.lists(st.integers(1, 512), min_size=1, max_size=6, unique=True)))
    doc: Any = {"batch": batches, "tpot_ms": [draw(st.floats(0.5, 80)) for _ in batches]}
    if draw(st.booleans()):
        doc = draw(st.one_of(st.just(doc | {"description": draw(json_value)}), json_value,
                             st.just(doc | {draw(st.sampled_from(("batch", "tpot_ms"))): draw(json_value)}),
                             st.just(doc | {"batch": [*batches[:-1], draw(json_value)]})))
    return draw(mutated(json.dumps(doc)))


def curve_case(kind: str, data: bytes, cmd: str) -> None:
    with scratch() as root:
        path = write(root, f"c.{kind}", data)
        argv = ["curves", path, "--json"] if cmd == "curves" else [
            "simulate", "--curve", path, "--steps", "2", "--groups", "3", "--group-size", "2", "--replicas", "2",
            "--policy", "uniform", "--workload", small_trace(root)]
        run_case(f"curve {kind}", argv, root)


@settings(max_examples=170, **SETTINGS)
@given(data=curve_csv(), cmd=st.sampled_from(("curves", "curves", "simulate")))
def test_curve_csv_files(data: bytes, cmd: str) -> None:
    curve_case("csv", data, cmd)


@settings(max_examples=130, **SETTINGS)
@given(data=curve_json(), cmd=st.sampled_from(("curves", "curves", "simulate")))
def test_curve_json_files(data: bytes, cmd: str) -> None:
    curve_case("json", data, cmd)


# -------------------------------------------------------------------------------------------------------- traces

TRACE_HEADERS = ("prompt_id,length", "length", "prompt_id,length,step", "prompt_uid,output_length,sample",
                 "prompt_id,length,prompt_tokens,truncated", "id,response_tokens", "prompt_id,length,length", "x,y")


@composite
def trace_file(draw: DrawFn) -> tuple[str, bytes]:
    if draw(st.booleans()):
        header = draw(st.sampled_from(TRACE_HEADERS))
        cols = header.split(",")
        rows = draw(st.lists(st.lists(small_count, min_size=len(cols), max_size=len(cols)), min_size=0, max_size=25))
        if draw(st.booleans()):  # prompt ids that repeat, so groups and steps form
            rows = [[f"p{i % 5}", *r[1:]] for i, r in enumerate(rows)]
        if rows and draw(st.booleans()):  # one hostile cell
            i, j = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, len(cols) - 1))
            rows[i][j] = draw(number_text)
        if header.endswith("truncated"):
            rows = [[*r[:-1], draw(st.sampled_from(("true", "0", "no", r[-1])))] for r in rows]
        body = "".join(",".join(r) + "\n" for r in rows)
        return "csv", draw(mutated(header + "\n" + body))
    hostile = st.one_of(json_value, st.sampled_from((2**62, 2**63, -1, 0, 1.5, float("nan"))))
    value = st.integers(1, 400)
    row = st.fixed_dictionaries({"prompt_id": st.sampled_from(("a", "b", "c")), "length": value},
                                optional={"step": value, "truncated": st.booleans(), "prompt_tokens": value})
    rows: list[Any] = draw(st.lists(row, max_size=25))
    if rows and draw(st.booleans()):  # one hostile row or value
        i = draw(st.integers(0, len(rows) - 1))
        key = draw(st.sampled_from(("length", "step", "truncated", "prompt_tokens", None)))
        rows[i] = draw(json_value) if key is None else rows[i] | {key: draw(hostile)}
    return "jsonl", draw(mutated("".join(json.dumps(r) + "\n" for r in rows)))


TRACE_COMMANDS = ("route", "route", "analyze", "oracle", "simulate", "rollout")


@settings(max_examples=260, **SETTINGS)
@given(trace=trace_file(), cmd=st.sampled_from(TRACE_COMMANDS))
def test_trace_files(trace: tuple[str, bytes], cmd: str) -> None:
    kind, data = trace
    with scratch() as root:
        path = write(root, f"t.{kind}", data)
        argv = {
            "route": ["route", "--workload", path, "--groups", "3", "--group-size", "2", "--replicas", "2"],
            "analyze": ["analyze", path],
            "oracle": ["oracle", "--workload", path, "--sample", "4", "--repeat", "2"],
            "simulate": ["simulate", "--workload", path, "--steps", "2", "--groups", "3", "--group-size", "2",
                         "--replicas", "2", "--policy", "uniform"],
            "rollout": [*rollout_base(root, prompt_file(root)), "--replay-lengths", path],
        }[cmd]
        run_case(f"trace {kind}", argv, root)


# ------------------------------------------------------------------------------------------------------- prompts


@composite
def prompts_file(draw: DrawFn) -> bytes:
    rec = st.one_of(
        st.fixed_dictionaries({"prompt": st.one_of(st.text(max_size=8), json_value)}, optional={"id": json_value}),
        st.fixed_dictionaries({"messages": json_value}),
        json_value,
    )
    rows = draw(st.lists(rec, max_size=8))
    return draw(mutated("".join(json.dumps(r) + "\n" for r in rows)))


@settings(max_examples=110, **SETTINGS)
@given(data=prompts_file(), gz=st.booleans(), template=st.sampled_from(("none", "math", "code")))
def test_prompt_files(data: bytes, gz: bool, template: str) -> None:
    import gzip

    with scratch() as root:
        path = write(root, "p.jsonl.gz" if gz else "p.jsonl", gzip.compress(data) if gz else data)
        run_case("prompts", [*rollout_base(root, path), "--template", template], root)


# ------------------------------------------------------------------------------------------------ TOML / JSON configs

LAUNCH_KEYS = ("model", "replicas", "device", "cores", "gpus", "ports", "base_port", "memory", "served_model_name",
               "tail_replicas", "args", "env", "command", "cpu_defaults", "host", "startup_timeout_s", "grace_s",
               "warmup_tokens", "weight_reload", "tail", "bulk", "bogus")
SPEC_KEYS = ("method", "tokens", "acceptance", "decay", "draft_cost", "verify_cost", "draft_share", "bogus")
toml_scalar = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True),
                        st.text(max_size=6), st.sampled_from(("m", "cpu", "gpu", "0;1", "0-3", "mtp", "ngram",
                                                              "eagle3", "none", "")),
                        st.integers(0, 8))
toml_value = st.recursive(toml_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(
    st.sampled_from(("a", "b", "args", "speculative", "model")), c, max_size=2), max_leaves=6)


def toml_text(v: Any) -> str:
    """A value in TOML syntax (inline)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_text(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_text(x)}" for k, x in v.items()) + "}"


@composite
def config_file(draw: DrawFn) -> tuple[str, bytes]:
    launch = draw(st.dictionaries(st.sampled_from(LAUNCH_KEYS), toml_value, max_size=6))
    if draw(st.booleans()):
        launch["model"] = "m"
    spec = {pool: draw(st.dictionaries(st.sampled_from(SPEC_KEYS), toml_value, max_size=3))
            for pool in draw(st.lists(st.sampled_from(("tail", "bulk", "middle")), max_size=2, unique=True))}
    doc: dict[str, Any] = {"launch": launch} if draw(st.booleans()) or not spec else {}
    if spec:
        doc["spec"] = spec
    if draw(st.integers(0, 9)) == 0:
        doc = {draw(st.sampled_from(("launch", "spec", "other"))): draw(toml_value)}
    if draw(st.integers(0, 3)) == 0:
        return "json", draw(mutated(json.dumps(doc)))
    lines = []
    for table, body in doc.items():
        if isinstance(body, dict):
            lines.append(f"[{table}]")
            lines += [f"{json.dumps(k)} = {toml_text(v)}" for k, v in body.items()]
        else:
            lines.append(f"{table} = {toml_text(body)}")
    return "toml", draw(mutated("\n".join(lines) + "\n"))


@settings(max_examples=220, **SETTINGS)
@given(cfg=config_file(), cmd=st.sampled_from(("launch", "launch", "launch", "simulate")))
def test_config_files(cfg: tuple[str, bytes], cmd: str) -> None:
    kind, data = cfg
    with scratch() as root:
        path = write(root, f"c.{kind}", data)
        argv = ["launch", "--config", path, "--dry-run", "--out", str(root / "launch")] if cmd == "launch" else [
            "simulate", "--config", path, "--steps", "2", "--groups", "3", "--group-size", "2", "--replicas", "2",
            "--policy", "uniform", "--workload", small_trace(root)]
        run_case(f"config {kind}", argv, root)


# ----------------------------------------------------------------------------------------------------------- flags

@composite
def model_json(draw: DrawFn) -> bytes:
    """A cost model file (`tailsieve profile`, issue 13): a valid curve with a hostile `cost_model` object."""
    num = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70), json_value)
    terms = draw(st.one_of(json_value, st.fixed_dictionaries({}, optional={
        "kv_ms_per_1k": num, "prefill_ms_per_token": num, "request_overhead_ms": num,
        "format": st.sampled_from(("tailsieve-cost-model/1", "x", 1, None))})))
    doc = {"batch": [1, 8], "tpot_ms": [2.0, 3.0], "cost_model": terms}
    if draw(st.booleans()):
        doc["fit"] = draw(json_value)
    return draw(mutated(json.dumps(doc)))


@settings(max_examples=120, **SETTINGS)
@given(data=model_json(), cmd=st.sampled_from(("curves", "simulate", "plan")))
def test_model_files(data: bytes, cmd: str) -> None:
    with scratch() as root:
        path = write(root, "model.json", data)
        shape = ["--steps", "2", "--groups", "3", "--group-size", "2", "--replicas", "2", "--workload",
                 small_trace(root)]
        argv = {"curves": ["curves", path, "--json"], "simulate": ["simulate", "--curve", path, "--policy", "uniform",
                                                                   *shape],
                "plan": ["plan", "--curve", path, *shape]}[cmd]
        run_case("model file", argv, root)


SIZE = st.sampled_from(("-5", "0", "1", "2", "3", "x", "1.5", "nan", str(2**63), str(10**12), ""))
WAIT = st.sampled_from(("-1", "nan", "inf", "-inf", "0", "0.1", "x", "1e300", ""))
SPEC = st.sampled_from(("mtp", "mtp:3", "ngram:99", "eagle3:4,acceptance=nan", "mtp,acceptance=2", "warp", "",
                        "mtp:-1", "ngram:3,decay=inf", "suffix:2,draft_cost=1e300"))
COLUMNS = {"--length-column": st.sampled_from(("length", "nope", "prompt_id", "")),
           "--prompt-column": st.sampled_from(("prompt_id", "x", "length", ""))}  # every command that reads a trace
FLAG_VALUES: dict[str, dict[str, Any]] = {
    "simulate": {"--replicas": SIZE, "--groups": SIZE, "--group-size": SIZE, "--steps": SIZE, "--rho": number_text,
                 "--q": SIZE, "--m": SIZE, "--q0": SIZE, "--m0": SIZE, "--max-redraws": SIZE, "--seed": number_text,
                 "--max-num-seqs": SIZE, "--kv-ms-per-1k": number_text, "--prefill-ms-per-token": number_text,
                 "--restart-s": number_text, "--dispatch": st.sampled_from(("group", "request", "x")),
                 "--replay": st.sampled_from(("recorded", "resample", "synthetic", "")),
                 "--policy": st.sampled_from(("static", "all", "", ",", "nope", "tailsieve")),
                 "--tail-spec": SPEC, "--bulk-spec": SPEC, "--spec-budgets": st.sampled_from(("1,2", "-1", "x", "99")),
                 "--spec": st.sampled_from(("mtp", "ngram:2", "x", "mtp,acceptance=nan")), **COLUMNS},
    "route": {"--replicas": SIZE, "--groups": SIZE, "--group-size": SIZE, "--q": SIZE, "--m": SIZE,
              "--policy": st.sampled_from(("topq", "seer-oracle", "", "nope", "uniform,topq-best")),
              "--curve": st.sampled_from(("h100-llama3-8b", "nope", "", "/")), **COLUMNS},
    "plan": {"--replicas": SIZE, "--groups": SIZE, "--group-size": SIZE, "--steps": SIZE, "--rho": number_text,
             "--max-redraws": SIZE, "--seed": number_text, "--max-num-seqs": SIZE, "--kv-ms-per-1k": number_text,
             "--prefill-ms-per-token": number_text, "--replay": st.sampled_from(("recorded", "resample", "x")),
             "--curve": st.sampled_from(("h100-llama3-8b", "nope", "", "/")), **COLUMNS},
    "profile": {"--contexts": st.sampled_from(("0", "0,1024", "-1", "x", "", ",", "1e9", "0,99999999")),
                "--batches": st.sampled_from(("1", "0", "x", "")), "--max-tokens": SIZE},
    "oracle": {"--sample": SIZE, "--repeat": SIZE, "--seed": number_text, "--max-seconds": number_text,
               "--max-states": SIZE, **COLUMNS},
    "rollout": {"--temperature": number_text, "--top-p": number_text, "--top-k": number_text,
                "--presence-penalty": number_text, "--length-scale": number_text, "--max-tokens": SIZE,
                "--stall-timeout": WAIT, "--give-up-after": WAIT, "--retries": SIZE, "--q": SIZE, "--m": SIZE,
                "--q0": SIZE, "--m0": SIZE, "--rho": number_text, "--seed": number_text, "--max-redraws": SIZE,
                "--groups": SIZE, "--group-size": SIZE, "--steps": SIZE, "--tail-spec": SPEC, "--bulk-spec": SPEC,
                "--policy": st.sampled_from(("static", "uniform,tailsieve", "", "nope")),
                "--replay-lengths": st.sampled_from(("kodcode-r1", "nope")), **COLUMNS},
    "launch": {"--replicas": SIZE, "--device": st.sampled_from(("cpu", "gpu", "tpu")),
               "--cores": st.sampled_from(("0;1", "a;b", ";", "0-3;4-7", "0,2", "", "1;2;3")),
               "--gpus": st.sampled_from(("0;1", "0,1;2", "", "GPU-abc;1")),
               "--ports": st.sampled_from(("8000,8001", "0,1", "99999,1", "x", "", "8000,8000")),
               "--base-port": SIZE, "--memory": number_text, "--m": SIZE, "--tail-spec": SPEC, "--bulk-spec": SPEC,
               "--tail-speculative": st.sampled_from(('{"model": "d"}', "[1]", "{", '{"method": "x"}', "NaN")),
               "--server-args": st.sampled_from(("--foo 1", "'unclosed", "")),
               "--startup-timeout": number_text, "--served-model-name": st.text(max_size=5)},
    "analyze": {"--seed": number_text, "--prompts": SIZE, "--checkpoints": SIZE, "--samples": SIZE,
                **COLUMNS},
}


@composite
def flag_case(draw: DrawFn) -> tuple[str, list[tuple[str, str]]]:
    cmd = draw(st.sampled_from(sorted(FLAG_VALUES)))
    pool = FLAG_VALUES[cmd]
    names = draw(st.lists(st.sampled_from(sorted(pool)), min_size=1, max_size=4, unique=True))
    return cmd, [(n, draw(pool[n])) for n in names]


@settings(max_examples=300, **SETTINGS)
@given(case=flag_case())
def test_flags(case: tuple[str, list[tuple[str, str]]]) -> None:
    cmd, flags = case
    with scratch() as root:
        trace = small_trace(root)
        base = {
            "simulate": ["simulate", "--workload", trace, "--steps", "2", "--groups", "3", "--group-size", "2",
                         "--replicas", "2"],
            "route": ["route", "--workload", trace, "--groups", "3", "--group-size", "2", "--replicas", "2"],
            "oracle": ["oracle", "--workload", trace, "--sample", "4", "--repeat", "2"],
            "plan": ["plan", "--workload", trace, "--steps", "2", "--groups", "3", "--group-size", "2",
                     "--replicas", "2"],
            "profile": ["profile", "--endpoint", "http://127.0.0.1:9", "--retries", "0", "--batches", "1",
                        "--out", str(root / "m.json")],
            "rollout": rollout_base(root, prompt_file(root)) if cmd == "rollout" else [],
            "launch": ["launch", "--model", "m", "--dry-run", "--out", str(root / "launch")],
            "analyze": ["analyze", trace, "--prompts", "3", "--checkpoints", "2", "--samples", "2"],
        }[cmd]
        run_case(f"flags {cmd}", [*base, *(f"{n}={v}" for n, v in flags)], root)


# ---------------------------------------------------------------------------------------------------- resume state


STEP_LINE = {"step": 0, "makespan_s": 1.0, "tail_s": 0.5, "bulk_s": 0.5, "q": 0, "m": 0, "candidates": 0,
             "wasted_tokens": 0, "batch_mean_length": 5.0, "lengths": [[5]], "uids": [1], "prompt_ids": ["a"],
             "restart_s": 0.0, "redraws": [0], "truncated": [[False]]}
STATE = {"version": 1, "policy": "uniform", "fingerprint": {}, "generation": {"a": 1}, "control": {"q": 0, "m": 0},
         "router": {"step": 2, "stream": None, "requeue": [], "candidates": [], "consumed": 1}}


@composite
def damaged(draw: DrawFn, doc: dict[str, Any]) -> Any:
    """`doc` with at most one key removed, replaced by a hostile value, or the whole replaced."""
    how = draw(st.sampled_from(("keep", "keep", "drop", "value", "value", "whole")))
    key = draw(st.sampled_from(sorted(doc)))
    if how == "drop":
        return {k: v for k, v in doc.items() if k != key}
    if how == "value":
        return doc | {key: draw(st.one_of(json_value, st.sampled_from((2**63, -1, float("nan"), [[2**70]]))))}
    return draw(json_value) if how == "whole" else doc


@composite
def resume_files(draw: DrawFn) -> tuple[bytes, bytes]:
    rows = [draw(damaged(STEP_LINE | {"step": k})) for k in range(draw(st.integers(0, 3)))]
    steps = draw(mutated("".join(json.dumps(r) + "\n" for r in rows)))
    return steps, draw(mutated(json.dumps(draw(damaged(STATE)))))


@settings(max_examples=120, **SETTINGS)
@given(files=resume_files())
def test_resume_state(files: tuple[bytes, bytes]) -> None:
    steps, state = files
    with scratch() as root:
        folder = root / "out" / "uniform"
        folder.mkdir(parents=True)
        (folder / "steps.jsonl").write_bytes(steps)
        (folder / "state.json").write_bytes(state)
        run_case("resume", [*rollout_base(root, prompt_file(root)), "--resume"], root)


def test_known_cases_from_the_issue(tmp_path: Path) -> None:
    """The issue's reported inputs, each now one error line (or, for BOM curves, success)."""
    deep = "[" * 5000 + "]" * 5000
    files = {
        "deep.json": '{"batch": ' + deep + ', "tpot_ms": [1]}', "deep.jsonl": '{"length": ' + deep + "}\n",
        "deep.toml": "a = " + deep + "\n", "long.csv": "batch,tpot_ms\n1," + "9" * 140_000 + "\n",
        "big.csv": f"prompt_id,length\na,{2**63}\nb,5\n", "big62.csv": f"prompt_id,length\na,{2**62 - 10}\nb,5\n",
        "list.jsonl": "".join(json.dumps({"prompt_id": f"p{i}", "length": [1, 2]}) + "\n" for i in range(20)),
        "zero.csv": "prompt_id,length\n" + "".join(f"p{i},0\n" for i in range(20)),
        "bom.csv": "\ufeffbatch,tpot_ms\n1,10\n8,12\n",
        "mem.toml": '[launch]\nmodel = "m"\nmemory = inf\n', "bad.toml": "launch = 5\n",
        "args.toml": '[launch]\nmodel = "m"\nargs = "a string"\n', "host.toml": '[launch]\nmodel = "m"\nhost = ""\n',
    }
    p = {name: str(tmp_path / name) for name in files}
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    prompts = prompt_file(tmp_path)
    roll = rollout_base(tmp_path, prompts)
    errors = [
        ["curves", p["deep.json"]], ["analyze", p["deep.jsonl"]], ["simulate", "--config", p["deep.toml"]],
        ["curves", p["long.csv"]], ["route", "--workload", p["big.csv"]], ["analyze", p["big.csv"]],
        ["oracle", "--workload", p["big62.csv"]], [*roll, "--replay-lengths", p["big.csv"]],
        ["simulate", "--workload", p["list.jsonl"]], ["analyze", p["list.jsonl"]],
        ["route", "--workload", p["zero.csv"]],
        ["simulate", "--kv-ms-per-1k", "1e300"], ["route", "--group-size", "100000"],
        ["launch", "--model", "m", "--memory", "inf", "--dry-run"], ["launch", "--config", p["mem.toml"], "--dry-run"],
        ["launch", "--config", p["bad.toml"], "--dry-run"],
        ["launch", "--config", p["args.toml"], "--dry-run", "--server-args=--x"],
        ["launch", "--config", p["host.toml"], "--dry-run"], ["launch", "--model", "m", "--cores", "a;b", "--dry-run"],
        [*roll, "--length-scale", "inf"], [*roll, "--temperature", "nan"], [*roll, "--presence-penalty", "inf"],
        [*roll, "--top-k", "-5"], [*roll, "--m0", "5"], [*roll, "--policy", "static", "--q", "-1", "--m", "1"],
        [*roll, "--give-up-after", "-1"], [*roll, "--give-up-after", "nan"], [*roll, "--stall-timeout", "nan"],
        ["workloads", "extra"], ["route", "--bogus"], ["oracle", "--sample", "0"], ["launch", "--replicas", "0"],
    ]
    for argv in errors:
        rc, err = run_case("issue cases", argv, tmp_path)
        assert rc != 0, argv
        assert "tailsieve: error" not in err, argv
    rc, _ = run_case("issue cases", ["curves", p["bom.csv"]], tmp_path)
    assert rc == 0


# ------------------------------------------------------------------------- issue 23: traces, curves, flags (generated)


def refused(suite: str, argv: Sequence[str], root: Path, *expect: str) -> None:
    """`argv` exits non-zero with one line holding every `expect` text, and every file under `root` is unchanged."""
    before = {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    rc, err = run_case(suite, argv, root)
    assert rc != 0, (suite, argv)
    assert all(e in err for e in expect), (suite, argv, err)
    assert {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} == before, (suite, argv)


def trace_argv(cmd: str, path: str, root: Path) -> list[str]:
    shape = ["--groups", "3", "--group-size", "2", "--replicas", "2"]
    return {"route": ["route", "--trace", path, *shape], "analyze": ["analyze", path],
            "oracle": ["oracle", "--trace", path, "--sample", "4", "--repeat", "2"],
            "simulate": ["simulate", "--workload", path, "--steps", "2", *shape, "--policy", "uniform"],
            "plan": ["plan", "--workload", path, "--steps", "2", *shape],
            "rollout": [*rollout_base(root, prompt_file(root)), "--replay-lengths", path]}[cmd]


def _rows(cols: str, n: int = 12) -> list[dict[str, Any]]:
    """A valid trace: prompts p0..p3, samples 0..2 (and steps 0, 1 when `cols` has step)."""
    rows = [{"prompt_id": f"p{i % 4}", "sample": i // 4, "length": 10 + i} for i in range(n)]
    return [r | {"step": r["sample"] % 2} for r in rows] if "step" in cols else rows


def _csv(rows: list[dict[str, Any]], rename: dict[str, str] | None = None) -> bytes:
    cols = list(rows[0])
    head = [(rename or {}).get(c, c) for c in cols]
    return (",".join(head) + "\n" + "".join(",".join(str(r[c]) for c in cols) + "\n" for r in rows)).encode()


def _jsonl(rows: list[Any]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


# (file suffix, bytes, the text the error line must hold): a repeated sample row counts as one more sample
DUPLICATE_TRACES: dict[str, tuple[str, bytes, str]] = {
    "csv (prompt, sample)": ("csv", _csv([*_rows("s"), _rows("s")[5]]), "line 14: prompt 'p1' sample 1 repeats line 7"),
    "csv (prompt, step, sample)": ("csv", _csv([*_rows("step"), _rows("step")[2]]),
                                   "line 14: prompt 'p2' step 0 sample 0 repeats line 4"),
    "csv sample_idx alias": ("csv", _csv([_rows("s")[0], *_rows("s")], {"sample": "sample_idx"}),
                             "line 3: prompt 'p0' sample 0 repeats line 2"),
    "csv repeat alias, adjacent": ("csv", _csv([*_rows("s")[:3], _rows("s")[2], *_rows("s")[3:]], {"sample": "repeat"}),
                                   "line 5: prompt 'p2' sample 0 repeats line 4"),
    "jsonl (prompt, sample)": ("jsonl", _jsonl([*_rows("s"), _rows("s")[11]]), "line 13: prompt 'p3' sample 2"),
    "jsonl (prompt, step, sample)": ("jsonl", _jsonl([*_rows("step"), _rows("step")[0]]),
                                     "line 13: prompt 'p0' step 0 sample 0 repeats line 1"),
    "jsonl same row, other length": ("jsonl", _jsonl([*_rows("s"), _rows("s")[4] | {"length": 99}]),
                                     "repeats line 5"),
    "jsonl int and text id": ("jsonl", _jsonl([*_rows("s"), {"prompt_id": 7, "sample": 0, "length": 1},
                                               {"prompt_id": "7", "sample": 0, "length": 2}]), "line 14"),
}
NON_SCALAR_IDS = {"list": [1, 2], "object": {"a": 1}, "empty list": [], "nested": [[0]], "boolean": True}
ID_TRACES = {f"prompt id {name}": ("jsonl", _jsonl([*_rows("s")[:5], _rows("s")[5] | {"prompt_id": v},
                                                    *_rows("s")[6:]]),
                                   "line 6: prompt id 'prompt_id' must be text or a number")
             for name, v in NON_SCALAR_IDS.items()}
TRACE_CLASSES = DUPLICATE_TRACES | ID_TRACES
TRACE_CASES = [(name, cmd) for name in TRACE_CLASSES for cmd in ("analyze", "simulate", "route", "oracle", "plan",
                                                                   "rollout")]


@pytest.mark.parametrize(("variant", "cmd"), TRACE_CASES, ids=[f"{v}-{c}" for v, c in TRACE_CASES])
def test_duplicate_rows_and_non_scalar_ids_are_refused_naming_the_line(variant: str, cmd: str) -> None:
    suffix, data, expect = TRACE_CLASSES[variant]
    with scratch() as root:
        path = write(root, f"t.{suffix}", data)
        refused(f"issue 23 traces ({variant})", trace_argv(cmd, path, root), root, f"trace {path}, ", expect)


def test_a_trace_without_repeats_still_runs() -> None:
    """The control: the same traces without the repeated row run in every command."""
    with scratch() as root:
        for suffix, data in (("csv", _csv(_rows("s"))), ("jsonl", _jsonl(_rows("step")))):
            path = write(root, f"ok.{suffix}", data)
            for cmd in ("analyze", "simulate", "route", "oracle", "plan"):
                assert run_case("issue 23 traces (control)", trace_argv(cmd, path, root), root)[0] == 0, cmd


# prompt files whose ids would collide once repeats get their #k suffix, or are not scalars
PROMPT_IDS: dict[str, tuple[list[Any], str]] = {
    "a, a, a#1": (["a", "a", "a#1"], "line 3: id 'a#1' is already the id of line 2"),
    "a#1, a, a": (["a#1", "a", "a"], "line 3: id 'a#1' is already the id of line 1"),
    "a, a, a, a#2": (["a", "a", "a", "a#2"], "line 4: id 'a#2' is already the id of line 3"),
    "x#1 then 3 x": (["x#1", "x", "x", "x"], "line 3: id 'x#1' is already the id of line 1"),
    "int 1, 1, text 1#1": ([1, 1, "1#1"], "line 3: id '1#1' is already the id of line 2"),
    **{f"id {name}": (["a", v, "b"], "line 2: id 'id' must be text or a number") for name, v in
       NON_SCALAR_IDS.items()},
}


@pytest.mark.parametrize("variant", sorted(PROMPT_IDS))
def test_colliding_or_non_scalar_prompt_ids_are_refused(variant: str) -> None:
    ids, expect = PROMPT_IDS[variant]
    with scratch() as root:
        path = write(root, "p.jsonl", _jsonl([{"id": v, "prompt": f"q{i}"} for i, v in enumerate(ids)]))
        refused(f"issue 23 prompt ids ({variant})", rollout_base(root, path), root, f"prompt file {path}", expect)


def _curve(kind: str, n: int) -> bytes:
    if kind == "csv":
        return ("batch,tpot_ms\n" + "".join(f"{b},{1 + b / n}\n" for b in range(1, n + 1))).encode()
    doc: dict[str, Any] = {"batch": list(range(1, n + 1)), "tpot_ms": [1 + b / n for b in range(1, n + 1)]}
    if kind == "model json":
        doc["cost_model"] = {"format": "tailsieve-cost-model/1", "kv_ms_per_1k": 0.1, "prefill_ms_per_token": 0.0}
    return json.dumps(doc).encode()


def curve_argv(cmd: str, path: str, root: Path) -> list[str]:
    trace = small_trace(root)
    shape = ["--groups", "3", "--group-size", "2", "--replicas", "2"]
    return {"curves": ["curves", path, "--json"],
            "simulate": ["simulate", "--curve", path, "--workload", trace, "--steps", "2", *shape, "--policy",
                         "uniform"],
            "plan": ["plan", "--curve", path, "--workload", trace, "--steps", "2", *shape],
            "route": ["route", "--curve", path, "--trace", trace, *shape],
            "oracle": ["oracle", "--curve", path, "--trace", trace, "--sample", "4", "--repeat", "2"],
            "rollout --curve": [*rollout_base(root, prompt_file(root)), "--curve", path],
            "rollout --tail-curve": [*rollout_base(root, prompt_file(root)), "--tail-curve", path]}[cmd]


CURVE_CASES = [(kind, cmd) for kind in ("csv", "json", "model json")
               for cmd in ("curves", "simulate", "plan", "route", "oracle", "rollout --curve", "rollout --tail-curve")]


@pytest.mark.parametrize(("kind", "cmd"), CURVE_CASES, ids=[f"{k}-{c}" for k, c in CURVE_CASES])
def test_every_command_refuses_a_curve_over_the_point_limit(kind: str, cmd: str) -> None:
    with scratch() as root:
        path = write(root, "c.csv" if kind == "csv" else "c.json", _curve(kind, 100_001))
        refused(f"issue 23 curve ({kind})", curve_argv(cmd, path, root), root,
                "100,001 points, more than the 100,000 allowed")


FLAG_CASES: dict[str, tuple[list[str], str]] = {
    **{f"profile --temperature {v}": ([f"--temperature={v}"], "--temperature must be a finite number >= 0 and <= 100")
       for v in ("inf", "-inf", "nan", "1e300", "100.5", "-1")},
    **{f"simulate --config {name}": ([text], f"{table} must be a table") for name, text, table in (
        ("launch = 5", "launch = 5\n", "launch"), ("launch = [1]", "launch = [1]\n", "launch"),
        ("launch = 'x'", 'launch = "x"\n', "launch"), ("spec = 5", "spec = 5\n", "spec"),
        ("json launch list", '{"launch": [1, 2]}', "launch"), ("json spec null", '{"spec": null}', "spec"))},
}


@pytest.mark.parametrize("variant", sorted(FLAG_CASES))
def test_flag_and_config_values_of_issue_23(variant: str) -> None:
    extra, expect = FLAG_CASES[variant]
    with scratch() as root:
        if variant.startswith("profile"):
            argv = ["profile", "--endpoint", "http://127.0.0.1:9", "--retries", "0", "--batches", "1", "--out",
                    str(root / "m.json"), *extra]
        else:
            cfg = write(root, "c.json" if "json" in variant else "c.toml", extra[0].encode())
            argv = ["simulate", "--config", cfg, "--steps", "2", "--groups", "3", "--group-size", "2", "--replicas",
                    "2", "--policy", "uniform", "--workload", small_trace(root)]
        refused(f"issue 23 flags ({variant})", argv, root, expect)
