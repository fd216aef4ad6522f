"""`bench_controller.py --fig6b`: (q, m) trajectories of `tailsieve-fixed` and `tailsieve` from different starts
(paper Fig. 6b), next to the references on the same stream at the same ρ (bench/README.md).

A start is (q0, m0) ∈ {1, E} × {0, R/2}. A run has settled where its last `--fig6b-last` non-warm-up steps are; the
verdict says whether the starts settle within (`--fig6b-tol-q`, `--fig6b-tol-m`) of each other. Where they do not,
the references say whether that matters: uniform, verl-lif and a coarse static grid (`--fig6b-grid`) run the same
stream, and each run's speedup over the settled window is printed next to the best reference's on that window (a
flat optimum, where splits and the dealt boundary are within a few percent, leaves the choice to noise).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from controller_sections import grid_spec, pool_map, spaced
from tailsieve.model.curve_names import load_curve
from tailsieve.policy.controller import ControllerConfig
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.workloads import load_workload


@dataclass(frozen=True)
class Fig6bTask:
    workload: str
    policy: str  # "uniform", "verl-lif", "static" (the references) or an adaptive policy
    q0: int  # static: its q
    m0: int  # static: its m
    steps: int
    curve: str
    rho: float
    seed: int


def run_fig6b_task(t: Fig6bTask) -> dict[str, Any]:
    """One run's per-step (q, m, warm-up), per-step makespans and mean step seconds."""
    wl = load_workload(t.workload, mode="resample", seed=t.seed)
    static = t.policy == "static"
    cfg = SimConfig(router=RouterConfig(rho=t.rho), steps=t.steps, seed=t.seed, controller=ControllerConfig(
        q0=t.q0, m0=t.m0), q=t.q0 if static else None, m=t.m0 if static else None)
    run = run_policy(t.policy, wl, load_curve(t.curve), cfg)
    return {"path": [(s.q, s.m, s.warmup) for s in run.steps], "makespans": [s.makespan_s for s in run.steps],
            "mean_s": run.mean_step_s()}


def _settled(path: list[tuple[int, int, bool]], last: int) -> tuple[float, float]:
    """Mean (q, m) over the last `last` steps that are not warm-ups."""
    tail = [(q, m) for q, m, w in path[-last:] if not w] or [(q, m) for q, m, _ in path[-last:]]
    return float(np.mean([x[0] for x in tail])), float(np.mean([x[1] for x in tail]))


