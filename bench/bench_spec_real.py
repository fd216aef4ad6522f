"""Real `ngram` speculation on the tail pool (issue 6, closing note): two vLLM CPU replicas on the tiny local Llama,
started by `LocalLauncher` (replica 0 bulk without speculation, replica 1 tail with ngram, d = 3,
prompt_lookup_max 4).

(a) `profile` of both replicas at temperature 0 and 1: τ(b), acceptance (vllm:spec_decode_* counters), the fitted
    α, γ, and the speculative model's τ_spec(b) = τ(b(d+1))/ā predicted from the plain curve, against the measured one.
(b) a static policy (q isolated groups on m = 1 tail replica) on a fixed-length replay of the KodCode trace (×scale),
    two arms interleaved A B B A …: the tail replica with ngram vs without (the launcher restarts it between arms;
    restart time is excluded from the compared step times). Same prompt stream and lengths in both arms.

Run: `.venv/bin/python bench/bench_spec_real.py` (about 10–15 minutes on 2 cores; `--steps`, `--temperatures`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.config import LaunchConfig, PoolEngine
from tailsieve.engines.launch.tiny_vllm import build_tiny_model
from tailsieve.engines.measure.profile import ProfilePoint, profile_endpoint, total_spec
from tailsieve.engines.measure.spec_measure import SpecMeasure, read_counters
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.prompts import load_prompts
from tailsieve.engines.transport.engine_client import Endpoint, EngineClient, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.model.curves import TpotCurve
from tailsieve.model.speculative import SpecConfig, SpecMethod
from tailsieve.policy.step import Pool
from tailsieve.workloads import load_workload

SHARED = Path(__file__).resolve().parents[2] / "shared"
NGRAM = PoolEngine(SpecConfig(SpecMethod.NGRAM, 3), (("prompt_lookup_max", 4),))
PLAIN = PoolEngine()


async def profile(url: str, batches: tuple[int, ...], tokens: int, temperature: float
                  ) -> tuple[TpotCurve, list[ProfilePoint]]:
    """`tailsieve profile` on one replica."""
    async with EngineClient() as c:
        return await profile_endpoint(c, Endpoint(url), batches=batches, max_tokens=tokens, temperature=temperature)


def predicted(base: TpotCurve, m: SpecMeasure, batch: int) -> float:
    """The speculative model's τ_spec(b) in ms from the plain curve and the measured ā (ngram: no drafting cost)."""
    d = m.depth
    return float(base.table(batch * (d + 1))[batch * (d + 1)]) * 1e3 / m.expected_tokens


def part_a(la: LocalLauncher, args: argparse.Namespace) -> dict[str, Any]:
    """Profiles of the plain and the ngram replica at each temperature."""
    plain_url, spec_url = la.endpoints
    out: dict[str, Any] = {}
    for temp in args.temperatures:
        base, _ = asyncio.run(profile(plain_url, (1, 4, 16, 64, 256), args.profile_tokens, temp))
        _, pts = asyncio.run(profile(spec_url, (1, 4, 16, 64), args.profile_tokens, temp))
        tot = total_spec(pts)
        rows = []
        for p in pts:
            assert p.spec is not None
            rows.append({"batch": p.batch, "plain_tpot_ms": base.tpot_ms[base.batch.index(p.batch)],
                         "ngram_tpot_ms": p.tpot_ms, "model_tpot_ms": predicted(base, p.spec, p.batch),
                         "speculative": p.spec.to_json()})
        out[f"T={temp:g}"] = {"plain_curve": base.to_json(), "rows": rows, "total": tot.to_json() if tot else None}
        print(f"\n(a) profile at temperature {temp:g} ({args.profile_tokens} tokens per request)")
        print(f"{'b':>4s} {'plain τ ms':>10s} {'ngram τ ms':>10s} {'model τ ms':>10s} {'accept':>7s} "
              f"{'drafted':>7s} {'ā':>6s}  P(pos k | pos < k)")
        for r in rows:
            s = r["speculative"]
            print(f"{r['batch']:4d} {r['plain_tpot_ms']:10.3f} {r['ngram_tpot_ms']:10.3f} {r['model_tpot_ms']:10.3f} "
                  f"{s['acceptance_rate'] or 0:7.3f} {s['draft_share'] or 0:7.3f} {s['expected_tokens'] or 0:6.3f}  "
                  + " ".join(f"{x:.2f}" if x is not None else "-" for x in s["conditional"]))
        if tot:
            a, g = tot.fit()
            print(f"fit: acceptance α = {a:.3f}, decay γ = {g:.3f}, measured ā = {tot.expected_tokens:.3f}", flush=True)
    return out


