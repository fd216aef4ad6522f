"""Hierarchical controller (§3.2, App. C.1–C.2), pure: a frozen state and a step observation in, a new state out.

Registry `CONTROLLERS` (name → class, filled by `@register`): `uniform`, `static`, `tailsieve-fixed`,
`tailsieve` and `tailsieve-paper`. Each has one required method, `update`; `initial` and the outer loop's hooks
(`split_q`, `q_after_move`) have defaults, so a variant overrides a hook instead of the base checking its name.

`tailsieve-paper` follows the paper literally: the inner loop moves q toward q* = N·r̄_tail/(r̄_bulk + r̄_tail)
from EMA-smoothed pool rates. That rule has a fixed point wherever the two pools finish together, and the tail
pool's time barely grows with q at low concurrency, so it tends to stay at q = 1. `tailsieve` replaces the rate
model by the calibrated predictor (`predictor.py`): the inner loop moves q toward argmin_q T̂(q, m) and the
measured/predicted ratio of each pool (EMA) corrects the forecasts online. Both keep damping (momentum), a
bounded step, a gain threshold, and the settle holds (one step after an increase, two after a decrease).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar, TypeVar

import numpy as np

from tailsieve.inputs import check_tail_replicas
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.calibration import calibrate, ema, factors, learn_spread, learn_uniform
from tailsieve.policy.control_state import ControllerConfig, ControlState, StepObservation
from tailsieve.policy.fresh import complete, fresh_record, fresh_sample, regenerations
from tailsieve.policy.observed import observed_times, uniform_counterfactual
from tailsieve.policy.outer import OuterLoop
from tailsieve.policy.predictor import Predictor, split_half_candidates
from tailsieve.policy.router import RouterConfig
from tailsieve.registry import Registry

__all__ = ["CONTROLLERS", "ControlState", "Controller", "ControllerConfig", "StepObservation", "TailSieveController",
           "TailSieveFixedController", "TailSievePaperController", "register"]


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


class Controller(OuterLoop):
    """Base: decides (q, m) for the next step. Subclasses implement `update`."""

    name: ClassVar[str] = ""
    min_replicas: ClassVar[int] = 2  # replicas a run needs: a tail and a bulk pool (uniform: 1)
    # outer-loop rules beyond C.2 (on for `tailsieve`, off for the literal `tailsieve-paper`): leave uniform straight
    # to the best split; no reversal of a move of m before `min_dwell` steps
    jump_from_uniform: ClassVar[bool] = False
    guard_reversal: ClassVar[bool] = False
    price_return: ClassVar[bool] = False  # a return to uniform must repay the waiting candidates' step
    choose_placement: ClassVar[bool] = False  # uniform steps deal requests or whole groups, whichever forecasts faster
    scan_m: ClassVar[bool] = False  # the outer loop scores splits over the whole range of m, not only its radius
    gain_on_target: ClassVar[bool] = False  # the q gain test prices the target, not the bounded step (`_move_q`)
    noise_gate: ClassVar[bool] = False  # leaving uniform needs a gain beyond the forecasts' noise (`leave_gain`)
    by_step: ClassVar[bool] = False  # bootstrap pools drawn within one history step each (`predictor._draw_rows`)
    outer_early: ClassVar[bool] = False  # the outer loop may move m while q is still moving (`_outer_while_moving`)

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
    ) -> None:
        self.router = router
        self.kv_s_per_token = kv_s_per_token  # the replicas' KV-traffic term, when known (ReplicaConfig)
        self.prefill_s = prefill_s  # seconds to prefill one prompt on one replica (shared by a group's requests there)
        self.curve = curve  # the bulk pool's curve (every replica's in uniform and warm-up steps)
        self.tail_curve = curve if tail_curve is None else tail_curve  # the tail pool's (§3.4)
        self.config = config or ControllerConfig()
        self.fixed_q, self.fixed_m = q, m

    def initial(self) -> ControlState:
        """State before the first step."""
        r = self.router.replicas
        m0 = min(self.config.m0 if self.config.m0 is not None else r // 2, max(r - 1, 0))
        # before any step is seen: deal requests unless a prompt prefill makes splitting a group costly
        dealt = "request" if self.choose_placement and self.prefill_s <= 0 else "group"
        return ControlState(q=max(self.config.q0, 1) if m0 > 0 else 0, m=m0, uniform_dispatch=dealt)

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Next state after observing one step."""
        raise NotImplementedError

    # helpers shared by the adaptive controllers -------------------------------------------------------------
    def _with_history(self, state: ControlState, obs: StepObservation,
                      redo: np.ndarray | None = None) -> ControlState:
        keep = self.config.history_steps
        past = state.history
        if redo is not None and past:  # the last step's sample, its cut groups completed by their regenerations
            past = (*past[:-1], redo)
        sample = None if obs.work is None else fresh_sample(obs.work, past, obs.step)
        hist = (*past, obs.consumed_lengths if sample is None else sample)[-keep:]
        tails = state.tail_history
        if obs.m > 0 and obs.q > 0 and not obs.warmup:
            # every regenerated candidate: the q isolated ones and the ones run pinned in the bulk pool
            tails = (*tails, obs.consumed_lengths[: obs.q + obs.pinned])[-2 * keep :]
        elif obs.m == 0 and not obs.warmup and self.router.extra > 0 and len(obs.consumed_lengths) > 1:
            # a uniform step regenerates no candidate, but its groups tell what a tail pool would have run: select
            # on one half of each group, regenerate with the other (the predictor's split-half prior); without
            # this one heavy observed step would price every split for as long as the controller stays uniform
            tails = (*tails, self.uniform_candidates(obs.consumed_lengths))[-2 * keep :]
        last: tuple[np.ndarray, ...] = ()
        if obs.work is not None and obs.work.uids is not None and obs.m > 0 and obs.q > 0 and not obs.warmup:
            rec = fresh_record(obs.work)
            last = () if rec is None or rec[:, 1].all() else (rec,)
        state = replace(state, history=hist, tail_history=tails, last_fresh=last)
        return self._learn_move_cost(state, obs)

    def completed_last(self, state: ControlState, obs: StepObservation) -> np.ndarray | None:
        """The last two-pool step's fresh groups with their cut members completed (`policy.fresh.complete`), now that
        this step regenerated them (None: nothing pending): what that step's fresh work really was, as well as it can
        be told; it replaces the sample made at the cutoff and prices the uniform boundary (`_calibrate`)."""
        if not state.last_fresh or obs.work is None or not state.history:
            return None
        rec = state.last_fresh[0]
        population = (rec[rec[:, 1] == 1, 3:], *state.history[:-1])
        return complete(rec, population, obs.step - 1, regenerations(obs.work))

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
            a = self.config.ema
            cost = ema(cost, obs.restart_s, a)
        return replace(state, move_cost_s=cost, last_m=obs.m)

    def predictor(self, state: ControlState) -> Predictor:
        """The forecast model over the current history."""
        return Predictor(
            np.concatenate(state.history),
            candidates=np.concatenate(state.tail_history) if state.tail_history else None,
            groups=self.router.groups,
            extra=self.router.extra,
            replicas=self.router.replicas,
            curve=self.curve,
            by_request=self.router.dispatch.value == "request",
            tail_curve=self.tail_curve,
            kv_s_per_token=self.kv_s_per_token,
            pinned_candidates=self.router.max_redraws <= 1,
            candidate_steps=state.tail_history,
            prefill_s=self.prefill_s,
            uniform_by_request=state.uniform_dispatch == "request",
            blocks=tuple(h.shape[0] for h in state.history) if self.by_step else None,
        )

    def _calibrated(self, state: ControlState, pred: Predictor, q: int, m: int) -> float:
        ct, cb, cu = factors(state)
        if m == 0:  # the uniform boundary with the state's placement
            return float(np.mean(pred.uniform_times(state.uniform_dispatch == "request"))) * cu
        return pred.makespan(q, m, ct, cb) * math.exp(state.bias_step)

    def _calibrate(self, state: ControlState, pred: Predictor, obs: StepObservation,
                   redo: np.ndarray | None = None) -> ControlState:
        """The model error and forecast bias after a step (`policy.calibration`): the model on the step's own
        requests (`policy.observed`) against the measured times and against the bootstrap forecast at the
        executed split (at uniform steps: with the placement that ran)."""
        if obs.warmup:
            return state
        modelled = None
        dealt = state.uniform_dispatch == "request"
        if obs.work is not None:
            modelled = observed_times(obs.work, tail_curve=self.tail_curve, bulk_curve=self.curve,
                                      kv_s_per_token=self.kv_s_per_token, prefill_s=self.prefill_s)
            lanes = obs.work.lanes
            dealt = bool(lanes.size) and bool((lanes != lanes[:, :1]).any())
        ft = float(np.mean(pred.tail_times(obs.q, obs.m))) if obs.m > 0 and obs.q > 0 else 0.0
        fb = float(np.mean(pred.bulk_times(obs.q, obs.m) if obs.m > 0 else pred.uniform_times(dealt)))
        state = calibrate(state, obs, self.config, modelled=modelled, forecast=(ft, fb))
        if obs.m > 0 and obs.q > 0 and modelled is not None:
            ct, cb, _ = factors(state)
            state = learn_spread(state, obs, self.config, pred.makespan(obs.q, obs.m, ct, cb))
        if redo is not None and redo.shape[0] == self.router.groups:
            # the uniform boundary priced on the last split step's fresh groups: what a uniform step would have run
            by_request = state.uniform_dispatch == "request"
            cf = uniform_counterfactual(redo, self.router.replicas, by_request, self.curve,
                                        kv_s_per_token=self.kv_s_per_token, prefill_s=self.prefill_s)
            state = learn_uniform(state, cf, float(np.mean(pred.uniform_times(by_request))), self.config)
        return state

    def q_limit(self) -> int:
        """q never exceeds the candidates a step produces (E), nor N − 1."""
        return max(1, min(self.router.extra, self.router.groups - 1))

    def best_q(self, state: ControlState, pred: Predictor, m: int, *, coarse: bool = False) -> tuple[int, float]:
        """argmin_q of the calibrated T̂(q, m) over 1..q_limit (a coarse grid plus a window when the range is wide;
        `coarse`: the grid alone, for splits far from the current one)."""
        qmax = self.q_limit()
        grid = set(np.linspace(1, qmax, 8 if coarse else 12).astype(int)) | {qmax}
        if qmax <= (12 if coarse else 24):
            qs = set(range(1, qmax + 1))
        elif coarse:
            qs = grid
        else:
            qs = grid | set(range(max(1, state.q - 6), min(qmax, state.q + 6) + 1))
        pred.prefetch(qs, m)
        scored = sorted((self._calibrated(state, pred, q, m), q) for q in qs)
        return scored[0][1], scored[0][0]


