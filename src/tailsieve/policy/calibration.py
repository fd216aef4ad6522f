"""The controller's calibration (§3.2): how far measured pool times are from the forecasts, learnt online.

Two factors per forecast class (tail pool, bulk pool, uniform boundary), both EMAs:
- **model error** (`ControlState.calib_*`): measured / the model on this step's own requests (`policy.observed`).
  What the all-admit model misses on this fleet (engine overheads, context effects, tool calls between turns):
  1 in the simulator unless the workload has tool calls. It carries little luck of the draw, so it may move fast
  (weight `ema`, clipped to `calib_bounds`); a pool's first ratio seeds it, and until then it borrows the nearest
  measured one (`model_errors`).
- **forecast bias** (`ControlState.bias_*`, a log-EMA): the model on this step's requests / the bootstrap forecast
  at the executed split. What the resampled history gets wrong about the next step (a candidate model that
  over- or under-rates the selector, a mean-field forecast that runs early). One step's ratio is mostly luck (a
  regenerated group with a response at the cap doubles T_tail), so each step's log-ratio is clipped to
  ±`BIAS_CLIP` and enters a slow EMA (weight `bias_ema`): one outlier moves a forecast by 2%, a lasting bias is
  learnt in about ten steps (issue 22: a single 2× step used to hold the controller at uniform for 10–14 steps).
A pool's forecast is multiplied by their product (`factors`). A two-pool split has one more, on the step:
- **spread bias** (`ControlState.bias_step`, a log-EMA clipped the same way, its first 1/`bias_ema` steps averaged:
  `step_weight`; `learn_spread`): measured makespan / the calibrated E[max(c_tail·T_tail, c_bulk·T_bulk)] at the
  executed split, with the factors that step has just updated. The bootstrap pools can have each pool's mean right
  and still under-state the step-to-step spread (kodcode-r1, (7, 4): T_bulk's spread 36.6 s measured against
  10.4 s across the resampled pools), which makes E[max] and so every split look faster than it is, by 6–7%
  there, against a uniform forecast that is right (uniform has no max of two pools).
While the controller stays at uniform the two-pool biases decay toward 0 at the same rate (the history they
corrected has been replaced). The uniform boundary keeps its own pair, learnt at uniform steps only: a two-pool
bulk pool (by-request dispatch, a cutoff, pinned candidates) is a different forecast.
Without a per-request record (`StepObservation.work` is None) the model error is measured against the bootstrap
forecast, as before issue 22, and the bias stays 0.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from tailsieve.policy.control_state import ControllerConfig, ControlState, StepObservation

BIAS_CLIP = 0.2  # most one step moves the log forecast bias before the EMA (±22%)
PRIOR_STEPS = 2  # weight of the spread bias's zero prior in the running mean of its first steps (`step_weight`)
COUNTERFACTUAL_CLIP = 0.5  # the same for a split step's uniform counterfactual (`learn_uniform`): a lasting bias
# of the uniform forecast is 10–25% (pooled bootstrap, censored imputation), and ±0.2 would learn at most 18% of it


def ema(prev: float, x: float, a: float) -> float:
    """Exponential moving average with weight `a` on the newest value; NaN `prev` (nothing seen yet) gives `x`."""
    return x if math.isnan(prev) else (1 - a) * prev + a * x


def model_errors(state: ControlState) -> tuple[float, float]:
    """(tail, bulk) model error: each pool's own once a two-pool step measured it, before that the nearest one
    measured (the other pool's, then the uniform boundary's, then 1). The model error is a property of the fleet
    (engine overheads, tool calls between turns), not of the split: a split priced at 1 against a uniform boundary
    measured at 1.5 looks 50% faster than it is, and the spread bias then learns the model error's lag while the
    pool's own factor catches up, and keeps it after (agent-search, Mixtral on 4×H100: 8% against every split)."""
    uniform = 1.0 if math.isnan(state.calib_uniform) else state.calib_uniform
    tail, bulk = state.calib_tail, state.calib_bulk
    return (tail if not math.isnan(tail) else bulk if not math.isnan(bulk) else uniform,
            bulk if not math.isnan(bulk) else tail if not math.isnan(tail) else uniform)


