"""TailSieve beside what RL teams run today (issue 16): slime's APRIL (partial rollout on / off), verl's request load
balancer, RollPacker's long rounds and OpenRLHF's group dispatch, each with its fidelity cost.

Run: `python bench/bench_peers.py [--quick] [--steps 30] [--seed 0] [--workers 2] [--json out.json]`.
For every workload regime (kodcode-r1, synthetic-math, video-rl, agent-search, math-drift) × curve (h100-llama3-8b,
a100-llama3-8b) it simulates uniform, tailsieve (default redraw limit 1) and every peer (`tailsieve.policy.peers`)
on the same prompt stream and length draws (R = 8, N = 64, G = 8, ρ = 0.1: the peers over-sample E = 7 groups as
TailSieve does), and prints one table per case: speedup over uniform with its ±2σ, length ratio, truncation ratio,
off-policy token share, dropped and delayed (> 1 step) prompt shares and the batch-length CV (docs/peers.md). Under
each table, goal 4: whether tailsieve (zero off-policy tokens, zero dropped prompts) is faster than every peer that
also has zero of both, and its gap to april-partial's speedup beside april-partial's off-policy token share.
`--quick` runs 12 steps. Reference figures (30 steps, 2 workers on 2 cores): docs/peers.md.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailsieve.analysis.metrics import PolicySummary, summarize
from tailsieve.model.curve_names import load_curve
from tailsieve.policy.peers import PEERS
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.runs import SimConfig, run_policies
from tailsieve.workloads import load_workload

WORKLOADS = ("kodcode-r1", "synthetic-math", "video-rl", "agent-search", "math-drift")
CURVES = ("h100-llama3-8b", "a100-llama3-8b")
POLICIES = ("tailsieve", *PEERS)


@dataclass(frozen=True)
class Case:
    workload: str
    curve: str
    steps: int
    seed: int


def row(name: str, s: PolicySummary) -> dict[str, Any]:
    """One policy's numbers."""
    b, t, v = s.batch, s.truncation, s.verdict
    return {"policy": name, "speedup": s.speedup, "speedup_2sigma": None if v is None else v.speedup_2sigma,
            "length_ratio": None if s.bias is None else s.bias.mean_ratio,
            "truncated_ratio": None if t is None else t.ratio,
            "off_policy_token_share": b.off_policy_token_share if b else 0.0,
            "dropped_prompt_share": b.dropped_prompt_share if b else 0.0,
            "delayed_prompt_share": b.delayed_prompt_share if b else 0.0,
            "batch_length_cv": b.batch_length_cv if b else 0.0}


def goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Goal 4: tailsieve on-policy and undropped, and faster than every peer with zero of both; the APRIL gap."""
    by = {r["policy"]: r for r in rows}
    ts = by["tailsieve"]
    clean = [r["policy"] for r in rows if r["policy"] in PEERS
             and r["off_policy_token_share"] == 0 and r["dropped_prompt_share"] == 0]
    behind = [p for p in clean if by[p]["speedup"] >= ts["speedup"]]
    ap = by["april-partial"]
    return {"tailsieve_clean": ts["off_policy_token_share"] == 0 and ts["dropped_prompt_share"] == 0,
            "clean_peers": clean, "ahead_of_clean_peers": not behind, "behind": behind,
            "april_partial_gap": ap["speedup"] - ts["speedup"],
            "april_partial_off_policy": ap["off_policy_token_share"]}


def run_case(case: Case) -> dict[str, Any]:
    """Every policy on one regime × curve."""
    start = time.perf_counter()
    cfg = SimConfig(router=RouterConfig(), steps=case.steps, seed=case.seed)
    runs = run_policies(list(POLICIES), load_workload(case.workload, seed=case.seed), load_curve(case.curve), cfg)
    summaries = summarize(runs)
    rows = [row(name, summaries[name]) for name in ("uniform", *POLICIES)]
    return {"workload": case.workload, "curve": case.curve, "steps": case.steps, "seed": case.seed,
            "wall_s": time.perf_counter() - start, "rows": rows, "goal": goal(rows)}


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(result: dict[str, Any]) -> str:
    """One case as a markdown table, with its goal-4 line."""
    head = (f"### {result['workload']} × {result['curve']} ({result['steps']} steps, seed {result['seed']}, "
            f"{result['wall_s']:.1f} s)\n\n| policy | speedup | ±2σ | length ratio | trunc. ratio | "
            "off-policy tokens | dropped | delayed >1 step | batch CV |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in result["rows"]:
        band = "-" if r["speedup_2sigma"] is None else f"±{100 * r['speedup_2sigma']:.1f}%"
        lines.append(f"| {r['policy']} | {_f(r['speedup'], '.3f')}× | {band} | {_f(r['length_ratio'], '.3f')} | "
                     f"{_f(r['truncated_ratio'], '.2f')} | {100 * r['off_policy_token_share']:.1f}% | "
                     f"{100 * r['dropped_prompt_share']:.1f}% | {100 * r['delayed_prompt_share']:.1f}% | "
                     f"{r['batch_length_cv']:.3f} |")
    g = result["goal"]
    verdict = ("ahead of every peer with zero off-policy tokens and zero drops (" + ", ".join(g["clean_peers"]) + ")"
               if g["ahead_of_clean_peers"] else "NOT ahead of " + ", ".join(g["behind"]))
    lines.append(f"\ngoal 4: tailsieve {'on-policy, nothing dropped' if g['tailsieve_clean'] else 'NOT clean'}; "
                 f"{verdict}; april-partial is {g['april_partial_gap']:+.3f} ahead at "
                 f"{100 * g['april_partial_off_policy']:.1f}% off-policy tokens.\n")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="12 steps instead of --steps")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    steps = 12 if args.quick else args.steps
    cases = [Case(w, c, steps, args.seed) for w in WORKLOADS for c in CURVES]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(run_case, cases))
    for r in results:
        print(render(r))
    ahead = sum(r["goal"]["ahead_of_clean_peers"] for r in results)
    print(f"goal 4 met in {ahead}/{len(results)} cases; total {time.perf_counter() - start:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
