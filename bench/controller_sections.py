"""The issue-22 `--decompose` section of `bench_controller.py` and the helpers every section shares (bench/README.md;
`--fleet`: `fleet_section.py`, `--fig6b`: `fig6b_section.py`).

Only public APIs: `run_policy` / `SimConfig` for the policies, and for the perfect-ranking ablation of `--decompose`
the step loop driven here exactly as `run_policy` drives it (`StepLoop`, `Router`, `SimExecutor`, `RunLog`,
`make_controller`), with one extra candidate ranking registered through `tailsieve.policy.ranking.ranking`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tailsieve.loop import SKIP_STEPS, PolicyRun, RunLog, StepLoop, make_controller
from tailsieve.model.curve_names import load_curve
from tailsieve.policy.ranking import ranking
from tailsieve.policy.router import Router, RouterConfig
from tailsieve.policy.step import GroupOutcome, StepPlan
from tailsieve.simulation.runs import SimConfig, SimExecutor, run_policy
from tailsieve.workloads import Workload, load_workload

ORACLE_RANKING = "bench-next-longest"  # registered below; only this bench uses it


def _workload(name: str, seed: int, capped: str) -> Workload:
    return load_workload(capped if name == "capped" else name, mode="resample", seed=seed)


def pool_map(fn: Callable[[Any], Any], tasks: Sequence[Any], workers: int,
              cost: Callable[[Any], float] | None = None) -> list[Any]:
    """`fn` over `tasks` on `workers` processes, the costliest first (so both workers stay busy); input order out."""
    order = sorted(range(len(tasks)), key=lambda i: -cost(tasks[i])) if cost else list(range(len(tasks)))
    with ProcessPoolExecutor(workers) as ex:
        done = dict(zip(order, ex.map(fn, [tasks[i] for i in order]), strict=True))
    return [done[i] for i in range(len(tasks))]


def multi_turn(name: str) -> bool:
    """Whether a bundled workload has tool waits between turns (10-50x slower to simulate)."""
    return name != "capped" and load_workload(name).tool_wait_s > 0


def spaced(top: int, count: int, *, interior: bool) -> list[int]:
    """`count` integers spread over 1..top: k·top/count (k = 1..count, `top` included) or, `interior`, the points
    k·(top+1)/(count+1) strictly inside (for m: m = R−1 leaves one bulk replica, m = 1 one tail replica)."""
    pts = [k * (top + 1) / (count + 1) for k in range(1, count + 1)] if interior else \
        [k * top / count for k in range(1, count + 1)]
    return sorted({min(max(round(x), 1), top) for x in pts})


def grid_spec(text: str) -> tuple[int, int]:
    """argparse type: 'QxM' (counts of q and m values of a coarse static grid)."""
    try:
        nq, nm = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"grid must be QxM, e.g. 6x8, got {text!r}") from None
    if nq < 1 or nm < 1:
        raise argparse.ArgumentTypeError(f"grid counts must be >= 1, got {text!r}")
    return nq, nm


# --decompose ----------------------------------------------------------------------------------------------------


@dataclass
class _OracleContext:
    """What the perfect ranking reads: the running executor's per-prompt generation counters and the step that is
    being observed (set by the pool hook before the step executes); the predictions it made, by uid."""

    executor: SimExecutor | None = None
    step: int = 0
    predicted: dict[int, int] = field(default_factory=dict)


_ORACLE = _OracleContext()


@ranking(ORACLE_RANKING)
def next_longest(cut: Sequence[GroupOutcome]) -> list[GroupOutcome]:
    """Perfect tail ranking (bench only): the cut groups by the true longest member of their NEXT generation, longest
    first. The next generation of prompt p is the executor's `generation[p]`-th draw (0-based, the count so far)
    at step `step + 1`: every candidate is regenerated in the step right after its cut, and a step's candidates are
    drawn before its fresh groups (tail first, then the requeued/pinned ones at the front of the bulk queue). Exact
    except when one prompt is cut twice in one step (both get the same prediction) or a candidate waits longer."""
    ex = _ORACLE.executor
    if ex is None:
        raise RuntimeError(f"ranking {ORACLE_RANKING!r} needs a bench-driven loop (controller_sections.drive)")
    g = ex.router.group_size

    def longest(o: GroupOutcome) -> int:
        pid = o.ref.prompt_id
        top = int(ex.workload.lengths(pid, ex.generation[pid], _ORACLE.step + 1, g).max())
        _ORACLE.predicted[o.ref.uid] = top
        return top

    return sorted(cut, key=lambda o: (-longest(o), o.ref.uid))


def drive(name: str, wl: Workload, curve_name: str, rc: RouterConfig, steps: int, seed: int, *,
          q: int | None = None, m: int | None = None) -> tuple[PolicyRun, int, int]:
    """The controller `name` on `SimExecutor` through `StepLoop`, as `run_policy` builds it for the default
    `SimConfig` (no speculation, all-admit replicas without prefill, no restarts); with `rc.ranking` =
    ORACLE_RANKING the ranking reads this executor. Returns the run and (exact predictions, predictions checked)."""
    cfg = SimConfig(router=rc, steps=steps, seed=seed)
    tail_curve, bulk_curve = cfg.spec.curves(load_curve(curve_name))
    if cfg.replica.prefill_ms_per_token > 0 or cfg.restart_s > 0:
        raise RuntimeError("drive() mirrors run_policy only for replicas without prefill and free restarts")
    ctl = make_controller(name, rc, bulk_curve=bulk_curve, tail_curve=tail_curve, config=cfg.controller, q=q, m=m,
                          kv_s_per_token=cfg.replica.kv_ms_per_1k_tokens / 1e6, prefill_s=0.0)
    loop = StepLoop(Router(rc, wl.prompts, shuffle=cfg.shuffle, seed=cfg.seed), ctl)
    ex = SimExecutor(wl, bulk_curve, rc, cfg.replica, tail_curve=tail_curve)
    _ORACLE.executor, _ORACLE.predicted = ex, {}

    def hook(plan: StepPlan) -> float:
        _ORACLE.step = plan.step
        return 0.0

    log, state, hits, checked = RunLog(name), loop.initial(), 0, 0
    for _ in range(steps):
        out = loop.step(state, ex, hook)
        for o in out.consumed:
            if o.ref.uid in _ORACLE.predicted:
                checked += 1
                hits += int(max(o.lengths) == _ORACLE.predicted.pop(o.ref.uid))
        state = out.state
        log.add_output(out)
    log.check_final(state.router)
    _ORACLE.executor = None
    return log.run(), hits, checked


@dataclass(frozen=True)
class DecomposeTask:
    workload: str
    curve: str
    steps: int
    seed: int
    part: str  # "policies", "static" (shipped ranking) or "static*" (perfect ranking)
    capped: str


def _makespans(run: PolicyRun) -> list[float]:
    return [s.makespan_s for s in run.steps]


def run_decompose_task(t: DecomposeTask) -> dict[str, Any]:
    """Per-step makespans of one part of a regime's decomposition."""
    t0 = time.perf_counter()
    wl = _workload(t.workload, t.seed, t.capped)
    curve = load_curve(t.curve)
    rc = RouterConfig()
    cfg = SimConfig(router=rc, steps=t.steps, seed=t.seed)
    out: dict[str, Any] = {}
    if t.part == "policies":
        u = run_policy("uniform", wl, curve, cfg)
        out["uniform"] = _makespans(u)
        out["topq-best"] = _makespans(run_policy("topq-best", wl, curve, cfg, reference=u))
        for p in ("verl-lif", "tailsieve"):
            out[p] = _makespans(run_policy(p, wl, curve, cfg))
        own, _, _ = drive("tailsieve", wl, t.curve, rc, t.steps, t.seed)
        out["loop_identical"] = _makespans(own) == out["tailsieve"]
        star, hits, checked = drive("tailsieve", wl, t.curve, RouterConfig(ranking=ORACLE_RANKING), t.steps, t.seed)
        out["tailsieve*"], out["hits"] = _makespans(star), [hits, checked]
    else:
        rs = RouterConfig(ranking=ORACLE_RANKING) if t.part == "static*" else rc
        out[t.part] = {f"{q},{m}": _makespans(drive("static", wl, t.curve, rs, t.steps, t.seed, q=q, m=m)[0])
                       for q in range(1, rc.extra + 1) for m in range(1, rc.replicas)}
    out["seconds"] = time.perf_counter() - t0
    return out


