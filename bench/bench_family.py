"""The controller over the generated regime family (`family:SEED`, issue 40; docs/workloads.md): how far `tailsieve`
stays from the better of the best static split in hindsight and verl's balancer, across many regimes.

Run: `python bench/bench_family.py [--split tune|validation] [--seeds A..B | COUNT] [--quick] [--steps 30]
[--policies tailsieve,tailsieve-fixed,tailsieve-paper] [--controller JSON] [--workers 2] [--json out.json]`.

For every regime of the split (`--seeds COUNT`: its first COUNT seeds; `A..B`: its seeds in A..B; even seeds tune,
odd seeds validate: tune only on `--split tune`) it runs, on one prompt stream and one set of length draws
(`SimConfig(router=regime's N, G, R, engine_scale=regime's, steps, seed=SEED)`, the lengths drawn with seed SEED):
uniform, verl-lif, the adaptive policies, and a coarse static grid in two stages: q = E at up to 8 values of m
spread over 1..R-1, then q = E/2 and E/4 at the best m and its two grid neighbours (the best static in hindsight
almost always has q = E). Reference = max(best static, verl-lif). Per regime it prints the speedups over uniform,
ts/ref (tailsieve / reference), ts/fix (tailsieve / tailsieve-fixed), m0 (steady steps tailsieve spent at m = 0),
len (its length bias: mean consumed response length over the steady steps / uniform's, App. E) and the paired noise
band: the std of the per-step difference (policy - reference run) over the steady steps
(after SKIP_STEPS) / sqrt(n), as a share of the reference's mean step. Then the distribution over regimes: for each
adaptive policy P, P / reference, P / max(reference, uniform) (both reference policies deal requests; where whole
groups win, uniform beats them) and P / tailsieve-fixed (median, p5, min; the share of regimes with
P >= fixed - 1%), the minimum P / uniform, the median noise band and the length bias (median [min, max]).

`--quick` (< 5 min on 2 cores): the 12 cheapest of the split's first 32 regimes, 20 steps. A full split (64
regimes, 30 steps) takes ~25-40 min on 2 cores; `--cache` keeps what a rerun of the adaptive policies does not need.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import tailsieve
from family_beliefs import BELIEFS, belief_replica
from family_report import print_rows, summary
from tailsieve.policy.controller import ControllerConfig
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.replica import ReplicaConfig
from tailsieve.simulation.runs import SKIP_STEPS, PolicyRun, SimConfig, policy_names, run_policy, static_grid
from tailsieve.workloads.engine_family import (
    ENGINE_SEEDS,
    engine_regime,
    engine_seeds,
    engine_workload,
)
from tailsieve.workloads.family import Split, family_regime, family_workload, split_of, split_seeds

DEFAULT_COUNT = 64  # regimes per split: at 32 the 95% share of issue 40 turns on one regime (bench/README.md)
QUICK_POOL, QUICK_COUNT, QUICK_STEPS = 32, 12, 20
GRID_M = 8  # m values of the grid's first stage


@dataclass(frozen=True)
class Task:
    seed: int
    steps: int
    policies: tuple[str, ...]
    controller: str  # JSON of ControllerConfig fields
    cache: str = ""  # folder of the controller-independent runs (uniform, verl-lif, static grid) per regime; "": none
    engine: bool = False  # the engine half (`workloads.engine_family`): truth apart from belief, fine-grid reference
    belief: str = "curve"  # engine half: the model file holds the curve only, + the servers' KV capacity, or `profile`


def cost(seed: int) -> float:
    """A rough relative simulation cost: requests per step, ~10x per request for multi-turn regimes, ~3x paged."""
    if seed >= ENGINE_SEEDS:
        e = engine_regime(seed)
        paged = e.truth.engine.kv_tokens is not None or e.truth.engine.max_num_batched_tokens is not None
        return e.base.router.groups * e.base.router.group_size * (
            10.0 if e.base.multi_turn else 3.0 if paged else 1.0) * (1 + e.base.router.replicas / 64)
    r = family_regime(seed)
    return r.router.groups * r.router.group_size * (10.0 if r.multi_turn else 1.0)


def spaced(top: int, count: int) -> list[int]:
    """Up to `count` integers strictly inside 0..top+1, evenly spread (m = 1 .. R-1)."""
    return sorted({min(max(round(k * (top + 1) / (count + 1)), 1), top) for k in range(1, count + 1)})


def coarse_grid(wl: Any, curve: Any, cfg: SimConfig) -> tuple[dict[tuple[int, int], float], PolicyRun]:
    """The two-stage static grid: mean step per (q, m) and the fastest run."""
    e, r = cfg.router.extra, cfg.router.replicas
    ms = spaced(r - 1, GRID_M)
    first = static_grid(wl, curve, cfg, qs=[e], ms=ms)
    i = ms.index(first.m)
    near = ms[max(i - 1, 0):i + 2]
    qs = sorted({max(1, round(e / 2)), max(1, round(e / 4))} - {e})
    means, best = dict(first.mean_s), first.best
    if qs:
        second = static_grid(wl, curve, cfg, qs=qs, ms=near)
        means.update(second.mean_s)
        if second.mean_s[(second.q, second.m)] < first.mean_s[(first.q, first.m)]:
            best = second.best
    return means, best


def fine_grid(wl: Any, curve: Any, cfg: SimConfig) -> tuple[dict[tuple[int, int], float], PolicyRun]:
    """The fine reference (issue 48): the coarse grid, then every m within ±3 of its best at q in {E, E/2, E/4}."""
    means, best = coarse_grid(wl, curve, cfg)
    e, r = cfg.router.extra, cfg.router.replicas
    q0, m0 = min(means, key=lambda k: means[k])
    ms = [m for m in range(max(1, m0 - 3), min(r - 1, m0 + 3) + 1)]
    qs = sorted({e, max(1, round(e / 2)), max(1, round(e / 4))})
    todo = [(q, m) for q in qs for m in ms if (q, m) not in means]
    for q in qs:
        mq = [m for m in ms if (q, m) in todo]
        if mq:
            g = static_grid(wl, curve, cfg, qs=[q], ms=mq)
            means.update(g.mean_s)
            if g.mean_s[(g.q, g.m)] < means[(q0, m0)] and g.mean_s[(g.q, g.m)] <= min(means.values()):
                best, (q0, m0) = g.best, (g.q, g.m)
    return means, best


def makespans(run: PolicyRun) -> np.ndarray:
    return np.array([s.makespan_s for s in run.steps[SKIP_STEPS:]])


def mean_length(run: PolicyRun) -> float:
    """Mean consumed response length over the steady steps (App. E's length bias is this over uniform's)."""
    kept = run.batch_lengths[SKIP_STEPS:] or run.batch_lengths
    return float(np.concatenate([np.ravel(b) for b in kept]).mean())


def noise_band(run: np.ndarray, ref: np.ndarray) -> float:
    """std of the per-step paired difference (run - ref) over the steady steps / sqrt(n), over ref's mean step."""
    d = run - ref
    if d.size < 2:
        return float("nan")
    return float(d.std(ddof=1) / np.sqrt(d.size) / ref.mean())


