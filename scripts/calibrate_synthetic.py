"""Offline calibration of `SyntheticConfig` to the paper's math workload (how the defaults were found).

Usage: .venv/bin/python docs/calibrate_synthetic.py [REPS] [ITERS]   (defaults 800 and 200; a few minutes)

Draws REPS App. B designs (64 prompts × 8 independent checkpoints × 8 samples) once (common random numbers), and
runs Nelder–Mead over mu, the four sigmas, ceiling and the two runaway parameters, minimising squared relative
errors against PAPER_TARGETS: pooled P50, P90 and truncated share, the median over designs of the longest
completed response, and the mean App. B shares. Then it re-checks the result on fresh draws.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from tailsieve.analysis.length_stats import variance_decomposition
from tailsieve.workloads.synthetic import PAPER_TARGETS as T
from tailsieve.workloads.synthetic import SyntheticConfig, SyntheticModel

NAMES = ["mu", "sigma_prompt", "sigma_checkpoint", "sigma_interaction", "sigma_sample", "ceiling",
         "runaway_logit", "runaway_prompt_slope"]
I, S, R = 64, 8, 8  # noqa: E741 (App. B notation)


def draws(reps: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((reps, I, 1, 1)), rng.standard_normal((reps, 1, S, 1)),
            rng.standard_normal((reps, I, S, 1)), rng.standard_normal((reps, I, S, R)), rng.random((reps, I, S, R)))


def stats(params: dict[str, float], d: tuple[np.ndarray, ...]) -> dict[str, float]:
    z, eta, nu, eps, u = d
    c = SyntheticConfig(**params)  # type: ignore[arg-type]
    model = SyntheticModel(SyntheticConfig(n_prompts=1), seed=0)
    object.__setattr__(model, "config", c)
    logx = c.mu + c.sigma_prompt * z + c.sigma_checkpoint * eta + c.sigma_interaction * nu + c.sigma_sample * eps
    lengths = model._finish(logx, u, np.broadcast_to(z, eps.shape))
    trunc = lengths >= c.max_length
    q50, q90 = np.percentile(lengths, [50, 90])
    shares = np.mean([list(variance_decomposition(g).to_json().values()) for g in lengths], axis=0)
    return {"p50": q50, "p90": q90, "truncated_share": trunc.mean(),
            "max_completed": float(np.median([g[~t].max() for g, t in zip(lengths, trunc, strict=True)])),
            "prompt": shares[0], "checkpoint": shares[1], "interaction": shares[2], "sampling": shares[3]}


def loss(v: np.ndarray, d: tuple[np.ndarray, ...]) -> float:
    p = dict(zip(NAMES, v.tolist(), strict=True))
    if min(v[1:5]) < 0 or p["ceiling"] < 2000:
        return 1e9
    s = stats(p, d)
    e = [np.log(s[k] / T[k]) for k in ("p50", "p90", "truncated_share")] + [0.5 * np.log(s["max_completed"] / 11800)]
    e += [2 * (s[k] - T[k]) / max(T[k], 0.05) for k in ("prompt", "checkpoint", "interaction")]
    return float(np.sum(np.square(e)))


def nelder_mead(f, x0: np.ndarray, step: np.ndarray, iters: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    pts = [x0] + [x0 + np.eye(x0.size)[i] * step[i] for i in range(x0.size)]
    vals = [f(x) for x in pts]
    for _ in range(iters):
        o = np.argsort(vals)
        pts, vals = [pts[i] for i in o], [vals[i] for i in o]
        c = np.mean(pts[:-1], axis=0)
        xr = 2 * c - pts[-1]
        fr = f(xr)
        if fr < vals[0]:
            xe = 3 * c - 2 * pts[-1]
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = (c + pts[-1]) / 2
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [(pts[0] + x) / 2 for x in pts[1:]]
                vals = [vals[0]] + [f(x) for x in pts[1:]]
    return pts[int(np.argmin(vals))]


if __name__ == "__main__":
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 800
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    fit = draws(reps, 12345)
    x0 = np.array([getattr(SyntheticConfig(), n) for n in NAMES], dtype=float)
    best = nelder_mead(lambda v: loss(v, fit), x0, np.array([0.1, 0.1, 0.05, 0.05, 0.1, 1000, 0.3, 0.3]), iters)
    params = dict(zip(NAMES, best.tolist(), strict=True))
    print(json.dumps(params, indent=1))
    print("fit sample:  ", {k: round(float(v), 4) for k, v in stats(params, fit).items()})
    print("fresh draws: ", {k: round(float(v), 4) for k, v in stats(params, draws(1000, 7)).items()})
