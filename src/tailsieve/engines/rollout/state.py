"""Save and restore a real run between processes: router state (stream position, requeue, ranked candidates),
controller state (q, m, EMAs, holds, history) and per-prompt generation counters, as one JSON file.

A restarted job that loads the state of its last completed step draws exactly the prompts the old job would have
drawn next: nothing is lost or repeated. Files are written atomically (`tailsieve.outputs.write_atomic`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_INT, excerpt, int_in, json_object, loads_json, read_text
from tailsieve.outputs import write_json_atomic
from tailsieve.policy.controller import ControlState
from tailsieve.policy.router import RouterState

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Everything a `Rollout` carries between steps."""

    policy: str
    fingerprint: dict[str, Any]  # run shape: groups, group size, replicas, rho, prompts, seed (checked on restore)
    router: RouterState
    control: ControlState
    generation: dict[str, int]  # prompt id → generations already started (seeds and replay lengths depend on it)
    weight_version: int = 0  # the weights served after the last step (`Rollout.update_weights`)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {"version": STATE_VERSION, "policy": self.policy, "fingerprint": self.fingerprint,
                "router": router_to_json(self.router), "control": control_to_json(self.control),
                "generation": dict(self.generation), "weight_version": self.weight_version}

    @classmethod
    def from_json(cls, obj: Any, where: str = "rollout state") -> RolloutState:
        """Inverse of `to_json`, field by field (`RouterState.from_json`, `ControlState.from_json`): the version,
        non-negative generation counters and weight version; a one-line ConfigError naming the field otherwise."""
        d = json_object(obj, where, ("version", "policy", "fingerprint", "router", "control", "generation"),
                        ("weight_version",))
        if d["version"] != STATE_VERSION:
            raise ConfigError(f"{where}: version {excerpt(d['version'])} is not {STATE_VERSION}")
        if not isinstance(d["policy"], str) or not isinstance(d["fingerprint"], dict):
            raise ConfigError(f"{where}: policy must be text and fingerprint an object")
        gen = d["generation"]
        if not isinstance(gen, dict):
            raise ConfigError(f"{where}: generation must be an object (prompt id → generations started)")
        generation = {k: int_in(v, f"{where}: generation[{excerpt(k)}]", 0, MAX_INT) for k, v in gen.items()}
        return cls(d["policy"], dict(d["fingerprint"]), RouterState.from_json(d["router"], f"{where}: router"),
                   ControlState.from_json(d["control"], f"{where}: control"), generation,
                   int_in(d.get("weight_version", 0), f"{where}: weight_version", 0, MAX_INT))

    def save(self, path: str | Path) -> None:
        """Write atomically."""
        write_json_atomic(Path(path), self.to_json(), "rollout state")

    @classmethod
    def load(cls, path: str | Path) -> RolloutState:
        """Read a saved state (one-line error if missing or malformed)."""
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"no saved rollout state at {p}")
        return cls.from_json(loads_json(read_text(p, "rollout state"), f"rollout state {p}"), f"rollout state {p}")


def router_to_json(s: RouterState) -> dict[str, Any]:
    """RouterState → dict (`RouterState.to_json`)."""
    return s.to_json()


def router_from_json(obj: Any) -> RouterState:
    """dict → RouterState (`RouterState.from_json`: validated field by field)."""
    return RouterState.from_json(obj)


def control_to_json(s: ControlState) -> dict[str, Any]:
    """ControlState → dict (`ControlState.to_json`: NaN as null, histories as nested lists)."""
    return s.to_json()


def control_from_json(obj: Any) -> ControlState:
    """dict → ControlState (`ControlState.from_json`: validated field by field)."""
    return ControlState.from_json(obj)
