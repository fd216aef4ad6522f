"""Controller quality: mean step time of `tailsieve` against the best static (q, m) in hindsight and uniform.

Run: `python bench/bench_controller.py [--steps 30] [--seeds 0,1] [--policies tailsieve,tailsieve-paper]`.
For every bundled workload and several curves it grids static (q, m) over q = 1..E, m = 1..R−1 on the same prompt
stream and length draws, and prints each adaptive policy's speedup over uniform, the best static speedup, and
the gap. Targets (issue 4): gap ≤ 5% everywhere; never more than 1% slower than uniform where isolation cannot
help (the `capped` workload: 80% of responses at the 16384-token cap).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from tailsieve.model.curves import load_curve
from tailsieve.policy.controller import ControllerConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.workloads import load_workload

CASES = [
    ("kodcode-r1", "h100-llama3-8b"),
    ("kodcode-r1", "a100-llama3-8b"),
    ("kodcode-tests", "h100-llama3-8b"),
    ("synthetic-math-weak", "h100-llama3-8b"),
    ("synthetic-math", "h100-llama3-8b"),
    ("synthetic-math-strong", "h100-llama3-8b"),
    ("synthetic-math-weak", "a100-llama3-8b"),
    ("synthetic-math", "a100-llama3-8b"),
    ("synthetic-math-strong", "a100-llama3-8b"),
    ("synthetic-math", "h100-llama2-70b-tp8"),
    ("capped", "h100-llama3-8b"),
]


def capped_trace(folder: Path) -> Path:
    """A trace where 80% of responses hit the 16384-token cap: isolation cannot help there."""
    rng = np.random.default_rng(0)
    path = folder / "capped.csv"
    rows = ["prompt_id,sample,length"]
    for p in range(256):
        for s in range(3):
            length = 16384 if rng.random() < 0.8 else int(rng.integers(2000, 16384))
            rows.append(f"p{p},{s},{length}")
    path.write_text("\n".join(rows) + "\n")
    return path


def main() -> None:
    """Print the gap table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--policies", default="tailsieve,tailsieve-fixed,tailsieve-paper")
    ap.add_argument("--controller", default="{}", help="JSON of ControllerConfig overrides, e.g. '{\"m_gain\": 0.05}'")
    args = ap.parse_args()
    policies = args.policies.split(",")
    overrides = json.loads(args.controller)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        capped = capped_trace(Path(tmp))
        gaps: dict[str, list[float]] = {p: [] for p in policies}
        print(f"{'workload':22s} {'curve':20s} seed  best static (q,m)  " + "  ".join(f"{p:>22s}" for p in policies))
        for seed in (int(s) for s in args.seeds.split(",")):
            for wname, cname in CASES:
                wl = load_workload(capped if wname == "capped" else wname, mode="resample", seed=seed)
                curve = load_curve(cname)
                cfg = SimConfig(steps=args.steps, seed=seed)
                uniform = run_policy("uniform", wl, curve, cfg).mean_step_s()
                best, best_qm = 1.0, (0, 0)
                for q in range(1, cfg.router.extra + 1):
                    for m in range(1, cfg.router.replicas):
                        s = uniform / run_policy("static", wl, curve, SimConfig(steps=args.steps, seed=seed, q=q,
                                                                                 m=m)).mean_step_s()
                        if s > best:
                            best, best_qm = s, (q, m)
                cells = []
                for p in policies:
                    run = run_policy(p, wl, curve, SimConfig(steps=args.steps, seed=seed,
                                                             controller=ControllerConfig(**overrides)))
                    s = uniform / run.mean_step_s()
                    gaps[p].append(1 - s / best)
                    cells.append(f"{s:.3f} gap {100 * (1 - s / best):4.1f}% ({run.steps[-1].q},{run.steps[-1].m})")
                print(f"{wname:22s} {cname:20s} {seed:4d}  {best:.3f} {best_qm!s:8s}  " + "  ".join(
                    f"{c:>22s}" for c in cells), flush=True)
    for p in policies:
        g = np.array(gaps[p]) * 100
        print(f"{p}: max gap {g.max():.1f}%  mean gap {g.mean():.1f}%")
    print(f"wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