def reference_runs(t: Task, wl: Any, curve: Any, cfg: SimConfig) -> dict[str, Any]:
    """The runs that do not depend on the controller: uniform's mean step, verl-lif's, the static grid's means, and
    the steady step times of verl-lif and of the best static split; kept in `t.cache` when given (`--cache`)."""
    path = Path(t.cache) / f"family{t.seed}_steps{t.steps}{'_engine' if t.engine else ''}.json" if t.cache else None
    # (the references run on the truth: the same file serves both beliefs)
    out: dict[str, Any] = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    if "uniform_len" in out:
        return out
    if out:  # a cache written before the length column: only uniform is run again
        out["uniform_len"] = mean_length(run_policy("uniform", wl, curve, cfg))
    else:
        uniform = run_policy("uniform", wl, curve, cfg)
        verl = run_policy("verl-lif", wl, curve, cfg)
        means, best = (fine_grid if t.engine else coarse_grid)(wl, curve, cfg)
        out = {"uniform": uniform.mean_step_s(), "verl": verl.mean_step_s(),
               "means": {f"{q},{m}": v for (q, m), v in means.items()},
               "verl_steps": makespans(verl).tolist(), "best_steps": makespans(best).tolist(),
               "uniform_len": mean_length(uniform), "best_len": mean_length(best)}
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(path)
    return out


