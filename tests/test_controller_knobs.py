"""Any `ControllerConfig` field by name, through one check (`policy.controller_knobs.controller_from_mapping`): the
framework adapters (verl's `trainer.v1.tailsieve.controller`, slime's `TAILSIEVE_CONTROLLER`, TRL's
`TrlSession(controller=)`) pass a valid field to the controller and refuse an unknown field or a bad value in one
line; their older `q0` / `m0` options keep working."""

from __future__ import annotations

import json
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

import pytest

from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.errors import ConfigError
from tailsieve.integrations.slime import SlimeIntegrationError, SlimeSettings
from tailsieve.integrations.trl.session import TrlIntegrationError, TrlSession
from tailsieve.integrations.verl.session import TailSieveSettings
from tailsieve.policy.control_state import ControllerConfig
from tailsieve.policy.controller_knobs import controller_from_mapping, knobs
from tailsieve.policy.paper_config import PaperConfig

VALID = "q0, m0, history_steps, z, horizon, move_cost_s, ema, momentum, max_q_step, gain, m_radius"


def test_the_knobs_are_the_fields() -> None:
    own = [f.name for f in fields(ControllerConfig) if f.name != "paper"]  # the paper's knobs keep their flat names
    assert [k.name for k in knobs()] == own + [f.name for f in fields(PaperConfig)] == VALID.split(", ")
    assert {k.name for k in knobs() if k.section == "paper"} == {f.name for f in fields(PaperConfig)}
    assert {k.name: (k.kind, k.optional) for k in knobs()}["m0"] == (int, True)
    assert all(k.help for k in knobs())


def test_a_mapping_sets_any_field_over_a_base() -> None:
    assert controller_from_mapping(None, "x") == ControllerConfig()
    assert controller_from_mapping({}, "x", ControllerConfig(q0=4)) == ControllerConfig(q0=4)
    got = controller_from_mapping({"z": 1, "history_steps": 4, "m0": None}, "x", ControllerConfig(q0=4))
    assert got == ControllerConfig(q0=4, z=1.0, history_steps=4, m0=None) and isinstance(got.z, float)