@register("uniform")
class UniformController(Controller):
    """Uniform group routing: (q, m) = (0, 0) forever."""

    min_replicas: ClassVar[int] = 1

    def initial(self) -> ControlState:
        """Always the uniform boundary."""
        return ControlState(q=0, m=0)

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Nothing to adapt."""
        return state


@register("static")
class StaticController(Controller):
    """A fixed (q, m) chosen by the user."""

    def initial(self) -> ControlState:
        """The user's (q, m); defaults q = ⌈E/2⌉, m = R // 4 (at least 1)."""
        r = self.router.replicas
        q = self.fixed_q if self.fixed_q is not None else max(1, math.ceil(self.router.extra / 2))
        m = self.fixed_m if self.fixed_m is not None else max(1, r // 4)
        if r >= 2:
            check_tail_replicas(m, r)
        return ControlState(q=q, m=m if r >= 2 else 0)

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Nothing to adapt."""
        return state


@register("tailsieve")
class TailSieveController(Controller):
    """Both loops, with the predictive inner loop (see module docstring)."""

    adapt_m: ClassVar[bool] = True
    jump_from_uniform: ClassVar[bool] = True
    guard_reversal: ClassVar[bool] = True
    price_return: ClassVar[bool] = True
    choose_placement: ClassVar[bool] = True
    scan_m: ClassVar[bool] = True
    gain_on_target: ClassVar[bool] = True  # the q gain test prices the target, not the bounded step (`_move_q`)
    noise_gate: ClassVar[bool] = True
    by_step: ClassVar[bool] = True
    outer_early: ClassVar[bool] = True

    def update(self, state: ControlState, obs: StepObservation) -> ControlState:
        """Learn from the step, then move q (inner loop) or, once q has settled, m (outer loop)."""
        redo = self.completed_last(state, obs)
        # a note says what this decision did or refused and why; none: it kept (q, m) for want of a reason to move
        state = replace(self._with_history(state, obs, redo), dwell=state.dwell + (0 if obs.warmup else 1),
                        since_move=state.since_move + 1, note="")
        pred = self.predictor(state)
        state = self._calibrate(state, pred, obs, redo)
        if state.m > 0:
            stepped, moved = self.inner(state, pred, obs)
            if moved:
                return self._outer_while_moving(state, stepped, pred, obs)
            state = stepped  # no move: the inner loop's damped velocity is kept
        if state.hold > 0:
            return replace(state, hold=state.hold - 1, note="hold")
        if obs.warmup:
            return state
        state = replace(state, settled=state.settled + 1)
        return self.outer(state, pred) if self.moves_m() else state

    def moves_m(self) -> bool:
        """Whether the outer loop runs: a policy that adapts m, on a fleet that can be split."""
        return self.adapt_m and self.router.replicas >= 2

    def _outer_while_moving(self, state: ControlState, moved: ControlState, pred: Predictor,
                            obs: StepObservation) -> ControlState:
        """A decision on which the inner loop moves q (`moved`): with `outer_early`, the outer loop is asked too,
        pricing this split at the q the inner loop is heading to (its target), and a move of m it makes wins. A
        start or a shift far from the optimum then does not serve every bounded q step at a split that, even at its
        best q, loses to uniform or to another m (agent-search from (q0 = 1, m0 = R/2): 8 split steps before the
        first return, each 20% slower than uniform). Otherwise the hierarchy of C.1/C.2 holds: q first, then m."""
        if not (self.outer_early and self.moves_m()) or obs.warmup:
            return moved
        target, _ = self.best_q(state, pred, state.m)
        out = self.outer(replace(state, q=target), pred)
        return out if out.m != state.m else moved

    def inner(self, state: ControlState, pred: Predictor, obs: StepObservation) -> tuple[ControlState, bool]:
        """C.1 discrete update toward argmin_q T̂(q, m): damped momentum, bounded step, gain threshold, holds."""
        if state.hold > 0:
            return state, False
        target, _ = self.best_q(state, pred, state.m)
        return self._move_q(state, float(target), lambda q: self._calibrated(state, pred, q, state.m))

    def q_step(self) -> int:
        """Most groups one q move shifts: `max_q_step`, at least a quarter of the range 1..q_limit (so q can cross
        a wide range, E = 52 at N = 512, in a bounded number of decisions)."""
        return max(self.config.max_q_step, -(-self.q_limit() // 4)) if self.gain_on_target else self.config.max_q_step

    def _move_q(self, state: ControlState, target: float, cost: Callable[[int], float]) -> tuple[ControlState, bool]:
        """Damped momentum toward `target`, a bounded step; taken only if the gain test passes. With
        `gain_on_target` the test prices where the moves are heading (T̂ at the target), not the bounded step:
        on a flat stretch of T̂(q) a capped step gains nothing and would be refused forever."""
        cfg = self.config
        q = min(state.q, self.q_limit())
        v = cfg.momentum * state.velocity + (1 - cfg.momentum) * (target - q)
        step = round(v)
        if step == 0 and abs(target - q) >= 1:
            step = int(np.sign(target - q))
        bound = self.q_step()
        new_q = int(np.clip(q + np.clip(step, -bound, bound), 1, self.q_limit()))
        goal = int(np.clip(round(target), 1, self.q_limit())) if self.gain_on_target else new_q
        if new_q != q and cost(new_q) > cost(q) * (1 + cfg.q_gain):
            new_q = goal  # the bounded step lands on a worse stretch of T̂(q) (a cliff of pinned candidates): go on
        if new_q == q or cost(goal) > cost(q) * (1 - cfg.q_gain):
            return replace(state, q=q, velocity=v if new_q == q else v * 0.5), False
        hold = 1 if new_q > q else 2
        return replace(state, q=new_q, velocity=v, hold=hold, settled=0, note=f"q {q}->{new_q}"), True


@register("tailsieve-fixed")
class TailSieveFixedController(TailSieveController):
    """Inner loop only, m fixed at R/2 (the paper's fixed-allocation variant)."""

    adapt_m: ClassVar[bool] = False

    def initial(self) -> ControlState:
        """m = R // 2 for the whole run."""
        r = self.router.replicas
        return ControlState(q=max(self.config.q0, 1), m=r // 2 if r >= 2 else 0)


@register("tailsieve-paper")
class TailSievePaperController(TailSieveController):
    """The paper's literal rules: rate-balance inner loop (§3.2), outer loop over m with q held (C.2)."""

    jump_from_uniform: ClassVar[bool] = False  # C.2: one replica per move, from the uniform boundary too
    guard_reversal: ClassVar[bool] = False
    price_return: ClassVar[bool] = False
    choose_placement: ClassVar[bool] = False  # uniform group routing, as the paper's baseline
    scan_m: ClassVar[bool] = False  # C.2's radius only
    gain_on_target: ClassVar[bool] = False
    noise_gate: ClassVar[bool] = False
    by_step: ClassVar[bool] = False
    outer_early: ClassVar[bool] = False  # C.1 settles q before C.2 moves m

    def split_q(self, state: ControlState, pred: Predictor, m: int) -> tuple[int, float]:
        """C.2 literally: a candidate split keeps the current q."""
        q = max(state.q, 1)
        return q, self._calibrated(state, pred, q, m)

    def q_after_move(self, state: ControlState, pred: Predictor, new_m: int, best: int | None) -> int:
        """C.2 literally: q is held across a move of m."""
        return max(state.q, 1)

    def inner(self, state: ControlState, pred: Predictor, obs: StepObservation) -> tuple[ControlState, bool]:
        """q* = N·r̄_tail/(r̄_bulk + r̄_tail) from EMA rates r_bulk = (N−q)/T_bulk, r_tail = q/T_tail."""
        n, a = self.router.groups, self.config.ema
        if obs.warmup or obs.q <= 0 or obs.tail_s <= 0 or obs.bulk_s <= 0 or state.hold > 0:
            return state, False
        rt, rb = obs.q / obs.tail_s, (n - obs.q) / obs.bulk_s
        rt, rb = ema(state.rate_tail, rt, a), ema(state.rate_bulk, rb, a)
        state = replace(state, rate_tail=rt, rate_bulk=rb)
        target = n * rt / (rb + rt)
        return self._move_q(state, target, lambda q: max(q / rt, (n - q) / rb))
