"""A length trace from a past run's logs (`tailsieve trace`): verl rollout dumps, TRL completion logs, or a plain
JSONL of responses, to the rows `load_trace` reads (prompt_id, step, length, and prompt_tokens where known).

Sources (`Source`), each file a step's or a run's records:
- **verl** (`trainer.rollout_data_dir=DIR`): one `{step}.jsonl` per step, a line per response with `input` (the
  prompt text), `output` (the response text) and `step` (verl's `_dump_generations`).
- **TRL** (`GRPOConfig(log_completions=True)`): `OUTPUT_DIR/completions/completions_{step:05d}.parquet`, a row per
  response with `step`, `prompt` and `completion` (text, or chat messages whose `content` is joined).
- **JSONL**: a line per response with a prompt (`prompt`, `prompt_id`, `input`, ...) and either a token count
  (`length`, `response_length`, `completion_tokens`, ...), token ids (`response_ids`, `output_ids`, `token_ids`) or
  the text (`response`, `output`, `completion`, `text`); `step` when it has one.

A token count in the record is used as it is; token ids are counted; text needs the model's tokenizer (`count`: a
callable text → tokens, `cli.trace_cmd` loads it from `--tokenizer DIR`): a length never comes from characters or
words. A prompt is identified by its id, else by a hash of its text, so the G responses of a group share one id.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from tailsieve.errors import ConfigError

__all__ = ["Counter", "Source", "TraceRow", "detect", "records", "rows", "write_csv"]

Counter = Callable[[str], int]  # text → tokens (the model's tokenizer)

PROMPT_IDS = ("prompt_id", "prompt_uid", "uid", "id", "question_id", "problem_id")
PROMPT_TEXTS = ("prompt", "input", "question", "query")
LENGTHS = ("length", "response_length", "response_tokens", "completion_tokens", "output_length", "num_tokens")
IDS = ("response_ids", "output_ids", "completion_ids", "token_ids")
TEXTS = ("response", "output", "completion", "text")
STEPS = ("step", "global_step")


class Source(Enum):
    """Where the records come from."""

    VERL = "verl"
    TRL = "trl"
    JSONL = "jsonl"


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One response of the trace."""

    prompt_id: str
    step: int
    length: int


def files_of(paths: Iterable[Path]) -> list[Path]:
    """The record files of `paths` (a folder: its *.jsonl and *.parquet, and a TRL run folder's completions/),
    in step order where the name is a step number."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            inner = p / "completions" if (p / "completions").is_dir() else p
            out += sorted([*inner.glob("*.jsonl"), *inner.glob("*.parquet")], key=_step_key)
        elif p.is_file():
            out.append(p)
        else:
            raise ConfigError(f"{p}: no such file or folder")
    if not out:
        raise ConfigError(f"no .jsonl or .parquet file in {', '.join(map(str, paths))}")
    return out


def _step_key(p: Path) -> tuple[int, str]:
    digits = "".join(c for c in p.stem if c.isdigit())
    return (int(digits) if digits else -1, p.name)


def detect(first: Mapping[str, Any], path: Path) -> Source:
    """The source a record looks like: TRL's parquet columns, verl's dump keys, else a plain JSONL."""
    if path.suffix == ".parquet" and "completion" in first:
        return Source.TRL
    if {"input", "output", "step"} <= first.keys():
        return Source.VERL
    return Source.JSONL


def records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of one file (JSONL lines, or parquet rows with pyarrow); one-line errors naming the place."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(f"{path}: reading parquet needs pyarrow: pip install -e '.[parquet]'") from None
        try:
            yield from pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow's errors have no common base
            raise ConfigError(f"{path}: not a readable parquet file ({type(exc).__name__})") from None
        return
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise ConfigError(f"{path}:{n}: a record must be a JSON object, got {type(rec).__name__}")
            yield rec


def _first(rec: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    return next(((k, rec[k]) for k in keys if rec.get(k) is not None), None)


def _text(value: Any) -> str:
    """A text field, or chat messages (TRL's conversational completions) joined by their `content`."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in value)
    return str(value)


def _length(rec: Mapping[str, Any], where: str, count: Counter | None) -> int:
    if (got := _first(rec, LENGTHS)) is not None:
        key, v = got
        if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < 0:
            raise ConfigError(f"{where}: {key} must be a token count >= 0, got {v!r}")
        return int(v)
    if (got := _first(rec, IDS)) is not None:
        if not isinstance(got[1], list):
            raise ConfigError(f"{where}: {got[0]} must be a list of token ids")
        return len(got[1])
    if (got := _first(rec, TEXTS)) is not None:
        if count is None:
            raise ConfigError(f"{where}: the response is text ({got[0]}): give --tokenizer DIR (the model's "
                              "tokenizer folder) to count its tokens")
        return count(_text(got[1]))
    raise ConfigError(f"{where}: no response length, token ids or text (one of {', '.join(LENGTHS + IDS + TEXTS)})")


def _prompt(rec: Mapping[str, Any], where: str) -> str:
    if (got := _first(rec, PROMPT_IDS)) is not None:
        return str(got[1])
    if (got := _first(rec, PROMPT_TEXTS)) is not None:
        return hashlib.sha256(_text(got[1]).encode("utf-8")).hexdigest()[:16]
    raise ConfigError(f"{where}: no prompt (one of {', '.join(PROMPT_IDS + PROMPT_TEXTS)})")


def rows(paths: Iterable[Path], count: Counter | None = None) -> tuple[Source, list[TraceRow]]:
    """Every response of the files under `paths` as a trace row; the source is the first record's (every file must
    be the same kind). A record without a step takes its file's position (0, 1, ...)."""
    files = files_of(list(paths))
    source: Source | None = None
    out: list[TraceRow] = []
    for i, path in enumerate(files):
        for n, rec in enumerate(records(path), 1):
            kind = detect(rec, path)
            if source is None:
                source = kind
            elif kind is not source:
                raise ConfigError(f"{path}:{n}: a {kind.value} record among {source.value} records")
            where = f"{path}:{n}"
            step = _first(rec, STEPS)
            if step is not None and (isinstance(step[1], bool) or not isinstance(step[1], int)):
                raise ConfigError(f"{where}: step must be an integer, got {step[1]!r}")
            out.append(TraceRow(_prompt(rec, where), i if step is None else int(step[1]), _length(rec, where, count)))
    if source is None:
        raise ConfigError(f"no records in {', '.join(map(str, files))}")
    return source, out


def write_csv(trace: list[TraceRow]) -> str:
    """The trace as CSV (`prompt_id,step,length`): `simulate --workload FILE` and the other commands read it."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["prompt_id", "step", "length"])
    w.writerows((r.prompt_id, r.step, r.length) for r in trace)
    return buf.getvalue()
