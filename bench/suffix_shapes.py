"""`bench_suffix_range.py --shapes`: the ceiling of any tail-pool drafter across step shapes (issue 52).

Per workload and shape (R, N, G, ρ): verl-lif's mean step time without speculation; the ceiling (`suffix_range`'s
`tail_ceiling`: the controller and every static split of `static_grid` with `IDEAL_TAIL` on the tail pool) with the
option that reached it and its length ratio (mean consumed response length over verl-lif's, same steady window, App. E);
the best option whose length ratio is at least `LENGTH_FLOOR` (an honest ceiling: a speedup bought with responses more
than 5% shorter is not one); and the low and central brackets' TailSieve with tail-pool suffix at its best depth, with
its length ratio and its ratio over uniform + suffix everywhere. Speedups are over verl-lif without speculation, every
run on one prompt stream per (workload, shape).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench_suffix_range import CURVE, SEED, WORKLOADS, setup
from tailsieve.analysis.balancer import length_ratio
from tailsieve.errors import ConfigError
from tailsieve.model.spec_records import Bracket
from tailsieve.model.speculative import PoolSpec
from tailsieve.model.suffix_model import pool_spec
from tailsieve.simulation.runs import run_policy
from tailsieve.simulation.suffix_range import BALANCER, TAIL_TARGET, arm_sources, ceiling_runs, suffix_compare

LENGTH_FLOOR = 0.95  # a pass needs responses at most 5% shorter than verl-lif's (house rule, App. E)
BRACKETS = (Bracket.LOW, Bracket.CENTRAL)


@dataclass(frozen=True, slots=True)
class Shape:
    """One step shape: R replicas, N groups of G responses, over-provisioning ρ."""

    replicas: int
    groups: int
    group_size: int
    rho: float

    @property
    def flags(self) -> list[str]:
        """The `simulate` flags of this shape."""
        return ["--replicas", str(self.replicas), "--groups", str(self.groups), "--group-size", str(self.group_size),
                "--rho", f"{self.rho:g}"]

    @property
    def label(self) -> str:
        return f"{self.replicas}:{self.groups}:{self.group_size}:{self.rho:g}"


DEFAULT_SHAPES = tuple(Shape(r, 8 * r, 8, rho) for rho in (0.1, 0.25) for r in (4, 8, 16, 32))


def parse_shapes(text: str) -> tuple[Shape, ...]:
    """`default` or comma-separated `R:N:G:RHO`."""
    if text == "default":
        return DEFAULT_SHAPES
    out = []
    for item in text.split(","):
        parts = item.strip().split(":")
        try:
            r, n, g, rho = int(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])
        except (ValueError, IndexError):
            raise ConfigError(f"--shapes takes 'default' or R:N:G:RHO[,...], got {item!r}") from None
        if len(parts) != 4:
            raise ConfigError(f"--shapes takes 'default' or R:N:G:RHO[,...], got {item!r}")
        out.append(Shape(r, n, g, rho))
    return tuple(out)


def shape_row(workload: str, steps: int, shape: Shape) -> dict[str, Any]:
    """One (workload, shape) of the sweep as JSON (module docstring)."""
    inputs, curve, config = setup(workload, steps, shape.flags)
    ref = run_policy(BALANCER, inputs, curve, config)
    ref_s = ref.mean_step_s()
    options = []
    for label, _q, _m, r in ceiling_runs(inputs, curve, config):
        options.append({"policy": label, "speedup": ref_s / r.mean_step_s(), "length_ratio": length_ratio(r, ref)})
    ceiling = options[0]
    for o in options[1:]:  # tail_ceiling's rule: the fastest, ties to the earlier
        if o["speedup"] > ceiling["speedup"]:
            ceiling = o
    honest = [o for o in options if o["length_ratio"] is not None and o["length_ratio"] >= LENGTH_FLOOR]
    table = suffix_compare(inputs, curve, config, brackets=BRACKETS)
    tail_source = arm_sources(config)["tail"][0]
    brackets = {}
    for row in table.rows:
        arm = row.tail_only
        run = run_policy(table.policy, inputs, curve,
                         replace(config, spec=PoolSpec(tail=pool_spec(tail_source, row.bracket, arm.depth))))
        assert run.mean_step_s() == arm.mean_step_s, "the rebuilt tail-only arm differs from suffix_compare's"
        brackets[row.bracket.value] = {"speedup": arm.speedup, "depth": arm.depth,
                                       "length_ratio": length_ratio(run, ref), "vs_uniform_suffix": row.vs_uniform}
    best_honest = max(honest, key=lambda o: o["speedup"]) if honest else None
    return {"workload": workload, "shape": shape.label, "replicas": shape.replicas, "groups": shape.groups,
            "group_size": shape.group_size, "rho": shape.rho, "verl_lif_step_s": ref_s,
            "tailsieve_no_spec": table.rows[0].no_spec, "ceiling": ceiling, "honest_ceiling": best_honest,
            "brackets": brackets, "pass": verdict(ceiling, best_honest)}


def verdict(ceiling: dict[str, Any], honest: dict[str, Any] | None) -> str:
    """`honest pass` (an option ≥ the target at length ratio ≥ `LENGTH_FLOOR`), `length-biased pass` (the target
    only with shorter responses: not a pass) or `missed`."""
    if honest is not None and honest["speedup"] >= TAIL_TARGET:
        return "honest pass"
    return "length-biased pass" if ceiling["speedup"] >= TAIL_TARGET else "missed"


HEADER = ("| workload | R:N:G:ρ | verl-lif s/step | tailsieve, no spec | ceiling (option) | ceiling len | "
          f"best at len ≥ {LENGTH_FLOOR:g} (option; len) | central tail-pool suffix (d; len; / uniform + suffix) | "
          f"low tail-pool suffix (d; len; / uniform + suffix) | ideal ≥ {TAIL_TARGET:g}× |")


def row_line(label: str, d: dict[str, Any]) -> str:
    """One markdown row."""
    c, h = d["ceiling"], d["honest_ceiling"]
    honest = "none" if h is None else f"{h['speedup']:.3f}× ({h['policy']}; {_ratio(h['length_ratio'])})"

    def arm(b: dict[str, Any]) -> str:
        biased = b["speedup"] >= TAIL_TARGET and (b["length_ratio"] or 0.0) < LENGTH_FLOOR
        return (f"{b['speedup']:.3f}× (d={b['depth']}; {_ratio(b['length_ratio'])}; "
                f"{b['vs_uniform_suffix']:.3f}×){', biased' if biased else ''}")

    return (f"| {label} | {d['shape']} | {d['verl_lif_step_s']:.2f} | {d['tailsieve_no_spec']:.3f}× | "
            f"{c['speedup']:.3f}× ({c['policy']}) | {_ratio(c['length_ratio'])} | {honest} | "
            f"{arm(d['brackets']['central'])} | {arm(d['brackets']['low'])} | {d['pass']} |")


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def sweep_main(shapes_text: str, workloads_text: str, steps: int, out: Path | None) -> int:
    """Print the sweep's table row by row (cheap shapes first); `out` gets the rows as JSON."""
    try:
        shapes = parse_shapes(shapes_text)
        labels = [w.strip() for w in workloads_text.split(",")]
        unknown = [w for w in labels if w not in WORKLOADS]
        if unknown:
            raise ConfigError(f"--workloads takes {', '.join(WORKLOADS)}, got {', '.join(unknown)}")
        for shape in shapes:  # every shape checked as `simulate` checks it, before the first run
            setup(WORKLOADS[labels[0]], steps, shape.flags)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|", flush=True)
    rows, t0 = [], time.perf_counter()
    for shape in sorted(shapes, key=lambda s: (s.replicas * s.groups * s.group_size, s.rho)):
        for label in labels:
            d = shape_row(WORKLOADS[label], steps, shape) | {"label": label}
            rows.append(d)
            print(row_line(label, d), flush=True)
            if out:
                out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(f"\n({time.perf_counter() - t0:.0f} s; speedups over verl-lif without speculation, {steps} steps, "
          f"seed {SEED}, curve {CURVE}; len = mean consumed response length / verl-lif's over the same steady steps; "
          f"'biased': ≥ {TAIL_TARGET:g}× only with len < {LENGTH_FLOOR:g})")
    return 0
