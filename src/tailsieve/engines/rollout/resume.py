"""Resume checks: a saved run folder (`state.json`, `steps.jsonl`, `batch-*.jsonl`) is validated as a whole before a
resumed run runs or writes anything, and a resumed run never erases what the folder holds.

`read_folder` checks the files against each other: the state builds field by field (`RolloutState.from_json`); the
step lines are steps 0, 1, 2, … (contiguous, each once), one per step the state has completed, each with its batch
file; their consumed groups are as many as the state's `consumed`, each once, drawn before the stream's position and
not waiting in the state. One step more than the state is allowed: a run killed after writing a step's batch file or
step line and before saving its state leaves them (`ResumePoint.uncommitted`), and so is an unfinished last line (a
writer killed, or out of space, mid-append; a failed append is truncated back to the last complete line where the
file system allows: `tailsieve.outputs.append_line`); the resumed run says so in one line, reruns that step and
first moves those files into `uncommitted/` (`set_aside`), never deleting them. A UTF-8 BOM is skipped.
`check_state` checks a state against the run that resumes it (shape, prompts, policy, redraw limit). Every refusal
is one `ConfigError` line.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.engines.rollout.state import RolloutState
from tailsieve.errors import ConfigError
from tailsieve.hashing import batch_digest
from tailsieve.inputs import excerpt, loads_json, read_bytes, read_text
from tailsieve.loop import StepRecord
from tailsieve.outputs import append_line, check_target, write_atomic
from tailsieve.policy.decision import Decision
from tailsieve.policy.router import Router

STATE_FILE, STEPS_FILE, ASIDE = "state.json", "steps.jsonl", "uncommitted"
SEAL = "batch"  # a step line's record of its batch file: {"bytes": N, "blake2b": HEX} (`batch_seal`)


def batch_name(step: int) -> str:
    """The batch file of step `step`."""
    return f"batch-{step:05d}.jsonl"


def batch_steps(folder: Path) -> list[int]:
    """The steps whose batch files `folder` holds."""
    names = (p.name.removeprefix("batch-").removesuffix(".jsonl") for p in folder.glob("batch-*.jsonl"))
    return [int(n) for n in names if n.isdigit() and n.isascii()]


@dataclass(frozen=True, slots=True)
class StepLines:
    """A `steps.jsonl` read for resume: its complete lines as (where, text, row), each a JSON object with an integer
    `step`, and its unfinished last line (no newline at its end, or not JSON: a writer died or failed mid-append),
    if any, as (where, why)."""

    rows: tuple[tuple[str, str, dict[str, Any]], ...]
    unfinished: tuple[str, str] | None = None


def step_lines(path: Path) -> StepLines:
    """The lines of a `steps.jsonl` (`StepLines`; a UTF-8 BOM is skipped). A last line that is not JSON, or has no
    newline at its end and is not a step line, is `unfinished` (a writer died or failed mid-append); any other bad
    line is a one-line ConfigError naming the file and line."""
    text = read_text(path, "resume file")
    lines = text.splitlines()
    out: list[tuple[str, str, dict[str, Any]]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"resume file {path}, line {lineno}"
        last, ended = lineno == len(lines), text.endswith(("\n", "\r"))
        try:
            row = loads_json(line, where, line=False, allow_nan=True)
        except ConfigError as exc:
            if not last:
                raise
            return StepLines(tuple(out), (where, str(exc).removeprefix(f"{where}: ")))
        try:
            out.append((where, line, _step_row(where, row)))
        except ConfigError as exc:
            if not last or ended:
                raise
            return StepLines(tuple(out), (where, str(exc).removeprefix(f"{where}: ") + ", no newline at its end"))
    return StepLines(tuple(out))


def _step_row(where: str, row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"{where}: 'step' must be a non-negative integer, got {excerpt(step)}")
    return row


_RECORD_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def step_record(row: Mapping[str, Any]) -> StepRecord:
    """A `StepRecord` from a step line, each field of its declared type, the decision by `Decision.from_json` (null
    or absent in older files: None); ValueError / TypeError otherwise (a bad decision: a ConfigError naming its
    field)."""
    kw: dict[str, Any] = {}
    for name, f in StepRecord.__dataclass_fields__.items():
        if name not in row:
            continue
        if name == "decision":
            kw[name] = None if row[name] is None else Decision.from_json(row[name], "decision")
            continue
        typ, v = _RECORD_TYPES[str(f.type)], row[name]
        if typ is float and v is None:  # NaN written by an older json.dumps as null
            v = math.nan
        ok = isinstance(v, typ) if typ is not float else isinstance(v, int | float)
        if not ok or (typ is not bool and isinstance(v, bool)):
            raise TypeError(f"{name} must be {typ.__name__}, got {excerpt(v)}")
        kw[name] = typ(v)
    return StepRecord(**kw)


@dataclass(frozen=True, slots=True)
class SavedStep:
    """One committed step line: its record and consumed groups (lengths, uids, prompt ids, redraws, truncation,
    bias weights) and the restart seconds before it."""

    where: str
    record: StepRecord
    lengths: NDArray[np.int64]
    uids: tuple[int, ...]
    prompts: tuple[str, ...]
    redraws: NDArray[np.int64]
    truncated: NDArray[np.bool_] | None
    weights: NDArray[np.float64] | None
    restart_s: float
    delays: tuple[int, ...] | None = None  # batch fidelity (absent in older folders: None)
    offpolicy: tuple[int, ...] | None = None
    dropped: int = 0


def saved_step(where: str, row: Mapping[str, Any]) -> SavedStep:
    """A step line's values, each checked (one line naming the file and line otherwise)."""
    try:
        lengths = np.asarray(row["lengths"], dtype=np.int64)
        uids = tuple(int(u) for u in row["uids"])
        prompts = tuple(str(x) for x in row["prompt_ids"])
        if lengths.ndim != 2 or lengths.shape[0] != len(uids) or len(prompts) != len(uids):
            raise ValueError("lengths, uids and prompt_ids do not match")
        restart = float(row.get("restart_s", 0.0))
        if not math.isfinite(restart):
            raise ValueError(f"restart_s is {restart}")
        trunc, weights = row.get("truncated"), row.get("weights")
        delays, offpolicy = row.get("delays"), row.get("offpolicy")
        if any(x is not None and len(x) != len(uids) for x in (delays, offpolicy)):
            raise ValueError("delays or offpolicy do not match the uids")
        return SavedStep(where, step_record(row), lengths, uids, prompts,
                         np.asarray(row.get("redraws") or [0] * len(uids), dtype=np.int64),
                         None if trunc is None else np.asarray(trunc, dtype=bool),
                         None if weights is None else np.asarray(weights, dtype=np.float64), restart,
                         None if delays is None else tuple(int(x) for x in delays),
                         None if offpolicy is None else tuple(int(x) for x in offpolicy), int(row.get("dropped", 0)))
    except KeyError as exc:
        raise ConfigError(f"{where}: missing key {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{where}: malformed step line ({why})") from None


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """A checked run folder: the saved state (None: no step completed), its committed steps, and whether a run
    that died before saving its state left files of the next step (moved aside before that step is rewritten),
    with `note`, one line saying what they are."""

    state: RolloutState | None
    steps: tuple[SavedStep, ...]
    uncommitted: bool = False
    note: str = ""


