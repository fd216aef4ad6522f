"""Run one or more policies on real replicas, interleaved step by step (A B A B …), writing an output folder:

    DIR/report.json                 same keys as `simulate --json` ("policies" → mean_step_s, speedup, steps …)
    DIR/<policy>/batch-00003.jsonl  one line per consumed group: prompt id, samples, token counts, finish reasons
                                    (and "weight", the bias-correction weight, when the run has it on)
    DIR/<policy>/steps.jsonl        one line per step: the step record (its "decision" an object or null,
                                    `Decision.to_json`) plus the consumed lengths (for resume),
                                    redraws and truncated flags per consumed group (absent in older files: 0 and
                                    unknown), restart_s (replica restarts before the step, in makespan_s), and
                                    "weights" (bias correction on)
    DIR/<policy>/state.json         router + controller state after the last completed step (resume point)
    DIR/<policy>/uncommitted/       files of a step a killed run wrote before its state (moved aside on resume)

    DIR/.tailsieve.lock             the one writer's lock (`tailsieve.outputs.OutputLock`, docs/engines.md)

Every file is complete after each step, so an error or interrupt loses nothing already written; a resumed run
checks the folder first (`prepare_runs`, `engines/rollout/resume.py`) and never erases a file. Files are replaced
by `tailsieve.outputs.write_atomic` and step lines appended by `append_line` (a failed append is undone).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.analysis.report import report_json
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.peer_rollout import make_rollout
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.rollout.resume import (
    SEAL,
    STATE_FILE,
    STEPS_FILE,
    ResumePoint,
    SavedStep,
    batch_name,
    batch_seal,
    check_steps,
    read_folder,
    set_aside,
    write_line,
)
from tailsieve.engines.rollout.weight_sync import ReloadHook
from tailsieve.engines.transport.engine_client import Endpoint
from tailsieve.errors import ConfigError
from tailsieve.loop import SKIP_STEPS, PolicyRun, PoolHook, StepRecord
from tailsieve.outputs import OutputLock, check_target, write_atomic, write_json_atomic
from tailsieve.policy.peers import PEERS

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
        self.delays: list[list[int]] = []  # batch fidelity per step (docs/peers.md); complete only if every
        self.offpolicy: list[list[int]] = []  # step line has it (older folders do not)
        self.dropped: list[int] = []
        self.restart_s = 0.0  # replica restarts (pool moves) over the steps so far
        self._aside = False  # files of an uncommitted step wait in the folder (`load`)
        self.note = ""  # what `load` found uncommitted, for the user (`ResumePoint.note`)

    @property
    def state_path(self) -> Path:
        """Where the resume state lives."""
        return self.dir / STATE_FILE

    def load(self, steps: Sequence[SavedStep], uncommitted: bool = False, note: str = "") -> None:
        """Take the committed steps of a checked folder (`resume.read_folder`); `uncommitted`: the folder holds
        files of the next step from a run that died before saving its state (moved aside before it is rewritten),
        `note` says which."""
        self.note = note
        for s in steps:
            self._add(s.record, s.lengths, s.uids, s.prompts, s.redraws, s.truncated, s.weights)
            self.restart_s += s.restart_s
            if s.delays is not None:
                self._fidelity(s.delays, s.offpolicy or [0] * len(s.delays), s.dropped)
        self._aside = uncommitted

    def _add(self, rec: StepRecord, lengths: np.ndarray[Any, np.dtype[np.int64]], uids: Sequence[int],
             prompts: tuple[str, ...], redraws: Sequence[int] | NDArray[np.int64],
             truncated: Sequence[Sequence[bool]] | NDArray[np.bool_] | None,
             weights: Sequence[float] | NDArray[np.float64] | None = None) -> None:
        self.records.append(rec)
        self.lengths.append(lengths)
        self.uids.extend(int(u) for u in uids)
        self.prompts.append(prompts)
        self.redraws.append(np.asarray(redraws, dtype=np.int64))
        self.truncated.append(None if truncated is None else np.asarray(truncated, dtype=bool))
        if weights is not None:
            self.weights.append(np.asarray(weights, dtype=np.float64))

    def write(self, batch: Batch, rollout: Rollout) -> None:
        """Batch file, step line, then state (in that order: the state never runs ahead of the files, and a run killed
        in between leaves files of an uncommitted step, which the resumed run moves aside: `resume.set_aside`)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._aside or (self.dir / batch_name(batch.step)).exists():
            set_aside(self.dir, batch.step)
            self._aside = False
        data = "".join(json.dumps(r) + "\n" for r in batch_lines(batch)).encode("utf-8")
        write_atomic(self.dir / batch_name(batch.step), data, "batch file")
        lengths = np.array([g.lengths for g in batch.groups], dtype=np.int64)
        uids = [g.uid for g in batch.groups]
        pids = tuple(g.prompt_id for g in batch.groups)
        line = batch.record.to_json() | {"lengths": lengths.tolist(), "uids": uids, "prompt_ids": list(pids),
                                       "redispatched": batch.redispatched, "down": list(batch.down),
                                       "started_at": batch.started_at, "restart_s": batch.restart_s,
                                       "redraws": list(batch.redraws),
                                       "truncated": None if batch.truncated is None else
                                       [list(t) for t in batch.truncated], SEAL: batch_seal(data)}
        if batch.weights is not None:
            line["weights"] = list(batch.weights)
        fid = (list(batch.delays) or [0] * len(uids), list(batch.offpolicy) or [0] * len(uids), batch.dropped)
        line |= {"delays": fid[0], "offpolicy": fid[1], "dropped": fid[2]}
        write_line(self.dir / STEPS_FILE, line)
        self._add(batch.record, lengths, uids, pids, batch.redraws or [0] * len(uids), batch.truncated, batch.weights)
        self._fidelity(*fid)
        self.restart_s += batch.restart_s
        rollout.save(self.state_path)

    def _fidelity(self, delays: Sequence[int], offpolicy: Sequence[int], dropped: int) -> None:
        self.delays.append([int(x) for x in delays])
        self.offpolicy.append([int(x) for x in offpolicy])
        self.dropped.append(int(dropped))

    def run(self) -> PolicyRun:
        """The run so far as a `PolicyRun` (what `simulate` summarizes), with the batch fidelity (delays, off-policy
        tokens, drops) when every step line has it."""
        weights = tuple(self.weights) if len(self.weights) == len(self.records) else ()
        full = len(self.delays) == len(self.records)
        return PolicyRun(self.policy, tuple(self.records), tuple(self.lengths), tuple(self.uids), tuple(self.prompts),
                         tuple(self.redraws), tuple(self.truncated), batch_weights=weights,
                         batch_delays=tuple(np.asarray(d, dtype=np.int64) for d in self.delays) if full else (),
                         batch_offpolicy=tuple(np.asarray(o, dtype=np.int64) for o in self.offpolicy) if full else (),
                         step_dropped=tuple(self.dropped) if full else (), own_routing=self.policy in PEERS)


