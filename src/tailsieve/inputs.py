"""The validated input boundary shared by every file reader and flag check (docs/inputs.md).

Files (curves, traces, prompts, TOML/JSON configs, resume state) are read through `open_input` (`read_bytes`,
`read_text`, `open_text`), `loads_json` and `loads_toml`: regular files only (opened non-blocking and checked with
fstat, so a FIFO never hangs and a device is never read), read with a cap (`MAX_FILE_BYTES` + 1 bytes, never trusting
`st_size`), UTF-8 (a byte-order mark is allowed), a nesting-depth limit, no non-standard JSON constants (NaN,
Infinity) unless asked, numbers a float64 holds, and every error one line naming the file (and line, and key). Flags
are checked with `finite`, `int_in` and `float_in`: finite numbers inside documented ranges, errors naming the flag.
Error messages quote file content through `excerpt` (redacted, at most 80 characters).

Limits: `MAX_LENGTH` tokens per response (10^9; sums over any realistic step stay far inside int64),
`MAX_STEP_REQUESTS` requests per step (N·G), `MAX_JSON_DEPTH` nesting levels, `MAX_FILE_BYTES` per document.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import re
import stat
import sys
import tomllib
from collections.abc import Callable, Collection, Iterator
from numbers import Integral
from pathlib import Path
from typing import IO, Any, BinaryIO

from tailsieve.errors import ConfigError, TailSieveError
from tailsieve.redact import clip as clip  # re-exported: how every reader quotes file content
from tailsieve.redact import excerpt as excerpt

MAX_LENGTH = 10**9  # tokens in one response (or one prompt); larger values are rejected where they are read
MAX_INT = 2**53  # other integer cells (steps, samples): exact in float64
MAX_STEP_REQUESTS = 1_000_000  # N·G: requests in one simulated or routed step
MAX_REPLICAS = 4096
MAX_JSON_DEPTH = 64  # nesting levels of a JSON/TOML document or JSONL line
MAX_FILE_BYTES = 1 << 30  # 1 GiB of text per file
MAX_LIST_VALUES = 4096  # the values one integer-list flag may name (`int_list`: a range counts each of its values)
MAX_TEMPERATURE = 100.0  # sampling temperature (`rollout`, `profile`): sent to servers as a JSON number

ErrorType = Callable[[str], TailSieveError]


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _cap(max_bytes: int | None) -> int:
    return MAX_FILE_BYTES if max_bytes is None else max_bytes  # read at call time: tests lower the module's limit


def _too_large(what: str, path: Path, cap: int, error: ErrorType) -> TailSieveError:
    return error(f"{what} {path}: more than the {cap:,} bytes allowed")


def open_input(path: Path, what: str, error: ErrorType = ConfigError, *, max_bytes: int | None = None) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file of at most `max_bytes` (default `MAX_FILE_BYTES`)
    by its size; else a one-line error `WHAT PATH: …`. Opened non-blocking (a FIFO without a writer never hangs)
    and checked with fstat on the open descriptor (no race with a swapped path); a device, FIFO, socket or
    directory, also behind a symlink, is refused before one byte is read. The size of a regular file is rechecked
    while reading (`read_bytes`, `open_text`): /proc files say 0."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        kind = next((name for test, name in _KINDS if test(st.st_mode)), None)
        if kind is not None or not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {path}: {kind or 'not a file'}, not a regular file")
        if st.st_size > _cap(max_bytes):
            raise _too_large(what, path, _cap(max_bytes), error)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Path, what: str, error: ErrorType = ConfigError, *, max_bytes: int | None = None) -> bytes:
    """A regular file's bytes (`open_input`), read with a cap: at most `max_bytes` + 1 bytes are ever read, and more
    than `max_bytes` is a one-line error."""
    cap = _cap(max_bytes)
    with open_input(path, what, error, max_bytes=cap) as fh:
        try:
            data = fh.read(cap + 1)
        except OSError as exc:
            raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > cap:
        raise _too_large(what, path, cap, error)
    return data


def read_text(path: Path, what: str, error: ErrorType = ConfigError, *, max_bytes: int | None = None) -> str:
    """A file's UTF-8 text (BOM stripped); one-line errors `WHAT PATH: …` for missing, unreadable, not regular, too
    large or non-UTF-8 files."""
    return decode(read_bytes(path, what, error, max_bytes=max_bytes), f"{what} {path}", error)


class _Capped(io.RawIOBase):
    """A binary stream that raises `over` once more than `cap` bytes have come through it."""

    def __init__(self, raw: BinaryIO | gzip.GzipFile, cap: int, over: Callable[[], TailSieveError]) -> None:
        super().__init__()
        self.raw, self.cap, self.over, self.seen = raw, cap, over, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(min(len(buffer), self.cap + 1 - self.seen) or 1)
        self.seen += len(data)
        if self.seen > self.cap:
            raise self.over()
        buffer[: len(data)] = data
        return len(data)


@contextlib.contextmanager
def open_text(path: Path, what: str, error: ErrorType = ConfigError, *, gz: bool = False,
              max_bytes: int | None = None) -> Iterator[IO[str]]:
    """A regular file (`open_input`) as UTF-8 text lines (BOM stripped), gunzipped when `gz`, for readers that stream;
    more than `max_bytes` of (decompressed) text is a one-line error when it is reached."""
    cap = _cap(max_bytes)
    with open_input(path, what, error, max_bytes=cap) as raw:
        inner: BinaryIO | gzip.GzipFile = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        capped = _Capped(inner, cap, lambda: _too_large(what, path, cap, error))
        with io.TextIOWrapper(io.BufferedReader(capped), encoding="utf-8-sig") as fh:
            yield fh


def decode(data: bytes, where: str, error: ErrorType = ConfigError) -> str:
    """UTF-8 text of `data` (BOM stripped), or a one-line error naming `where` and the offending byte offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(f"{where}: not UTF-8 text (line {line}, byte {exc.start}: {exc.reason})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def json_depth_ok(obj: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `obj` nests at most `limit` containers deep (iterative, stops at the first violation)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        cur, depth = stack.pop()
        if isinstance(cur, dict):
            items: Any = cur.values()
        elif isinstance(cur, list):
            items = cur
        else:
            continue
        if depth > limit:
            return False
        stack.extend((v, depth + 1) for v in items if isinstance(v, dict | list))
    return True


def check_numbers(obj: Any, where: str, error: ErrorType = ConfigError, *, allow_nan: bool = False) -> None:
    """Every number in a parsed document is one a float64 holds (|x| <= 1.8e308: a JSON `1e400` parses as inf, an
    integer of 400 digits overflows where it is used) and finite unless `allow_nan`; else one line naming `where`,
    the key path (`cost_model.kv_ms_per_1k`, `batch[1]`) and a prefix of the value."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        key, cur = stack.pop()
        if isinstance(cur, dict):
            stack.extend(reversed([(f"{key}.{k}" if key else str(k), v) for k, v in cur.items()]))
        elif isinstance(cur, list):
            stack.extend(reversed([(f"{key}[{i}]", v) for i, v in enumerate(cur)]))
        elif (isinstance(cur, float) and not allow_nan and not math.isfinite(cur)) or (
                isinstance(cur, int) and not isinstance(cur, bool) and abs(cur) > sys.float_info.max):
            at = f"key {excerpt(key)}" if key else "the document"
            raise error(f"{where}: {at} holds {excerpt(cur)}, not a finite number within ±{sys.float_info.max:.1e}")


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (`json` would keep the last value silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return out


def loads_json(text: str, where: str, error: ErrorType = ConfigError, *, allow_nan: bool = False,
               line: bool = True) -> Any:
    """Parse one JSON document (or, with `line=False`, one JSONL line whose number `where` already names); `where`
    names the file in every error."""
    try:
        obj = (json.loads(text, object_pairs_hook=_unique_keys) if allow_nan
               else json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys))
    except DuplicateKey as exc:
        raise error(f"{where}: key {excerpt(exc.key)} appears twice in one object") from None
    except json.JSONDecodeError as exc:
        at = f" at line {exc.lineno}" if line else ""
        raise error(f"{where}: invalid JSON{at} ({exc.msg})") from None
    except ValueError as exc:  # NaN / Infinity
        raise error(f"{where}: invalid JSON ({exc})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
    if not json_depth_ok(obj):
        raise error(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep")
    check_numbers(obj, where, error, allow_nan=allow_nan)
    return obj


def loads_toml(text: str, where: str, error: ErrorType = ConfigError) -> dict[str, Any]:
    """Parse a TOML document with the same depth limit and one-line errors; floats must be finite."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: invalid TOML: {str(exc).splitlines()[0]}") from None
    except ValueError as exc:  # an integer of more digits than int() converts (4300)
        raise error(f"{where}: invalid TOML ({excerpt(str(exc))})") from None
    except RecursionError:
        raise error(f"{where}: TOML nested more than {MAX_JSON_DEPTH} levels deep") from None
    if not json_depth_ok(doc):
        raise error(f"{where}: TOML nested more than {MAX_JSON_DEPTH} levels deep")
    check_numbers(doc, where, error)
    return doc