def part_b(la: LocalLauncher, args: argparse.Namespace, temp: float) -> dict[str, Any]:
    """Static q/m=1 with the tail replica speculating (A) or not (B), interleaved A B B A …"""
    prompts = load_prompts(SHARED / "data" / "prompts" / "kodcode_demo_232.jsonl")
    cfg = RolloutConfig(groups=args.groups, group_size=args.group_size, rho=args.rho, policy="static", q=args.q,
                        m=1, replay=load_workload("kodcode-r1", mode="recorded"), length_scale=args.scale, seed=None,
                        sampling=SamplingParams(temperature=temp, max_tokens=4096),
                        faults=FaultPolicy(stall_timeout_s=180))
    tail_url = Endpoint(la.endpoints[1])

    def hook(engine: PoolEngine) -> Any:
        return lambda plan: la.configure([Pool.BULK, Pool.TAIL if plan.m else Pool.BULK],
                                         [PLAIN, engine if plan.m else PLAIN])

    arms = {"ngram": hook(NGRAM), "none": hook(PLAIN)}
    rows: list[dict[str, Any]] = []

    async def go() -> None:
        async with Rollout(la.endpoints, cfg, prompts, pools=arms["ngram"]) as ra, \
                Rollout(la.endpoints, cfg, prompts, pools=arms["none"]) as rb:
            runs = {"ngram": ra, "none": rb}
            async with EngineClient() as c:
                for k in range(args.steps):
                    for arm in (("ngram", "none") if k % 2 == 0 else ("none", "ngram")):
                        r = runs[arm]
                        before = await read_counters(c, tail_url)
                        batch: Batch = await r.step()
                        after = await read_counters(c, tail_url)
                        sm = SpecMeasure.between(before, after) if before and after else None
                        rec = batch.record
                        rows.append({"arm": arm, "step": rec.step, "q": rec.q, "m": rec.m, "tail_s": rec.tail_s,
                                     "bulk_s": rec.bulk_s, "step_s": rec.makespan_s - batch.restart_s,
                                     "restart_s": batch.restart_s, "warmup": rec.warmup,
                                     "tail_tokens": sum(sum(g.lengths) for g in batch.groups if g.pool is Pool.TAIL),
                                     "speculative": sm.to_json() if sm else None})
                        own = rec.makespan_s - batch.restart_s
                        print(f"  T={temp:g} {arm:5s} step {rec.step:2d}: step {own:6.2f}s "
                              f"tail {rec.tail_s:6.2f}s bulk {rec.bulk_s:6.2f}s q={rec.q} m={rec.m} "
                              f"restart {batch.restart_s:5.1f}s"
                              + (f" ā={sm.expected_tokens:.2f}" if sm and sm.iterations > 0 else ""), flush=True)

    asyncio.run(go())
    summary: dict[str, Any] = {}
    for arm in ("ngram", "none"):
        steady = [r for r in rows if r["arm"] == arm and not r["warmup"] and r["m"] == 1]
        tail_tps = [r["tail_tokens"] / r["tail_s"] for r in steady if r["tail_s"] > 0]
        series = (("tail_s", [r["tail_s"] for r in steady]), ("step_s", [r["step_s"] for r in steady]),
                  ("tail_tokens_per_s", tail_tps))
        summary[arm] = {k: {"mean": statistics.fmean(v), "std": statistics.pstdev(v), "min": min(v), "max": max(v)}
                        for k, v in series if v}
    pairs = [(a["tail_s"], b["tail_s"]) for a, b in zip([r for r in rows if r["arm"] == "ngram"],
                                                       [r for r in rows if r["arm"] == "none"], strict=True)
             if not a["warmup"] and a["m"] == 1 and b["m"] == 1]
    ratios = [b / a for a, b in pairs if a > 0]
    summary["tail_speedup_per_step"] = ratios
    print(f"(b) T={temp:g}: tail-pool speedup of ngram per step (none/ngram tail time): "
          + " ".join(f"{x:.2f}" for x in ratios), flush=True)
    return {"rows": rows, "summary": summary}


def main() -> None:
    """Launch, profile, run both arms per temperature, save."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--steps", type=int, default=7, help="steps per arm (the first is the warm-up)")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rho", type=float, default=0.1)
    ap.add_argument("--q", type=int, default=1)
    ap.add_argument("--scale", type=float, default=0.125, help="replayed lengths × this")
    ap.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 1.0])
    ap.add_argument("--profile-tokens", type=int, default=128)
    ap.add_argument("--skip-rollout", action="store_true")
    ap.add_argument("--out", default="bench/results/spec_real.json")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ts-spec-"))
    model = build_tiny_model(scratch / "tiny")
    cores = ("0", "1") if (os.cpu_count() or 1) >= 2 else ()
    cfg = LaunchConfig(model=str(model), replicas=2, places=cores, memory=2, served_model_name="tiny",
                       tail_replicas=1, tail=NGRAM, args=("--max-model-len", "4096", "--max-num-seqs", "256"),
                       startup_timeout_s=300)
    la = LocalLauncher(cfg, scratch / "launch")
    doc: dict[str, Any] = {"args": dict(vars(args)), "ngram": NGRAM.speculative_config()}
    t0 = time.perf_counter()
    try:
        la.start()
        print(f"replicas up: {[(r.url, r.pool.value, round(r.boot_s, 1)) for r in la.replicas]}", flush=True)
        doc["profile"] = part_a(la, args)
        if not args.skip_rollout:
            doc["rollout"] = {f"T={t:g}": part_b(la, args, t) for t in args.temperatures}
        doc["restarts"] = [r.restarts for r in la.replicas]
        doc["restart_s_total"] = la.restart_s_total
    finally:
        la.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    doc["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(replace_nan(doc), indent=1))
    print(f"saved {out} ({doc['wall_s']:.0f}s)")


def replace_nan(x: Any) -> Any:
    """NaN → None for JSON."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: replace_nan(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [replace_nan(v) for v in x]
    return x


if __name__ == "__main__":
    main()
