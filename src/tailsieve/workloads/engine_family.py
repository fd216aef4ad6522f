"""The regime family's engine half (issue 48; docs/workloads.md): regimes where the simulated engine is not the
controller's model, on seeds nobody ran before (`ENGINE_SEEDS` and up; odd seeds validate, even seeds tune).

`engine_regime(seed)` starts from `family_regime(seed)` (its curve, lengths and step shape) and redraws, from its own
stream `default_rng([FAMILY_TAG, seed, ENGINE_TAG])`, what the family was blind to:

- G up to 64 (a quarter of the regimes: 24, 32, 48 or 64, N lowered to keep N · G ≤ `MAX_REQUESTS`); R up to 1,024
  (a tenth: log-U 256..1024, N ≥ R).
- cap-dominated long chain-of-thought (a quarter of the single-turn regimes): cap 16..32 K, 10..40 % of the samples
  loop to it.
- prompts: prefill-heavy (30 %: median log-U 4..16 K tokens, video and agent prompts), else log-U 100..1000; per
  prompt × exp(N(0, 0.4)).
- agents: up to 30 turns, tool waits log-U 0.2..60 s.
- MoE curves whose knee lies past batch 64 (a fifth: knee batch log-U 64..256, knee height U(1, 3)).
- the truth: a curve off the belief by a factor U(0.8, 1.2) and a tilt U(−0.2, 0.2) per decade of batch; KV and
  prefill terms the controller does not know (prefill τ(1)·U(0.005, 0.03) per token, KV τ(1)·U(0, 0.003) per 1 K
  context tokens); single-turn regimes have paged KV in 70 % of the regimes, its capacity 0.3..1.5 × the step's peak
  KV demand per replica on the all-admit engine (at least one request's prompt + cap), block 16, prefix caching in
  70 %, chunked prefill (2 K, 8 K or 16 K tokens) in half; replicas 0..20 % uneven, drifting 0..5 % a step.
  Multi-turn regimes keep the all-admit engine (the paged engine does not simulate tool waits).

The controller is given the family curve only (`curve`): no KV or prefill term, no engine keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tailsieve.errors import ConfigError
from tailsieve.model.costmodel import CostModel
from tailsieve.model.curve_family import FAMILY_TAG, KneeShape, draw_knee_shape, family_rng, knee_curve
from tailsieve.model.curves import TpotCurve, curve_from_points
from tailsieve.model.engine import EngineTruth, FleetSpeed
from tailsieve.workloads.family import (
    MAX_AGENT_REQUESTS,
    MAX_REQUESTS,
    FamilyRegime,
    RouterShape,
    Split,
    family_regime,
    runaway_logit,
    split_of,
)
from tailsieve.workloads.regimes import AgentConfig, AgentModel
from tailsieve.workloads.synthetic import SyntheticConfig, SyntheticModel
from tailsieve.workloads.workload import ReplayMode, Workload

__all__ = ["ENGINE_SEEDS", "ENGINE_TAG", "EngineRegime", "engine_regime", "engine_seeds", "engine_workload"]

ENGINE_TAG = 48
ENGINE_SEEDS = 1000  # the engine half's first seed: seeds below it are the first family's, run since issue 40
BIG_GROUPS = (24, 32, 48, 64)
BLOCK = 16


@dataclass(frozen=True, slots=True)
class EngineRegime:
    """A family regime with its engine truth: `truth` (the simulated replicas' model file: curve, terms, engine keys)
    apart from `curve` (what the controller believes); `prompt_median` its prompts' median tokens; `kv_ratio` the
    KV capacity over the step's peak KV demand per replica (0: unbounded)."""

    base: FamilyRegime
    truth: CostModel
    prompt_median: float
    kv_ratio: float

    @property
    def seed(self) -> int:
        """The family seed."""
        return self.base.seed

    @property
    def curve(self) -> TpotCurve:
        """The controller's curve (the belief)."""
        return self.base.curve

    @property
    def kv_bound(self) -> bool:
        """KV capacity below the step's peak KV demand (preemptions expected)."""
        return 0 < self.kv_ratio < 1

    def describe(self) -> str:
        """The base regime's line plus the engine's."""
        e = self.truth.engine
        kv = "KV unbounded" if e.kv_tokens is None else f"KV {e.kv_tokens // 1000}k ({self.kv_ratio:.2f}x peak)"
        return (f"{self.base.describe()}; prompts ~{self.prompt_median:.0f} tok, {kv}"
                f"{', prefix cache' if e.prefix_caching else ''}"
                f"{f', chunk {e.max_num_batched_tokens}' if e.max_num_batched_tokens else ''}"
                f", speeds -{e.speed.spread:.0%} drift {e.speed.drift:.1%}")


def engine_seeds(split: Split | str, count: int) -> list[int]:
    """The first `count` engine seeds of `split` (from `ENGINE_SEEDS`; even tune, odd validate)."""
    first = ENGINE_SEEDS + (int(split_of(ENGINE_SEEDS) is not Split(split)))
    return list(range(first, first + 2 * count, 2))


def _log_u(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _shape(base: FamilyRegime, rng: np.random.Generator) -> RouterShape:
    """G up to 64 and R up to 1024 (N · G kept within the family's bound)."""
    r, g, n = base.router.replicas, base.router.group_size, base.router.groups
    big_g, big_r = rng.random() < 0.25, rng.random() < 0.1 and not base.multi_turn
    g2, r2 = int(rng.choice(BIG_GROUPS)), round(_log_u(rng, 256, 1024))
    if big_g:
        g = g2
    if big_r:
        r = r2
    limit = MAX_AGENT_REQUESTS if base.multi_turn else MAX_REQUESTS
    n = max(min(n if not big_r else r * 4, limit // g), r if big_r else 1)
    if n * g > limit:
        g = max(limit // n, 1)
    return RouterShape(groups=n, group_size=g, replicas=r)


def _generator(base: FamilyRegime, rng: np.random.Generator) -> SyntheticConfig | AgentConfig:
    g = base.generator
    long_cot, cap = rng.random() < 0.25, int(rng.integers(16, 33)) * 1024
    share = float(rng.uniform(0.1, 0.4))
    turns, tool = int(rng.integers(4, 31)), _log_u(rng, 0.2, 60.0)
    if isinstance(g, AgentConfig):
        return replace(g, max_turns=max(turns, g.min_turns), tool_wait_s=tool,
                       max_length=max(g.max_length, max(turns, g.min_turns)))
    if long_cot:
        return replace(g, max_length=cap, runaway_logit=runaway_logit(share, 0.0), runaway_prompt_slope=0.0,
                       ceiling=cap * 0.9, mu=math.log(cap * 0.1))
    return g


def _curve(base: FamilyRegime, rng: np.random.Generator) -> TpotCurve:
    moe, knee_batch, knee = rng.random() < 0.2, _log_u(rng, 64, 256), float(rng.uniform(1.0, 3.0))
    if not moe:
        return base.curve
    shape = draw_knee_shape(family_rng(base.seed))
    return knee_curve(base.curve.name, KneeShape(shape.tpot1_ms, knee, knee_batch, shape.slope))


def _truth_curve(curve: TpotCurve, rng: np.random.Generator) -> TpotCurve:
    scale, tilt = float(rng.uniform(0.8, 1.2)), float(rng.uniform(-0.2, 0.2))
    b = np.asarray(curve.batch, np.float64)
    t = np.asarray(curve.tpot_ms) * scale * (1.0 + tilt * np.log10(b))
    return curve_from_points(f"{curve.name}-truth", [int(x) for x in b], [float(x) for x in np.maximum(t, 1e-3)],
                             description=f"the truth: x{scale:.2f}, tilt {tilt:+.2f} per decade of batch")


def engine_regime(seed: int) -> EngineRegime:
    """Engine regime `seed` (a pure function of it; the module docstring gives the ranges)."""
    if seed < ENGINE_SEEDS:
        raise ConfigError(f"engine regimes start at seed {ENGINE_SEEDS}, got {seed}")
    base = family_regime(seed)
    rng = np.random.default_rng([FAMILY_TAG, seed, ENGINE_TAG])
    router = _shape(base, rng)
    generator = _generator(base, rng)
    curve = _curve(base, rng)
    heavy = rng.random() < 0.3
    prompt = _log_u(rng, 4096, 16384) if heavy else _log_u(rng, 100, 1000)
    truth_curve = _truth_curve(curve, rng)
    tau1 = float(curve.tpot_ms[0])
    prefill, kv_term = tau1 * float(rng.uniform(0.005, 0.03)), tau1 * float(rng.uniform(0.0, 0.003))
    paged, ratio = rng.random() < 0.7 and not base.multi_turn, float(rng.uniform(0.3, 1.5))
    prefix, chunk = rng.random() < 0.7, int(rng.choice([0, 0, 0, 2048, 8192, 16384]))
    spread, drift = float(rng.uniform(0.0, 0.2)), float(rng.uniform(0.0, 0.05))
    base = replace(base, router=router, generator=generator, curve=curve, engine_scale=1.0)
    kv_tokens = None
    if paged:
        demand = _peak_demand(base, prompt)
        floor = prompt * 2.5 + generator.max_length + BLOCK  # one request of the longest prompt at the cap
        kv_tokens = int(max(ratio * demand, floor)) // BLOCK * BLOCK + BLOCK
        ratio = kv_tokens / demand
    if base.multi_turn:  # tool waits run on the all-admit engine
        chunk = 0
    engine = EngineTruth(kv_tokens=kv_tokens, block_size=BLOCK, max_num_batched_tokens=chunk or None,
                         prefix_caching=paged and prefix, speed=FleetSpeed(spread=spread, drift=drift))
    truth = CostModel(truth_curve, kv_ms_per_1k=kv_term, prefill_ms_per_token=prefill, engine=engine)
    return EngineRegime(base, truth, prompt, ratio if paged else 0.0)


def _peak_demand(base: FamilyRegime, prompt: float) -> float:
    """The step's peak KV demand per replica on the all-admit engine: its first step's N + E groups (draw seed 0)
    all admitted, each request holding its prompt and the tokens decoded so far until it finishes; the peak over
    time of Σ over unfinished requests of (prompt + k), over the replicas."""
    g, shape = base.generator, base.router
    model = AgentModel(g, seed=0) if isinstance(g, AgentConfig) else SyntheticModel(g, seed=0)
    groups = min(len(model.prompts), shape.groups + math.ceil(shape.rho * shape.groups))
    lens = np.sort(np.concatenate([model.lengths(p, 0, 0, shape.group_size) for p in model.prompts[:groups]]))
    left = lens.size - np.arange(lens.size)  # requests still decoding when the i-th shortest finishes
    return float(np.max(left * (prompt + lens))) / shape.replicas


def engine_workload(regime: EngineRegime, *, draw_seed: int = 0) -> Workload:
    """The regime's workload with its prompt tokens (median × exp(N(0, 0.4)) per prompt, at most 2.5 × the median),
    its lengths drawn with `draw_seed`."""
    g = regime.base.generator
    model = AgentModel(g, seed=draw_seed) if isinstance(g, AgentConfig) else SyntheticModel(g, seed=draw_seed)
    rng = np.random.default_rng([FAMILY_TAG, regime.seed, ENGINE_TAG, 1])
    toks = np.minimum(regime.prompt_median * np.exp(rng.normal(0.0, 0.4, len(model.prompts))),
                      2.5 * regime.prompt_median)
    ptoks = {p: max(int(t), 1) for p, t in zip(model.prompts, toks, strict=True)}
    return Workload(name=regime.base.name, prompts=model.prompts, max_length=model.max_length,
                    mode=ReplayMode.SYNTHETIC, seed=draw_seed, source=model, description=regime.describe(),
                    _prompt_tokens=ptoks)
