"""Run one or more policies on real replicas, interleaved step by step (A B A B …), writing an output folder:

    DIR/report.json                 same keys as `simulate --json` ("policies" → mean_step_s, speedup, steps …)
    DIR/<policy>/batch-00003.jsonl  one line per consumed group: prompt id, samples, token counts, finish reasons
                                    (and "weight", the bias-correction weight, when the run has it on)
    DIR/<policy>/steps.jsonl        one line per step: the step record plus the consumed lengths (for resume),
                                    redraws and truncated flags per consumed group (absent in older files: 0 and
                                    unknown), restart_s (replica restarts before the step, in makespan_s), and
                                    "weights" (bias correction on)
    DIR/<policy>/state.json         router + controller state after the last completed step (resume point)

Every file is complete after each step, so an error or interrupt loses nothing already written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from tailsieve.analysis.report import report_json
from tailsieve.engines.client import Endpoint
from tailsieve.engines.prompts import PromptRecord
from tailsieve.engines.rollout import Batch, Rollout, RolloutConfig, pools_from_assign
from tailsieve.engines.state import RolloutState, write_json_atomic
from tailsieve.engines.weights import ReloadHook
from tailsieve.errors import ConfigError
from tailsieve.inputs import loads_json, read_text
from tailsieve.loop import SKIP_STEPS, PolicyRun, PoolHook, StepRecord

OnStep = Callable[[str, Batch], None]


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint in `folder`: a subfolder holding `config.json` and weights (`*.safetensors` or
    `*.bin`), newest by modification time then name; None when there is none yet. Write a checkpoint under a temporary
    name and rename it into place, so that a half-written one is never picked."""
    if not folder.is_dir():
        raise ConfigError(f"--weights-dir {folder} is not a folder")
    found = [d for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".") and (d / "config.json").is_file()
             and (any(d.glob("*.safetensors")) or any(d.glob("*.bin")))]
    return max(found, key=lambda d: (d.stat().st_mtime, d.name)).resolve() if found else None


def batch_lines(batch: Batch) -> list[dict[str, Any]]:
    """The JSONL rows of one consumed batch (`weight` per group with bias correction on)."""
    return [{"step": batch.step, "uid": g.uid, "prompt_id": g.prompt_id, "pool": g.pool.value, "finish_s": g.finish_s,
             "tokens": list(g.lengths), "finish_reasons": list(g.finish_reasons),
             "samples": [{"text": s.text, "tokens": s.tokens, "finish_reason": s.finish_reason,
                          "token_ids": None if s.token_ids is None else list(s.token_ids), "replica": s.replica,
                          "attempts": s.attempts, "weight_version": s.weight_version}
                         | ({} if s.logprobs is None else {"logprobs": list(s.logprobs)})
                         | ({} if s.prompt_token_ids is None else {"prompt_token_ids": list(s.prompt_token_ids)})
                         for s in g.samples]}
            | ({} if g.weight is None else {"weight": g.weight})
            for g in batch.groups]


