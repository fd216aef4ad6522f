"""Decision latency at cluster scale (issue 12, part 4): one router plan (`StepLoop.plan`) plus one controller
update (`Controller.update`, the predictor included) at N = 4096 groups, G = 16, R = 512 replicas; target ≤ 50 ms.

Run: `python bench/bench_decision.py [--groups 4096] [--group-size 16] [--replicas 512] [--steps 8]
[--policy tailsieve]`. Simulates the bundled KodCode R1 trace (resample) on h100-llama3-8b and times, per step,
the plan and the update separately (the simulated execution is not timed). Prints per-step ms and the median and
max over the steps after the warm-up step, with the load average (other jobs share the cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from tailsieve.loop import StepLoop
from tailsieve.model.curves import load_curve
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.workloads import load_workload

TARGET_MS = 50.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=4096)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--replicas", type=int, default=512)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--policy", default="tailsieve")
    args = ap.parse_args()
    plans: list[float] = []
    updates: list[float] = []
    orig_plan: Callable[..., Any] = StepLoop.plan
    cls: Any = CONTROLLERS[args.policy]
    had_own = "update" in cls.__dict__
    orig_update: Callable[..., Any] = cls.update

    def plan(self: Any, state: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig_plan(self, state)
        finally:
            plans.append(time.perf_counter() - t)

    def update(self: Any, state: Any, obs: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig_update(self, state, obs)
        finally:
            updates.append(time.perf_counter() - t)

    StepLoop.plan = plan  # type: ignore[method-assign]
    cls.update = update
    try:
        cfg = SimConfig(router=RouterConfig(groups=args.groups, group_size=args.group_size, replicas=args.replicas),
                        steps=args.steps)
        t0 = time.perf_counter()
        run_policy(args.policy, load_workload("kodcode-r1", mode="resample"), load_curve("h100-llama3-8b"), cfg)
        wall = time.perf_counter() - t0
    finally:
        StepLoop.plan = orig_plan  # type: ignore[method-assign]
        if had_own:
            cls.update = orig_update
        else:
            del cls.update
    totals = [(p + u) * 1000 for p, u in zip(plans, updates, strict=False)]
    print(f"{args.policy}: N={args.groups} G={args.group_size} R={args.replicas}, {args.steps} steps, run wall "
          f"{wall:.1f}s, load average {os.getloadavg()[0]:.1f}")
    print(f"{'step':>5}{'plan ms':>10}{'update ms':>11}{'decision ms':>13}")
    for k, (p, u) in enumerate(zip(plans, updates, strict=False)):
        print(f"{k:>5}{p * 1000:>10.1f}{u * 1000:>11.1f}{(p + u) * 1000:>13.1f}")
    steady = totals[1:] or totals
    print(f"decision (plan + update), steps 1..: median {statistics.median(steady):.1f} ms, max {max(steady):.1f} ms "
          f"(target ≤ {TARGET_MS:.0f} ms: {'met' if max(steady) <= TARGET_MS else 'NOT met'})")


if __name__ == "__main__":
    main()