def read_folder(folder: Path) -> ResumePoint:
    """Check a policy's output folder as a whole (module docstring); a one-line ConfigError naming the file and
    the disagreement otherwise. A folder that does not exist or is empty resumes from step 0."""
    state_path, steps_path = folder / STATE_FILE, folder / STEPS_FILE
    state = RolloutState.load(state_path) if state_path.exists() else None
    nxt = 0 if state is None else state.router.step
    lines = step_lines(steps_path) if steps_path.exists() else StepLines(())
    rows = lines.rows
    for k, (where, _, row) in enumerate(rows):
        if row["step"] != k:
            raise ConfigError(f"{where}: step {row['step']} where step {k} belongs (step lines are 0, 1, 2, … "
                              "each once)")
    have = (f"{steps_path} holds steps 0..{len(rows) - 1}" if rows else f"{steps_path} holds no step"
            if steps_path.exists() else f"there is no {steps_path}")
    saved = f"{state_path} is at step {nxt}" if state is not None else f"there is no {state_path}"
    if len(rows) < nxt or len(rows) > nxt + 1:
        cut = "" if lines.unfinished is None else f"; {lines.unfinished[0]} is unfinished ({lines.unfinished[1]})"
        raise ConfigError(f"cannot resume: {saved} but {have} (the files do not belong together){cut}"[:400])
    for s in range(nxt):
        if not os.path.lexists(folder / batch_name(s)):
            raise ConfigError(f"cannot resume: {saved} but {folder / batch_name(s)} is missing")
    later = sorted(s for s in batch_steps(folder) if s > nxt)
    if later:
        raise ConfigError(f"cannot resume: {saved} but {folder / batch_name(later[0])} exists (the files are ahead "
                          "of the state)")
    steps = tuple(saved_step(where, row) for where, _, row in rows[:nxt])
    for s, (_, _, row) in enumerate(rows[:nxt]):
        check_batch(folder, s, row.get(SEAL), steps[s])
    if state is not None:
        _check_consumed(state, steps, state_path)
    return ResumePoint(state, steps, *_uncommitted(folder, nxt, lines))