def _switching(uniform: np.ndarray, static: dict[str, np.ndarray], window: int) -> float:
    """Sum over steps SKIP_STEPS.. of the best of uniform and every static split per window, in hindsight."""
    total = 0.0
    for lo in range(SKIP_STEPS, len(uniform), window):
        total += min(uniform[lo:lo + window].sum(), *(a[lo:lo + window].sum() for a in static.values()))
    return total


def decompose_row(workload: str, parts: dict[str, Any], window: int) -> dict[str, Any]:
    """Speedups over uniform (sums of makespans over steps SKIP_STEPS..) of every column of one regime."""
    s = SKIP_STEPS
    u = np.array(parts["uniform"])
    base = u[s:].sum()
    row: dict[str, Any] = {"workload": workload}
    for p in ("tailsieve", "tailsieve*", "verl-lif", "topq-best"):
        row[p] = base / np.array(parts[p])[s:].sum()
    for key in ("static", "static*"):
        arrays = {k: np.array(v) for k, v in parts[key].items()}
        best = min(arrays, key=lambda k: arrays[k][s:].sum())
        row[key], row[f"{key} qm"] = base / arrays[best][s:].sum(), best
    row["switch"] = base / _switching(u, {k: np.array(v) for k, v in parts["static"].items()}, window)
    row["hits"], row["loop_identical"], row["seconds"] = parts["hits"], parts["loop_identical"], parts["seconds"]
    return row


