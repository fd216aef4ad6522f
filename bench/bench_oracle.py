"""Exact two-lane oracle benchmark: median seconds and DP states per group of N requests (App. A.4 setting).

Run: `.venv/bin/python bench/bench_oracle.py` (options: `--groups`, `--seed`, `--sizes`, `--curve`). Groups are
drawn without replacement from the bundled KodCode R1 trace with numpy's default_rng(seed); each group is solved
once by `two_lane_oracle` (wall clock, after one warm-up solve). The target is a median of ≤ 0.2 s at N = 100.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tailsieve.model.curve_names import load_curve
from tailsieve.model.oracle import two_lane_oracle
from tailsieve.workloads.traces import load_trace

TARGET_S = 0.2


def main() -> None:
    """Print one row per group size: median/max seconds, median/max states and the ratio to the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--groups", type=int, default=20, help="groups per size (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 200], help="group sizes (default 100 200)")
    parser.add_argument("--curve", default="h100-llama3-8b", help="TPOT curve (default h100-llama3-8b)")
    args = parser.parse_args()
    lengths = load_trace().length
    curve = load_curve(args.curve)
    two_lane_oracle(lengths[:50], curve)  # warm-up: imports, curve tables
    print(f"curve {curve.name}, {args.groups} groups per size, seed {args.seed}, target {TARGET_S} s median")
    print(f"{'N':>5} {'median s':>9} {'max s':>7} {'median states':>14} {'max states':>11} {'median/target':>14}")
    for n in args.sizes:
        rng = np.random.default_rng(args.seed)
        seconds, states = [], []
        for _ in range(args.groups):
            group = rng.choice(lengths, size=n, replace=False)
            t0 = time.perf_counter()
            res = two_lane_oracle(group, curve)
            seconds.append(time.perf_counter() - t0)
            states.append(res.states)
        med = statistics.median(seconds)
        print(f"{n:>5} {med:>9.4f} {max(seconds):>7.3f} {statistics.median(states):>14,.0f} {max(states):>11,} "
              f"{med / TARGET_S:>14.2f}")


if __name__ == "__main__":
    main()
