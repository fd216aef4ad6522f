"""RL workload regimes beyond the paper's math workload (issue 14): video/VLM RL, multi-turn agentic search, math RL
with a low prompt share and lengths that grow over the run; and rare, prompt-independent cap hits (issue 22).

`video-rl`, `math-drift` and `rare-cap` are `SyntheticModel`s with other parameters; `agent-search` is `AgentModel`,
whose samples are several decode turns separated by tool calls (`turns`, `tool_wait_s`). Every draw is a pure
function of (seed, prompt, generation[, step]): common random numbers across policies. The targets and which of them are
assumptions rather than published statistics are in docs/workloads.md ("Workload regimes").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.hashing import stable_hash
from tailsieve.inputs import excerpt
from tailsieve.workloads.synthetic import SyntheticConfig, SyntheticModel

_TAG_AGENT_PROMPT, _TAG_AGENT_SAMPLE = 31, 32

# (a) video/VLM RL: median ≈ 200 tokens, short bulk (soft ceiling 1200), 3 % of samples loop to the 2048 cap; the
# loop probability is weakly prompt-dependent (β = 0.5: 0.75 % for the easiest 1 % of prompts, 9 % for the hardest).
VIDEO_CONFIG = SyntheticConfig(
    mu=5.2204, sigma_prompt=0.45, sigma_checkpoint=0.05, sigma_interaction=0.10, sigma_sample=0.45,
    ceiling=1200.0, runaway_logit=-3.5927, runaway_prompt_slope=0.5, max_length=2048, prompt_prefix="video",
)

# (c) math RL with a low prompt share: the synthetic-math shape with the prompt effect shrunk and the sampling noise
# widened (prompt share ≈ 17.5 % of an App. B design), the runaway less prompt-driven (β = 1 against 5.26; still
# ≈ 3 % at the 16384 cap), median ≈ 1160 at step 0 (the paper's), and lengths growing
# 1.75× log-linearly over the first 200 steps.
MATH_DRIFT_CONFIG = SyntheticConfig(
    mu=6.97, sigma_prompt=0.47, sigma_checkpoint=0.10, sigma_interaction=0.15, sigma_sample=0.75,
    runaway_logit=-3.93, runaway_prompt_slope=1.0, growth=1.75, growth_steps=200, prompt_prefix="mathdrift",
)


# (d) rare cap hits (issue 22): the synthetic-math bulk, softly bounded at 6000 tokens, and a runaway to the 16384 cap
# with probability 1 % for every sample of every prompt (runaway_prompt_slope = 0: sigmoid(-ln 99) = 1/100),
# so a cap hit is luck, not a property of the prompt, and a step that waits for one takes 2-3x as long.
RARE_CAP_SHARE = 0.01
RARE_CAP_CONFIG = SyntheticConfig(
    ceiling=6000.0, runaway_logit=-math.log(1.0 / RARE_CAP_SHARE - 1.0), runaway_prompt_slope=0.0,
    prompt_prefix="rarecap",
)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Multi-turn agentic search: per sample `turns` decode segments, each followed by a tool call but the last."""

    turn_mu: float = 5.0  # log of the typical decode tokens of one turn (≈ 150)
    sigma_prompt: float = 0.10  # prompt effect on the log turn length (sd)
    sigma_turn: float = 0.60  # per-turn sampling noise of the log turn length (sd)
    turns_mean: float = 4.0  # typical number of turns
    turns_prompt: float = 0.3  # prompt effect on the (latent) turn count, in turns (sd)
    turns_sample: float = 1.4  # per-sample noise of the (latent) turn count, in turns (sd)
    min_turns: int = 2
    max_turns: int = 8
    max_length: int = 4096  # cap on a sample's total decode tokens (truncation)
    tool_wait_s: float = 2.0  # seconds of tool latency between two turns (assumption, see docs)
    n_prompts: int = 2048

    def __post_init__(self) -> None:
        if not 1 <= self.min_turns <= self.max_turns:
            raise ConfigError(f"agent turns need 1 <= min_turns <= max_turns, got {self.min_turns}..{self.max_turns}")
        for name in ("sigma_prompt", "sigma_turn", "turns_prompt", "turns_sample", "tool_wait_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"agent {name} must be a finite number >= 0, got {v}")
        if self.max_length < self.max_turns:
            raise ConfigError(f"agent max_length must be >= max_turns ({self.max_turns}), got {self.max_length}")
        if self.n_prompts < 1:
            raise ConfigError(f"agent n_prompts must be >= 1, got {self.n_prompts}")


def _words(h: int) -> list[int]:
    return [h & 0xFFFFFFFF, h >> 32]


@dataclass(frozen=True, slots=True)
class AgentModel:
    """Agentic-search generator: `lengths` (total decode tokens) and `turns` are pure in (seed, p, generation)."""

    config: AgentConfig = field(default_factory=AgentConfig)
    seed: int = 0
    prompts: tuple[str, ...] = field(init=False, repr=False)
    _effect: dict[str, tuple[float, float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        n = self.config.n_prompts
        prompts = tuple(f"agent-{i:0{max(5, len(str(n - 1)))}d}" for i in range(n))
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _TAG_AGENT_PROMPT]))
        inv = NormalDist().inv_cdf
        scores = [[inv(q) for q in ((rng.permutation(n) + 0.5) / n).tolist()] for _ in range(2)]
        object.__setattr__(self, "prompts", prompts)
        object.__setattr__(self, "_effect", dict(zip(prompts, zip(*scores, strict=True), strict=True)))

    @property
    def max_length(self) -> int:
        """Cap on a sample's total decode tokens."""
        return self.config.max_length

    @property
    def tool_wait_s(self) -> float:
        """Tool latency between two turns (seconds)."""
        return self.config.tool_wait_s

    def _draw(self, prompt_id: str, generation: int, group_size: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(total decode tokens, turns) of the G samples of one generation."""
        c = self.config
        eff = self._effect.get(prompt_id)
        if eff is None:
            raise ConfigError(f"agent workload: unknown prompt id {excerpt(prompt_id)}")
        rng = np.random.default_rng(
            np.random.SeedSequence([self.seed, _TAG_AGENT_SAMPLE, *_words(stable_hash(prompt_id)), generation])
        )
        latent = c.turns_mean + c.turns_prompt * eff[1] + c.turns_sample * rng.standard_normal(group_size)
        turns = np.clip(np.rint(latent), c.min_turns, c.max_turns).astype(np.int64)
        log_turn = c.turn_mu + c.sigma_prompt * eff[0] + c.sigma_turn * rng.standard_normal((group_size, c.max_turns))
        per_turn = np.maximum(np.rint(np.exp(log_turn)), 1.0)
        per_turn[np.arange(c.max_turns)[None, :] >= turns[:, None]] = 0.0
        total = np.minimum(per_turn.sum(axis=1), c.max_length).astype(np.int64)
        return total, turns

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """Total decode tokens of each sample (all turns; capped at `max_length`); `step` is ignored."""
        return self._draw(prompt_id, generation, group_size)[0]

    def turns(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """Decode turns of each sample (tool calls = turns − 1); the same draw as `lengths`."""
        return self._draw(prompt_id, generation, group_size)[1]


# name → (factory(seed), one-line description)
REGIMES: dict[str, tuple[Callable[[int], SyntheticModel | AgentModel], str]] = {
    "video-rl": (lambda seed: SyntheticModel(VIDEO_CONFIG, seed=seed),
                 "video/VLM RL: median ~200 tokens, 3% of samples loop to the 2048 cap (assumed targets)"),
    "agent-search": (lambda seed: AgentModel(AgentConfig(), seed=seed),
                     "multi-turn agentic search: 2-8 turns, 2 s tool wait between turns, low prompt share"),
    "math-drift": (lambda seed: SyntheticModel(MATH_DRIFT_CONFIG, seed=seed),
                   "math RL, prompt share ~17%, lengths grow 1.75x over 200 steps (cap 16384)"),
    "rare-cap": (lambda seed: SyntheticModel(RARE_CAP_CONFIG, seed=seed),
                 "math bulk below ~6k; 1% of samples of any prompt run to the 16384 cap (prompt-independent)"),
}
