"""What `tailsieve profile` shows (`cli/profile_cmd.py` measures and writes): the measured points, the fitted cost
model, the engine readout, the speculative measurement and its fits as tables and lines, and the plots of the points
against the fit (docs/profile.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tailsieve.cli._common import CliConsole, print_table
from tailsieve.engines.measure.engine_readout import ENGINE_KEYS
from tailsieve.engines.measure.profile import PrefillPoint, ProfilePoint, total_spec
from tailsieve.engines.measure.spec_measure import CostFit, SpecMeasure
from tailsieve.model.costmodel import CostModel
from tailsieve.model.curves import TpotCurve
from tailsieve.outputs import write_figure


def print_points(args: argparse.Namespace, url: str, points: list[ProfilePoint], costs: CostFit | None,
                 model: CostModel | None, plain: TpotCurve | None) -> None:
    """The measured points, the fitted model and the speculative measurement, as tables and lines."""
    print_table(f"TPOT of {url} ({args.max_tokens} tokens per request)",
                ["batch", "prompt tokens", "tpot ms (median)", "tpot ms (p90)", "ttft ms", "batch s",
                 "tokens/s (all)"],
                [(p.batch, round(p.prompt_tokens), p.tpot_ms, p.tpot_ms_p90, p.ttft_ms, p.step_s, p.tokens_per_s)
                 for p in points])
    if model is not None:
        print_model(model)
    spec = total_spec(points)
    if spec is not None:
        print_spec(points, spec, costs)
    elif plain is not None:
        CliConsole(stderr=True).print("note: the server reported no vllm:spec_decode_* counters; nothing to fit")


def print_engine(doc: dict[str, Any]) -> None:
    """What the profiled server reported of its engine, and the measured speed factors."""
    first = doc["engine_readout"]["replicas"][0]
    shown = ", ".join(f"{k} {'not reported' if first[k] is None else first[k]}" for k in ENGINE_KEYS)
    speeds = [r["speed_factor"] for r in doc["engine_readout"]["replicas"]]
    extra = "" if speeds[0] is None else f"; speed_factors {', '.join(f'{x:.3f}' for x in speeds)}"
    CliConsole().print(f"engine: {shown}{extra}", highlight=False)


def print_concurrency_fit(fit: dict[str, Any], plain: str, out: Path) -> None:
    """The fitted concurrency terms and how to simulate with them."""
    CliConsole().print(
        f"concurrency fit ({fit['points']} batch sizes): α(b) = {fit['acceptance']:.4f} + "
        f"{fit['acceptance_slope']:.4f}·log2 b (rms {fit['acceptance_rms']:.4f}); "
        f"token_cost = {fit['token_cost']:.4f}, "
        f"token_cost_slope = {fit['token_cost_slope']:.4f} with draft_cost = {fit['draft_cost']:.4f} and verify_cost = "
        f"{fit['verify_cost']:.4f} held (iteration times within {100 * fit['rms_rel_error']:.1f}% rms); simulate it: "
        f"--curve {plain} --tail-spec {out}  (or --tail-spec '{fit['tail_spec']}')", highlight=False)


def print_model(model: CostModel) -> None:
    """The fitted terms and how well they fit."""
    fit = model.fit
    pre = fit.get("prefill") or []
    pre_rms = (sum(r["residual_ms"] ** 2 for r in pre) / len(pre)) ** 0.5 if pre else float("nan")
    CliConsole().print(
        f"fitted cost model: τ(b) at zero context {dict(zip(model.curve.batch, model.curve.tpot_ms, strict=True))} ms; "
        f"kv_ms_per_1k = {model.kv_ms_per_1k:.5f} ms per 1k context tokens per iteration; prefill_ms_per_token = "
        f"{model.prefill_ms_per_token:.5f}; request overhead {model.request_overhead_ms:.1f} ms (not simulated); "
        f"per-token times within {100 * fit.get('decode_rms_rel', 0.0):.1f}% rms, TTFT within {pre_rms:.1f} ms rms",
        highlight=False)


def print_spec(points: list[ProfilePoint], spec: SpecMeasure, costs: CostFit | None = None) -> None:
    """Acceptance per batch size and the model constants for the config file."""
    rows: list[tuple[int | str, float, float, float, str]] = [
        (p.batch, p.spec.acceptance_rate, p.spec.draft_share, p.spec.expected_tokens,
         " ".join(f"{x:.2f}" for x in p.spec.conditional()))
        for p in points if p.spec is not None]
    rows.append(("all", spec.acceptance_rate, spec.draft_share, spec.expected_tokens,
                 " ".join(f"{x:.2f}" for x in spec.conditional())))
    print_table(f"Speculative decoding (d = {spec.depth}, vllm:spec_decode_* counters)",
                ["batch", "accepted/drafted", "iterations with a draft", "tokens per iteration ā",
                 "P(pos k | pos < k)"], rows)
    alpha, gamma = spec.fit()
    extra = "" if costs is None else (f", draft_cost = {costs.draft_cost:.3f}, verify_cost = {costs.verify_cost:.3f}"
                                      f" (iteration times within {100 * costs.rms_rel_error:.1f}% rms)")
    CliConsole().print(f"model fit for the config file: acceptance = {alpha:.3f}, decay = {gamma:.3f}, "
                    f"draft_share = {spec.draft_share:.3f}, tokens = {spec.depth}{extra} (measured ā = "
                    f"{spec.expected_tokens:.3f}); this curve already is the speculative server's τ_spec(b): pass it "
                    "as rollout --tail-curve")


def context_series(points: list[ProfilePoint]) -> dict[int, list[ProfilePoint]]:
    """The points of each requested context (a --contexts value), in increasing context, each in measured order.
    The server's own prompt count differs a little from batch to batch (1060 and 1070 for 1024 asked), so grouping
    by the measured count would split one context into several series."""
    out: dict[int, list[ProfilePoint]] = {}
    for p in points:
        out.setdefault(p.requested_context, []).append(p)
    return dict(sorted(out.items()))


def context_label(requested: int) -> str:
    """A plot legend entry: the context asked for (0: the short default prompt)."""
    return "measured, short prompt" if requested == 0 else f"measured, {requested}-token prompt"


def save_fit_plot(model: CostModel, points: list[ProfilePoint], prefill: list[PrefillPoint], path: Path) -> None:
    """Measured per-token times against the fit, one series per context asked for; TTFT against prompt tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (ctx, pts) in enumerate(context_series(points).items()):
        bs = [p.batch for p in pts]
        a1.plot(bs, [p.tpot_ms for p in pts], "o", color=f"C{i}", label=context_label(ctx))
        a1.plot(bs, [model.tpot_ms(p.batch, p.context) for p in pts], "-", color=f"C{i}", alpha=0.7)
    a1.set_xscale("log", base=2)
    a1.set_xlabel("concurrent requests b")
    a1.set_ylabel("ms per token per request (lines: fit)")
    a1.legend(fontsize=8)
    if prefill:
        xs = [p.prompt_tokens for p in prefill]
        a2.plot(xs, [p.ttft_ms for p in prefill], "o", label="measured TTFT")
        a2.plot(xs, [model.request_overhead_ms + model.prefill_ms_per_token * x for x in xs], "-", label="fit")
        a2.legend(fontsize=8)
    a2.set_xlabel("prompt tokens")
    a2.set_ylabel("time to first token ms (alone)")
    fig.suptitle(f"{model.curve.name}: kv {model.kv_ms_per_1k:.4f} ms/1k ctx, prefill "
                 f"{model.prefill_ms_per_token:.4f} ms/token")
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)


def save_plot(points: list[ProfilePoint], path: Path, title: str) -> None:
    """τ(b) and aggregate tokens/s against the batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    bs = [p.batch for p in points]
    a1.plot(bs, [p.tpot_ms for p in points], marker="o")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("concurrent requests b")
    a1.set_ylabel("ms per token per request τ(b)")
    a2.plot(bs, [p.tokens_per_s for p in points], marker="o", color="C1")
    a2.set_xscale("log", base=2)
    a2.set_xlabel("concurrent requests b")
    a2.set_ylabel("aggregate tokens/s")
    fig.suptitle(title)
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)
