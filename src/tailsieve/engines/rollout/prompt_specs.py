"""What a `Rollout` sends for each planned group (`GroupSpec`): its prompt rendered with the run's template (once per
prompt), per-member seeds derived from the run seed, the prompt and the generation the group regenerates, and under
length replay each member's replayed max_tokens (scaled by `length_scale`); the sampling params sent with them; and
the generation counters (how many draws of each prompt have started), which advance only when a step succeeds. A
group that a plan resumes (`StepPlan.resume`, a peer's partial rollout) continues the generation it was cut in."""

from __future__ import annotations

from collections.abc import Sequence

from tailsieve.engines.rollout.executor_types import GroupSpec
from tailsieve.engines.rollout.prompts import Messages, PromptRecord, render
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.hashing import stable_hash
from tailsieve.policy.step import GroupRef, StepPlan
from tailsieve.workloads import Workload

__all__ = ["PromptSpecs", "replay_ids"]


def replay_ids(prompts: Sequence[PromptRecord], replay: Workload | None) -> dict[str, str]:
    """The workload prompt whose lengths each prompt replays: its own id when the workload has it, else the
    workload's prompts in turn (prompt i → workload prompt i mod its count); empty without replay."""
    if replay is None:
        return {}
    known = set(replay.prompts)
    return {p.prompt_id: p.prompt_id if p.prompt_id in known else replay.prompts[i % len(replay.prompts)]
            for i, p in enumerate(prompts)}


class PromptSpecs:
    """Renders prompts and builds each planned group's `GroupSpec` (see the module docstring)."""

    def __init__(self, prompts: Sequence[PromptRecord], config: RolloutConfig, group_size: int) -> None:
        self.config = config
        self.g = group_size
        self.generation: dict[str, int] = {}  # prompt id → draws started (saved with the run's state)
        self._by_id = {p.prompt_id: p for p in prompts}
        self._rendered: dict[str, str | Messages] = {}
        self._replay_id = replay_ids(prompts, config.replay)
        self._drawn: tuple[int, dict[int, int], dict[str, int]] | None = None  # (step, uid → generation, counters)

    def prompt(self, prompt_id: str) -> str | Messages:
        """The prompt as sent: rendered with the run's template, once per prompt."""
        if prompt_id not in self._rendered:
            self._rendered[prompt_id] = render(self._by_id[prompt_id], self.config.template)
        return self._rendered[prompt_id]

    def params(self) -> SamplingParams:
        """The sampling params of every request; under length replay every request ends at its max_tokens
        (`ignore_eos`, no stop strings)."""
        s = self.config.sampling
        if self.config.replay is None:
            return s
        return SamplingParams(s.temperature, s.top_p, s.top_k, s.presence_penalty, s.max_tokens, (), True, s.extra)

    def spec(self, ref: GroupRef, generation: int, step: int) -> GroupSpec:
        """Group `ref` in its `generation`-th draw at `step`: prompt, per-member seeds (None without a run seed) and
        max_tokens (None: the sampling default; replayed lengths × length_scale, at least 1)."""
        g, cfg = self.g, self.config
        seeds: tuple[int | None, ...] = (None,) * g
        if cfg.seed is not None:
            h = stable_hash(f"{cfg.seed}|{ref.prompt_id}|{generation}")
            seeds = tuple(int((h + j * 0x9E3779B1) % (2**31 - 1)) for j in range(g))
        lens: tuple[int | None, ...] = (None,) * g
        if cfg.replay is not None:
            raw = cfg.replay.lengths(self._replay_id[ref.prompt_id], generation, step, g)
            lens = tuple(max(1, round(int(x) * cfg.length_scale)) for x in raw)
        return GroupSpec(self.prompt(ref.prompt_id), seeds, lens)

    def generations(self, plan: StepPlan) -> tuple[dict[int, int], dict[str, int]]:
        """The generation each planned group regenerates (per prompt, counting every earlier one; a resumed group the
        one it was cut in, drawing none) and the counters after the step; computed once per plan."""
        if self._drawn is None or self._drawn[0] != plan.step:
            gen = dict(self.generation)
            drawn: dict[int, int] = {}
            for ref in (*plan.tail, *plan.bulk):
                if ref.uid in plan.resume:
                    drawn[ref.uid] = max(gen.get(ref.prompt_id, 0) - 1, 0)
                else:
                    drawn[ref.uid] = gen.get(ref.prompt_id, 0)
                    gen[ref.prompt_id] = drawn[ref.uid] + 1
            self._drawn = (plan.step, drawn, gen)
        return self._drawn[1], self._drawn[2]

    def group_spec(self, ref: GroupRef, plan: StepPlan) -> GroupSpec:
        """The executor's spec function (`EngineExecutor(spec=…)`): what group `ref` of `plan` is sent."""
        return self.spec(ref, self.generations(plan)[0][ref.uid], plan.step)

    def commit(self, plan: StepPlan) -> None:
        """The plan's step succeeded: its draws count."""
        self.generation = self.generations(plan)[1]

    def restore(self, generation: dict[str, int]) -> None:
        """Continue from saved counters (a draw computed before is forgotten)."""
        self.generation, self._drawn = dict(generation), None
