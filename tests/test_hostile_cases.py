"""Hostile inputs reported in issues 15 and 23, each a fixed case (the generated ones: tests/test_hostile_inputs.py):
duplicate trace rows and non-scalar ids named by line, colliding prompt ids, curves over the point limit in every
command, flag and config values; each one error line, and nothing already on disk changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hostile_harness import (
    prompt_file,
    refused,
    report_outcomes,  # noqa: F401 (the module's autouse fixture: outcome counts)
    rollout_base,
    run_case,
    scratch,
    small_trace,
    write,
)


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


def trace_argv(cmd: str, path: str, root: Path) -> list[str]:
    shape = ["--groups", "3", "--group-size", "2", "--replicas", "2"]
    return {"route": ["route", "--workload", path, *shape], "analyze": ["analyze", path],
            "oracle": ["oracle", "--workload", path, "--sample", "4", "--repeat", "2"],
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
            "route": ["route", "--curve", path, "--workload", trace, *shape],
            "oracle": ["oracle", "--curve", path, "--workload", trace, "--sample", "4", "--repeat", "2"],
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