def load_document(path: Path, what: str, error: ErrorType = ConfigError) -> Any:
    """A whole config file: JSON by suffix `.json`, else TOML."""
    text = read_text(path, what, error)
    where = f"{what.removesuffix(' file')} {path}"
    return loads_json(text, where, error) if path.suffix.lower() == ".json" else loads_toml(text, where, error)


def finite(value: float, flag: str, *, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False) -> float:
    """A finite number in [lo, hi] ((lo, hi] when `lo_open`); ConfigError naming the flag otherwise."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        lo_s = "" if lo is None else (f"> {lo:g}" if lo_open else f">= {lo:g}")
        hi_s = "" if hi is None else f"<= {hi:g}"
        bound = " and ".join(s for s in (lo_s, hi_s) if s)
        raise ConfigError(f"{flag} must be a finite number{' ' + bound if bound else ''}, got {excerpt(value)}")
    return float(value)


def int_in(value: int, flag: str, lo: int, hi: int | None = None) -> int:
    """An integer in [lo, hi]; ConfigError naming the flag otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ConfigError(f"{flag} must be an integer {rng}, got {excerpt(value)}")
    return value


def int_list(text: str, flag: str, lo: int, hi: int, error: ErrorType = ConfigError) -> tuple[int, ...]:
    """The integers a list flag names, sorted and distinct: comma-separated items, each an integer or an inclusive
    range `A..B` (`0..7`, `0,2..4`), every value in `lo..hi` and at most `MAX_LIST_VALUES` of them; a one-line
    error naming the flag and the bad item otherwise."""
    out: set[int] = set()
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        first, dots, last = item.partition("..")
        try:  # ASCII digits, bounded before conversion (`ascii_int`)
            a = ascii_int(first, flag)
            b = ascii_int(last, flag) if dots else a
        except ValueError:
            raise error(f"{flag} must be comma-separated integers or ranges A..B, got {excerpt(item)}") from None
        for v in (a, b):
            if not lo <= v <= hi:
                raise error(f"{flag} values must lie in {lo}..{hi}, got {excerpt(v)}")
        if b < a:
            raise error(f"{flag}: the range {excerpt(item)} runs backwards; write A..B with A <= B")
        if len(out) + b - a + 1 > MAX_LIST_VALUES:
            raise error(f"{flag} names more than {MAX_LIST_VALUES} values")
        out.update(range(a, b + 1))
    if not out:
        raise error(f"{flag} is empty; give integers such as 0,1,2 or a range such as 0..3")
    return tuple(sorted(out))


