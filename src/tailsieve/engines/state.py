"""Save and restore a real run between processes: router state (stream position, requeue, ranked candidates),
controller state (q, m, EMAs, holds, history) and per-prompt generation counters, as one JSON file.

A restarted job that loads the state of its last completed step draws exactly the prompts the old job would have
drawn next: nothing is lost or repeated. Files are written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from tailsieve.errors import ConfigError
from tailsieve.inputs import loads_json, read_text
from tailsieve.policy.controller import ControlState
from tailsieve.policy.router import RouterState
from tailsieve.policy.step import GroupRef
from tailsieve.policy.stream import StreamState

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
    def from_json(cls, obj: dict[str, Any]) -> RolloutState:
        """Inverse of `to_json`."""
        if obj.get("version") != STATE_VERSION:
            raise ConfigError(f"rollout state version {obj.get('version')!r} is not {STATE_VERSION}")
        return cls(str(obj["policy"]), dict(obj["fingerprint"]), router_from_json(obj["router"]),
                   control_from_json(obj["control"]), {str(k): int(v) for k, v in obj["generation"].items()},
                   int(obj.get("weight_version", 0)))

    def save(self, path: str | Path) -> None:
        """Write atomically."""
        write_json_atomic(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> RolloutState:
        """Read a saved state (one-line error if missing or malformed)."""
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"no saved rollout state at {p}")
        obj = loads_json(read_text(p, "rollout state"), f"rollout state {p}")
        if not isinstance(obj, dict):
            raise ConfigError(f"rollout state {p} is malformed: expected a JSON object, got {type(obj).__name__}")
        try:
            return cls.from_json(obj)
        except KeyError as exc:
            raise ConfigError(f"rollout state {p} is malformed: missing key {exc}") from None
        except (ValueError, TypeError, AttributeError, IndexError, OverflowError) as exc:
            raise ConfigError(f"rollout state {p} is malformed: {exc}") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    """json.dump to a temp file beside `path`, fsync, rename over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _refs(refs: tuple[GroupRef, ...]) -> list[list[Any]]:
    return [[r.uid, r.prompt_id, r.cuts] for r in refs]


def _unrefs(rows: list[list[Any]]) -> tuple[GroupRef, ...]:
    return tuple(GroupRef(int(u), str(p), int(c)) for u, p, c in rows)


def router_to_json(s: RouterState) -> dict[str, Any]:
    """RouterState → dict."""
    return {"step": s.step, "stream": s.stream.to_json() if s.stream else None, "requeue": _refs(s.requeue),
            "candidates": _refs(s.candidates), "consumed": s.consumed}


def router_from_json(obj: dict[str, Any]) -> RouterState:
    """dict → RouterState."""
    stream = StreamState.from_json(obj["stream"]) if obj.get("stream") else None
    return RouterState(int(obj["step"]), stream, _unrefs(obj["requeue"]), _unrefs(obj["candidates"]),
                       int(obj["consumed"]))


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def control_to_json(s: ControlState) -> dict[str, Any]:
    """ControlState → dict (NaN rates as null, history arrays as nested lists)."""
    out: dict[str, Any] = {}
    for f in fields(s):
        v = getattr(s, f.name)
        if f.name in ("history", "tail_history", "last_fresh"):
            out[f.name] = [a.tolist() for a in v]
        elif isinstance(v, float):
            out[f.name] = _num(v)
        else:
            out[f.name] = v
    return out


def control_from_json(obj: dict[str, Any]) -> ControlState:
    """dict → ControlState."""
    kw: dict[str, Any] = {}
    for f in fields(ControlState):
        if f.name not in obj:
            continue
        v = obj[f.name]
        if f.name in ("history", "tail_history", "last_fresh"):
            kw[f.name] = tuple(np.asarray(a, dtype=np.int64).reshape(-1, len(a[0]) if a else 0) for a in v)
        elif f.type == "float":  # NaN was written as null
            kw[f.name] = math.nan if v is None else float(v)
        elif f.type == "int":
            kw[f.name] = int(v)
        else:
            kw[f.name] = v
    return ControlState(**kw)
