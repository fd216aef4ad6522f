"""A generated family of RL rollout regimes (issue 40), addressable as `family:SEED` (docs/workloads.md).

`family_regime(seed)` is a pure function of `seed`: every draw comes from the family's stream
`numpy.random.default_rng([FAMILY_TAG, seed])` (`tailsieve.model.curve_family.family_rng`), in a fixed order: the
curve's four draws first (so `load_curve("family:SEED")` gives the same curve without this module), then the
common draws (multi-turn or not, R, G, N/R, cap, typical length, prompt share, spread, engine speed), then the
generator's own. A regime is a length generator (`SyntheticConfig` for single-turn RL, `AgentConfig` for multi-turn
agents with tool latency), a TPOT curve, a step shape (N groups of G on R replicas) and an engine speed factor.

Ranges (all inclusive; "log-U" is log-uniform):

- single-turn (80 %): R log-U 4..256; agent (20 %): R log-U 4..64.
- G from {4, 5, 6, 8, 10, 12, 16}; N/R log-U 4..32, N = round(R · N/R), then clipped so that N · G stays within
  `MAX_REQUESTS` (16384 requests per step) single-turn and `MAX_AGENT_REQUESTS` (2048) multi-turn: a bound by
  construction, so that a 30-step run of every policy stays cheap to simulate (multi-turn runs cost ~10× more per
  request). The clip can lower N/R below 4 (only for multi-turn regimes with R > 32 and large G).
- cap: log-U 2048..32768, rounded to a multiple of 1024.
- prompt share of the log-length variance: U(0.1, 0.9) (its App. B share on raw lengths spans about the same).
- single-turn bulk: median cap · (log-U 0.03..0.3), total log-sd U(0.4, 1.3) split into prompt (the share above),
  prompt × step interaction (U(0, 0.3) of the rest) and sampling; soft ceiling cap · U(0.35, 0.9), sharpness
  U(2, 8). Loops to the cap: none in 20 %, else a share U(0.2 %, 3 %) of the samples, prompt-independent
  (slope 0) in half of those and prompt-dependent (runaway logit slope U(0.5, 3) per prompt sd) in the other half.
  Step-to-step drift: checkpoint sd U(0, 0.3) over a window of 8..32 steps; in a third of the regimes the lengths
  also grow or shrink by a factor log-U 0.6..2 over 20..200 steps.
- multi-turn: 1 or 2 .. 4..12 turns (typical count U(2, 6)), turn tokens log-U 40..600, tool latency log-U
  0.2..5 s, turn-count sd U(1, 2.5) split between prompt and sample by the prompt share, as is the per-turn log-sd
  U(0.4, 1.0); no loops and no drift (the agent generator has neither).
- curve: `model/curve_family.py` (flat dense to a steep MoE knee); engine speed `engine_scale` U(0.7, 1.5) (the
  simulated replicas run at τ(b) · engine_scale, the policies keep the unscaled curve).

Splits by seed: even seeds are `Split.TUNE` (tune controller constants on these only), odd seeds
`Split.VALIDATION`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from tailsieve.errors import ConfigError
from tailsieve.model.curve_family import (
    FAMILY_PREFIX,
    FAMILY_SEED_LIMIT,
    FAMILY_TAG,
    draw_knee_shape,
    family_rng,
    knee_curve,
    parse_family_seed,
)
from tailsieve.model.curves import TpotCurve
from tailsieve.workloads.regimes import AgentConfig, AgentModel
from tailsieve.workloads.synthetic import SyntheticConfig, SyntheticModel
from tailsieve.workloads.workload import ReplayMode, Workload

__all__ = ["FAMILY_PREFIX", "FAMILY_SEED_LIMIT", "FAMILY_TAG", "MAX_AGENT_REQUESTS", "MAX_REQUESTS", "FamilyRegime",
           "RouterShape", "Split", "family_generator", "family_regime", "family_workload", "parse_family_seed",
           "split_of", "split_seeds"]

AGENT_SHARE = 0.2
GROUP_SIZES = (4, 5, 6, 8, 10, 12, 16)
REPLICAS = (4, 256)
AGENT_REPLICAS = (4, 64)
GROUPS_PER_REPLICA = (4.0, 32.0)
MAX_REQUESTS = 16384  # N · G bound, single-turn
MAX_AGENT_REQUESTS = 2048  # N · G bound, multi-turn
CAP = (2048, 32768)
PROMPT_SHARE = (0.1, 0.9)
ENGINE_SCALE = (0.7, 1.5)
LOOP_SHARE = (0.002, 0.03)
NO_LOOP_LOGIT = -40.0  # sigmoid(-40) ≈ 4e-18: no loops
MIN_PROMPTS = 2048


class Split(StrEnum):
    """Which half of the family a seed belongs to: tune on `TUNE` (even seeds), report on `VALIDATION` (odd)."""

    TUNE = "tune"
    VALIDATION = "validation"


def split_of(seed: int) -> Split:
    """Even seeds tune, odd seeds validate."""
    return Split.TUNE if seed % 2 == 0 else Split.VALIDATION


def split_seeds(split: Split | str, count: int, start: int = 0) -> list[int]:
    """The first `count` seeds >= `start` of `split`, ascending."""
    first = start + (int(split_of(start) is not Split(split)))
    return list(range(first, first + 2 * count, 2))


@dataclass(frozen=True, slots=True)
class RouterShape:
    """A regime's step shape: fields of `tailsieve.policy.router.RouterConfig`, of the same defaults (this layer may
    not import the policy layer; tests/test_family.py holds them equal): `RouterConfig(**shape.kwargs())`. The
    router's other knobs (`max_redraws`, `dispatch`, `ranking`) are RouterConfig's defaults in every regime."""

    groups: int  # N
    group_size: int  # G
    replicas: int  # R
    rho: float = 0.1  # the over-provisioning E = ⌈ρN⌉ a regime's prompts are counted for (`engine_family`)

    def kwargs(self) -> dict[str, Any]:
        """The RouterConfig keyword arguments."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FamilyRegime:
    """One regime of the family; `generator` is a `SyntheticConfig` (single-turn) or an `AgentConfig` (multi-turn
    with tool latency). `prompt_share` is the drawn share of the prompt effect in the log-length variance and
    `loop_share` the drawn share of samples that loop to the cap (0 for multi-turn)."""

    seed: int
    split: Split
    generator: SyntheticConfig | AgentConfig
    curve: TpotCurve
    router: RouterShape
    engine_scale: float
    prompt_share: float
    loop_share: float

    @property
    def name(self) -> str:
        """'family:SEED'."""
        return f"{FAMILY_PREFIX}{self.seed}"

    @property
    def multi_turn(self) -> bool:
        """Whether the samples are several decode turns separated by tool calls."""
        return isinstance(self.generator, AgentConfig)

    @property
    def cap(self) -> int:
        """The truncation cap (tokens)."""
        return self.generator.max_length

    def describe(self) -> str:
        """One line: shape, lengths, loops, drift, curve, engine speed."""
        r, g = self.router, self.generator
        head = f"{self.name} ({self.split}) R={r.replicas} N={r.groups} G={r.group_size} cap {self.cap}"
        if isinstance(g, AgentConfig):
            body = (f"agent {g.min_turns}-{g.max_turns} turns ~{math.exp(g.turn_mu):.0f} tok, tool "
                    f"{g.tool_wait_s:.1f}s")
        else:
            loops = "no loops" if self.loop_share == 0 else (
                f"loops {self.loop_share:.1%} {'prompt-dep' if g.runaway_prompt_slope > 0 else 'any prompt'}")
            drift = f" growth x{g.growth:.2f}/{g.growth_steps}" if g.growth != 1.0 else ""
            body = f"median ~{math.exp(g.mu):.0f} tok, {loops}, drift sd {g.sigma_checkpoint:.2f}{drift}"
        knee = self.curve.tpot_ms[4] / self.curve.tpot_ms[0]  # τ(16) / τ(1)
        return (f"{head}, {body}, prompt share {self.prompt_share:.2f}, curve tau16/tau1 {knee:.2f}, "
                f"engine x{self.engine_scale:.2f}")


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def runaway_logit(share: float, slope: float) -> float:
    """The intercept a with E_z[sigmoid(a + slope·z)] = share over z ~ N(0, 1) (Gauss-Hermite, bisection)."""
    if share <= 0:
        return NO_LOOP_LOGIT
    z, w = hermegauss(64)
    w = w / w.sum()
    lo, hi = -40.0, 10.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        mean = float(w @ (1.0 / (1.0 + np.exp(-(mid + slope * z)))))
        lo, hi = (mid, hi) if mean < share else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True, slots=True)
