"""`TailSieveReplayBuffer`: verl's replay buffer that returns exactly the N groups TailSieve consumes.

Set by config: `trainer.v1.sampler.custom_sampler.path=pkg://tailsieve.integrations.verl.buffer` and
`...name=TailSieveReplayBuffer`. The trainer attaches its `StepSession`; `sample()` then polls TransferQueue (verl's
own metadata sync) until the session says the step can be cut: every tail and pinned group finished, the bulk
quota reached. A group whose agent loop failed is never consumed (a failed bulk group is cut and regenerated like a
straggler; a failed tail or pinned group stops the step with a one-line RuntimeError). It returns the kept groups'
trajectories only, exactly N groups. The other groups are the leftovers: the trainer aborts their requests at
the end of sampling and `discard()` drops whatever they wrote; the router carries them and they are regenerated
from scratch next step under new keys and request ids (verl's partial rollout, which resumes aborted requests, is
never used). Without an attached session (validation, or another trainer) it is verl's `ReplayBuffer`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from tailsieve.errors import ConfigError
from tailsieve.integrations.verl.session import StepSession
from tailsieve.policy.step import Pool


class TailSieveReplayBuffer(ReplayBuffer):  # type: ignore[misc]  # verl ships no type information
    """verl's custom-sampler contract: `(trainer_mode, trainer_config, max_off_policy_threshold,
    max_off_policy_strategy, sampler_kwargs, refill_fn=None)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session: StepSession | None = None
        self.poll_s = 0.2

    def attach(self, session: StepSession, poll_s: float = 0.2) -> None:
        """Sample the steps of this session from now on."""
        self.session = session
        self.poll_s = poll_s

    def _lengths(self, partition_id: str, key: str) -> list[int]:
        """Response tokens per member of group `key` from the trajectory tags (`{key}_{session}_{index}`)."""
        g = self.session.group_size if self.session else 0
        lens = [0] * g
        for k, tag in self.partitions[partition_id].items():
            uid, sid, _ = [*k.split("_"), "", ""][:3]
            if uid == key and sid.isdigit() and int(sid) < g:
                lens[int(sid)] += int(tag.get("response_len", 0))
        return lens

    def poll(self, partition_id: str = "train") -> bool:
        """One look at TransferQueue: report newly terminal groups to the session; whether the step can be cut."""
        session = self.session
        if session is None:
            raise RuntimeError("no TailSieve session attached")
        self._sync_metadata_from_transfer_queue()
        failed = self.failure_keys[partition_id] & set(session.by_key())
        for key, a in session.by_key().items():
            if key in self.finished_keys[partition_id]:
                session.mark_done(a.ref.uid, self._lengths(partition_id, key))
            elif key not in failed:
                session.mark_progress(a.ref.uid, self._lengths(partition_id, key))
        self._check_failed(session, failed)
        return session.cut_ready()

    @staticmethod
    def _check_failed(session: StepSession, failed: set[str]) -> None:
        """A failed group (agent-loop error) is never consumed: a failed bulk group is cut like a straggler;
        RuntimeError (one line) when a group that must complete failed, or too many bulk groups failed."""
        plan = session.plan
        if not failed or plan is None:
            return
        by_key = session.by_key()
        must = sorted(k for k in failed if by_key[k].pool is Pool.TAIL or by_key[k].pinned)
        if must:
            raise RuntimeError(f"TailSieve step {plan.step}: group(s) {', '.join(must)} failed in the agent loop "
                               "and must complete (tail pool or pinned); see the agent-loop worker logs")
        free = [a for a in by_key.values() if a.pool is Pool.BULK and not a.pinned]
        pinned = sum(1 for a in by_key.values() if a.pool is Pool.BULK and a.pinned)
        if len(free) - len(failed) < plan.bulk_quota - pinned:
            raise RuntimeError(f"TailSieve step {plan.step}: {len(failed)} bulk group(s) failed in the agent loop, "
                               f"the bulk quota {plan.bulk_quota} can no longer be reached")

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict[str, Any]]:
        """Exactly the N groups of the open step the session keeps (verl's sampling for validation)."""
        session = self.session
        if partition_id == "val" or session is None or session.plan is None:
            base: tuple[Any, dict[str, Any]] = super().sample(global_steps=global_steps, partition_id=partition_id,
                                                              batch_size=batch_size)
            return base
        n = session.loop.router.config.groups
        if batch_size != n:
            raise ConfigError(f"replay buffer asked for {batch_size} groups but TailSieve consumes N = {n} per step "
                              "(trainer.v1.sync.parameter_sync_step must be 1)")
        while not self.poll(partition_id):
            time.sleep(self.poll_s)
        kept = [a.key for a in session.kept()]
        batch = self._materialize_batch(partition_id, kept, dict(self.partitions[partition_id]))
        plan = session.plan
        metrics = {"tailsieve/q": plan.q, "tailsieve/m": plan.m, "tailsieve/planned_groups": len(session.assignments),
                   "tailsieve/carried_groups": len(session.leftovers())}
        return batch, metrics

    def discard(self, keys: Iterable[str], partition_id: str = "train", timeout_s: float = 60.0) -> set[str]:
        """Drop the aborted leftover groups from TransferQueue once they settled (terminal, or never started);
        returns the keys still running at the timeout (dropped as well; their late writes are never sampled)."""
        keys = set(keys)
        deadline = time.monotonic() + timeout_s
        while True:
            self._sync_metadata_from_transfer_queue()
            running: set[str] = keys & set(self.running_keys[partition_id] | self.pending_keys[partition_id])
            if not running or time.monotonic() >= deadline:
                break
            time.sleep(self.poll_s)
        self._clear_groups(partition_id, keys)
        return running
