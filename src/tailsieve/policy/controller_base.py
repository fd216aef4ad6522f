"""The base of every controller (§3.2): the registry `CONTROLLERS` and `Controller`, which holds what the adaptive
policies share (learning from a step, pricing an option). The policies themselves, one file each, each extending
`Controller` directly: `uniform.py`, `static.py`, `paper.py` (`tailsieve-paper`), `tailsieve_rule.py` (`tailsieve`)
and `fixed.py` (`tailsieve-fixed`), the last two over the rule of `paired_rule.py`; `controller.py` declares the
registry's order."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar, TypeVar

import numpy as np

from tailsieve.model.curves import TpotCurve
from tailsieve.policy.calibration import calibrate, ema, factors, uniform_factor
from tailsieve.policy.control_state import ControllerConfig, ControlState, StepObservation
from tailsieve.policy.decision import Decision, Reason
from tailsieve.policy.fresh import fresh_sample
from tailsieve.policy.observed import observed_times
from tailsieve.policy.predictor import FloatArray, Predictor, PredictorFacts, split_half_candidates
from tailsieve.policy.router import RouterConfig
from tailsieve.registry import Registry

__all__ = ["CONTROLLERS", "Controller", "register"]


def _controller_class(obj: object) -> str | None:
    return None if isinstance(obj, type) and issubclass(obj, Controller) else "not a subclass of Controller"


def _named(name: str, cls: type[Controller]) -> None:
    cls.name = name


# the policies of the step loop (`tailsieve.registry.Registry`; plugins: `pkg.module:Class`, group tailsieve.policies)
CONTROLLERS: Registry[type[Controller]] = Registry("policy", "tailsieve.policies", check=_controller_class,
                                                   on_add=_named)
C = TypeVar("C", bound="type[Controller]")


def register(name: str) -> Callable[[C], C]:
    """Class decorator adding a controller to `CONTROLLERS` under `name` (a name taken by another class is refused)."""
    return CONTROLLERS.register(name)


class Controller(ABC):
    """Base: decides (q, m) for the next step. Subclasses implement `update` (abstract: the base itself, or a
    subclass without `update`, is refused as a policy at load)."""

    name: ClassVar[str] = ""
    min_replicas: ClassVar[int] = 2  # replicas a run needs: a tail and a bulk pool (uniform: 1)
    state_type: ClassVar[type[ControlState]] = ControlState  # a controller with state of its own: its class

    def __init__(
        self,
        router: RouterConfig,
        curve: TpotCurve,
        config: ControllerConfig | None = None,
        *,
        q: int | None = None,
        m: int | None = None,
        tail_curve: TpotCurve | None = None,
        kv_s_per_token: float = 0.0,
        prefill_s: float = 0.0,
        kv_tokens: int = 0,
        prompt_tokens: float = 0.0,
    ) -> None:
        self.router = router
        self.kv_tokens = kv_tokens  # a replica's KV capacity in tokens, when its model file holds it (0: not priced)
        self.prompt_tokens = prompt_tokens  # the prompts' mean tokens (the KV a request holds before decoding)
        self.kv_s_per_token = kv_s_per_token  # the replicas' KV-traffic term, when known (ReplicaConfig)
        self.prefill_s = prefill_s  # seconds to prefill one prompt on one replica (shared by a group's requests there)
        self.curve = curve  # the bulk pool's curve (every replica's in uniform and warm-up steps)
        self.tail_curve = curve if tail_curve is None else tail_curve  # the tail pool's (§3.4)
        self.config = config or ControllerConfig()
        self.fixed_q, self.fixed_m = q, m

    def initial(self) -> ControlState:
        """State before the first step (a `state_type`): m = `start_m` clipped to R − 1, q = max(q0, 1) at a split
        and 0 at the uniform boundary, which places whole groups."""
        m0 = min(self.start_m(), max(self.router.replicas - 1, 0))
        q0 = max(self.config.q0, 1) if m0 > 0 else 0
        return self.state_type(q=q0, m=m0, decision=Decision(q0, m0, Reason.START))

    def start_m(self) -> int:
        """The first step's tail-pool size: `m0` (None: R // 2)."""
        return self.config.m0 if self.config.m0 is not None else self.router.replicas // 2

    @abstractmethod
    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Next state after observing one step."""

    # learning from a step --------------------------------------------------------------------------------------
    def learn(self, state: ControlState, obs: StepObservation) -> tuple[ControlState, Predictor]:
        """The state after one step, before deciding: this step's fresh groups and candidates added to the
        history, the model errors and the price of a pool move updated; and the predictor over the new history."""
        state = self._with_history(state, obs)
        state = self._learn_move_cost(state, obs)
        if obs.warmup:
            return state, self.predictor(state)
        if obs.work is not None:
            modelled = observed_times(obs.work, tail_curve=self.tail_curve, bulk_curve=self.curve,
                                      kv_s_per_token=self.kv_s_per_token, prefill_s=self.prefill_s)
            return calibrate(state, obs, self.config.ema, modelled), self.predictor(state)
        pred = self.predictor(state)  # no per-request record: against the forecast at the executed split
        ft = float(np.mean(pred.tail_times(obs.q, obs.m))) if obs.m > 0 and obs.q > 0 else 0.0
        fb = float(np.mean(pred.bulk_times(obs.q, obs.m) if obs.m > 0 else pred.uniform_times()))
        return calibrate(state, obs, self.config.ema, (ft, fb)), pred

    def _with_history(self, state: ControlState, obs: StepObservation) -> ControlState:
        """§3.2's response-work history: each step's fresh groups (cut members completed, `policy.fresh`), and the
        candidates regenerated (at a uniform step, the split-half stand-ins its batch holds)."""
        keep = self.config.history_steps
        sample = None if obs.work is None else fresh_sample(obs.work, state.history, obs.step)
        hist = (*state.history, obs.consumed_lengths if sample is None else sample)[-keep:]
        tails = state.tail_history
        if obs.m > 0 and obs.q > 0 and not obs.warmup:
            # every regenerated candidate: the q isolated ones and the ones run pinned in the bulk pool
            tails = (*tails, obs.consumed_lengths[: obs.q + obs.pinned])[-2 * keep :]
        elif obs.m == 0 and not obs.warmup and self.router.extra > 0 and len(obs.consumed_lengths) > 1:
            tails = (*tails, self.uniform_candidates(obs.consumed_lengths))[-2 * keep :]
        return replace(state, history=hist, tail_history=tails)

    def uniform_candidates(self, batch: np.ndarray) -> np.ndarray:
        """The E candidates a uniform step's batch stands for, likeliest tail first: ranked on one half of each
        group's members, their regenerated lengths the other half (`predictor.split_half_candidates`)."""
        width = min(self.router.extra, batch.shape[0])
        out: np.ndarray = split_half_candidates(batch[None].astype(np.float64), width)[0].astype(np.int64)
        return out

    def _learn_move_cost(self, state: ControlState, obs: StepObservation) -> ControlState:
        """EMA of the restart seconds of the steps whose m changed and that restarted replicas; remembers m."""
        cost = state.move_cost_s
        if obs.m != state.last_m and obs.restart_s > 0:
            cost = ema(cost, obs.restart_s, self.config.ema)
        return replace(state, move_cost_s=cost, last_m=obs.m)

    def move_cost(self, state: ControlState) -> float:
        """Seconds a pool move costs: the measured restart EMA, else the configured prior."""
        return self.config.move_cost_s if math.isnan(state.move_cost_s) else state.move_cost_s

    # pricing options ---------------------------------------------------------------------------------------------
    def facts(self, state: ControlState) -> PredictorFacts:
        """What the predictor prices on besides the history: the router's shape, placement and pinning, the pools'
        curves and cost terms, and the state's placement at the uniform boundary."""
        return PredictorFacts(
            groups=self.router.groups, extra=self.router.extra, replicas=self.router.replicas, curve=self.curve,
            tail_curve=self.tail_curve, by_request=self.router.dispatch.value == "request",
            uniform_by_request=state.uniform_dispatch == "request", pinned_candidates=self.router.pins_candidates,
            kv_s_per_token=self.kv_s_per_token, prefill_s=self.prefill_s, kv_tokens=self.kv_tokens,
            prompt_tokens=self.prompt_tokens)

    def predictor(self, state: ControlState) -> Predictor:
        """The forecast model over the current history, pool k drawn within history step k mod H."""
        return Predictor(np.concatenate(state.history), self.facts(state),
                         candidates=np.concatenate(state.tail_history) if state.tail_history else None,
                         candidate_steps=state.tail_history, blocks=tuple(h.shape[0] for h in state.history))

    def times(self, state: ControlState, pred: Predictor, q: int, m: int, dispatch: str | None = None) -> FloatArray:
        """(K,) calibrated step seconds per bootstrap pool: max(c_tail·T_tail, c_bulk·T_bulk) for a split (§3.2),
        c_uniform·T_uniform at the uniform boundary with `dispatch` (default: the state's placement)."""
        ct, cb, cu = factors(state)
        if m == 0:
            dealt = (dispatch or state.uniform_dispatch) == "request"
            own = uniform_factor(state, dealt)
            out: FloatArray = pred.uniform_times(dealt) * (cu if math.isnan(own) else own)
            return out
        return pred.split_times(q, m, ct, cb)

    def q_limit(self) -> int:
        """q never exceeds the candidates a step produces (E), nor N − 1."""
        return max(1, min(self.router.extra, self.router.groups - 1))

    def q_grid(self, around: int | None = None) -> list[int]:
        """The isolation sizes priced at a split: all of 1..q_limit up to 12, else 8 spread over the range, the
        limit, and `around` ± 1, 2, 4."""
        qmax = self.q_limit()
        if qmax <= 12:
            return list(range(1, qmax + 1))
        qs = set(np.linspace(1, qmax, 8).round().astype(int).tolist()) | {qmax}
        if around is not None:
            qs |= {around + d for d in (-4, -2, -1, 0, 1, 2, 4) if 1 <= around + d <= qmax}
        return sorted(qs)

    def best_q(self, state: ControlState, pred: Predictor, m: int, around: int | None = None) -> tuple[int, float]:
        """argmin over `q_grid` of the calibrated T̂(q, m) (ties: the smaller q), and that T̂. Where non-isolated
        candidates run pinned (the default redraw limit), q = E: a candidate left in the bulk pool holds its cutoff,
        the stand-in candidates of uniform steps know the selector only from half-groups and rate a pinned one too
        short, and the mean field cannot see a pinned group hold the cutoff from its own replica; the best static
        split in hindsight isolates every candidate in 29 of the first 30 tuning regimes of the family."""
        qs = [self.q_limit()] if self.router.pins_candidates else self.q_grid(around)
        pred.prefetch(qs, m)
        scored = min((float(np.mean(self.times(state, pred, q, m))), q) for q in qs)
        return scored[1], scored[0]

    def feasible(self, state: ControlState, pred: Predictor, mc: int, deadline: float) -> bool:
        """C.2 deadline feasibility of moving the split from m to `mc` (both > 0) at the current predicted barrier:
        the pool gaining replicas must absorb at least the groups the losing pool can no longer finish by the
        deadline (G_tail(m) ≥ D_bulk(m), or mirrored)."""
        n, q, m = self.router.groups, state.q, state.m
        ct, cb, _ = factors(state)
        if mc > m:
            qmax = min(n - 1, 4 * self.router.extra + 4)
            gained = max(0, pred.tail_capacity(deadline / ct, mc, qmax) - q)
            dropped = max(0, (n - q) - pred.bulk_capacity(deadline / cb, q, mc))
        else:
            gained = max(0, pred.bulk_capacity(deadline / cb, q, mc) - (n - q))
            dropped = max(0, q - pred.tail_capacity(deadline / ct, mc, q))
        return gained >= dropped
