"""The closing-note table of a TRL run: per optimizer step, TRL's reward and step time next to TailSieve's numbers
(the weight version the step's samples were generated under, stale samples, the greedy probe after the push, tail
groups carried in and cut)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tailsieve.integrations.trl.session import StepStats

__all__ = ["TableRow", "format_table", "table_rows"]


@dataclass(frozen=True, slots=True)
class TableRow:
    """One optimizer step of the run."""

    step: int
    reward: float | None  # TRL's logged mean reward
    step_s: float | None  # TRL's logged step time (generation + loss + optimizer)
    rollout_s: float  # the TailSieve step behind it
    push_s: float | None  # weights saved and reloaded on every replica after the step
    weight_version: int  # version the consumed samples were generated under
    stale_samples: int
    probe: str  # replicas serving the trainer's weights after the push (greedy probe), "-" when off
    carried_in: int  # consumed groups cut at an earlier step (regenerated on the tail pool)
    cut: int  # groups cut at this step, carried to the next

    def to_json(self) -> dict[str, Any]:
        """Plain dict."""
        return asdict(self)


def table_rows(log_history: Sequence[Mapping[str, Any]], history: Sequence[StepStats], pushes: Sequence[Any],
               steps_per_generation: int = 1) -> tuple[TableRow, ...]:
    """One row per optimizer step found in TRL's `log_history` (logging_steps=1), joined with the session's step
    stats (one per generation) and the trainer's `PushRecord`s."""
    logs = {int(e["step"]): e for e in log_history if "reward" in e and "step" in e}
    by_step = {p.step: p for p in pushes}
    rows = []
    for step in sorted(logs):
        gen = (step - 1) // steps_per_generation
        if gen >= len(history):
            continue
        s, log, push = history[gen], logs[step], by_step.get(step)
        rows.append(TableRow(step, _num(log.get("reward")), _num(log.get("step_time")), s.rollout_s,
                             None if push is None else push.seconds, s.weight_version, s.stale_samples,
                             "-" if push is None or push.probe is None else push.probe.label(), s.carried_in, s.cut))
    return tuple(rows)


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


HEADER = ("step", "reward", "step_s", "rollout_s", "push_s", "version", "stale_samples", "probe", "carried_in", "cut")


def format_table(rows: Sequence[TableRow]) -> str:
    """A fixed-width text table with a totals line."""
    def cell(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)

    body = [[cell(v) for v in (r.step, r.reward, r.step_s, r.rollout_s, r.push_s, r.weight_version, r.stale_samples,
                                r.probe, r.carried_in, r.cut)] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(HEADER)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(HEADER, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    lines.append(f"{len(rows)} steps, stale_samples {sum(r.stale_samples for r in rows)}, tail groups carried "
                 f"{sum(r.carried_in for r in rows)}")
    return "\n".join(lines)
