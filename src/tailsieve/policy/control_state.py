"""The controller's frozen values (§3.2, App. C): its constants (`ControllerConfig`), what it learns from one step
(`StepObservation`) and what it carries between steps (`ControlState`, saved and restored by real runs)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_INT, MAX_LENGTH, excerpt, finite_or_nan, int_in, json_object, one_of
from tailsieve.policy.decision import Decision
from tailsieve.policy.paper_config import PaperConfig
from tailsieve.policy.paper_config import knob as _knob

CONTROL_FORMAT = 2  # the saved `ControlState`'s format (`to_json`'s "format"); any other is refused on restore


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Every constant of the controllers, each with one help line (docs/controller.md, "Constants"): the learning
    every adaptive controller shares (`q0`, `m0`, `history_steps`, `move_cost_s`, `ema`), the paired rule's
    (`z`, `horizon`: `tailsieve`, `tailsieve-fixed`), and `paper`, the paper's literal rules' own (`PaperConfig`)."""

    q0: int = _knob(1, "initial isolation size q (the paper's default, §4.4)")
    m0: int | None = _knob(0, "initial tail replicas m (0: start at the uniform boundary; None: R // 2)")
    history_steps: int = _knob(16, "steps of response-work history every forecast is priced on (H)")
    z: float = _knob(1.0, "a move's paired gain must clear its switching cost at the confidence of z standard errors "
                          "(Student's t at the history's degrees of freedom)")
    horizon: int = _knob(8, "steps over which a move's gain must repay its one-time cost")
    move_cost_s: float = _knob(0.0, "prior restart seconds of a pool move, until one is measured")
    ema: float = _knob(0.3, "weight of the newest step in the model-error, restart and rate averages")
    paper: PaperConfig = field(default_factory=PaperConfig, metadata={"help": "tailsieve-paper's own knobs"})

    def __post_init__(self) -> None:
        if self.q0 < 0:
            raise ConfigError(f"q0 must be >= 0, got {self.q0}")
        if self.m0 is not None and self.m0 < 0:
            raise ConfigError(f"m0 must be >= 0, got {self.m0}")
        if not 0.0 <= self.ema <= 1.0:
            raise ConfigError(f"ema must lie in [0, 1], got {self.ema}")
        for name in ("history_steps", "horizon"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.z >= 0 and math.isfinite(self.z)):
            raise ConfigError(f"z must be >= 0 and finite, got {self.z}")
        if not (self.move_cost_s >= 0 and math.isfinite(self.move_cost_s)):
            raise ConfigError(f"move_cost_s must be >= 0 and finite, got {self.move_cost_s}")


@dataclass(frozen=True, slots=True)
class StepWork:
    """Every request of one step as it ran, in plan order (tail groups first): what the model would have forecast
    for exactly this step's work, so calibration measures the model's error and not the luck of the draw."""

    lengths: NDArray[np.int64]  # (P, G) tokens each request generated (a cut one: what it had at the cutoff)
    lanes: NDArray[np.int64]  # (P, G) replica of each request
    tail: int  # the first `tail` groups ran in the tail pool
    kept: NDArray[np.bool_]  # (P,) groups consumed (run to completion)
    fresh: NDArray[np.bool_] | None = None  # (P,) groups drawn from the stream this step (never cut before)
    finished: NDArray[np.int64] | None = None  # (P,) members that finished (a cut group's shortest ones)
    uids: NDArray[np.int64] | None = None  # (P,) stream uid of each group (links a cut group to its regeneration)


@dataclass(frozen=True, slots=True)
class StepObservation:
    """What the controller learns from one executed step (from `StepResult` and the consumed batch)."""

    step: int
    q: int
    m: int
    warmup: bool
    tail_s: float
    bulk_s: float
    consumed_lengths: NDArray[np.int64]  # (N, G) lengths of the consumed groups, the q tail groups first
    restart_s: float = 0.0  # replica restarts before this step (a pool move between differently configured pools)
    pinned: int = 0  # consumed groups right after the tail groups that were candidates run pinned in the bulk pool
    work: StepWork | None = None  # the step's requests as they ran (None: calibrate against the bootstrap forecast)


S = TypeVar("S", bound="ControlState")
Parse = Callable[[Any, str], Any]  # a saved field's value and its name in errors → the field's value