def step_rows(path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """The lines of a `steps.jsonl` (resume state) as (where, text, row): each row a JSON object with an integer
    `step`; errors are one line naming the file and line (a truncated last line included)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for lineno, line in enumerate(read_text(path, "resume file").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"resume file {path}, line {lineno}"
        row = loads_json(line, where, line=False, allow_nan=True)
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(row).__name__}")
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"{where}: 'step' must be a non-negative integer, got {step!r}")
        out.append((where, line, row))
    return out


_RECORD_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def step_record(row: Mapping[str, Any]) -> StepRecord:
    """A `StepRecord` from a step line, each field of its declared type (ValueError / TypeError otherwise)."""
    kw: dict[str, Any] = {}
    for name, f in StepRecord.__dataclass_fields__.items():
        if name not in row:
            continue
        typ, v = _RECORD_TYPES[str(f.type)], row[name]
        if typ is float and v is None:  # NaN written by an older json.dumps as null
            v = math.nan
        ok = isinstance(v, typ) if typ is not float else isinstance(v, int | float)
        if not ok or (typ is not bool and isinstance(v, bool)):
            raise TypeError(f"{name} must be {typ.__name__}, got {v!r}")
        kw[name] = typ(v)
    return StepRecord(**kw)


class PolicyOutput:
    """One policy's subfolder: batches, step lines, state; and the run so far (reloaded on resume)."""

    def __init__(self, root: Path, policy: str) -> None:
        self.dir = root / policy
        self.policy = policy
        self.records: list[StepRecord] = []
        self.lengths: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        self.uids: list[int] = []
        self.prompts: list[tuple[str, ...]] = []
        self.redraws: list[np.ndarray[Any, np.dtype[np.int64]]] = []
        self.truncated: list[np.ndarray[Any, np.dtype[np.bool_]] | None] = []
        self.weights: list[np.ndarray[Any, np.dtype[np.float64]]] = []
        self.restart_s = 0.0  # replica restarts (pool moves) over the steps so far

    @property
    def state_path(self) -> Path:
        """Where the resume state lives."""
        return self.dir / "state.json"

    def load(self, upto: int) -> None:
        """Reload the step lines of steps < `upto` (the saved state's step)."""
        path = self.dir / "steps.jsonl"
        if not path.exists():
            return
        for where, _, row in step_rows(path):
            if row["step"] >= upto:
                continue
            try:
                lengths = np.asarray(row["lengths"], dtype=np.int64)
                uids = [int(u) for u in row["uids"]]
                prompts = tuple(str(x) for x in row["prompt_ids"])
                if lengths.ndim != 2 or lengths.shape[0] != len(uids) or len(prompts) != len(uids):
                    raise ValueError("lengths, uids and prompt_ids do not match")
                rec = step_record(row)
                restart = float(row.get("restart_s", 0.0))
                if not math.isfinite(restart):
                    raise ValueError(f"restart_s is {restart}")
                self._add(rec, lengths, uids, prompts, row.get("redraws") or [0] * len(uids), row.get("truncated"),
                          row.get("weights"))
            except KeyError as exc:
                raise ConfigError(f"{where}: missing key {exc}") from None
            except (TypeError, ValueError, OverflowError) as exc:
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ConfigError(f"{where}: malformed step line ({why})") from None
            self.restart_s += restart

    def _add(self, rec: StepRecord, lengths: np.ndarray[Any, np.dtype[np.int64]], uids: Sequence[int],
             prompts: tuple[str, ...], redraws: Sequence[int], truncated: Sequence[Sequence[bool]] | None,
             weights: Sequence[float] | None = None) -> None:
        self.records.append(rec)
        self.lengths.append(lengths)
        self.uids.extend(int(u) for u in uids)
        self.prompts.append(prompts)
        self.redraws.append(np.asarray(redraws, dtype=np.int64))
        self.truncated.append(None if truncated is None else np.asarray(truncated, dtype=bool))
        if weights is not None:
            self.weights.append(np.asarray(weights, dtype=np.float64))

    def write(self, batch: Batch, rollout: Rollout) -> None:
        """Batch file, step line, then state (in that order: the state never runs ahead of the files)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        rows = batch_lines(batch)
        tmp = self.dir / f".batch-{batch.step:05d}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(self.dir / f"batch-{batch.step:05d}.jsonl")
        lengths = np.array([g.lengths for g in batch.groups], dtype=np.int64)
        uids = [g.uid for g in batch.groups]
        pids = tuple(g.prompt_id for g in batch.groups)
        self._rewrite_steps(batch.step)
        line = asdict(batch.record) | {"lengths": lengths.tolist(), "uids": uids, "prompt_ids": list(pids),
                                       "redispatched": batch.redispatched, "down": list(batch.down),
                                       "started_at": batch.started_at, "restart_s": batch.restart_s,
                                       "redraws": list(batch.redraws),
                                       "truncated": None if batch.truncated is None else
                                       [list(t) for t in batch.truncated]}
        if batch.weights is not None:
            line["weights"] = list(batch.weights)
        with (self.dir / "steps.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        self._add(batch.record, lengths, uids, pids, batch.redraws or [0] * len(uids), batch.truncated, batch.weights)
        self.restart_s += batch.restart_s
        rollout.save(self.state_path)

    def _rewrite_steps(self, step: int) -> None:
        """Drop step lines at or after `step` (left by a run that died before saving its state)."""
        path = self.dir / "steps.jsonl"
        if not path.exists():
            return
        rows = step_rows(path)
        keep = [ln for _, ln, row in rows if row["step"] < step]
        if len(keep) != len(rows):
            path.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")

    def run(self) -> PolicyRun:
        """The run so far as a `PolicyRun` (what `simulate` summarizes)."""
        weights = tuple(self.weights) if len(self.weights) == len(self.records) else ()
        return PolicyRun(self.policy, tuple(self.records), tuple(self.lengths), tuple(self.uids), tuple(self.prompts),
                         tuple(self.redraws), tuple(self.truncated), batch_weights=weights)


def report(runs: Mapping[str, PolicyRun], meta: Mapping[str, Any], skip: int = SKIP_STEPS,
           extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The report document (`tailsieve.analysis.report.report_json`, as `simulate --json`): `meta` plus "policies"
    with the per-policy keys of `simulate --json` (+ `extra`, e.g. restart_s)."""
    return report_json(runs, meta, skip=skip, extra=extra)


async def run_policies_real(
    endpoints: Sequence[str | Endpoint], prompts: Sequence[PromptRecord], configs: Mapping[str, RolloutConfig],
    steps: int, out: Path, *, resume: bool = False, meta: Mapping[str, Any] | None = None,
    on_step: OnStep | None = None, pools: PoolHook | None = None, assign: Callable[[int], float] | None = None,
    live_meta: Callable[[], Mapping[str, Any]] | None = None, weights_dir: Path | None = None,
    reload: ReloadHook | None = None,
) -> dict[str, PolicyRun]:
    """Run every policy `steps` steps, interleaved A B A B …, writing `out` after each step (see module docstring).
    `pools(plan)`: a launcher's pool move before each step (its restart seconds count in the step; the deprecated
    `assign(m)` still works); `live_meta()`:
    report keys read again at every write (the launcher's replicas and restart counts). `weights_dir`: before each
    step the newest checkpoint there (`latest_checkpoint`) is loaded when it changed (one policy only); `reload`:
    the restart fallback of that update (a launcher's `reload`)."""
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    if weights_dir is not None and len(configs) != 1:
        raise ConfigError("--weights-dir drives one training run: give exactly one --policy")
    loaded: dict[str, Path | None] = dict.fromkeys(configs)
    out.mkdir(parents=True, exist_ok=True)
    outputs = {name: PolicyOutput(out, name) for name in configs}
    states: dict[str, RolloutState | None] = {}
    for name, po in outputs.items():
        if resume and po.state_path.exists():
            st = RolloutState.load(po.state_path)
            po.load(st.router.step)
            states[name] = st
        elif not resume and po.dir.exists() and any(po.dir.iterdir()):
            raise ConfigError(f"{po.dir} already holds a run; pass --resume to continue it or choose another --out")
        else:
            states[name] = None
    doc_meta = dict(meta or {}) | {"policies_order": list(configs), "steps": steps}
    async with AsyncExitStack() as stack:
        if assign is not None and pools is None:
            pools = pools_from_assign(assign)
        rollouts = {name: await stack.enter_async_context(Rollout(endpoints, cfg, prompts, state=states[name],
                                                                  pools=pools, reload=reload))
                    for name, cfg in configs.items()}
        for _ in range(steps):
            for name, r in rollouts.items():
                if r.rstate.step >= steps:
                    continue
                if weights_dir is not None:
                    ck = latest_checkpoint(weights_dir)
                    if ck is not None and ck != loaded[name]:
                        await r.update_weights(ck)
                        loaded[name] = ck
                batch = await r.step()
                outputs[name].write(batch, r)
                now = doc_meta if live_meta is None else doc_meta | dict(live_meta())
                write_json_atomic(out / "report.json",
                                  report({n: o.run() for n, o in outputs.items()}, now,
                                         extra={n: {"restart_s": o.restart_s} for n, o in outputs.items()}))
                if on_step is not None:
                    on_step(name, batch)
    return {n: o.run() for n, o in outputs.items()}
