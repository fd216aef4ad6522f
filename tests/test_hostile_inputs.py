"""Hostile inputs from files and flags (issue 15): generated curve, trace, prompt, TOML/JSON config and resume-state
files and flag values, run through the CLI in-process. Every case either succeeds (exit 0) or exits non-zero with
exactly one stderr line `tailsieve CMD: error: …`; never a traceback or an internal error, never a hang (an alarm
per case), never the API key in any output or written file. Outcome counts are printed at the end of the module
(`pytest -s`) and written to $TAILSIEVE_HOSTILE_REPORT when set.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, composite

from hostile_harness import (
    SETTINGS,
    prompt_file,
    report_outcomes,  # noqa: F401 (the module's autouse fixture: outcome counts)
    rollout_base,
    run_case,
    scratch,
    small_trace,
    write,
)

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