def batch_seal(data: bytes) -> dict[str, Any]:
    """What a step line records of its batch file: its byte length and BLAKE2b digest (`check_batch`)."""
    return {"bytes": len(data), "blake2b": batch_digest(data)}


def check_batch(folder: Path, step: int, seal: Any, saved: SavedStep) -> None:
    """A committed batch file against its step line, before a resume builds on it: a regular file (not a link), of
    the recorded byte length and BLAKE2b digest; a step line without a record (an older folder) has each of the
    file's rows read and their uids compared with the line's. A one-line ConfigError naming the file, the step and
    what differs otherwise (a truncated, emptied, NUL-filled, swapped or replaced batch)."""
    path = folder / batch_name(step)
    head = f"cannot resume: {path} (step {step})"
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise ConfigError(f"{head}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{head} is not a regular file (a link, folder or device); a committed batch is a file "
                          "the run wrote itself")
    data = read_bytes(path, "batch file")
    if seal is None:
        _check_rows(head, data, step, saved)
        return
    if not (isinstance(seal, dict) and isinstance(seal.get("bytes"), int) and not isinstance(seal["bytes"], bool)
            and isinstance(seal.get("blake2b"), str)):
        raise ConfigError(f"{saved.where}: malformed step line ({SEAL} must be {{\"bytes\": N, \"blake2b\": HEX}}, "
                          f"got {excerpt(seal)})")
    if len(data) != seal["bytes"]:
        raise ConfigError(f"{head}: {len(data):,} bytes where its step line ({saved.where}) records "
                          f"{seal['bytes']:,}: the batch file was cut, extended or replaced")
    if batch_digest(data) != seal["blake2b"]:
        raise ConfigError(f"{head}: its BLAKE2b digest differs from the one its step line ({saved.where}) records "
                          "(same length: the content was changed or swapped with another step's)")


def _check_rows(head: str, data: bytes, step: int, saved: SavedStep) -> None:
    """An unsealed batch file (an older folder): every line a batch row of this step, their uids the step line's."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise ConfigError(f"{head}: not UTF-8 text") from None
    uids: list[int] = []
    for k, raw in enumerate(text.splitlines(), start=1):
        row = loads_json(raw, f"{head}, line {k}", line=False) if raw.strip() else None
        uid = row.get("uid") if isinstance(row, dict) else None
        if not isinstance(row, dict) or row.get("step") != step or isinstance(uid, bool) or not isinstance(uid, int):
            raise ConfigError(f"{head}, line {k}: not a batch row of step {step}")
        uids.append(uid)
    if tuple(uids) != saved.uids:
        raise ConfigError(f"{head}: its groups (uids {excerpt(uids)}) are not the ones its step line "
                          f"({saved.where}) consumed (uids {excerpt(list(saved.uids))})")


def _uncommitted(folder: Path, step: int, lines: StepLines) -> tuple[bool, str]:
    """Whether files of step `step` (not committed: no state saved after it) wait in `folder`, and one line naming
    them for the user."""
    found = [f"its line in {STEPS_FILE}"] if len(lines.rows) > step else []
    if lines.unfinished is not None:
        found.append(f"an unfinished last line in {STEPS_FILE} ({lines.unfinished[0].rsplit(', ', 1)[-1]}: "
                     f"{lines.unfinished[1]})")
    if (folder / batch_name(step)).exists():
        found.append(batch_name(step))
    if not found:
        return False, ""
    check_target(folder / ASIDE, "folder of uncommitted steps", folder=True)  # refused now, not mid-run
    return True, (f"{folder}: step {step} was not committed by the run that wrote it ({', '.join(found)}); moved "
                  f"to {folder / ASIDE}/ and run again")[:400]


def _check_consumed(state: RolloutState, steps: Sequence[SavedStep], state_path: Path) -> None:
    """The step lines' consumed groups are the state's: as many, each once, drawn, not waiting."""
    r = state.router
    n = sum(len(s.uids) for s in steps)
    if n != r.consumed:
        raise ConfigError(f"cannot resume: {state_path} counts {r.consumed} consumed groups but its step lines "
                          f"hold {n}")
    seen = {ref.uid for ref in r.waiting}
    drawn = 0 if r.stream is None else r.stream.position
    for s in steps:
        for uid in s.uids:
            if uid in seen or uid >= drawn:
                why = "is consumed twice or still waits" if uid in seen else f"was never drawn (stream at {drawn})"
                raise ConfigError(f"{s.where}: group uid {uid} {why}")
            seen.add(uid)


def check_state(state: RolloutState, fingerprint: Mapping[str, Any], policy: str, router: Router) -> None:
    """A saved state against the run resuming it: same shape and policy (fingerprint), the same prompt stream (size,
    shuffle, seed), exactly N consumed per completed step, every waiting group and generation counter naming a
    prompt of this run (a waiting group the prompt its stream position draws), and no waiting group cut more often
    than the redraw limit allows. One ConfigError line otherwise."""
    diff = [k for k in fingerprint if state.fingerprint.get(k) != fingerprint[k]]
    if state.policy != policy:
        diff.insert(0, "policy")
    if diff:
        raise ConfigError(f"saved rollout state does not match this run ({', '.join(diff)} differ)")
    rc, r, mine = router.config, state.router, router.stream0
    if r.stream is not None and (r.stream.n_prompts, r.stream.shuffle, r.stream.seed) != (
            mine.n_prompts, mine.shuffle, mine.seed):
        raise ConfigError("saved rollout state: its prompt stream (prompts, shuffle, seed) is not this run's")
    if r.consumed != r.step * rc.groups:
        raise ConfigError(f"saved rollout state: {r.consumed} groups consumed in {r.step} steps of N={rc.groups}")
    for ref in r.waiting:
        if router.prompt_at(ref.uid) != ref.prompt_id:
            raise ConfigError(f"saved rollout state: waiting group uid {ref.uid} names prompt "
                              f"{excerpt(ref.prompt_id)}, which this run's prompts do not draw there")
        if ref.cuts > rc.max_redraws:
            raise ConfigError(f"saved rollout state: waiting group uid {ref.uid} was cut {ref.cuts} times, more than "
                              f"max_redraws={rc.max_redraws}")
    known = set(router.prompts)
    unknown = sorted(set(state.generation) - known)
    if unknown:
        raise ConfigError(f"saved rollout state: generation counter of unknown prompt {excerpt(unknown[0])}")
    if not 0 <= state.control.m < max(rc.replicas, 1):
        raise ConfigError(f"saved rollout state: m={state.control.m} tail replicas of R={rc.replicas}")
    if any(h.shape[1] != rc.group_size for h in (*state.control.history, *state.control.tail_history)):
        raise ConfigError(f"saved rollout state: a history table is not {rc.group_size} samples wide")


def check_steps(steps: Sequence[SavedStep], router: Router) -> None:
    """Every consumed group of the step lines names the prompt the run's stream draws at its uid, in groups of G."""
    for s in steps:
        if s.lengths.shape[1] != router.config.group_size or len(s.uids) != router.config.groups:
            raise ConfigError(f"{s.where}: {s.lengths.shape[0]} groups of {s.lengths.shape[1]}, not "
                              f"N={router.config.groups} of G={router.config.group_size}")
        for uid, pid in zip(s.uids, s.prompts, strict=True):
            if router.prompt_at(uid) != pid:
                raise ConfigError(f"{s.where}: group uid {uid} names prompt {excerpt(pid)}, which this run's prompts "
                                  "do not draw there")