class _Common:
    """The draws every regime makes, in order, after the curve's."""

    agent: bool
    replicas: int
    group_size: int
    groups: int
    cap: int
    typical: float  # single-turn median / cap
    share: float
    spread: float  # U(0, 1): where the total log-sd lies in its range
    engine_scale: float


def _common(rng: np.random.Generator) -> _Common:
    agent = bool(rng.random() < AGENT_SHARE)
    replicas = round(_log_uniform(rng, *(AGENT_REPLICAS if agent else REPLICAS)))
    group_size = int(rng.choice(GROUP_SIZES))
    per = _log_uniform(rng, *GROUPS_PER_REPLICA)
    limit = MAX_AGENT_REQUESTS if agent else MAX_REQUESTS
    groups = max(1, min(round(replicas * per), limit // group_size))
    cap = min(max(round(_log_uniform(rng, *CAP) / 1024) * 1024, CAP[0]), CAP[1])
    typical = _log_uniform(rng, 0.03, 0.3)
    share = float(rng.uniform(*PROMPT_SHARE))
    spread = float(rng.random())
    scale = float(rng.uniform(*ENGINE_SCALE))
    return _Common(agent, replicas, group_size, groups, cap, typical, share, spread, scale)


def _single_turn(rng: np.random.Generator, c: _Common, seed: int) -> tuple[SyntheticConfig, float]:
    """A single-turn generator and its loop share."""
    total = 0.4 + 0.9 * c.spread  # total log-sd 0.4..1.3
    inter = float(rng.uniform(0.0, 0.3))
    rest = total**2 * (1.0 - c.share)
    ceiling = c.cap * float(rng.uniform(0.35, 0.9))
    sharp = float(rng.uniform(2.0, 8.0))
    loops = 0.0 if rng.random() < 0.2 else float(rng.uniform(*LOOP_SHARE))
    slope = 0.0 if rng.random() < 0.5 else float(rng.uniform(0.5, 3.0))
    sigma_ckpt = float(rng.uniform(0.0, 0.3))
    window = int(rng.integers(8, 33))
    grows = bool(rng.random() < 1.0 / 3.0)
    growth = _log_uniform(rng, 0.6, 2.0) if grows else 1.0
    growth_steps = int(rng.integers(20, 201))
    cfg = SyntheticConfig(
        mu=math.log(c.cap * c.typical), sigma_prompt=total * math.sqrt(c.share),
        sigma_checkpoint=sigma_ckpt, sigma_interaction=math.sqrt(rest * inter),
        sigma_sample=math.sqrt(rest * (1.0 - inter)), drift_window=window, ceiling=ceiling, ceiling_sharpness=sharp,
        runaway_logit=runaway_logit(loops, slope), runaway_prompt_slope=slope if loops > 0 else 0.0,
        max_length=c.cap, n_prompts=max(MIN_PROMPTS, 4 * c.groups), growth=growth, growth_steps=growth_steps,
        prompt_prefix=f"fam{seed}",
    )
    return cfg, loops


def _multi_turn(rng: np.random.Generator, c: _Common) -> AgentConfig:
    """A multi-turn agent generator."""
    min_turns = int(rng.integers(1, 3))
    max_turns = int(rng.integers(4, 13))
    turns_mean = min(float(rng.uniform(2.0, 6.0)), float(max_turns))
    turn_tokens = _log_uniform(rng, 40.0, 600.0)
    tool = _log_uniform(rng, 0.2, 5.0)
    turn_sd = float(rng.uniform(1.0, 2.5))
    log_sd = 0.4 + 0.6 * c.spread
    return AgentConfig(
        turn_mu=math.log(turn_tokens), sigma_prompt=log_sd * math.sqrt(c.share),
        sigma_turn=log_sd * math.sqrt((1.0 - c.share) * turns_mean), turns_mean=turns_mean,
        turns_prompt=turn_sd * math.sqrt(c.share), turns_sample=turn_sd * math.sqrt(1.0 - c.share),
        min_turns=min_turns, max_turns=max_turns, max_length=c.cap, tool_wait_s=tool,
        n_prompts=max(MIN_PROMPTS, 4 * c.groups),
    )


def family_regime(seed: int) -> FamilyRegime:
    """Regime `seed` of the family (a pure function of `seed`; ranges in the module docstring)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < FAMILY_SEED_LIMIT:
        raise ConfigError(f"family seed must be an integer in 0..{FAMILY_SEED_LIMIT - 1}, got {seed!r}")
    seed = int(seed)
    rng = family_rng(seed)
    curve = knee_curve(f"{FAMILY_PREFIX}{seed}", draw_knee_shape(rng))  # first: load_curve draws the same
    c = _common(rng)
    generator: SyntheticConfig | AgentConfig
    if c.agent:
        generator, loops = _multi_turn(rng, c), 0.0
    else:
        generator, loops = _single_turn(rng, c, seed)
    return FamilyRegime(seed=seed, split=split_of(seed), generator=generator, curve=curve,
                        router=RouterShape(groups=c.groups, group_size=c.group_size, replicas=c.replicas),
                        engine_scale=c.engine_scale, prompt_share=c.share, loop_share=loops)


def family_generator(seed: int, draw_seed: int = 0) -> SyntheticModel | AgentModel:
    """The length generator of regime `seed`, drawing with `draw_seed` (common random numbers across policies)."""
    g = family_regime(seed).generator
    return AgentModel(g, seed=draw_seed) if isinstance(g, AgentConfig) else SyntheticModel(g, seed=draw_seed)


def family_workload(seed: int, *, draw_seed: int = 0) -> Workload:
    """Regime `seed`'s workload, named 'family:SEED', its lengths drawn with `draw_seed` (`load_workload("family:SEED",
    seed=draw_seed)`); like every generator it ignores the replay mode."""
    if isinstance(draw_seed, bool) or not isinstance(draw_seed, int) or draw_seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {draw_seed!r}")
    regime = family_regime(seed)
    model = family_generator(seed, draw_seed)
    return Workload(name=regime.name, prompts=model.prompts, max_length=model.max_length, mode=ReplayMode.SYNTHETIC,
                    seed=draw_seed, source=model, description=regime.describe())