def run_regime(t: Task) -> dict[str, Any]:
    """Uniform, verl-lif, the coarse static grid and the adaptive policies on one regime; one JSON-able row."""
    t0 = time.perf_counter()
    eng = engine_regime(t.seed) if t.engine else None
    regime = family_regime(t.seed) if eng is None else eng.base
    wl = family_workload(t.seed, draw_seed=t.seed) if eng is None else engine_workload(eng, draw_seed=t.seed)
    curve = regime.curve  # what the controller believes

    def cfg(**kw: Any) -> SimConfig:
        base = SimConfig(router=RouterConfig(**regime.router.kwargs()), engine_scale=regime.engine_scale,
                         steps=t.steps, seed=t.seed, **kw)
        if eng is None:
            return base
        tm = eng.truth  # the truth: the controller prices with `curve` and no KV or prefill term
        e = tm.engine
        replica = ReplicaConfig(kv_ms_per_1k_tokens=tm.kv_ms_per_1k, prefill_ms_per_token=tm.prefill_ms_per_token,
                                kv_tokens=e.kv_tokens, block_size=e.block_size,
                                max_num_batched_tokens=e.max_num_batched_tokens, prefix_caching=e.prefix_caching)
        return dataclasses.replace(base, replica=replica, truth_curve=tm.curve, speed=e.speed,
                                   belief=belief_replica(t.belief, eng))

    refs = reference_runs(t, wl, curve, cfg())
    base, means = refs["uniform"], {tuple(map(int, k.split(","))): v for k, v in refs["means"].items()}
    best_qm = min(means, key=lambda k: means[k])
    sp_best, sp_verl = base / means[best_qm], base / refs["verl"]
    ref_steps = np.asarray(refs["best_steps"] if sp_best >= sp_verl else refs["verl_steps"])
    row: dict[str, Any] = {
        "seed": t.seed, "split": str(regime.split), "describe": regime.describe(), "replicas": regime.router.replicas,
        "groups": regime.router.groups, "group_size": regime.router.group_size, "multi_turn": regime.multi_turn,
        "cap": regime.cap, "loop_share": regime.loop_share, "prompt_share": regime.prompt_share,
        "engine_scale": regime.engine_scale, "uniform_s": base, "verl": sp_verl, "best": sp_best,
        "best_qm": list(best_qm), "reference": max(sp_best, sp_verl),
        "reference_policy": "static" if sp_best >= sp_verl else "verl-lif",
        "static": {f"{q},{m}": base / v for (q, m), v in means.items()}, "policies": {},
        "kv_bound": bool(eng is not None and eng.kv_bound), "kv_ratio": 0.0 if eng is None else eng.kv_ratio}
    if eng is not None:
        row["describe"] = eng.describe()
    ctl = ControllerConfig(**json.loads(t.controller))
    for p in t.policies:
        run = run_policy(p, wl, curve, cfg(controller=ctl))
        sp = base / run.mean_step_s()
        steady = [s for s in run.steps[SKIP_STEPS:] if not s.warmup]
        row["policies"][p] = {"speedup": sp, "ratio_ref": sp / row["reference"], "final_qm": [run.final_q, run.final_m],
                              "m0_steps": sum(s.m == 0 for s in steady), "steady_steps": len(steady),
                              "noise": noise_band(makespans(run), ref_steps),
                              "length_ratio": mean_length(run) / refs["uniform_len"], "ratio_verl": sp / sp_verl,
                              "preemptions": sum(s.preemptions for s in run.steps)}
    row["seconds"] = time.perf_counter() - t0
    return row


