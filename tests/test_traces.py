"""Trace loading: formats, column aliases, overrides, bundled traces, and one test per bad-file message."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DATA, require_extra
from tailsieve.errors import TraceError
from tailsieve.workloads.traces import bundled_trace_names, bundled_trace_path, load_trace, read_trace

TRACES = DATA / "traces"  # excerpts (tests/data/README.md); the KodCode traces are the package's own


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def jsonl(tmp_path: Path, rows: list[dict[str, object]], name: str = "t.jsonl") -> Path:
    return write(tmp_path, name, "".join(json.dumps(r) + "\n" for r in rows))


def error(path: Path, **kwargs: str) -> str:
    with pytest.raises(TraceError) as exc:
        read_trace(path, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_bundled_default_and_kodcode_tests() -> None:
    assert bundled_trace_names()[0] == "kodcode-r1"
    r1 = load_trace()
    assert len(r1) == 696 and r1.n_prompts == 232 and r1.has_prompt_groups
    assert r1.prompt_tokens is not None and r1.sample is not None and r1.step is None
    tests = load_trace("kodcode-tests")
    assert len(tests) == 1050 and tests.n_prompts == 350
    assert int(np.median(tests.length)) == 402 and int(tests.length.max()) == 2390
    assert bundled_trace_path("kodcode-tests").name == "kodcode_solution_and_tests_generation_lengths.csv"


@pytest.mark.parametrize(
    ("name", "length_col", "grouped"),
    [
        ("kodcode_r1_response_lengths.csv", "response_tokens", True),
        ("kodcode_solution_and_tests_generation_lengths.csv", "response_tokens", True),
        ("azure2023_code.csv", "GeneratedTokens", False),
        ("azure2023_conv.csv", "GeneratedTokens", False),
        ("mooncake_conversation.csv", "output_length", False),
    ],
)
def test_shared_traces_column_aliases(name: str, length_col: str, grouped: bool) -> None:
    path = TRACES / name if (TRACES / name).exists() else bundled_trace_path("kodcode-r1").parent / name
    t = load_trace(path)
    assert t.meta["length_column"] == length_col
    assert t.has_prompt_groups is grouped
    assert t.prompt_tokens is not None
    assert (t.length >= 0).all() and len(t) > 100


def test_jsonl_with_all_optional_columns(tmp_path: Path) -> None:
    rows = [
        {"prompt_uid": "a", "output_length": 10, "step": 1, "sample": 0, "prompt_tokens": 5, "truncated": False},
        {"prompt_uid": "a", "output_length": 16384, "step": 1, "sample": 1, "prompt_tokens": 5, "truncated": True},
        {"prompt_uid": "b", "output_length": 7.0, "step": 2, "sample": 0, "prompt_tokens": 9, "truncated": "no"},
    ]
    t = read_trace(jsonl(tmp_path, rows))
    assert list(t.prompt_id) == ["a", "a", "b"]
    assert list(t.length) == [10, 16384, 7]
    assert t.step is not None and list(t.step) == [1, 1, 2]
    assert t.sample is not None and list(t.sample) == [0, 1, 0]
    assert t.prompt_tokens is not None and list(t.prompt_tokens) == [5, 5, 9]
    assert t.truncated is not None and list(t.truncated) == [False, True, False]


def test_column_overrides(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "q,n,length\nx,3,99\ny,4,99\n")
    t = read_trace(p, length_column="n", prompt_column="q")
    assert list(t.length) == [3, 4] and list(t.prompt_id) == ["x", "y"]
    assert list(read_trace(p).length) == [99, 99]  # the canonical name wins without an override


def test_no_prompt_column_makes_one_prompt_per_row(tmp_path: Path) -> None:
    t = read_trace(write(tmp_path, "t.csv", "GeneratedTokens\n5\n6\n"))
    assert list(t.prompt_id) == ["row0", "row1"] and not t.has_prompt_groups


def test_bom_blank_lines_and_quoted_fields(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes('\ufeffprompt_id,length\n"a,1",5\n\n"b",6\n'.encode())
    t = read_trace(p)
    assert list(t.prompt_id) == ["a,1", "b"] and list(t.length) == [5, 6]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["p", "q", "r s"]), st.integers(0, 10**6)), min_size=1, max_size=30))
def test_csv_roundtrip(tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[str, int]]) -> None:
    p = tmp_path_factory.mktemp("rt") / "t.csv"
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt_id", "length"])
        w.writerows(rows)
    t = read_trace(p)
    assert list(t.prompt_id) == [r[0] for r in rows] and list(t.length) == [r[1] for r in rows]


# ---------------------------------------------------------------------------------------------- bad-file messages


def test_missing_length_column(tmp_path: Path) -> None:
    msg = error(write(tmp_path, "t.csv", "prompt_id,tokens\na,1\n"))
    assert "t.csv" in msg and "missing length column" in msg and "columns are prompt_id, tokens" in msg


def test_missing_override_columns(tmp_path: Path) -> None:
    p = write(tmp_path, "t.csv", "prompt_id,length\na,1\n")
    assert "missing length column 'n'" in error(p, length_column="n")
    assert "missing prompt column 'q'" in error(p, prompt_column="q")


def test_non_integer_length(tmp_path: Path) -> None:
    msg = error(write(tmp_path, "t.csv", "prompt_id,length\na,1\nb,abc\n"))
    assert "t.csv, line 3" in msg and "length 'length' is not an integer: 'abc'" in msg


def test_fractional_length(tmp_path: Path) -> None:
    msg = error(jsonl(tmp_path, [{"prompt_id": "a", "length": 12.5}]))
    assert "line 1" in msg and "not an integer: 12.5" in msg


def test_boolean_length_is_not_an_integer(tmp_path: Path) -> None:
    assert "not an integer: True" in error(jsonl(tmp_path, [{"prompt_id": "a", "length": True}]))


def test_negative_length(tmp_path: Path) -> None:
    msg = error(write(tmp_path, "t.csv", "prompt_id,length\na,1\nb,2\nc,-4\n"))
    assert "line 4" in msg and "is negative: -4" in msg


def test_missing_length_value(tmp_path: Path) -> None:
    msg = error(jsonl(tmp_path, [{"prompt_id": "a", "length": 3}, {"prompt_id": "b"}]))
    assert "line 2" in msg and "missing length 'length'" in msg
    msg = error(write(tmp_path, "t.csv", "prompt_id,length\na,\n"))
    assert "line 2" in msg and "missing length" in msg


def test_missing_prompt_id_value(tmp_path: Path) -> None:
    msg = error(write(tmp_path, "t.csv", "prompt_id,length\n,3\n"))
    assert "line 2" in msg and "missing prompt id 'prompt_id'" in msg


def test_empty_file(tmp_path: Path) -> None:
    assert "t.csv: empty file" in error(write(tmp_path, "t.csv", ""))
    assert "t.jsonl: empty file" in error(write(tmp_path, "t.jsonl", "\n  \n"))


def test_header_only(tmp_path: Path) -> None:
    assert "no data rows" in error(write(tmp_path, "t.csv", "prompt_id,length\n"))


def test_invalid_json_line(tmp_path: Path) -> None:
    msg = error(write(tmp_path, "t.jsonl", '{"prompt_id": "a", "length": 1}\n{"prompt_id": "b", \n'))
    assert "t.jsonl, line 2: invalid JSON" in msg


def test_json_line_not_an_object(tmp_path: Path) -> None:
    assert "line 1: expected a JSON object, got list" in error(write(tmp_path, "t.jsonl", "[1, 2]\n"))


def test_wrong_field_count(tmp_path: Path) -> None:
    msg = error(write(tmp_path, "t.csv", "prompt_id,length\na,1\nb,2,3\n"))
    assert "t.csv, line 3: 3 fields, the header has 2" in msg


def test_duplicate_header(tmp_path: Path) -> None:
    assert "line 1: duplicate column 'length'" in error(write(tmp_path, "t.csv", "length,length\n1,2\n"))


def test_bad_step_and_truncated_cells(tmp_path: Path) -> None:
    msg = error(jsonl(tmp_path, [{"prompt_id": "a", "length": 1, "step": "x"}]))
    assert "line 1" in msg and "step 'step' is not an integer" in msg
    msg = error(jsonl(tmp_path, [{"prompt_id": "a", "length": 1, "truncated": "maybe"}]))
    assert "line 1" in msg and "is not a boolean: 'maybe'" in msg


def test_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes(b"prompt_id,length\n\xff\xfe,1\n")
    assert "not UTF-8 text (line 2, byte 17" in error(p)


def test_missing_path_and_directory(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace 'nope.csv'.*kodcode-r1"):
        load_trace("nope.csv")
    with pytest.raises(TraceError, match="is a directory"):
        load_trace(tmp_path)


def test_parquet_roundtrip_and_bad_file(tmp_path: Path) -> None:
    require_extra("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"prompt_uid": ["a", "a", "b"], "response_tokens": [5, 6, 7], "step": [0, 0, 1]})
    p = tmp_path / "t.parquet"
    pq.write_table(table, p)
    t = read_trace(p)
    assert list(t.prompt_id) == ["a", "a", "b"] and list(t.length) == [5, 6, 7]
    assert t.step is not None and list(t.step) == [0, 0, 1]
    pq.write_table(pa.table({"prompt_id": ["a"], "length": [-1]}), p)
    assert "line 2" in error(p) and "is negative" in error(p)
    bad = write(tmp_path, "bad.parquet", "not parquet")
    assert "not a readable Parquet file" in error(bad)


def test_repeated_sample_rows_are_refused_but_repeated_steps_are_samples(tmp_path: Path) -> None:
    """A (prompt, sample) row, or (prompt, step, sample) with steps, appears once; without a sample column a prompt
    may repeat at one step (each row one sample); the same sample number at another step is another sample."""
    ok = read_trace(write(tmp_path, "a.csv", "prompt_id,step,length\na,0,1\na,0,2\na,1,3\n"))
    assert ok.length.tolist() == [1, 2, 3]
    ok = read_trace(write(tmp_path, "b.csv", "prompt_id,step,sample,length\na,0,0,1\na,1,0,2\nb,0,0,3\n"))
    assert ok.sample is not None and ok.sample.tolist() == [0, 0, 0]
    assert len(read_trace(write(tmp_path, "c.csv", "length,sample\n1,0\n2,0\n"))) == 2  # no prompt column: own rows
    with pytest.raises(TraceError, match=r"c2.csv, line 4: prompt 'a' step 1 sample 0 repeats line 3 \(each "
                                         r"\(prompt, step, sample\) once\)"):
        read_trace(write(tmp_path, "c2.csv", "prompt_id,step,sample,length\na,0,0,1\na,1,0,2\na,1,0,2\n"))
    with pytest.raises(TraceError, match=r"line 3: prompt 'b' sample 2 repeats line 1 \(each \(prompt, sample\)"):
        read_trace(write(tmp_path, "d.jsonl", '{"prompt_id": "b", "sample": 2, "length": 4}\n'
                                              '{"prompt_id": "a", "sample": 2, "length": 4}\n'
                                              '{"prompt_id": "b", "sample": 2, "length": 5}\n'))


@pytest.mark.parametrize(("value", "kind"), [([1], "list"), ({"x": 1}, "object"), (False, "boolean")])
def test_non_scalar_prompt_ids_are_refused(tmp_path: Path, value: object, kind: str) -> None:
    rows = [{"prompt_id": "a", "length": 1}, {"prompt_id": value, "length": 2}]
    path = write(tmp_path, "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError, match=f"line 2: prompt id 'prompt_id' must be text or a number, got a {kind}"):
        read_trace(path)
    assert read_trace(write(tmp_path, "n.jsonl", '{"prompt_id": 7, "length": 1}\n')).prompt_id.tolist() == ["7"]
