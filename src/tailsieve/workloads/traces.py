"""Response-length traces (§2.3, App. B): JSONL, CSV or Parquet rows of `prompt_id`, `length` and optional
`step`, `sample`, `prompt_tokens`, `truncated`.

Common column names of public traces are recognised (`response_tokens`, `prompt_uid`, `GeneratedTokens`,
`output_length`, …). The KodCode traces ship inside the package; `kodcode-r1` is the default, so every command
runs without a file. Errors are one line naming the file, the line and the problem.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import TraceError
from tailsieve.inputs import MAX_INT, MAX_LENGTH, clip, excerpt, loads_json, read_bytes, read_text

DEFAULT_TRACE = "kodcode-r1"
_BUNDLED = {
    DEFAULT_TRACE: "data/traces/kodcode_r1_response_lengths.csv",
    "kodcode-tests": "data/traces/kodcode_solution_and_tests_generation_lengths.csv",
}

LENGTH_ALIASES = ("length", "response_tokens", "output_length", "GeneratedTokens", "completion_tokens",
                  "output_tokens", "response_length", "num_tokens")
PROMPT_ALIASES = ("prompt_id", "prompt_uid", "id", "uid", "question_id", "problem_id")
STEP_ALIASES = ("step", "checkpoint", "round", "global_step")
SAMPLE_ALIASES = ("sample", "sample_idx", "sample_id", "repeat")
PROMPT_TOKEN_ALIASES = ("prompt_tokens", "ContextTokens", "input_length", "input_tokens", "prompt_length")
TRUNCATED_ALIASES = ("truncated", "is_truncated")
_JSONL = (".jsonl", ".ndjson", ".json")
_PARQUET = (".parquet", ".pq")
_TRUE = ("true", "1", "yes", "y", "t")
_FALSE = ("false", "0", "no", "n", "f", "")


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A response-length trace: row i is one generation of prompt `prompt_id[i]` with `length[i]` tokens."""

    source: str
    prompt_id: NDArray[np.str_]
    length: NDArray[np.int64]
    step: NDArray[np.int64] | None = None
    sample: NDArray[np.int64] | None = None
    prompt_tokens: NDArray[np.int64] | None = None
    truncated: NDArray[np.bool_] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.length.size)

    @property
    def n_prompts(self) -> int:
        """Number of distinct prompt ids."""
        return int(np.unique(self.prompt_id).size)

    @property
    def has_prompt_groups(self) -> bool:
        """Whether the file named a prompt column (otherwise every row is its own prompt)."""
        return self.meta.get("prompt_column") is not None


def _pick(header: list[str], aliases: tuple[str, ...], override: str | None) -> str | None:
    """The header column of the first name (the override, else the aliases in order) that the header holds, ignoring
    case (`Length` is `length`); a column spelled exactly as the name wins over one differing only in case."""
    for name in (override,) if override is not None else aliases:
        if name in header:
            return name
        folded = name.casefold()
        hit = next((h for h in header if h.casefold() == folded), None)
        if hit is not None:
            return hit
    return None


def _read_text(path: Path) -> list[str]:
    lines = read_text(path, "trace", TraceError).splitlines()
    if not any(line.strip() for line in lines):
        raise TraceError(f"trace {path}: empty file")
    return lines


def _jsonl_rows(path: Path, lines: list[str]) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    header: dict[str, None] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        obj = loads_json(line, f"trace {path}, line {lineno}", TraceError, line=False)
        if not isinstance(obj, dict):
            raise TraceError(f"trace {path}, line {lineno}: expected a JSON object, got {type(obj).__name__}")
        header.update(dict.fromkeys(obj))
        rows.append((lineno, obj))
    return list(header), rows


