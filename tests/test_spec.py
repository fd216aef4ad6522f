"""The one assembly point: `PolicySpec` checks each thing once with one message, and `build_loop` gives every driver
(simulate, Rollout, the verl and slime adapters) the same router, controller and cost model."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.errors import ConfigError
from tailsieve.integrations.slime.settings import SlimeIntegrationError, SlimeSettings
from tailsieve.integrations.verl.session import TailSieveSettings
from tailsieve.loop import build_loop
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.control_state import ControllerConfig
from tailsieve.policy.router import Dispatch, RouterConfig
from tailsieve.policy.spec import FleetCost, PolicySpec
from tailsieve.simulation.runs import SimConfig, policy_spec
from tailsieve.workloads import load_workload

CURVE = TpotCurve("flat", (1, 1024), (0.01, 0.01))
FAST = TpotCurve("fast", (1, 1024), (0.005, 0.005))


def spec(**kw: object) -> PolicySpec:
    base = PolicySpec("tailsieve", RouterConfig(groups=8, group_size=2, replicas=4), FleetCost(CURVE))
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "message"), [
    ({"policy": "nope"}, "unknown policy 'nope' (valid: uniform, static, tailsieve-paper, tailsieve, tailsieve-fixed)"),
    ({"router": RouterConfig(replicas=1)},
     "policy tailsieve needs at least 2 replicas (a tail and a bulk pool), got R=1"),
    ({"policy": "static", "m": 4}, "m must lie in 0..3 (R=4 replicas), got m=4"),
    ({"policy": "static", "m": -1}, "m must lie in 0..3 (R=4 replicas), got m=-1"),
    ({"policy": "static", "q": -2}, "q must be an integer >= 0, got -2"),
    ({"controller": ControllerConfig(m0=7)}, "m0 must lie in 0..3 (R=4 replicas), got m0=7"),
])
def test_each_check_has_one_message(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        spec(**kw)
    assert str(err.value) == message


def test_the_router_and_cost_checks_are_their_own_values() -> None:
    with pytest.raises(ConfigError, match=r"^max_redraws must be an integer >= 1, got 0$"):
        RouterConfig(max_redraws=0)
    with pytest.raises(ConfigError, match=r"^dispatch must be request or group, got 'sideways'$"):
        RouterConfig(dispatch="sideways")  # type: ignore[arg-type]
    assert RouterConfig(dispatch="group").dispatch is Dispatch.GROUP  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^kv_s_per_token must be finite and >= 0, got -1.0$"):
        FleetCost(CURVE, kv_s_per_token=-1.0)


def test_uniform_runs_on_one_replica_and_ignores_the_split_settings() -> None:
    s = spec(policy="uniform", router=RouterConfig(groups=8, group_size=2, replicas=1), m=3,
             controller=ControllerConfig(m0=5))
    assert build_loop(s, ["a", "b"]).initial().control.m == 0


def test_build_loop_hands_the_controller_the_whole_spec() -> None:
    # max_redraws 2: q0 is the start (at the pinned limit `tailsieve` starts a split at q = E)
    s = spec(cost=FleetCost(CURVE, FAST, 2e-6, 0.03), controller=ControllerConfig(q0=3, m0=1), shuffle=True, seed=5,
             router=RouterConfig(groups=8, group_size=2, replicas=4, max_redraws=2))
    loop = build_loop(s, [f"p{i}" for i in range(30)])
    ctl = loop.controller
    assert (ctl.kv_s_per_token, ctl.prefill_s) == (2e-6, 0.03)
    assert (ctl.curve, ctl.tail_curve, ctl.config) == (CURVE, FAST, s.controller)
    assert loop.initial().control.q == 3 and loop.initial().control.m == 1
    assert loop.router.config is s.router and loop.router.stream0 == build_loop(s, loop.router.prompts).router.stream0
    assert loop.router.stream0 != build_loop(replace(s, seed=6), loop.router.prompts).router.stream0


def test_simulate_and_rollout_assemble_the_same_spec() -> None:
    wl = load_workload("kodcode-r1")
    rc = RouterConfig(groups=8, group_size=2, replicas=4, ranking="stream-order", max_redraws=2)
    curve = load_curve("h100-llama3-8b")
    sim = policy_spec("tailsieve", wl, curve, SimConfig(router=rc, controller=ControllerConfig(q0=2)))
    real = RolloutConfig(groups=8, group_size=2, ranking="stream-order", max_redraws=2,
                         controller=ControllerConfig(q0=2)).policy_spec(4)
    assert sim == real  # no prefill term on either side here: the same spec, so the same loop


def test_verl_now_passes_the_tail_curve_kv_term_and_controller_constants() -> None:
    settings = TailSieveSettings.from_mapping({"tail_curve": "h100-llama3-8b", "kv_ms_per_1k": 0.5, "q0": 2, "m0": 1,
                                               "dispatch": "group", "ranking": "stream-order"})
    s = settings.spec(8, 2, 4)
    assert s.cost.kv_s_per_token == 0.5 / 1e6 and s.cost.tail_curve == load_curve("h100-llama3-8b")
    assert (s.controller.q0, s.controller.m0, s.router.dispatch, s.router.ranking) == (2, 1, Dispatch.GROUP,
                                                                                       "stream-order")
    assert build_loop(s, ["a"]).controller.kv_s_per_token == 0.5 / 1e6
    with pytest.raises(ConfigError, match=r"^dispatch must be request or group, got 'x'$"):
        TailSieveSettings(dispatch="x").spec(8, 2, 4)


def test_slime_now_passes_ranking_and_dispatch() -> None:
    args = SimpleNamespace(rollout_batch_size=8, n_samples_per_prompt=2, tailsieve_ranking="stream-order",
                           tailsieve_dispatch="group")
    s = SlimeSettings.from_args(args).spec(3)
    assert (s.router.ranking, s.router.dispatch, s.router.replicas) == ("stream-order", Dispatch.GROUP, 3)
    with pytest.raises(SlimeIntegrationError) as err:
        SlimeSettings.from_args(SimpleNamespace(**{**vars(args), "tailsieve_ranking": "nope"})).spec(3)
    assert str(err.value) == "unknown candidate ranking 'nope' (valid: least-progress, stream-order)"
