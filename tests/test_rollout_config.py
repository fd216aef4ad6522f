"""`RolloutConfig` (engines/rollout/rollout_config.py): every check when it is built, in one line, and the router and
`PolicySpec` it hands on."""

from __future__ import annotations

import pytest

from tailsieve.engines.rollout.api import RolloutConfig as FromApi
from tailsieve.engines.rollout.engine_executor import RequestMode
from tailsieve.engines.rollout.rollout_config import RolloutConfig
from tailsieve.engines.transport.engine_client import Api
from tailsieve.errors import ConfigError
from tailsieve.policy.router import Dispatch


@pytest.mark.parametrize(("kw", "message"), [
    ({"policy": "nope"}, r"^unknown policy 'nope' \(valid: .*verl-lif.*\)$"),
    ({"length_scale": 0.0}, r"^length_scale must be > 0, got 0\.0$"),
    ({"length_scale": float("nan")}, r"^length_scale must be > 0, got nan$"),
    ({"policy": "verl-lif", "bias_correction": True},
     r"^bias correction does not apply to peer verl-lif \(it carries no weights\)$"),
    ({"policy": "april-partial", "stream": False}, r"^peer april-partial resumes cut requests from their text"),
    ({"policy": "april-partial", "api": Api.CHAT}, r"^peer april-partial resumes cut requests"),
    ({"policy": "april-partial", "request_mode": RequestMode.N}, r"^peer april-partial resumes cut requests"),
])
def test_a_config_that_cannot_run_is_refused_when_built(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as exc:
        RolloutConfig(**kw)  # type: ignore[arg-type]
    assert len(str(exc.value).splitlines()) == 1


def test_the_router_and_policy_spec_carry_the_config() -> None:
    cfg = RolloutConfig(groups=32, group_size=4, rho=0.25, dispatch=Dispatch.GROUP, max_redraws=2, policy="tailsieve")
    rc = cfg.router(6)
    assert (rc.groups, rc.group_size, rc.replicas, rc.rho, rc.dispatch, rc.max_redraws, rc.extra) == (
        32, 4, 6, 0.25, Dispatch.GROUP, 2, 8)
    spec = cfg.policy_spec(6)
    assert spec.router == rc and spec.controller == cfg.controller
    # a peer plans with its own loop, every replica bulk: the controller it is given is uniform's
    assert RolloutConfig(policy="verl-lif").policy_spec(4).policy == "uniform"


def test_the_api_module_hands_on_the_same_class() -> None:
    assert FromApi is RolloutConfig