@dataclass(frozen=True, slots=True)
class ControlState:
    """Controller state between steps, what every controller shares; `q`, `m` are what the next step should run,
    `decision` why. A controller with state of its own extends it (`paper.PaperState`), names it by `kind` and
    lists it in `STATE_KINDS` (`own_state`) so a saved one is restored as itself."""

    kind: ClassVar[str] = "control"  # the saved state's "state" (`STATE_KINDS`)
    parse: ClassVar[dict[str, Parse]]  # how a saved field is read (filled below the class)

    q: int
    m: int
    calib_tail: float = math.nan  # model error, measured / modelled at two-pool steps (NaN: none yet)
    calib_bulk: float = math.nan
    calib_uniform: float = math.nan  # the same at uniform steps dealing requests
    calib_group: float = math.nan  # the same at uniform steps placing whole groups
    move_cost_s: float = math.nan  # EMA of the measured restart seconds of a pool move (NaN: none seen yet)
    last_m: int = 0  # m of the last executed step (a change in m is a pool move)
    uniform_dispatch: str = "group"  # how a uniform step places requests: "group" (whole groups) or "request"
    history: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    tail_history: tuple[NDArray[np.int64], ...] = field(default_factory=tuple)
    decision: Decision | None = None  # the decision that set (q, m) (None: the initial state)

    @property
    def note(self) -> str:
        """The decision's one-line note ('' before the first decision)."""
        return "" if self.decision is None else self.decision.note

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict, its format and kind first: NaN (not measured yet) as null, the histories as nested
        lists."""
        out: dict[str, Any] = {"format": CONTROL_FORMAT, "state": self.kind}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _HISTORIES:
                out[f.name] = [a.tolist() for a in v]
            elif f.name == "decision":
                out[f.name] = None if v is None else v.to_json()
            else:
                out[f.name] = None if isinstance(v, float) and math.isnan(v) else v
        return out

    @classmethod
    def from_json(cls: type[S], obj: Any, where: str = "control") -> S:
        """Inverse of `to_json`, field by field, as the class its "state" names (`STATE_KINDS`; called on a subclass,
        that one only): format `CONTROL_FORMAT` only (a state saved by an older version is refused, never read in
        part); q and m required, the rest default; counts are integers >= 0, estimates finite (calibrations > 0;
        null: not measured yet), histories (rows, G) tables of token counts; a ConfigError naming the field
        otherwise. A state saved before the per-placement errors is read as `_placement_errors` says."""
        if not isinstance(obj, dict):
            raise ConfigError(f"{where} must be a JSON object, got {type(obj).__name__}")
        if obj.get("format") != CONTROL_FORMAT:
            got = obj.get("format")
            saved = "by an older TailSieve (no format)" if got is None else f"in format {excerpt(got)}"
            raise ConfigError(f"{where}: saved {saved}; this version restores format {CONTROL_FORMAT} only: start a "
                              "fresh run, or resume with the version that saved it")
        kind = obj.get("state")
        own = STATE_KINDS.get(kind) if isinstance(kind, str) else None
        if own is None or not issubclass(own, cls):
            valid = ", ".join(k for k, c in STATE_KINDS.items() if issubclass(c, cls))
            raise ConfigError(f"{where}.state must name the controller state it holds ({valid}), got {excerpt(kind)}")
        d = json_object(obj, where, ("format", "state", "q", "m"), tuple(f.name for f in fields(own)))
        kw = {name: own.parse[name](v, f"{where}.{name}") for name, v in d.items() if name not in ("format", "state")}
        return own(**_placement_errors(kw))


_HISTORIES = ("history", "tail_history")


def _placement_errors(kw: dict[str, Any]) -> dict[str, Any]:
    """A restored state's uniform-boundary errors (its parsed fields). One saved before each placement had its own
    error has no `calib_group`: its `calib_uniform` is the one error of every uniform step, measured at the
    placement it saved (the controller stays at a placement once chosen), so at whole groups it is `calib_group` and
    the dealt placement's is unmeasured (the placement probe then measures it); at dealt requests it stays."""
    if "calib_group" in kw or kw.get("uniform_dispatch", "group") != "group":
        return kw
    return kw | {"calib_group": kw.get("calib_uniform", math.nan), "calib_uniform": math.nan}


def count(v: Any, flag: str) -> int:
    """A saved count: an integer >= 0."""
    return int_in(v, flag, 0, MAX_INT)


def measured(v: Any, flag: str) -> float:
    """A saved estimate >= 0 (null: not measured yet, NaN)."""
    return finite_or_nan(v, flag, lo=0)


def _calibration(v: Any, flag: str) -> float:
    return finite_or_nan(v, flag, lo=0, lo_open=True)


ControlState.parse = {
    "q": count, "m": count, "last_m": count, "move_cost_s": measured,
    "calib_tail": _calibration, "calib_bulk": _calibration, "calib_uniform": _calibration, "calib_group": _calibration,
    "uniform_dispatch": lambda v, flag: one_of(v, flag, ("group", "request")),
    "history": lambda v, flag: _history(v, flag), "tail_history": lambda v, flag: _history(v, flag),
    "decision": lambda v, flag: None if v is None else Decision.from_json(v, flag),
}
STATE_KINDS: dict[str, type[ControlState]] = {ControlState.kind: ControlState}  # "state" of a saved state → its class
T = TypeVar("T", bound=type[ControlState])


def own_state(cls: T) -> T:
    """Class decorator (outermost, above `@dataclass`) listing a controller's own state in `STATE_KINDS` under its
    `kind` (a kind taken by another class is refused)."""
    if STATE_KINDS.get(cls.kind, cls) is not cls:
        raise ValueError(f"controller state kind {cls.kind!r} is taken by {STATE_KINDS[cls.kind].__qualname__}")
    STATE_KINDS[cls.kind] = cls
    return cls


def _history(v: Any, flag: str) -> tuple[NDArray[np.int64], ...]:
    """Saved response-work history: a list of (rows, G) tables of token counts in 0..MAX_LENGTH."""
    if not isinstance(v, list):
        raise ConfigError(f"{flag} must be a list of (rows, G) tables, got {type(v).__name__}")
    out = []
    for i, table in enumerate(v):
        ok = (isinstance(table, list) and table and all(isinstance(r, list) and r and len(r) == len(table[0])
                                                        for r in table)
              and all(type(x) is int and 0 <= x <= MAX_LENGTH for r in table for x in r))
        if not ok:
            raise ConfigError(f"{flag}[{i}] must be a non-empty table of token counts in 0..{MAX_LENGTH:,} with rows "
                              "of one length")
        out.append(np.asarray(table, dtype=np.int64))
    return tuple(out)
