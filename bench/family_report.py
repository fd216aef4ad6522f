"""The tables `bench_family.py` prints: one row per regime and the distribution over regimes of each adaptive
policy's ratios (reference, verl-lif, tailsieve-fixed), returned for its JSON file."""

from __future__ import annotations

from typing import Any

import numpy as np


def short(row: dict[str, Any]) -> str:
    """A compact regime label: kind, cap, loops (p: prompt-dependent), prompt share."""
    kind = "agent" if row["multi_turn"] else "1turn"
    loops = "L0" if row["loop_share"] == 0 else f"L{100 * row['loop_share']:.1f}%" + (
        "p" if "prompt-dep" in row["describe"] else "")
    return f"{kind} {row['cap'] // 1024}k {loops} ps{row['prompt_share']:.2f}"


def ratio(row: dict[str, Any], a: str, b: str) -> float | None:
    pol = row["policies"]
    return pol[a]["speedup"] / pol[b]["speedup"] if a in pol and b in pol else None


def print_rows(rows: list[dict[str, Any]], policies: tuple[str, ...]) -> None:
    head = f"{'seed':>5s} {'regime':26s} {'R':>4s} {'N':>5s} {'G':>3s} {'unif s':>7s} {'verl':>6s} {'best':>6s} " \
           f"{'(q,m)':>9s} " + " ".join(f"{p[:14]:>14s}" for p in policies)
    ts = "tailsieve" in policies
    head += f" {'ts/ref':>6s} {'ts/fix':>6s} {'m0':>5s} {'len':>5s}" if ts else ""
    print(head)
    for r in rows:
        qm = "({},{})".format(*r["best_qm"])
        line = (f"{r['seed']:5d} {short(r):26s} {r['replicas']:4d} {r['groups']:5d} {r['group_size']:3d} "
                f"{r['uniform_s']:7.1f} {r['verl']:6.3f} {r['best']:6.3f} {qm:>9s} "
                + " ".join(f"{r['policies'][p]['speedup']:14.3f}" for p in policies))
        if ts:
            t = r["policies"]["tailsieve"]
            fix = ratio(r, "tailsieve", "tailsieve-fixed")
            line += f" {t['ratio_ref']:6.3f} {'' if fix is None else f'{fix:6.3f}':>6s} " \
                    f"{t['m0_steps']:2d}/{t['steady_steps']:<2d} {t['length_ratio']:5.3f}"
        print(line)


def dist(xs: list[float]) -> str:
    a = np.asarray(xs, dtype=np.float64)
    return f"median {np.median(a):.3f}  p5 {np.percentile(a, 5):.3f}  min {a.min():.3f}"


def summary(rows: list[dict[str, Any]], policies: tuple[str, ...]) -> dict[str, Any]:
    """Print and return the distribution over regimes of each adaptive policy's ratios."""
    out: dict[str, Any] = {}
    print(f"\ndistribution over {len(rows)} regimes (reference = max(best static, verl-lif); noise = paired 1-sigma "
          "band of policy/reference, median over regimes)")
    for p in policies:
        ref = [r["policies"][p]["ratio_ref"] for r in rows]
        uni = [r["policies"][p]["speedup"] for r in rows]
        noise = [r["policies"][p]["noise"] for r in rows]
        lens = np.array([r["policies"][p]["length_ratio"] for r in rows])
        s: dict[str, Any] = {"ratio_ref": _stats(ref), "min_speedup": min(uni),
                             "noise_median": float(np.nanmedian(noise)) if not np.isnan(noise).all() else None,
                             "length_ratio": {"median": float(np.median(lens)), "min": float(lens.min()),
                                              "max": float(lens.max())}}
        print(f"  {p:16s} / reference: {dist(ref)}   min / uniform {min(uni):.3f}   "
              f"noise {100 * (s['noise_median'] or float('nan')):.2f}%   lengths / uniform: median "
              f"{np.median(lens):.3f} [{lens.min():.3f}, {lens.max():.3f}]")
        # uniform beside the reference: both reference policies deal requests, so where whole groups win (prefill-
        # heavy regimes) uniform beats the reference and ratio_ref exceeds 1 without beating uniform
        with_uniform = [r["policies"][p]["speedup"] / max(r["reference"], 1.0) for r in rows]
        s["ratio_ref_or_uniform"] = _stats(with_uniform)
        print(f"  {p:16s} / max(reference, uniform): {dist(with_uniform)}")
        verl = [r["policies"][p].get("ratio_verl") for r in rows]
        if all(v is not None for v in verl):
            s["share_ge_verl_minus_1pct"] = float(np.mean([v >= 0.99 for v in verl]))
            print(f"  {p:16s} / verl-lif: {dist(verl)}   share >= verl-lif - 1%: {s['share_ge_verl_minus_1pct']:.0%}")
        if p != "tailsieve-fixed" and "tailsieve-fixed" in policies:
            fix = [ratio(r, p, "tailsieve-fixed") or 0.0 for r in rows]
            share = float(np.mean([f >= 0.99 for f in fix]))
            s["ratio_fixed"] = {**_stats(fix), "share_ge_fixed_minus_1pct": share}
            print(f"  {p:16s} / tailsieve-fixed: {dist(fix)}   share >= fixed - 1%: {share:.0%}")
        out[p] = s
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=np.float64)
    return {"median": float(np.median(a)), "p5": float(np.percentile(a, 5)), "min": float(a.min())}