def parse_seeds(text: str, split: Split) -> list[int]:
    """'COUNT' (the split's first COUNT seeds), 'A..B' (the split's seeds in A..B) or 'A,B,…' (those of the split)."""
    if "," in text:
        items = text.split(",")
        if not all(x.isdigit() for x in items):
            raise argparse.ArgumentTypeError(f"--seeds A,B,... takes integers, got {text!r}")
        return [int(x) for x in items if split_of(int(x)) is split]
    if ".." in text:
        lo, _, hi = text.partition("..")
        if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
            raise argparse.ArgumentTypeError(f"--seeds must be COUNT or A..B with 0 <= A <= B, got {text!r}")
        return [s for s in range(int(lo), int(hi) + 1) if split_of(s) is split]
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--seeds must be COUNT (>= 1) or A..B, got {text!r}")
    return split_seeds(split, int(text))


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[int], tuple[str, ...]]:
    """Seeds and policies, and the controller JSON checked against ControllerConfig's fields (one-line errors)."""
    try:
        seeds = parse_seeds(args.seeds, Split(args.split))
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    if not seeds:
        ap.error(f"--seeds {args.seeds!r} holds no seed of the {args.split} split")
    policies = tuple(dict.fromkeys(p for p in args.policies.split(",") if p))
    known = set(policy_names())
    bad = [p for p in policies if p not in known or p in ("uniform", "static")]
    if bad or not policies:
        ap.error(f"--policies: unknown or non-adaptive {', '.join(bad) or '(none given)'}")
    try:
        ctl = json.loads(args.controller)
    except json.JSONDecodeError as exc:
        ap.error(f"--controller is not JSON: {exc}")
    if not isinstance(ctl, dict):
        ap.error("--controller must be a JSON object of ControllerConfig fields")
    fields = {f.name for f in dataclasses.fields(ControllerConfig)}
    unknown = sorted(set(ctl) - fields)
    if unknown:
        ap.error(f"--controller: no ControllerConfig field {', '.join(unknown)} (fields: {', '.join(sorted(fields))})")
    try:
        ControllerConfig(**ctl)
    except (TypeError, ValueError) as exc:
        ap.error(f"--controller: {str(exc).splitlines()[0]}")
    return seeds, policies


def _ablate(name: str) -> None:
    """Worker initializer: take mechanism `name` out of `tailsieve` (`family_ablations.py`)."""
    if name:
        import family_ablations

        family_ablations.apply(name)


def run_all(tasks: list[Task], workers: int, t0: float, ablate: str = "", rows_path: Path | None = None
            ) -> list[dict[str, Any]]:
    """Every regime on `workers` processes, the costliest first (so the workers stay busy); a progress line on
    stderr as each finishes; rows in task order. `ablate`: a mechanism patched out in every worker."""
    with ProcessPoolExecutor(workers, initializer=_ablate, initargs=(ablate,)) as ex:
        futures = {ex.submit(run_regime, t): i for i, t in sorted(enumerate(tasks), key=lambda it: -cost(it[1].seed))}
        done: dict[int, dict[str, Any]] = {}
        for f in as_completed(futures):
            row = done[futures[f]] = f.result()
            if rows_path is not None:  # each row as it finishes: a run cut short keeps what it measured
                with rows_path.open("a") as out:
                    out.write(json.dumps(row) + "\n")
            print(f"[{len(done)}/{len(tasks)} {time.perf_counter() - t0:.0f}s] {row['describe']} "
                  f"({row['seconds']:.0f} s)", file=sys.stderr, flush=True)
    return [done[i] for i in range(len(tasks))]


def current_commit() -> str:
    """The commit this run measures (`git rev-parse HEAD`, '+dirty' when the tree has changes): a validation result
    names the code it validated."""
    here = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=[s.value for s in Split], default=Split.VALIDATION.value)
    ap.add_argument("--seeds", default=str(DEFAULT_COUNT), help=f"COUNT or A..B (default {DEFAULT_COUNT})")
    ap.add_argument("--quick", action="store_true", help=f"the {QUICK_COUNT} cheapest of the split's first "
                    f"{QUICK_POOL} regimes, {QUICK_STEPS} steps (< 5 min on 2 cores)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--policies", default="tailsieve,tailsieve-fixed,tailsieve-paper")
    ap.add_argument("--controller", default="{}", help="JSON object of ControllerConfig fields")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the rows, the summary and the commit here")
    ap.add_argument("--cache", type=Path, help="keep each regime's controller-independent runs (uniform, verl-lif, "
                    "the static grid) in this folder: a rerun after a controller change runs only the policies")
    ap.add_argument("--ablate", default="", help="take one mechanism out of tailsieve in every worker (the ablation "
                    "ledger; names: family_ablations.ABLATIONS)")
    ap.add_argument("--engine", action="store_true", help="the engine half (issue 48: seeds from "
                    f"{ENGINE_SEEDS}, truth apart from belief: KV capacity, prefix caching, prefill, uneven replicas, "
                    "a curve the controller does not know; fine-grid reference)")
    ap.add_argument("--belief", choices=BELIEFS, default="curve",
                    help="--engine: the controller's model file holds the family curve only (default); also what a "
                    "server reports of itself (`servers`: KV capacity and block size, no cost term); or also what "
                    "`tailsieve profile` measures (`profile`: the KV and prefill terms too)")
    return ap