@pytest.mark.parametrize(("table", "message"), [
    ({"zz": 1, "bias_ema": 0.1}, f"where: unknown controller field(s) bias_ema, zz (valid: {VALID})"),
    ({"z": -1}, "where.z must be >= 0 and finite, got -1.0"),
    ({"horizon": 0}, "where.horizon must be >= 1, got 0"),
    ({"ema": 2}, "where.ema must lie in [0, 1], got 2.0"),
    ({"q0": 1.5}, "where.q0 must be an integer, got 1.5"),
    ({"q0": None}, "where.q0 must be an integer, got None"),
    ({"m0": "1"}, "where.m0 must be an integer or null, got '1'"),
    ({"history_steps": True}, "where.history_steps must be an integer, got True"),
    ({"z": "2"}, "where.z must be a number, got '2'"),
    ({"gain": float("nan")}, "where.gain must be finite, got nan"),
])
def test_a_bad_mapping_is_one_line(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        controller_from_mapping(table, "where")
    assert str(err.value) == message


def test_a_mapping_that_is_not_one_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^where must be a mapping of controller fields, got list$"):
        controller_from_mapping([("z", 1)], "where")  # type: ignore[arg-type]


# ---- verl ------------------------------------------------------------------------------------------------------


def test_verl_passes_any_controller_field_and_keeps_q0_m0() -> None:
    s = TailSieveSettings.from_mapping({"controller": {"z": 1.5, "history_steps": 8}, "q0": 2, "m0": 1})
    assert s.spec(8, 2, 4).controller == ControllerConfig(q0=2, m0=1, z=1.5, history_steps=8)
    s = TailSieveSettings.from_mapping({"controller": {"m0": 2, "horizon": 4}})
    assert s.spec(8, 2, 4).controller == ControllerConfig(m0=2, horizon=4)
    assert TailSieveSettings().spec(8, 2, 4).controller == ControllerConfig()


@pytest.mark.parametrize(("raw", "message"), [
    ({"controller": {"zz": 1}}, f"trainer.v1.tailsieve.controller: unknown controller field(s) zz (valid: {VALID})"),
    ({"controller": {"z": -1}}, "trainer.v1.tailsieve.controller.z must be >= 0 and finite, got -1.0"),
    ({"q0": -1}, "trainer.v1.tailsieve.controller.q0 must be >= 0, got -1"),
    ({"q0": 2, "controller": {"q0": 3}},
     "trainer.v1.tailsieve.q0 and trainer.v1.tailsieve.controller.q0 are both set: give one"),
    ({"controller": [1]}, "trainer.v1.tailsieve.controller must be a mapping of controller fields, got list"),
])
def test_verl_refuses_a_bad_controller_field_at_construction(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        TailSieveSettings.from_mapping(raw)
    assert str(err.value) == message


# ---- slime -----------------------------------------------------------------------------------------------------


def slime_args(**kw: Any) -> SimpleNamespace:
    return SimpleNamespace(rollout_batch_size=8, n_samples_per_prompt=2, **kw)


def test_slime_passes_any_controller_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAILSIEVE_CONTROLLER", raising=False)
    assert SlimeSettings.from_args(slime_args()).spec(3).controller == ControllerConfig()
    s = SlimeSettings.from_args(slime_args(tailsieve_controller={"m0": 1, "z": 1.5}))
    assert s.spec(3).controller == ControllerConfig(m0=1, z=1.5)
    monkeypatch.setenv("TAILSIEVE_CONTROLLER", json.dumps({"history_steps": 4, "gain": 0.1}))
    want = ControllerConfig(history_steps=4, paper=PaperConfig(gain=0.1))
    assert SlimeSettings.from_args(slime_args()).spec(3).controller == want


@pytest.mark.parametrize(("value", "message"), [
    ('{"zz": 1}', f"tailsieve_controller (TAILSIEVE_CONTROLLER): unknown controller field(s) zz (valid: {VALID})"),
    ('{"horizon": 0}', "tailsieve_controller.horizon must be >= 1, got 0"),
    ("{z: 1}", "tailsieve_controller (TAILSIEVE_CONTROLLER): invalid JSON (Expecting property name enclosed in "
               "double quotes)"),
    ("[1]", "tailsieve_controller (TAILSIEVE_CONTROLLER) must be a mapping of controller fields, got list"),
])
def test_slime_refuses_a_bad_controller_setting_in_one_line(value: str, message: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILSIEVE_CONTROLLER", value)
    with pytest.raises(SlimeIntegrationError) as err:
        SlimeSettings.from_args(slime_args())
    assert str(err.value) == message


# ---- TRL -------------------------------------------------------------------------------------------------------


def trl(controller: Any, config: RolloutConfig | None = None) -> TrlSession:
    return TrlSession(["http://127.0.0.1:9", "http://127.0.0.1:10"], config or RolloutConfig(groups=2, group_size=2),
                      [{"prompt": "a"}, {"prompt": "b"}], checkpoints="unused", controller=controller)


def test_trl_passes_any_controller_field_over_the_configs() -> None:
    s = trl({"z": 1.5, "m0": 1}, RolloutConfig(groups=2, group_size=2, controller=ControllerConfig(q0=3)))
    try:
        assert s.config.controller == ControllerConfig(q0=3, m0=1, z=1.5)
        assert s.rollout.config.controller == s.config.controller
    finally:
        s.close()
    s = trl(None)
    try:
        assert s.config.controller == ControllerConfig()
    finally:
        s.close()


@pytest.mark.parametrize(("table", "message"), [
    ({"zz": 1}, f"TrlSession controller: unknown controller field(s) zz (valid: {VALID})"),
    ({"ema": -0.5}, "TrlSession controller.ema must lie in [0, 1], got -0.5"),
])
def test_trl_refuses_a_bad_controller_field_in_one_line(table: dict[str, Any], message: str) -> None:
    with pytest.raises(TrlIntegrationError) as err:
        trl(table)
    assert str(err.value) == message
