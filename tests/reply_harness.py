"""What the reply-fault tests share (`test_reply_faults.py`, `test_reply_classes.py`): one `Rollout` step on
replicas [bad, healthy] under a fault policy whose hangs end fast, and the check that the step completed on the
healthy replica with every group exactly once."""

from __future__ import annotations

from dataclasses import replace

from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.engine_executor import RequestMode
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.engines.transport.types import FaultKind, SamplingParams
from tailsieve.policy.step import GroupStatus

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(40))
# the bad replica is probed back only after the step: every fault shows once, and nothing flaps
POLICY = FaultPolicy(stall_timeout_s=0.5, backoff_s=0.01, probe_interval_s=30.0, probe_max_s=30.0,
                     no_healthy_wait_s=0.5)
BOUND_S = 10.0  # a whole step, hangs included

BAD = FaultKind.BAD_REPLY.value


def cfg(stream: bool, deadline_s: float | None = None, mode: RequestMode = RequestMode.SPLIT,
        stall_s: float = POLICY.stall_timeout_s) -> RolloutConfig:
    return RolloutConfig(groups=4, group_size=3, rho=0.5, policy="static", q=1, m=1, stream=stream,
                         request_mode=mode, sampling=SamplingParams(max_tokens=20),
                         faults=replace(POLICY, deadline_s=deadline_s, stall_timeout_s=stall_s))


async def one_step(urls: list[str], c: RolloutConfig) -> tuple[Batch, list[tuple[int, bool, str]]]:
    async with Rollout(urls, c, PROMPTS) as r:
        batch = await r.step()
        assert r.replicas is not None
        return batch, [(e.replica, e.up, e.reason) for e in r.replicas.events]


def check_complete(batch: Batch, n: int = 4, g: int = 3) -> None:
    assert len(batch.groups) == n and len({x.uid for x in batch.groups}) == n
    assert all(len(x.samples) == g for x in batch.groups)
    assert sum(o.status is GroupStatus.DONE for o in batch.outcomes) == n
    for grp in batch.groups:
        for s in grp.samples:
            assert s.replica == 1 and s.tokens >= 1 and s.finish_reason in ("stop", "length")
