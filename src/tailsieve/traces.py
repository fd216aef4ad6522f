"""Response-length traces: JSONL or CSV with `prompt_id`, `length` (optional `step`, `sample`).

The KodCode R1 trace ships inside the package and is the default, so every command runs without a file.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import TraceError

DEFAULT_TRACE = "kodcode-r1"
_BUNDLED = {DEFAULT_TRACE: "data/traces/kodcode_r1_response_lengths.csv"}

LENGTH_ALIASES = ("length", "response_tokens", "output_length", "GeneratedTokens", "completion_tokens")
PROMPT_ALIASES = ("prompt_id", "prompt_uid", "id", "uid")
STEP_ALIASES = ("step", "checkpoint")
SAMPLE_ALIASES = ("sample", "sample_idx")


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A response-length trace: row i is one generation of prompt `prompt_id[i]` with `length[i]` tokens."""

    source: str
    prompt_id: NDArray[np.str_]
    length: NDArray[np.int64]
    step: NDArray[np.int64] | None = None
    sample: NDArray[np.int64] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.length.size)


def _pick(header: list[str], aliases: tuple[str, ...], override: str | None) -> str | None:
    if override is not None:
        return override if override in header else None
    return next((a for a in aliases if a in header), None)


def _rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"trace {path}: not a UTF-8 text file") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise TraceError(f"trace {path}: empty file")
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        rows: list[tuple[int, dict[str, Any]]] = []
        header: list[str] = []
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"trace {path}, line {lineno}: invalid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"trace {path}, line {lineno}: expected a JSON object")
            for k in obj:
                if k not in header:
                    header.append(k)
            rows.append((lineno, obj))
        return header, rows
    reader = csv.reader(lines)
    head = next(reader)
    header = [h.strip() for h in head]
    out = []
    for lineno, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise TraceError(f"trace {path}, line {lineno}: {len(row)} fields, header has {len(header)}")
        out.append((lineno, dict(zip(header, row, strict=True))))
    return header, out


def _int_cell(value: Any, path: Path, lineno: int, column: str, what: str) -> int:
    try:
        if isinstance(value, bool):
            raise ValueError
        f = float(value)
        if not f.is_integer():
            raise ValueError
        n = int(f)
    except (TypeError, ValueError):
        raise TraceError(f"trace {path}, line {lineno}: {what} '{column}' is not an integer: {value!r}") from None
    if n < 0:
        raise TraceError(f"trace {path}, line {lineno}: {what} '{column}' is negative: {n}")
    return n


def read_trace(
    path: str | Path, *, length_column: str | None = None, prompt_column: str | None = None
) -> Trace:
    """Read a trace file (CSV or JSONL), recognising common column names; errors name file, line and problem."""
    p = Path(path)
    header, rows = _rows(p)
    if not rows:
        raise TraceError(f"trace {p}: no data rows")
    lcol = _pick(header, LENGTH_ALIASES, length_column)
    if lcol is None:
        want = length_column or "length (or " + ", ".join(LENGTH_ALIASES[1:]) + ")"
        raise TraceError(f"trace {p}: missing length column {want}")
    pcol = _pick(header, PROMPT_ALIASES, prompt_column)
    if prompt_column is not None and pcol is None:
        raise TraceError(f"trace {p}: missing prompt column {prompt_column}")
    scol = _pick(header, STEP_ALIASES, None)
    xcol = _pick(header, SAMPLE_ALIASES, None)
    lengths = np.empty(len(rows), dtype=np.int64)
    prompts: list[str] = []
    steps = np.zeros(len(rows), dtype=np.int64) if scol else None
    samples = np.zeros(len(rows), dtype=np.int64) if xcol else None
    for i, (lineno, row) in enumerate(rows):
        if lcol not in row or row[lcol] in ("", None):
            raise TraceError(f"trace {p}, line {lineno}: missing length '{lcol}'")
        lengths[i] = _int_cell(row[lcol], p, lineno, lcol, "length")
        prompts.append(str(row.get(pcol, "")) if pcol else f"row{i}")
        if steps is not None and scol is not None:
            steps[i] = _int_cell(row.get(scol), p, lineno, scol, "step")
        if samples is not None and xcol is not None:
            samples[i] = _int_cell(row.get(xcol), p, lineno, xcol, "sample")
    return Trace(
        source=str(p),
        prompt_id=np.asarray(prompts, dtype=np.str_),
        length=lengths,
        step=steps,
        sample=samples,
        meta={"length_column": lcol, "prompt_column": pcol},
    )


def bundled_trace_path(name: str) -> Path:
    """Filesystem path of a trace shipped inside the package."""
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
        raise TraceError(f"no such trace '{spec}': not a bundled name ({names}) and no such file")
    if p.is_dir():
        raise TraceError(f"trace {p}: is a directory, expected a CSV or JSONL file")
    return read_trace(p, **kwargs)