def factors(state: ControlState) -> tuple[float, float, float]:
    """(c_tail, c_bulk, c_uniform): model error × forecast bias of each forecast class (`model_errors`; the uniform
    pair falls back to the bulk's until a uniform step was seen)."""
    mt, mb = model_errors(state)
    ct = mt * math.exp(state.bias_tail)
    cb = mb * math.exp(state.bias_bulk)
    cu = cb if math.isnan(state.calib_uniform) else state.calib_uniform * math.exp(state.bias_uniform)
    return ct, cb, cu


def _log_ratio(observed: float, forecast: float, clip: float) -> float | None:
    """One step's log(observed / forecast), clipped to ±clip (None: nothing measured)."""
    if not (observed > 0 and forecast > 0):
        return None
    return float(np.clip(math.log(observed / forecast), -clip, clip))


def _log_step(prev: float, observed: float, forecast: float, a: float, clip: float = BIAS_CLIP) -> float:
    x = _log_ratio(observed, forecast, clip)
    return prev if x is None else (1 - a) * prev + a * x


def _spread(var: float, prev: float, observed: float, forecast: float, a: float, clip: float = BIAS_CLIP) -> float:
    """EMA (weight a) of the squared deviation of one step's clipped log-ratio from the bias learnt before it: how
    much a bias estimate moves step to step (NaN `var`: none seen yet)."""
    x = _log_ratio(observed, forecast, clip)
    return var if x is None else ema(var, (x - prev) ** 2, a)


def history_variance(split: np.ndarray, uniform: np.ndarray, steps: int) -> float:
    """Variance of the log forecast gain log(T̂(0, 0) / T̂(q, m)) from the H history steps the bootstrap pools are
    drawn from (pool k from step k mod H, `Predictor(blocks=)`): the jackknife over steps, on the paired per-pool
    makespans (a split's bulk pool and the uniform step share their fresh groups), shrunk toward the prior
    BIAS_CLIP²/H with the weight of one step. Without per-step pools (pooled draws, H < 2): the prior."""
    prior = BIAS_CLIP ** 2 / max(steps, 1)
    k = len(split)
    if steps < 2 or k % steps or k != len(uniform):
        return prior
    by_step = np.arange(k) % steps
    s = np.bincount(by_step, weights=split, minlength=steps)
    u = np.bincount(by_step, weights=uniform, minlength=steps)
    if np.any(s.sum() - s <= 0) or np.any(u.sum() - u <= 0):
        return prior
    g = np.log((u.sum() - u) / (s.sum() - s))  # the gain without step h
    jack = (steps - 1) / steps * float(np.sum((g - g.mean()) ** 2))
    return (prior + (steps - 1) * jack) / steps


def step_weight(n: int, a: float) -> float:
    """Weight of the n-th two-pool step in the spread bias: 1/(n + PRIOR_STEPS) until that is below a, then a. The
    first steps make a running mean in which the zero prior counts as PRIOR_STEPS steps: an EMA of weight a from 0
    would keep 1 − (1 − a)^n of the prior after n steps (66% after four), so a split tried for three steps that
    did not pay had learnt a third of it; a plain mean (no prior) lets one noisy first step decide."""
    return max(a, 1.0 / (max(n, 0) + PRIOR_STEPS))


def forecast_noise(state: ControlState, a: float, history: float | None = None) -> float:
    """Standard error of the log gap between the uniform and the two-pool forecasts. The uniform bias is an EMA of
    weight a over per-step log-ratios of spread σ_u (unmeasured: BIAS_CLIP), so it wanders by σ_u·√(a/(2 − a)); the
    spread bias is the running mean of its first n steps (`step_weight`), off by σ_s/√(n + PRIOR_STEPS), then an EMA
    like the uniform one (unmeasured: BIAS_CLIP·√(a/(2 − a))); and the forecasts rest on the H steps of the history:
    `history` is the gain's variance over them (`history_variance`; None: each step off by up to BIAS_CLIP,
    BIAS_CLIP²/H). A forecast gain smaller than this is noise, not the workload."""
    prior = BIAS_CLIP ** 2
    ema_share = a / (2 - a)
    vu = prior if math.isnan(state.var_uniform) else state.var_uniform
    vs = prior * ema_share if math.isnan(state.var_step) else \
        state.var_step * max(1 / (state.seen_step + PRIOR_STEPS), ema_share)
    h = prior / max(len(state.history), 1) if history is None else history
    return math.sqrt(vu * ema_share + vs + h)