def _csv_rows(path: Path, lines: list[str]) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    try:
        parsed = list(csv.reader(lines))
    except csv.Error as exc:
        raise TraceError(f"trace {path}: malformed CSV ({exc})") from None
    start = next(i for i, row in enumerate(parsed) if row)
    header = [h.strip() for h in parsed[start]]
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise TraceError(f"trace {path}, line {start + 1}: duplicate column {excerpt(dup)} in the header")
    out = []
    for lineno, row in enumerate(parsed[start + 1 :], start=start + 2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(header):
            raise TraceError(f"trace {path}, line {lineno}: {len(row)} fields, the header has {len(header)}")
        out.append((lineno, dict(zip(header, row, strict=True))))
    return header, out


def _parquet_rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceError(f"trace {path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    data = read_bytes(path, "trace", TraceError)
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # pyarrow raises several unrelated types for bad files
        raise TraceError(f"trace {path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
    header = [str(c) for c in table.column_names]
    if table.num_rows == 0:
        raise TraceError(f"trace {path}: empty file (no rows)")
    # Parquet has no text lines: "line" n means row n (1-based), as if a header line preceded the data.
    cols = {c: table.column(c).to_pylist() for c in header}
    rows = [(i + 2, {c: cols[c][i] for c in header}) for i in range(table.num_rows)]
    return header, rows


def _rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    suffix = path.suffix.lower()
    if suffix in _PARQUET:
        return _parquet_rows(path)
    lines = _read_text(path)
    if suffix in _JSONL:
        return _jsonl_rows(path, lines)
    return _csv_rows(path, lines)


def _int_cell(value: Any, path: Path, lineno: int, column: str, what: str, limit: int = MAX_INT) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        f = float(value.strip() if isinstance(value, str) else value)
        if not f.is_integer():
            raise ValueError
        n = int(f)
    except (TypeError, ValueError, OverflowError):
        raise TraceError(f"trace {path}, line {lineno}: {what} '{column}' is not an integer: "
                         f"{excerpt(value)}") from None
    if n < 0:
        raise TraceError(f"trace {path}, line {lineno}: {what} '{column}' is negative: {n}")
    if n > limit:
        raise TraceError(f"trace {path}, line {lineno}: {what} '{column}' is {n}, more than the {limit:,} allowed")
    return n


def _bool_cell(value: Any, path: Path, lineno: int, column: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise TraceError(f"trace {path}, line {lineno}: 'truncated' column '{column}' is not a boolean: {excerpt(value)}")


def _int_column(
    rows: list[tuple[int, dict[str, Any]]], col: str, path: Path, what: str, *, required: bool
) -> NDArray[np.int64]:
    """Parse one integer column; a fast vectorised path, then a row loop that names the first bad line. Lengths
    (and prompt token counts) are at most `MAX_LENGTH`, other integers at most `MAX_INT`."""
    limit = MAX_LENGTH if what in ("length", "prompt tokens") else MAX_INT
    values = [row.get(col) for _, row in rows]
    try:
        if any(isinstance(v, bool | list | dict) for v in values):
            raise TypeError
        arr = np.asarray(values, dtype=np.float64)
        if (arr.ndim == 1 and np.isfinite(arr).all() and (arr == np.floor(arr)).all() and (arr >= 0).all()
                and arr.max() <= limit):
            return arr.astype(np.int64)
    except (TypeError, ValueError):
        pass
    out = np.empty(len(rows), dtype=np.int64)
    for i, (lineno, row) in enumerate(rows):
        v = row.get(col)
        if v is None or (isinstance(v, str) and not v.strip()):
            if required:
                raise TraceError(f"trace {path}, line {lineno}: missing {what} '{col}'")
            raise TraceError(f"trace {path}, line {lineno}: empty {what} '{col}'")
        out[i] = _int_cell(v, path, lineno, col, what, limit)
    return out


def _prompt_ids(rows: list[tuple[int, dict[str, Any]]], col: str, path: Path) -> NDArray[np.str_]:
    """The prompt-id column as text: a string (stripped) or a number; a missing, empty, boolean, list or object id is
    a one-line error naming the line."""
    ids: list[str] = []
    for lineno, row in rows:
        v = row.get(col)
        if v is None or (isinstance(v, str) and not v.strip()):
            raise TraceError(f"trace {path}, line {lineno}: missing prompt id '{col}'")
        if isinstance(v, bool | list | dict):
            kind = {bool: "boolean", list: "list"}.get(type(v), "object")
            raise TraceError(f"trace {path}, line {lineno}: prompt id '{col}' must be text or a number, got a {kind}")
        ids.append(v.strip() if isinstance(v, str) else str(v))
    return np.asarray(ids, dtype=np.str_)


def _unique_samples(rows: list[tuple[int, dict[str, Any]]], path: Path, pid: NDArray[np.str_],
                    steps: NDArray[np.int64] | None, samples: NDArray[np.int64]) -> None:
    """Each (prompt, sample), or (prompt, step, sample) when the trace has steps, on one row only: a repeated row
    would count as one more sample of that prompt. The error names the repeated line and the first one."""
    _, inv = np.unique(pid, return_inverse=True)
    cols = [inv, samples] if steps is None else [inv, steps, samples]
    keys = np.stack(cols, axis=1)
    if np.unique(keys, axis=0).shape[0] == keys.shape[0]:
        return
    what = "sample" if steps is None else "step, sample"
    first: dict[tuple[int, ...], int] = {}
    for i, key in enumerate(map(tuple, keys.tolist())):
        if key in first:
            where = (f"prompt {excerpt(str(pid[i]))}" + ("" if steps is None else f" step {key[1]}")
                     + f" sample {key[-1]}")
            raise TraceError(f"trace {path}, line {rows[i][0]}: {where} repeats line {rows[first[key]][0]} (each "
                             f"(prompt, {what}) once)")
        first[key] = i


def read_trace(
    path: str | Path, *, length_column: str | None = None, prompt_column: str | None = None
) -> Trace:
    """Read a trace file (CSV, JSONL or Parquet), recognising common column names; errors name file, line, problem."""
    p = Path(path)
    header, rows = _rows(p)
    if not rows:
        raise TraceError(f"trace {p}: no data rows")
    lcol = _pick(header, LENGTH_ALIASES, length_column)
    if lcol is None:
        want = f"'{length_column}'" if length_column else "'length' (or " + ", ".join(LENGTH_ALIASES[1:]) + ")"
        raise TraceError(f"trace {p}: missing length column {want}; columns are {clip(', '.join(header))}")
    pcol = _pick(header, PROMPT_ALIASES, prompt_column)
    if prompt_column is not None and pcol is None:
        raise TraceError(f"trace {p}: missing prompt column '{prompt_column}'; columns are "
                         f"{clip(', '.join(header))}")
    lengths = _int_column(rows, lcol, p, "length", required=True)
    pid = _prompt_ids(rows, pcol, p) if pcol is not None else np.char.add("row", np.arange(len(rows)).astype(np.str_))

    def optional(aliases: tuple[str, ...], what: str) -> tuple[str | None, NDArray[np.int64] | None]:
        col = _pick(header, aliases, None)
        return col, None if col is None else _int_column(rows, col, p, what, required=False)

    scol, steps = optional(STEP_ALIASES, "step")
    xcol, samples = optional(SAMPLE_ALIASES, "sample")
    tcol, ptoks = optional(PROMPT_TOKEN_ALIASES, "prompt tokens")
    fcol = _pick(header, TRUNCATED_ALIASES, None)
    trunc = None
    if fcol is not None:
        trunc = np.array([_bool_cell(row.get(fcol), p, ln, fcol) for ln, row in rows], dtype=bool)
    if samples is not None and pcol is not None:
        _unique_samples(rows, p, pid, steps, samples)
    meta = {"length_column": lcol, "prompt_column": pcol, "step_column": scol, "sample_column": xcol,
            "prompt_tokens_column": tcol, "truncated_column": fcol}
    return Trace(source=str(p), prompt_id=pid, length=lengths, step=steps, sample=samples, prompt_tokens=ptoks,
                 truncated=trunc, meta=meta)


def require_tokens(trace: Trace) -> Trace:
    """`trace` when some length is > 0; a one-line error otherwise (speedups and ratios of nothing are undefined)."""
    if not trace.length.any():
        raise TraceError(f"trace {trace.source}: every length is 0 (nothing to generate, route or compare)")
    return trace


def bundled_trace_names() -> tuple[str, ...]:
    """Names of the traces shipped inside the package, the default first."""
    return tuple(_BUNDLED)


def bundled_trace_path(name: str) -> Path:
    """Filesystem path of a trace shipped inside the package."""
    if name not in _BUNDLED:
        raise TraceError(f"no bundled trace {excerpt(name)} (bundled: {', '.join(_BUNDLED)})")
    return Path(str(resources.files("tailsieve").joinpath(_BUNDLED[name])))


def load_trace(spec: str | Path | None = None, **kwargs: Any) -> Trace:
    """A trace by bundled name or path; None gives the default (KodCode R1)."""
    if spec is None:
        spec = DEFAULT_TRACE
    if isinstance(spec, str) and spec in _BUNDLED:
        return read_trace(bundled_trace_path(spec), **kwargs)
    p = Path(spec)
    if not p.exists():
        names = ", ".join(sorted(_BUNDLED))
        raise TraceError(f"no such trace {excerpt(spec)}: not a bundled name ({names}) and no such file")
    if p.is_dir():
        raise TraceError(f"trace {p}: is a directory, expected a CSV, JSONL or Parquet file")
    return read_trace(p, **kwargs)