def check_step_size(groups: int, group_size: int, flags: str = "--groups × --group-size") -> None:
    """N·G at most `MAX_STEP_REQUESTS` (a size guard instead of allocating terabytes)."""
    if groups * group_size > MAX_STEP_REQUESTS:
        raise ConfigError(f"{flags} = {groups} × {group_size} = {groups * group_size:,} requests per step; "
                          f"at most {MAX_STEP_REQUESTS:,} are supported")


def json_object(obj: Any, where: str, required: Collection[str], optional: Collection[str] = ()) -> dict[str, Any]:
    """`obj` as a JSON object holding every `required` key and no key outside `required` and `optional`; a
    ConfigError naming `where` otherwise (the saved-state readers build their values field by field from it)."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(obj).__name__}")
    missing = [k for k in required if k not in obj]
    if missing:
        raise ConfigError(f"{where}: missing key '{missing[0]}'")
    unknown = sorted(str(k) for k in set(obj) - set(required) - set(optional))
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'")
    return obj


def finite_or_nan(value: Any, flag: str, *, lo: float | None = None, lo_open: bool = False) -> float:
    """A saved rate or estimate: null (not measured yet) as NaN, else a finite number >= lo (> lo when
    `lo_open`)."""
    return math.nan if value is None else finite(value, flag, lo=lo, lo_open=lo_open)


def one_of(value: Any, flag: str, choices: Collection[Any]) -> Any:
    """`value` when it is one of `choices` (compared with its type: True is not 1); ConfigError otherwise."""
    if not any(type(value) is type(c) and value == c for c in choices):
        raise ConfigError(f"{flag} must be one of {', '.join(repr(c) for c in choices)}, got {excerpt(value)}")
    return value


def check_replicas(policy: str, minimum: int, replicas: int, *, default_fix: str | None = None) -> None:
    """The one "needs ≥ k replicas" check of every policy (controllers, peers, the known-length baselines): an
    integer `replicas` of at least `minimum` (2: a tail and a bulk pool), else a one-line ConfigError. `default_fix`:
    the policy is the command's default, not one the user named, so the message says so and what to give instead."""
    if isinstance(replicas, bool) or not isinstance(replicas, Integral) or replicas < minimum:
        need = "a tail and a bulk pool" if minimum > 1 else "a replica"
        who = f"policy {policy}" if default_fix is None else f"the default --policy {policy}"
        fix = "" if default_fix is None else f"; {default_fix}"
        raise ConfigError(f"{who} needs at least {minimum} replicas ({need}), got R={replicas}{fix}")