def learn_spread(state: ControlState, obs: StepObservation, config: ControllerConfig,
                 forecast_step: float) -> ControlState:
    """The spread bias after one steady two-pool step: its measured makespan against `forecast_step`, the calibrated
    E[max] at the executed split with the factors this step has just updated (`calibrate`), so that the spread bias
    learns only what the factors do not (with the factors from before the step it also learnt their lag)."""
    if obs.warmup or not (obs.m > 0 and obs.q > 0 and forecast_step > 0):
        return state
    span = max(obs.tail_s, obs.bulk_s)
    w = step_weight(state.seen_step + 1, config.bias_ema)
    return replace(state, bias_step=_log_step(state.bias_step, span, forecast_step, w),
                   var_step=_spread(state.var_step, state.bias_step, span, forecast_step, w),
                   seen_step=state.seen_step + 1)


def calibrate(state: ControlState, obs: StepObservation, config: ControllerConfig, *,
              modelled: tuple[float, float] | None, forecast: tuple[float, float]) -> ControlState:
    """The model errors and forecast biases after one steady step (the spread bias: `learn_spread`, after this).
    `modelled`: (T_tail, T_bulk) of the model on the step's own requests (None: no per-request record);
    `forecast`: the bootstrap forecast's (T_tail, T_bulk) at the executed split."""
    if obs.warmup:
        return state
    b = config.bias_ema
    lo, hi = config.calib_bounds
    a = config.ema
    ft, fb = modelled if modelled is not None else forecast
    s = state
    if obs.m > 0 and obs.q > 0 and ft > 0:
        s = replace(s, calib_tail=ema(s.calib_tail, float(np.clip(obs.tail_s / ft, lo, hi)), a))
        if modelled is not None:
            s = replace(s, bias_tail=_log_step(s.bias_tail, ft, forecast[0], b))
    if fb > 0:
        ratio = float(np.clip(obs.bulk_s / fb, lo, hi))
        if obs.m > 0:
            s = replace(s, calib_bulk=ema(s.calib_bulk, ratio, a))
            if modelled is not None:
                s = replace(s, bias_bulk=_log_step(s.bias_bulk, fb, forecast[1], b))
        else:
            s = replace(s, calib_uniform=ema(s.calib_uniform, ratio, a))
            if modelled is not None:
                s = replace(s, bias_uniform=_log_step(s.bias_uniform, fb, forecast[1], b),
                            var_uniform=_spread(s.var_uniform, s.bias_uniform, fb, forecast[1], b))
    if obs.m == 0:  # the two-pool biases age while no split runs: their evidence is from an older history
        s = replace(s, bias_tail=(1 - b) * s.bias_tail, bias_bulk=(1 - b) * s.bias_bulk,
                    bias_step=(1 - b) * s.bias_step, var_step=age_spread(s.var_step, b))
    return s


def age_spread(var: float, a: float) -> float:
    """The spread bias's measured step-to-step variance one uniform step later: it returns toward the unmeasured
    prior BIAS_CLIP² at the rate the bias itself decays toward 0 (NaN: never measured, stays NaN). The estimate
    ages, so the confidence in it must age too: a split measured once and left long ago is no better known than
    one never tried."""
    return var if math.isnan(var) else ema(var, BIAS_CLIP ** 2, a)


def learn_uniform(state: ControlState, counterfactual: float, forecast: float,
                  config: ControllerConfig) -> ControlState:
    """The uniform boundary's forecast bias learnt at a two-pool step: the model on the fresh groups a uniform step
    would have run (the last split step's, cut ones completed by their regenerations) / the bootstrap forecast.
    Without it the uniform forecast is corrected only at uniform steps, which a controller in a split never runs."""
    a, clip = config.bias_ema, COUNTERFACTUAL_CLIP
    return replace(state, bias_uniform=_log_step(state.bias_uniform, counterfactual, forecast, a, clip),
                   var_uniform=_spread(state.var_uniform, state.bias_uniform, counterfactual, forecast, a, clip))