def report(runs: Mapping[str, PolicyRun], meta: Mapping[str, Any], skip: int = SKIP_STEPS,
           extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The report document (`tailsieve.analysis.report.report_json`, as `simulate --json`): `meta` plus "policies"
    with the per-policy keys of `simulate --json` (+ `extra`, e.g. restart_s)."""
    return report_json(runs, meta, skip=skip, extra=extra)


def prepare_runs(endpoints: Sequence[str | Endpoint], prompts: Sequence[PromptRecord],
                 configs: Mapping[str, RolloutConfig], out: Path, *, resume: bool, pools: PoolHook | None = None,
                 reload: ReloadHook | None = None) -> dict[str, tuple[Rollout, PolicyOutput]]:
    """Every policy's (unopened) `Rollout` and output folder, each folder checked before anything runs or is
    written: without `resume` it must be empty; with it, the files must belong together (`resume.read_folder`) and
    to this run (`resume.check_state` when the Rollout restores, `resume.check_steps`). A one-line ConfigError
    otherwise; nothing is touched. The CLI calls it before it starts replicas, `run_policies_real` again."""
    check_target(out, "--out", folder=True)
    points: dict[str, ResumePoint] = {}
    for name in configs:
        folder = out / name
        if not resume and folder.is_dir() and any(folder.iterdir()):
            raise ConfigError(f"{folder} already holds a run; pass --resume to continue it or choose another --out")
        if resume and name in PEERS and folder.is_dir() and any(folder.iterdir()):
            raise ConfigError(f"{folder}: a run of peer {name} cannot be resumed yet; choose another --out")
        points[name] = read_folder(folder) if resume and folder.is_dir() else ResumePoint(None, ())
    prepared: dict[str, tuple[Rollout, PolicyOutput]] = {}
    for name, cfg in configs.items():
        r = make_rollout(endpoints, cfg, prompts, state=points[name].state, pools=pools, reload=reload)
        check_steps(points[name].steps, r.router)
        po = PolicyOutput(out, name)
        po.load(points[name].steps, points[name].uncommitted, points[name].note)
        prepared[name] = (r, po)
    return prepared


async def run_policies_real(
    endpoints: Sequence[str | Endpoint], prompts: Sequence[PromptRecord], configs: Mapping[str, RolloutConfig],
    steps: int, out: Path, *, resume: bool = False, meta: Mapping[str, Any] | None = None,
    on_step: OnStep | None = None, pools: PoolHook | None = None,
    live_meta: Callable[[], Mapping[str, Any]] | None = None, weights_dir: Path | None = None,
    reload: ReloadHook | None = None, lock: OutputLock | None = None,
) -> dict[str, PolicyRun]:
    """Run every policy `steps` steps, interleaved A B A B …, writing `out` after each step (see module docstring).
    `pools(plan)`: a launcher's pool move before each step (its restart seconds count in the step); `live_meta()`:
    report keys read again at every write (the launcher's replicas and restart counts). `weights_dir`: before each
    step the newest checkpoint there (`latest_checkpoint`) is loaded when it changed (one policy only); `reload`:
    the restart fallback of that update (a launcher's `reload`). `out` has one writer (`tailsieve.outputs.OutputLock`):
    `lock` is the caller's, already held; without it the run takes its own (another writer: a one-line OutputError)."""
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    if weights_dir is not None and len(configs) != 1:
        raise ConfigError("--weights-dir drives one training run: give exactly one --policy")
    own = None if lock is not None else OutputLock(out, "rollout", folder=True)
    if own is not None:
        own.check()
        prepare_runs(endpoints, prompts, configs, out, resume=resume, pools=pools, reload=reload)  # touches nothing
        out.mkdir(parents=True, exist_ok=True)
        own.acquire()
    try:  # checked (again) under the lock: no other writer can change the folder from here on
        prepared = prepare_runs(endpoints, prompts, configs, out, resume=resume, pools=pools, reload=reload)
        return await _run_prepared(prepared, steps, out, meta, on_step, live_meta, weights_dir)
    finally:
        if own is not None:
            own.release()


async def _run_prepared(prepared: Mapping[str, tuple[Rollout, PolicyOutput]], steps: int, out: Path,
                        meta: Mapping[str, Any] | None, on_step: OnStep | None,
                        live_meta: Callable[[], Mapping[str, Any]] | None,
                        weights_dir: Path | None) -> dict[str, PolicyRun]:
    """`run_policies_real`'s steps on checked, locked output folders."""
    loaded: dict[str, Path | None] = dict.fromkeys(prepared)
    outputs = {name: po for name, (_, po) in prepared.items()}
    doc_meta = dict(meta or {}) | {"policies_order": list(prepared), "steps": steps}
    out.mkdir(parents=True, exist_ok=True)
    async with AsyncExitStack() as stack:
        rollouts = {name: await stack.enter_async_context(r) for name, (r, _) in prepared.items()}
        for _ in range(steps):
            for name, r in rollouts.items():
                if r.steps_done >= steps:
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
                                         extra={n: {"restart_s": o.restart_s} for n, o in outputs.items()}),
                                  "report")
                if on_step is not None:
                    on_step(name, batch)
    return {n: o.run() for n, o in outputs.items()}
