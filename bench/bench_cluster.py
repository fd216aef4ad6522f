"""Cluster-size benchmark (issue 15, part 3): `tailsieve simulate --groups 4096 --replicas 256` with every default
policy in ≤ 60 s and ≤ 2 GB, and the exact `topq-best` against the exhaustive evaluation it replaced.

Run: `.venv/bin/python bench/bench_cluster.py` (about 2 minutes on 2 cores; `--quick` runs the simulate at
N = 1024, R = 64). Three parts, all measured in this run:

1. `topq-best` old vs new on the same batches: the steps of a `uniform` run at N = 256, R = 16 and N = 512,
   R = 32 (KodCode R1, resample, h100-llama3-8b), solved by the exhaustive R·N²·G evaluation (kept here, as in the
   tests) and by the branch and bound of `model.topq_search`; median CPU seconds per step, the ratio, and whether
   every (q, m, T) agrees.
2. The whole `simulate` command in a subprocess: wall seconds, CPU seconds and peak RSS (the child's rusage).
3. `--per-policy`: CPU seconds per policy at that size, in this process.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from tailsieve.model.baselines import GroupBatch, TopQBest, group_tail_rank, topq_lanes
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.makespan import marginal_tpot
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.capture import capture_rates
from tailsieve.simulation.runs import SimConfig, policy_names, run_policy
from tailsieve.workloads import load_workload

TARGET_S = 60.0
TARGET_RSS_GB = 2.0


def lexsort_lane_makespans(lengths: np.ndarray, lanes: np.ndarray, n_lanes: int, curve: TpotCurve) -> np.ndarray:
    """`lane_makespans` as it was before this change (one lexsort), so the comparison is against the old code."""
    arr = lengths.astype(np.float64)
    order = np.lexsort((-arr, lanes))
    sorted_lane = lanes[order]
    rank = np.arange(arr.size) - np.searchsorted(sorted_lane, sorted_lane, side="left") + 1
    d = marginal_tpot(curve, int(rank.max()))
    return np.bincount(sorted_lane, weights=arr[order] * d[rank], minlength=n_lanes)


def exhaustive_topq_best(batch: GroupBatch, replicas: int, curve: TpotCurve) -> tuple[int, int, float]:
    """The replaced `TopQBest.assign`: every (q, m) exactly, one N × (N·G) lane matrix per m."""
    flat, g, rank = batch.lengths.ravel(), batch.group_size, group_tail_rank(batch)
    qs = np.arange(1, batch.n_groups + 1)
    best = (0, 0, float(lexsort_lane_makespans(flat, np.repeat(np.arange(batch.n_groups) % replicas, g), replicas,
                                               curve).max()))
    for m in range(1, replicas):
        lanes = np.repeat(topq_lanes(rank, qs, m, replicas), g, axis=1)
        offset = (np.arange(qs.size) * replicas)[:, None]
        spans = lexsort_lane_makespans(np.tile(flat, qs.size), (lanes + offset).ravel(), qs.size * replicas, curve)
        t = spans.reshape(qs.size, replicas).max(axis=1)
        i = int(np.argmin(t))
        if t[i] < best[2]:
            best = (int(qs[i]), m, float(t[i]))
    return best


def compare_topq(groups: int, replicas: int, steps: int, curve: TpotCurve) -> None:
    """Part 1: old and new `topq-best` on the same `uniform` batches."""
    config = SimConfig(router=RouterConfig(groups=groups, group_size=8, replicas=replicas), steps=steps)
    ref = run_policy("uniform", load_workload(None, mode="resample", seed=0), curve, config)
    old_s, new_s, same = [], [], True
    for lens in ref.batch_lengths:
        batch = GroupBatch(lens)
        t0 = time.process_time()
        q, m, t = exhaustive_topq_best(batch, replicas, curve)
        t1 = time.process_time()
        a = TopQBest().assign(batch, replicas, curve)
        t2 = time.process_time()
        old_s.append(t1 - t0)
        new_s.append(t2 - t1)
        same &= (int(a.info["q"]), int(a.info["m"])) == (q, m) and abs(a.makespan_s - t) <= 1e-12 * t
    old, new = statistics.median(old_s), statistics.median(new_s)
    print(f"topq-best N={groups} R={replicas}, {steps} steps: exhaustive {old:.3f} s/step, branch and bound "
          f"{new:.4f} s/step, ratio {old / new:.0f}×, identical (q, m, T) on every step: {same}")


def run_simulate(groups: int, replicas: int) -> None:
    """Part 2: the CLI command in a child process; wall, CPU and peak RSS from its rusage."""
    cmd = [sys.executable, "-m", "tailsieve", "simulate", "--groups", str(groups), "--replicas", str(replicas)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    rss_gb = after.ru_maxrss / 1024**2  # KiB on Linux
    load = os.getloadavg()[0]
    print(f"simulate --groups {groups} --replicas {replicas} (all {len(policy_names())} policies, 30 steps): "
          f"wall {wall:.1f} s ({wall / TARGET_S:.2f} × {TARGET_S:g} s), CPU {cpu:.1f} s, peak RSS {rss_gb:.2f} GB "
          f"({rss_gb / TARGET_RSS_GB:.2f} × {TARGET_RSS_GB:g} GB), load average {load:.1f} on {os.cpu_count()} cores")


def per_policy(groups: int, replicas: int, curve: TpotCurve) -> None:
    """Part 3: CPU seconds per policy (oracles replay uniform's batches) and the capture measurement."""
    config = SimConfig(router=RouterConfig(groups=groups, group_size=8, replicas=replicas), steps=30)
    workload = load_workload(None, mode="resample", seed=0)
    t0 = time.process_time()
    ref = run_policy("uniform", workload, curve, config)
    print(f"  {'uniform':16s} {time.process_time() - t0:6.2f} s")
    for name in policy_names()[1:]:
        t0 = time.process_time()
        run_policy(name, workload, curve, config, reference=ref)
        print(f"  {name:16s} {time.process_time() - t0:6.2f} s")
    t0 = time.process_time()
    capture_rates(workload, curve, config.router, steps=10)
    print(f"  {'capture':16s} {time.process_time() - t0:6.2f} s")


def main() -> None:
    """Parse the options and run the three parts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="simulate at N = 1024, R = 64 instead")
    parser.add_argument("--per-policy", action="store_true", help="also CPU seconds per policy (about +1 minute)")
    parser.add_argument("--compare-steps", type=int, nargs=2, default=[8, 3], metavar=("AT_256", "AT_512"),
                        help="steps of the old-vs-new topq-best comparison at N=256/R=16 and N=512/R=32 (0 skips)")
    args = parser.parse_args()
    curve = load_curve("h100-llama3-8b")
    for (groups, replicas), steps in zip(((256, 16), (512, 32)), args.compare_steps, strict=True):
        if steps > 0:
            compare_topq(groups, replicas, steps, curve)
    groups, replicas = (1024, 64) if args.quick else (4096, 256)
    run_simulate(groups, replicas)
    if args.per_policy:
        print(f"CPU seconds per policy at N={groups}, R={replicas}:")
        per_policy(groups, replicas, curve)


if __name__ == "__main__":
    main()
