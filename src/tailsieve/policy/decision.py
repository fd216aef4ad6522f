"""A controller's decision as data (issue 40): the (q, m) the next step runs, why (`Reason`), and the evidence the
paired rule weighed (docs/controller.md, "The rule"). Every step records one; its `note` is derived from it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_INT, excerpt, finite, int_in, json_object

__all__ = ["Decision", "Reason"]


class Reason(StrEnum):
    """Why a decision kept or changed (q, m)."""

    START = "start"  # the state before the first step
    FIXED = "fixed"  # the policy does not adapt (uniform, static)
    WARMUP = "warmup"  # a warm-up step: no candidate regenerated, nothing to compare on
    HOLD = "hold"  # the paper's settle hold after a move of q (App. E: one step after an increase, two after a cut)
    STAY = "stay"  # no option's paired gain clears its standard error times z
    UNPAID = "unpaid"  # an option gains beyond noise, but not enough to repay its switching cost over the horizon
    INFEASIBLE = "infeasible"  # C.2's feasibility refused the best move of m
    MOVE_Q = "move-q"  # q moved at the same m
    MOVE_M = "move-m"  # m moved between two-pool splits (q to that split's best)
    LEAVE = "leave"  # the uniform boundary left for a split
    RETURN = "return"  # a split left for the uniform boundary
    PLACEMENT = "placement"  # at the uniform boundary, requests dealt instead of whole groups (or back)
    PROBE = "probe"  # the uniform boundary's other placement run once to measure its model error


_MOVES = (Reason.MOVE_Q, Reason.MOVE_M, Reason.LEAVE, Reason.RETURN, Reason.PLACEMENT, Reason.PROBE)


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision: the next step's (q, m), its reason, and the best alternative weighed (`option`, the (q, m) the
    rule compared against the current one; None when nothing was compared) with its paired gain per step in
    seconds (`gain_s`, positive: the option is faster), that gain's standard error (`se_s`) and the one-time
    seconds moving there costs (`cost_s`: restarts, the warm-up or return step)."""

    q: int
    m: int
    reason: Reason
    option: tuple[int, int] | None = None
    gain_s: float = 0.0
    se_s: float = 0.0
    cost_s: float = 0.0

    @property
    def moved(self) -> bool:
        """Whether this decision changed what the next step runs."""
        return self.reason in _MOVES

    @property
    def note(self) -> str:
        """One line for a trace or a log: what was decided and on what evidence."""
        head = {Reason.MOVE_Q: f"q -> {self.q}", Reason.MOVE_M: f"m -> {self.m} (q {self.q})",
                Reason.LEAVE: f"leave uniform for ({self.q}, {self.m})", Reason.RETURN: "return to uniform",
                Reason.PROBE: "probe the other placement"}.get(self.reason, self.reason.value)
        if self.option is None:
            return head
        q, m = self.option
        evidence = f"({q}, {m}): {self.gain_s:+.2f} s/step ± {self.se_s:.2f}"
        if self.cost_s > 0:
            evidence += f", cost {self.cost_s:.1f} s"
        return f"{head}; {evidence}"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (the reason by value)."""
        return {"q": self.q, "m": self.m, "reason": self.reason.value,
                "option": None if self.option is None else list(self.option),
                "gain_s": self.gain_s, "se_s": self.se_s, "cost_s": self.cost_s}

    @classmethod
    def from_json(cls, obj: Any, where: str = "decision") -> Decision:
        """Inverse of `to_json`; a ConfigError naming the field otherwise."""
        d = json_object(obj, where, ("q", "m", "reason"), ("q", "m", "reason", "option", "gain_s", "se_s", "cost_s"))
        reasons = {r.value: r for r in Reason}
        if not isinstance(d["reason"], str) or d["reason"] not in reasons:  # a list or an object is unhashable
            raise ConfigError(f"{where}.reason must be one of {', '.join(reasons)}, got {excerpt(d['reason'])}")
        option = d.get("option")
        if option is not None:
            if not (isinstance(option, list) and len(option) == 2):
                raise ConfigError(f"{where}.option must be null or [q, m]")
            option = (int_in(option[0], f"{where}.option[0]", 0, MAX_INT),
                      int_in(option[1], f"{where}.option[1]", 0, MAX_INT))
        nums = {name: float(finite(d.get(name, 0.0), f"{where}.{name}", lo=None if name == "gain_s" else 0.0))
                for name in ("gain_s", "se_s", "cost_s")}
        return cls(int_in(d["q"], f"{where}.q", 0, MAX_INT), int_in(d["m"], f"{where}.m", 0, MAX_INT),
                   reasons[d["reason"]], option, **nums)