DECOMPOSE_LEGEND = """legend (speedup over uniform, mean over steps {skip}+; each column removes one loss):
  tailsieve  the controller as shipped: least-progress ranking, (q, m) learnt online
  rank*      tailsieve with a PERFECT candidate ranking (the cut groups ordered by the true longest member of their
             next generation): removes the tail-prediction loss; the controller still learns (q, m) online
  best       best single static (q, m) in hindsight (49 splits, shipped ranking): removes the controller's
             learning / tracking loss for one fixed split
  best*      best static (q, m) with the perfect ranking: removes both
  switch{w}    best of uniform and every static split per {w}-step window, in hindsight (shipped ranking): also
             removes the loss of holding one split while the workload moves (an upper bound for a switching
             controller)
  verl-lif   uniform's group-atomic placement replaced by request dealing (verl's least-in-flight = request
             round-robin at t = 0), nothing cut, no over-provisioning: the request-vs-group placement loss
  topq*      topq-best: known lengths, per-step best isolation of the longest groups, no over-provisioning waste
             (replays uniform's batches): the bound with no prediction and no waste. It consumes uniform's draws;
             a cutting policy consumes redraws instead (rare-cap: the cut cap hits come back short, see the main
             table's trunc column), so static splits can beat this "bound" by length bias, not by routing
  note       tailsieve's own (0, 0) steps may deal requests like verl-lif (the controller picks the uniform
             placement), while the uniform reference places whole groups
  hits       perfect-ranking predictions that matched the regenerated group's longest member / predictions checked
  loop       'same' when this bench's own loop with the shipped ranking reproduces run_policy('tailsieve')
             step for step (the perfect-ranking runs use that loop)"""


def decompose_section(args: argparse.Namespace, capped: str) -> list[dict[str, Any]]:
    """`--decompose`: where the time goes, per regime (issue 22 item 6)."""
    t0 = time.perf_counter()
    workloads = args.decompose_workloads.split(",")
    tasks = [DecomposeTask(w, args.decompose_curve, args.decompose_steps, args.decompose_seed, part, capped)
             for w in workloads for part in ("policies", "static", "static*")]
    cost = {"policies": 1.0, "static": 3.0, "static*": 3.0}
    results = pool_map(run_decompose_task, tasks, args.workers,
                        lambda t: cost[t.part] * (20.0 if multi_turn(t.workload) else 1.0))
    rows = []
    for w in workloads:
        parts: dict[str, Any] = {"seconds": 0.0}
        for t, res in zip(tasks, results, strict=True):
            if t.workload == w:
                parts["seconds"] += res.pop("seconds")
                parts.update(res)
        rows.append(decompose_row(w, parts, args.decompose_window))
    win = args.decompose_window
    print(f"decompose: {args.decompose_curve}, seed {args.decompose_seed}, R=8, N=64x8, rho 0.1, max_redraws "
          f"{RouterConfig().max_redraws}, {args.decompose_steps} steps")
    print(f"{'workload':15s} {'tailsieve':>9s} {'rank*':>6s} {'best':>6s} {'(q,m)':>6s} {'best*':>6s} {'(q,m)':>6s} "
          f"{'switch' + str(win):>8s} {'verl-lif':>8s} {'topq*':>6s} {'hits':>9s} {'loop':>5s} {'cpu s':>6s}")
    for r in rows:
        print(f"{r['workload']:15s} {r['tailsieve']:9.3f} {r['tailsieve*']:6.3f} {r['static']:6.3f} "
              f"{r['static qm']:>6s} {r['static*']:6.3f} {r['static* qm']:>6s} {r['switch']:8.3f} "
              f"{r['verl-lif']:8.3f} {r['topq-best']:6.3f} {r['hits'][0]:>4d}/{r['hits'][1]:<4d} "
              f"{'same' if r['loop_identical'] else 'DIFF':>5s} {r['seconds']:6.0f}")
    print(DECOMPOSE_LEGEND.format(skip=SKIP_STEPS, w=win))
    print(f"decompose section wall time {time.perf_counter() - t0:.0f} s on {args.workers} workers")
    return rows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The section's flags."""
    g = ap.add_argument_group("--decompose (where the time goes)")
    g.add_argument("--decompose", action="store_true", help="run only the decomposition section")
    g.add_argument("--decompose-workloads", default="kodcode-r1,kodcode-tests,synthetic-math,video-rl,agent-search,"
                   "math-drift,rare-cap,capped")
    g.add_argument("--decompose-curve", default="h100-llama3-8b")
    g.add_argument("--decompose-steps", type=int, default=30)
    g.add_argument("--decompose-seed", type=int, default=0)
    g.add_argument("--decompose-window", type=int, default=5, help="window of the switching oracle (steps)")