def set_aside(folder: Path, step: int) -> Path | None:
    """Before step `step` is written again: move what a run that died before saving its state left of that step (its
    batch file, its step line, an unfinished last line) into `folder/uncommitted/step-NNNNN[-k]/` byte for byte,
    never deleting it; the new folder, or None when there was nothing."""
    batch, steps = folder / batch_name(step), folder / STEPS_FILE
    keep, late = _split_lines(steps, step) if steps.exists() else ("", "")
    if not late.strip() and not batch.exists():
        return None
    check_target(folder / ASIDE, "folder of uncommitted steps", folder=True)  # never through a link
    check_target(batch, "uncommitted batch file")
    dest = folder / ASIDE / f"step-{step:05d}"
    k = 1
    while os.path.lexists(dest):
        dest, k = folder / ASIDE / f"step-{step:05d}-{k}", k + 1
    (folder / ASIDE).mkdir(exist_ok=True)
    dest.mkdir()
    if late.strip():
        write_atomic(dest / STEPS_FILE, late, "uncommitted step lines")
        write_atomic(steps, keep, "step log")
    if batch.exists():
        os.replace(batch, dest / batch.name)
    return dest


def _split_lines(path: Path, step: int) -> tuple[str, str]:
    """A step log's text as (its first `step` step lines, the rest), the BOM dropped."""
    kept: list[str] = []
    n, lines = 0, read_text(path, "resume file").splitlines(keepends=True)
    for i, line in enumerate(lines):
        if n == step:
            return "".join(kept), "".join(lines[i:])
        kept.append(line)
        n += bool(line.strip())
    return "".join(kept), ""


def write_line(path: Path, row: Mapping[str, Any]) -> None:
    """Append one JSON line (flushed to disk before the state that commits it is written; a failed append is
    truncated back to the last complete line: `tailsieve.outputs.append_line`)."""
    append_line(path, json.dumps(row), "step log")
