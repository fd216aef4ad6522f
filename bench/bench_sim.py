"""Simulator benchmark (issue 4 item 8): one policy, 30 steps × 64 groups × 8 on 8 replicas in ≤ 0.5 s, and a
scaling table up to N = 1024 groups and R = 64 replicas.

Run: `.venv/bin/python bench/bench_sim.py` (add `--quick` to skip the largest cells; `--engine` instead times the
paged engine of docs/simulator.md against the all-admit one at N = 4096, R = 256, 30 steps: bench R of issue 48,
target ≤ 2×; `--engine --quick`: N = 1024, R = 64; the paged engine is the compiled one when numba is installed, the
`fast` extra, and both engines are timed after an untimed run has memoised the length draws). Every run simulates the
bundled KodCode R1 trace (resample mode) on h100-llama3-8b. Times are wall-clock medians over `--repeats` runs in
this process (imports and curve tables warmed first); "controller" is the time spent inside the controller's
`update` (the predictor included), "sim" the rest: router, executor, replica simulator and workload draws.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import tailsieve.model.paged as paged_module
from tailsieve.model.curve_names import load_curve
from tailsieve.model.engine import FleetSpeed
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.workloads import load_workload

TARGET_S = 0.5
POLICIES = ("uniform", "tailsieve")
GROUPS = (64, 256, 1024)
REPLICAS = (8, 16, 64)
STEPS = {64: 30, 256: 10, 1024: 5}  # fewer steps for the big shapes; per-step times are comparable


@contextmanager
def timed_controller(name: str) -> Iterator[list[float]]:
    """Accumulate the seconds spent in `CONTROLLERS[name].update` (patched on that class, restored after)."""
    cls: Any = CONTROLLERS[name]
    had_own = "update" in cls.__dict__
    orig: Callable[..., Any] = cls.update
    acc = [0.0]

    def update(self: Any, state: Any, obs: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig(self, state, obs)
        finally:
            acc[0] += time.perf_counter() - t

    cls.update = update
    try:
        yield acc
    finally:
        if had_own:
            cls.update = orig
        else:
            del cls.update


def measure(name: str, groups: int, replicas: int, steps: int, repeats: int) -> tuple[float, float]:
    """Median wall seconds of one run and the median controller seconds inside it."""
    workload = load_workload("kodcode-r1", mode="resample")
    curve = load_curve("h100-llama3-8b")
    config = SimConfig(router=RouterConfig(groups=groups, group_size=8, replicas=replicas), steps=steps)
    walls, ctl = [], []
    for _ in range(repeats):
        with timed_controller(name) as acc:
            t = time.perf_counter()
            run_policy(name, workload, curve, config)
            walls.append(time.perf_counter() - t)
        ctl.append(acc[0])
    return statistics.median(walls), statistics.median(ctl)


ENGINE_TARGET = 2.0  # paged / all-admit CPU time (issue 48, bench R)
PAGED = ReplicaConfig(kv_tokens=150_000, prefix_caching=True, max_num_batched_tokens=8192, prefill_ms_per_token=0.02)


def engine(quick: bool, python_engine: bool) -> None:
    """Bench R: CPU seconds of uniform and tailsieve on the all-admit engine and on a KV-bound paged engine (150 K
    tokens of KV per replica, prefix caching, chunked prefill, 10% uneven replicas drifting 5% a step), one run;
    `python_engine`: the Python paged engine even when the compiled one is there."""
    groups, replicas = (1024, 64) if quick else (4096, 256)
    workload = load_workload("kodcode-r1", mode="resample")
    curve = load_curve("h100-llama3-8b")
    base = SimConfig(router=RouterConfig(groups=groups, group_size=8, replicas=replicas), steps=30)
    paged = replace(base, replica=PAGED, speed=FleetSpeed(spread=0.1, drift=0.05))
    if python_engine:
        paged_module.USE_KERNEL = False
    print(f"Bench R: N={groups}, R={replicas}, G=8, 30 steps, kodcode-r1 on h100-llama3-8b (CPU s; target paged <= "
          f"{ENGINE_TARGET:g}x all-admit); paged engine: {'compiled' if paged_module.USE_KERNEL else 'Python'}")
    print(f"{'policy':<12}{'all-admit s':>12}{'paged s':>10}{'ratio':>8}{'preemptions':>13}")
    run_policy("uniform", workload, curve, replace(paged, steps=1))  # load the compiled engine (`fast` extra)
    for name in POLICIES:
        run_policy(name, workload, curve, base)  # untimed: the workload's length draws are memoised by the first run
        t = time.process_time()
        run_policy(name, workload, curve, base)
        plain = time.process_time() - t
        t = time.process_time()
        run = run_policy(name, workload, curve, paged)
        kv = time.process_time() - t
        print(f"{name:<12}{plain:>12.2f}{kv:>10.2f}{kv / plain:>8.2f}{sum(s.preemptions for s in run.steps):>13}",
              flush=True)


def main() -> None:
    """Print the headline figures and the scaling table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="skip N = 1024")
    ap.add_argument("--engine", action="store_true", help="bench R: the paged engine against the all-admit one")
    ap.add_argument("--python-engine", action="store_true", help="with --engine: time the Python paged engine")
    args = ap.parse_args()
    if args.engine:
        engine(args.quick, args.python_engine)
        return
    measure("tailsieve", 64, 8, 3, 1)  # warm imports and curve tables
    print(f"Headline: 30 steps × 64 groups × 8 on 8 replicas (target ≤ {TARGET_S} s per policy)")
    print(f"{'policy':<12}{'total s':>9}{'x target':>10}{'sim s':>8}{'controller s':>14}")
    for name in POLICIES:
        wall, ctl = measure(name, 64, 8, 30, args.repeats)
        print(f"{name:<12}{wall:>9.3f}{wall / TARGET_S:>10.2f}{wall - ctl:>8.3f}{ctl:>14.3f}")
    print()
    print("Scaling: ms per step (sim / controller); steps per cell: " +
          ", ".join(f"N={n}: {s}" for n, s in STEPS.items()))
    print(f"{'N':>6}{'R':>5}" + "".join(f"{p + ' total':>18}{'sim':>9}{'ctl':>9}" for p in POLICIES))
    for n in GROUPS:
        if args.quick and n > 256:
            continue
        for r in REPLICAS:
            cells = []
            for name in POLICIES:
                wall, ctl = measure(name, n, r, STEPS[n], 1 if n >= 1024 else args.repeats)
                per = 1000 / STEPS[n]
                cells.append(f"{wall * per:>18.1f}{(wall - ctl) * per:>9.1f}{ctl * per:>9.1f}")
            print(f"{n:>6}{r:>5}" + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
