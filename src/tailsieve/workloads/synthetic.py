"""Synthetic math workload calibrated to the paper (§2.3, §4.1, App. A.5, App. B).

Per response, log-length = μ + prompt effect + checkpoint drift + prompt×checkpoint interaction + sampling noise;
the bulk is softly bounded at `ceiling` (so the longest completed response stays near Table A.3's 11.8k), and
with a prompt-dependent probability a response runs away to the cap and is truncated (the heavy upper tail,
§4.1's ≈ 3 % truncated). Every effect is a pure function of (seed, prompt, step, generation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.hashing import stable_hash
from tailsieve.inputs import excerpt
from tailsieve.model.tailstrength import tail_transform

# Stream tags keep the effects' random streams disjoint.
_TAG_PROMPT, _TAG_CKPT, _TAG_INTER, _TAG_SAMPLE = 11, 12, 13, 14
_DRIFT_BLOCK = 1024  # per-step innovations are drawn in blocks of this many steps

# Paper targets for the real math workload (Table A.3, §4.1, App. B).
PAPER_TARGETS: dict[str, float] = {
    "p50": 1160.0,
    "p90": 4115.0,
    "p90_p50": 3.547,
    "max_completed": 11800.0,
    "truncated_share": 0.03,
    "prompt": 0.648,
    "sampling": 0.261,
    "checkpoint": 0.022,
    "interaction": 0.069,
}


def _words(h: int) -> list[int]:
    return [h & 0xFFFFFFFF, h >> 32]


# Calibration (scripts/calibrate_synthetic.py): Nelder–Mead on mu, the four sigmas, ceiling and the two runaway
# parameters, minimising squared relative errors against PAPER_TARGETS on 800 App. B designs (64 prompts × 8
# independent checkpoints × 8 samples, common random numbers); on fresh draws the defaults give P50 ≈ 1150,
# P90 ≈ 4098, 3.0 % truncated, longest completed response ≈ 11.8k per design, shares 64.3 / 2.3 / 7.0 / 26.4 %.
@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    """Parameters of the synthetic generator; the defaults are the calibrated ones (see docs/workloads.md)."""

    mu: float = 7.0449  # log of the bulk's typical length
    sigma_prompt: float = 0.7540  # sd of the prompt effect (log space)
    sigma_checkpoint: float = 0.2782  # sd of the per-step checkpoint drift (log space)
    sigma_interaction: float = 0.2772  # sd of the prompt×checkpoint interaction (log space)
    sigma_sample: float = 0.4333  # sd of the sampling noise (log space)
    drift_window: int = 24  # the checkpoint drift is a moving average over this many steps (1: independent)
    trend_per_step: float = 0.0  # deterministic log-length drift per rollout step
    ceiling: float = 12130.0  # soft upper bound of completed responses (tokens)
    ceiling_sharpness: float = 4.0  # exponent k of the smooth minimum x / (1 + (x/ceiling)^k)^(1/k)
    runaway_logit: float = -10.420  # intercept of the per-response runaway (truncation) probability
    runaway_prompt_slope: float = 5.260  # runaway logit per unit of the standardised prompt effect
    max_length: int = 16384  # truncation cap (§4.1: 16K output tokens)
    n_prompts: int = 2048  # size of the synthetic prompt set
    tail_ratio: float | None = None  # App. A.5 target P90/P50 (None: untransformed)
    growth: float = 1.0  # length multiplier reached at `growth_steps` (log-linear ramp, flat after; 1: none)
    growth_steps: int = 200  # rollout steps over which `growth` is reached
    prompt_prefix: str = "math"  # prompt ids are f"{prefix}-{i:05d}"

    def __post_init__(self) -> None:
        for name in ("mu", "trend_per_step", "runaway_logit", "runaway_prompt_slope"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"synthetic {name} must be finite, got {getattr(self, name)}")
        for name in ("sigma_prompt", "sigma_checkpoint", "sigma_interaction", "sigma_sample"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ConfigError(f"synthetic {name} must be a finite number >= 0, got {v}")
        if not (math.isfinite(self.ceiling_sharpness) and self.ceiling_sharpness > 0):
            raise ConfigError(f"synthetic ceiling_sharpness must be > 0, got {self.ceiling_sharpness}")
        if self.drift_window < 1:
            raise ConfigError(f"synthetic drift_window must be >= 1 step, got {self.drift_window}")
        if self.max_length < 1:
            raise ConfigError(f"synthetic max_length must be >= 1, got {self.max_length}")
        if not (math.isfinite(self.ceiling) and self.ceiling > 0):
            raise ConfigError(f"synthetic ceiling must be > 0, got {self.ceiling}")
        if self.n_prompts < 1:
            raise ConfigError(f"synthetic n_prompts must be >= 1, got {self.n_prompts}")
        if not (math.isfinite(self.growth) and self.growth > 0):
            raise ConfigError(f"synthetic growth must be a finite number > 0, got {self.growth}")
        if self.growth_steps < 1:
            raise ConfigError(f"synthetic growth_steps must be >= 1, got {self.growth_steps}")
        if self.tail_ratio is not None and not (math.isfinite(self.tail_ratio) and self.tail_ratio > 1):
            raise ConfigError(f"synthetic tail_ratio must be a finite number > 1, got {self.tail_ratio}")


# Median and P90 of the untransformed default generator (mean of four 262k-response App. B-design samples;
# tested), the reference M and P90 of the A.5 transform for the weak/strong variants.
REFERENCE_P50 = 1150.0
REFERENCE_P90 = 4090.0


@dataclass(frozen=True, slots=True)
class SyntheticModel:
    """The generator: `lengths(prompt, generation, step, G)` is pure in its arguments and `seed`."""

    config: SyntheticConfig
    seed: int = 0
    prompts: tuple[str, ...] = field(init=False, repr=False)
    _prompt_effect: dict[str, float] = field(init=False, repr=False, compare=False)
    _kernel: NDArray[np.float64] = field(init=False, repr=False, compare=False)
    _blocks: dict[int, NDArray[np.float64]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        width = max(5, len(str(self.config.n_prompts - 1)))
        prompts = tuple(f"{self.config.prompt_prefix}-{i:0{width}d}" for i in range(self.config.n_prompts))
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _TAG_PROMPT]))
        # stratified normal scores in random order: a finite prompt set has exactly normal prompt-effect quantiles
        n = self.config.n_prompts
        inv = NormalDist().inv_cdf
        z = np.array([inv(q) for q in ((rng.permutation(n) + 0.5) / n).tolist()])
        object.__setattr__(self, "prompts", prompts)
        object.__setattr__(self, "_prompt_effect", dict(zip(prompts, z.tolist(), strict=True)))
        # Checkpoint drift: a Hann-weighted moving average of i.i.d. per-step innovations (unit variance), smooth
        # in the step, stationary, and exactly uncorrelated at lags >= drift_window.
        w = np.hanning(self.config.drift_window + 2)[1:-1]
        object.__setattr__(self, "_kernel", w / np.sqrt((w**2).sum()))
        object.__setattr__(self, "_blocks", {})  # memo of innovation blocks (deterministic, so purity holds)

    @property
    def checkpoint_spacing(self) -> int:
        """Steps between the App. B design's checkpoints: one drift window, so their drifts are independent."""
        return self.config.drift_window

    def _innovations(self, lo: int, hi: int) -> NDArray[np.float64]:
        """Per-step N(0, 1) innovations for steps lo..hi-1 (negative steps too: the drift's warm-up)."""
        out = []
        for b in range(lo // _DRIFT_BLOCK, (hi - 1) // _DRIFT_BLOCK + 1):
            if b not in self._blocks:
                ss = np.random.SeedSequence([self.seed, _TAG_CKPT, b + 2**31])  # offset keeps entropy >= 0
                self._blocks[b] = np.random.default_rng(ss).standard_normal(_DRIFT_BLOCK)
            out.append(self._blocks[b])
        first = (lo // _DRIFT_BLOCK) * _DRIFT_BLOCK
        return np.concatenate(out)[lo - first : hi - first]

    @property
    def max_length(self) -> int:
        """Largest length the generator can return (the cap, stretched by the A.5 transform when r > P90/P50)."""
        cap = self.config.max_length
        if self.config.tail_ratio is None:
            return cap
        return int(np.rint(self._transform(np.array([cap], dtype=np.float64)))[0])

    def _transform(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        assert self.config.tail_ratio is not None
        return tail_transform(x, self.config.tail_ratio, median=REFERENCE_P50, p90=REFERENCE_P90)

    def prompt_z(self, prompt_id: str) -> float:
        """Standardised prompt effect (N(0, 1) over the prompt set)."""
        z = self._prompt_effect.get(prompt_id)
        if z is None:
            raise ConfigError(f"synthetic workload: unknown prompt id {excerpt(prompt_id)}")
        return z

    def checkpoint_effect(self, step: int) -> float:
        """Log-space drift of checkpoint `step` (shared by all prompts): smooth in `step`, sd `sigma_checkpoint`."""
        c = self.config
        k = self._kernel
        wiggle = float(self._innovations(step - k.size + 1, step + 1) @ k)
        out = c.sigma_checkpoint * wiggle + c.trend_per_step * step
        if c.growth != 1.0:  # the ramp is skipped entirely otherwise: default draws stay bit-identical
            out += math.log(c.growth) * min(step, c.growth_steps) / c.growth_steps
        return out

    def interaction_effect(self, prompt_id: str, step: int) -> float:
        """Log-space prompt×checkpoint interaction."""
        h = _words(stable_hash(prompt_id))
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, _TAG_INTER, *h, step]))
        return self.config.sigma_interaction * float(rng.standard_normal())

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """G response lengths of generation `generation` of `prompt_id` at checkpoint `step`."""
        c = self.config
        z = self.prompt_z(prompt_id)
        rng = np.random.default_rng(
            np.random.SeedSequence([self.seed, _TAG_SAMPLE, *_words(stable_hash(prompt_id)), generation])
        )
        eps = rng.standard_normal(group_size)
        u = rng.random(group_size)
        base = c.mu + c.sigma_prompt * z + self.checkpoint_effect(step) + self.interaction_effect(prompt_id, step)
        return self._finish(base + c.sigma_sample * eps, u, np.full(group_size, z))

    def _finish(self, logx: NDArray[np.float64], u: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.int64]:
        """Soft ceiling, runaway truncation, rounding and the optional A.5 transform (vectorised)."""
        c = self.config
        x = np.exp(logx)
        k = c.ceiling_sharpness
        bulk = x / (1.0 + (x / c.ceiling) ** k) ** (1.0 / k)
        p_run = 1.0 / (1.0 + np.exp(-(c.runaway_logit + c.runaway_prompt_slope * z)))
        out = np.where(u < p_run, float(c.max_length), np.minimum(bulk, c.max_length))
        out = np.maximum(np.rint(out), 1.0)
        if c.tail_ratio is not None:
            out = np.rint(self._transform(out))
        return out.astype(np.int64)

    def grid(self, n_prompts: int, n_checkpoints: int, n_samples: int) -> NDArray[np.int64]:
        """An App. B design (I×S×R): prompt i's s-th generation at step s·`checkpoint_spacing`, R samples each."""
        if n_prompts > len(self.prompts):
            raise ConfigError(f"grid needs {n_prompts} prompts, the workload has {len(self.prompts)}")
        out = np.empty((n_prompts, n_checkpoints, n_samples), dtype=np.int64)
        for i, p in enumerate(self.prompts[:n_prompts]):
            for s in range(n_checkpoints):
                out[i, s] = self.lengths(p, s, s * self.checkpoint_spacing, n_samples)
        return out