def split_share(path: list[tuple[int, int, bool]]) -> float:
    """Share of the second half's steady steps (warm-ups left out) that ran a two-pool split (m > 0): where a
    controller goes back and forth between the uniform boundary and a split, the settled window catches it at one
    phase or the other, and this share is the statistic that compares starts (it includes the window)."""
    half = [m > 0 for _, m, w in path[len(path) // 2:] if not w]
    return float(np.mean(half)) if half else 0.0


def _window_s(res: dict[str, Any], last: int) -> float:
    """Mean step seconds over the last `last` steps (the settled window, warm-ups included: they are steps)."""
    return float(np.mean(res["makespans"][-last:]))


def fig6b_section(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`--fig6b`: the runs from every start, their verdict, and the references on the same stream."""
    t0 = time.perf_counter()
    r = RouterConfig().replicas
    rc = RouterConfig(rho=args.fig6b_rho)
    starts = [(q0, m0) for q0 in (1, rc.extra) for m0 in (0, r // 2)]
    workloads = args.fig6b_workloads.split(",")
    nq, nm = args.fig6b_grid
    grid = [(q, m) for q in spaced(rc.extra, nq, interior=False) for m in spaced(r - 1, nm, interior=True)]

    def task(w: str, policy: str, q0: int, m0: int) -> Fig6bTask:
        return Fig6bTask(w, policy, q0, m0, args.fig6b_steps, args.fig6b_curve, args.fig6b_rho, args.fig6b_seed)

    tasks = [task(w, p, q0, m0) for w in workloads for p in ("tailsieve-fixed", "tailsieve") for q0, m0 in starts]
    tasks += [task(w, p, 1, 0) for w in workloads for p in ("uniform", "verl-lif")]
    tasks += [task(w, "static", q, m) for w in workloads for q, m in grid]
    res = dict(zip(tasks, pool_map(run_fig6b_task, tasks, args.workers), strict=True))
    every, last = args.fig6b_every, args.fig6b_last
    print(f"fig6b: {args.fig6b_curve}, seed {args.fig6b_seed}, R={r}, N={rc.groups}, rho {args.fig6b_rho} (E = "
          f"{rc.extra}), {args.fig6b_steps} steps; (q,m) every {every}th step from step 0, 'w' = warm-up step "
          f"(recorded at (0,0)); settled = mean (q, m) over the last {last} non-warm-up steps; speedup over uniform "
          f"at the same rho, over the run and over the last {last} steps (the settled window); references on the "
          f"same stream: verl-lif and the static grid q in {sorted({q for q, _ in grid})} x m in "
          f"{sorted({m for _, m in grid})}")
    verdicts: dict[str, dict[str, str]] = {"tailsieve-fixed": {}, "tailsieve": {}}
    for w in workloads:
        uni = res[task(w, "uniform", 1, 0)]
        u, uw = uni["mean_s"], _window_s(uni, last)
        refs = {"verl-lif": res[task(w, "verl-lif", 1, 0)]}
        refs |= {f"static ({q},{m})": res[task(w, "static", q, m)] for q, m in grid}
        best_run = max(refs, key=lambda k: u / refs[k]["mean_s"])
        best_win = max(refs, key=lambda k: uw / _window_s(refs[k], last))
        print(f"{w}: references: best over the run {best_run} {u / refs[best_run]['mean_s']:.3f}, best over the "
              f"settled window {best_win} {uw / _window_s(refs[best_win], last):.3f} (verl-lif "
              f"{u / refs['verl-lif']['mean_s']:.3f} / {uw / _window_s(refs['verl-lif'], last):.3f})")
        for p, by_workload in verdicts.items():
            runs = [t for t in tasks if t.workload == w and t.policy == p]
            by_workload[w] = _report_policy(args, runs, res, (u, uw), refs)
    _print_tally(verdicts, workloads)
    print(f"fig6b section wall time {time.perf_counter() - t0:.0f} s on {args.workers} workers")
    return [{"workload": t.workload, "policy": t.policy, "q0": t.q0, "m0": t.m0, **res[t]} for t in tasks]


def _report_policy(args: argparse.Namespace, runs: list[Fig6bTask], res: dict[Fig6bTask, dict[str, Any]],
                   uniform: tuple[float, float], refs: dict[str, dict[str, Any]]) -> str:
    """Print one policy's runs on one workload (trajectory, settled (q, m), speedups), its verdict, spread and split
    shares; return "converge", "flat" (apart, within the noise band: `within_band`) or "beyond"."""
    u, uw = uniform
    every, last = args.fig6b_every, args.fig6b_last
    print(f"{runs[0].workload} / {runs[0].policy}:")
    for t in runs:
        path = res[t]["path"]
        traj = " ".join("w" if path[i][2] else f"{path[i][0]},{path[i][1]}" for i in range(0, len(path), every))
        sq, sm = _settled(path, last)
        window = uw / _window_s(res[t], last)
        print(f"  q0={t.q0:<2d} m0={t.m0}: {traj} | final ({path[-1][0]},{path[-1][1]}) settled "
              f"({sq:.1f},{sm:.1f}) speedup {u / res[t]['mean_s']:.3f}, window {window:.3f}")
    dq, dm = settled_spread(runs, res, last)
    print("  " + fig6b_verdict(runs, res, last, args.fig6b_tol_q, args.fig6b_tol_m))
    print("  " + fig6b_spread(runs, res, u, refs))
    shares = [split_share(res[t]["path"]) for t in runs]
    print(f"  share of the second half's steady steps in a split, by start: "
          f"{' / '.join(f'{x:.2f}' for x in shares)} (spread {max(shares) - min(shares):.2f})")
    if dq <= args.fig6b_tol_q and dm <= args.fig6b_tol_m:
        return "converge"
    return "flat" if within_band(runs, res, u, refs) else "beyond"


def _print_tally(verdicts: dict[str, dict[str, str]], workloads: list[str]) -> None:
    """Per policy: on how many workloads the starts converge, and of those apart which are within the noise band."""
    for p, by_workload in verdicts.items():
        done = [w for w in workloads if by_workload[w] == "converge"]
        apart = [w for w in workloads if w not in done]
        print(f"{p}: converges on {len(done)} of {len(workloads)} workloads" + (f" (not: {', '.join(apart)})"
                                                                                  if apart else ""))
        if apart:
            flat = [w for w in apart if by_workload[w] == "flat"]
            beyond = [w for w in apart if by_workload[w] == "beyond"]
            print(f"  of those apart, within the +-2 sigma band of each other and of the best reference: "
                  f"{', '.join(flat) or 'none'}; beyond it: {', '.join(beyond) or 'none'}")


def settled_spread(runs: list[Fig6bTask], res: dict[Fig6bTask, dict[str, Any]], last: int) -> tuple[float, float]:
    """(dq, dm): how far apart the starts' settled (q, m) lie (max − min over the runs)."""
    settled = [_settled(res[t]["path"], last) for t in runs]
    return (max(s[0] for s in settled) - min(s[0] for s in settled),
            max(s[1] for s in settled) - min(s[1] for s in settled))


def fig6b_verdict(runs: list[Fig6bTask], res: dict[Fig6bTask, dict[str, Any]], last: int, tol_q: float,
                  tol_m: float) -> str:
    """Whether the runs from different starts settle within (tol_q, tol_m) of each other; which starts gave
    identical runs (a start the policy does not represent: tailsieve-fixed holds m = R/2 whatever m0, and at m0 = 0
    the controller starts at (0, 0) whatever q0)."""
    dq, dm = settled_spread(runs, res, last)
    same = [f"(q0={a.q0},m0={a.m0})=(q0={b.q0},m0={b.m0})" for i, a in enumerate(runs) for b in runs[i + 1:]
            if res[a]["path"] == res[b]["path"]]
    verdict = "converge" if dq <= tol_q and dm <= tol_m else "do NOT converge"
    ident = f"; identical runs: {' '.join(same)}" if same else ""
    return (f"spread of settled (q, m) across starts: dq {dq:.1f}, dm {dm:.1f} -> {verdict} (tolerance dq <= "
            f"{tol_q:g}, dm <= {tol_m:g}){ident}")


def _band(res: dict[str, Any], skip: int = 2) -> float:
    """±2σ of a run's mean step seconds, relative to it (steps `skip` onward taken as independent draws)."""
    xs = np.asarray(res["makespans"][skip:], dtype=float)
    return 2 * float(xs.std(ddof=1)) / np.sqrt(len(xs)) / float(xs.mean()) if len(xs) > 1 else 0.0


def fig6b_spread(runs: list[Fig6bTask], res: dict[Fig6bTask, dict[str, Any]], u: float,
                 refs: dict[str, dict[str, Any]]) -> str:
    """Where the starts land in step time, not in (q, m): their run speedups, the spread between them, the best
    reference's, and the ±2σ band of one run's mean. Where the (q, m) verdict says the starts settle apart but the
    speedups lie within the band of each other and of the best reference, the optimum is flat: which (q, m) a run
    ends at is then decided by noise, and no start is slower for it."""
    speed, best, band, spread, gap = _speeds(runs, res, u, refs)
    flat = "within" if max(spread, gap) <= band else "beyond"
    return (f"run speedups {min(speed):.3f}-{max(speed):.3f} (spread {spread:.1%}), best reference {best:.3f} "
            f"(slowest start {min(speed) / best:.3f}x it); +-2 sigma of a run's mean step {band:.1%}: {flat} the band")


def _speeds(runs: list[Fig6bTask], res: dict[Fig6bTask, dict[str, Any]], u: float,
            refs: dict[str, dict[str, Any]]) -> tuple[list[float], float, float, float, float]:
    """(run speedups, best reference's, the widest ±2σ band, spread between the runs, gap of the slowest to the
    best reference)."""
    speed = [u / res[t]["mean_s"] for t in runs]
    best = max(u / r["mean_s"] for r in refs.values())
    band = max(_band(res[t]) for t in runs)
    return speed, best, band, max(speed) / min(speed) - 1, best / min(speed) - 1


def within_band(runs: list[Fig6bTask], res: dict[Fig6bTask, dict[str, Any]], u: float,
                refs: dict[str, dict[str, Any]]) -> bool:
    """Whether the starts' run speedups lie within the ±2σ band of each other and of the best reference: a flat
    optimum, on which the (q, m) a start settles at is decided by noise (`fig6b_spread`)."""
    _, _, band, spread, gap = _speeds(runs, res, u, refs)
    return max(spread, gap) <= band


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The section's flags."""
    g = ap.add_argument_group("--fig6b (convergence of q from different starts)")
    g.add_argument("--fig6b", action="store_true", help="run only the Fig. 6b section")
    g.add_argument("--fig6b-workloads", default="kodcode-r1,synthetic-math")
    g.add_argument("--fig6b-curve", default="h100-llama3-8b")
    g.add_argument("--fig6b-steps", type=int, default=60)
    g.add_argument("--fig6b-seed", type=int, default=0)
    g.add_argument("--fig6b-rho", type=float, default=0.5, help="over-provisioning; E = ceil(rho N) = 32 at 0.5")
    g.add_argument("--fig6b-every", type=int, default=5, help="print (q, m) every this many steps")
    g.add_argument("--fig6b-last", type=int, default=10, help="settled (q, m) = mean over this many last steps")
    g.add_argument("--fig6b-tol-q", type=float, default=3.0)
    g.add_argument("--fig6b-tol-m", type=float, default=1.0)
    g.add_argument("--fig6b-grid", type=grid_spec, default=(4, 7),
                   help="QxM static reference grid at the section's rho (default 4x7: q = E/4..E, m = 1..R-1)")