def check_tail_replicas(m: int | None, replicas: int, what: str = "m") -> None:
    """The one 0 ≤ m < R check of a tail-pool size (a static m, the controller's m0, a baseline's m, the router's
    plan); None passes (the policy's default)."""
    if m is None:
        return
    if isinstance(m, bool) or not isinstance(m, Integral) or not 0 <= m < max(replicas, 1):
        raise ConfigError(f"{what} must lie in 0..{max(replicas - 1, 0)} (R={replicas} replicas), got {what}={m}")


MAX_INT_DIGITS = 18  # an integer written on the command line or in a spec: at most this many digits (< 2**63)
_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?|[+-]?(?:inf|infinity|nan)",
                          re.IGNORECASE)


def ascii_int(text: str, what: str, *, lo: int | None = None, hi: int | None = None,
              error: ErrorType = ConfigError) -> int:
    """An integer written as ASCII digits (an optional sign, no `_`, no other script's digits: `mtp:٣` and `1_0` are
    refused, where `int()` would take them), at most `MAX_INT_DIGITS` digits (checked before conversion), in
    [lo, hi]; a one-line `error` naming `what` and quoting an excerpt of the text otherwise."""
    body = str(text).strip()
    if len(body) > MAX_INT_DIGITS + 1 or not _ASCII_INT.fullmatch(body):
        rng = "" if lo is None and hi is None else f" in {'' if lo is None else lo}..{'' if hi is None else hi}"
        raise error(f"{what} must be an integer{rng} written in ASCII digits, got {excerpt(text)}")
    value = int(body)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in {lo}..{hi}"
        raise error(f"{what} must be an integer {rng}, got {value}")
    return value


def ascii_float(text: str, what: str, error: ErrorType = ConfigError) -> float:
    """A number written in ASCII (digits, sign, point, exponent; `inf`/`nan` spelled out, for the caller's range
    check to refuse), at most 64 characters; a one-line `error` quoting an excerpt of the text otherwise."""
    body = str(text).strip()
    if len(body) > 64 or not _ASCII_FLOAT.fullmatch(body):
        raise error(f"{what} must be a number written in ASCII, got {excerpt(text)}")
    return float(body)