def resolve(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[int], tuple[str, ...], int]:
    """The seeds, policies and steps the arguments ask for, every refusal a usage error (the validation split runs
    the controller as committed)."""
    if args.split == Split.VALIDATION.value and (args.ablate or json.loads(args.controller or "{}") != {}):
        ap.error("the validation split runs the controller as committed: --ablate and --controller tune, so they "
                 "run on --split tune only")
    if args.engine and args.seeds.isdigit():
        first = engine_seeds(args.split, int(args.seeds))
        args.seeds = f"{first[0]}..{first[-1]}"
    seeds, policies = check_args(ap, args)
    if args.ablate:
        import family_ablations

        if args.ablate not in family_ablations.ABLATIONS:
            ap.error(f"--ablate: unknown {args.ablate!r} (known: {', '.join(family_ablations.ABLATIONS)})")
    steps = args.steps
    if args.steps < SKIP_STEPS + 2 or args.workers < 1:
        ap.error(f"--steps must be >= {SKIP_STEPS + 2} and --workers >= 1")
    if args.quick:
        pool = (engine_seeds if args.engine else split_seeds)(Split(args.split), QUICK_POOL)
        seeds, steps = sorted(sorted(pool, key=cost)[:QUICK_COUNT]), min(steps, QUICK_STEPS)
    return seeds, policies, steps


def main() -> None:
    ap = parser()
    args = ap.parse_args()
    seeds, policies, steps = resolve(ap, args)
    print(f"family {args.split} split, {len(seeds)} regimes (seeds {','.join(map(str, seeds))}), {steps} steps, "
          f"mean over steps {SKIP_STEPS}+; policies {','.join(policies)}; controller {args.controller}"
          + (" [--quick]" if args.quick else "") + (f" [--ablate {args.ablate}]" if args.ablate else "")
          + (f" [--engine, belief {args.belief}]" if args.engine else "")
          + f"; tailsieve from {Path(tailsieve.__file__).parent}", flush=True)
    t0 = time.perf_counter()
    commit = current_commit()
    print(f"commit {commit}", flush=True)
    tasks = [Task(s, steps, policies, args.controller, str(args.cache or ""), args.engine, args.belief) for s in seeds]
    rows = run_all(tasks, args.workers, t0, args.ablate,
                   args.json.with_suffix(".rows.jsonl") if args.json else None)
    print_rows(rows, policies)
    summ = summary(rows, policies)
    kv_rows = [r for r in rows if r.get("kv_bound")]
    kv_summ = None
    if args.engine and kv_rows:
        print(f"\nKV-bound subset ({len(kv_rows)} of {len(rows)} regimes: KV capacity below the step's peak demand)")
        kv_summ = summary(kv_rows, policies)
    wall = time.perf_counter() - t0
    print(f"wall time {wall:.0f} s on {args.workers} workers (cpu {sum(r['seconds'] for r in rows):.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"split": args.split, "steps": steps, "seeds": seeds, "quick": args.quick,
                                         "policies": list(policies), "controller": json.loads(args.controller),
                                         "skip_steps": SKIP_STEPS, "ablate": args.ablate, "rows": rows, "summary": summ,
                                         "wall_s": wall, "commit": commit, "engine": args.engine,
                                         "belief": args.belief,
                                         "kv_bound_summary": kv_summ}, indent=1))


if __name__ == "__main__":
    main()
