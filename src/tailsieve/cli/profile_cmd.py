"""`tailsieve profile`: measure a live OpenAI-compatible server's TPOT curve τ(b) and write it as curve JSON; on a
speculative vLLM server also its acceptance (vllm:spec_decode_* counters) and the α, γ, p they imply, and with
`--plain-curve` the cost constants c, v and the concurrency terms s, u0, u1 (docs/speculative.md). What it prints
and plots: `cli/profile_view.py`."""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tailsieve.cli._common import (
    CliConsole,
    api_key_env,
    plot_path,
    print_json,
    progress_console,
    progress_enabled,
)
from tailsieve.cli.flags import add, add_served_model_name
from tailsieve.cli.launch_cmd import sigterm_as_interrupt
from tailsieve.cli.profile_view import print_concurrency_fit, print_engine, print_points, save_fit_plot, save_plot
from tailsieve.cli.progress import heartbeat
from tailsieve.engines.measure.engine_readout import (
    probe_tpot,
    read_engine_config,
    readout_json,
    speeds_from_probe,
)
from tailsieve.engines.measure.profile import (
    DEFAULT_BATCHES,
    DEFAULT_CONTEXTS,
    PrefillPoint,
    ProfilePoint,
    Retry,
    parse_batches,
    parse_contexts,
    profile_endpoint,
    profile_model,
    served_model,
    total_spec,
)
from tailsieve.engines.measure.spec_measure import CostFit, concurrency_points, fit_costs
from tailsieve.engines.transport.backends import get_backend
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient
from tailsieve.errors import ConfigError, Interrupted
from tailsieve.inputs import MAX_TEMPERATURE, finite
from tailsieve.model.costmodel import CostModel
from tailsieve.model.curve_names import load_curve
from tailsieve.model.curves import TpotCurve
from tailsieve.model.spec_fit import fit_concurrency_terms
from tailsieve.model.speculative import METHOD_DEFAULTS, SpecConfig, SpecMethod
from tailsieve.outputs import OutputLock, check_target, write_json_atomic

T = TypeVar("T")


def register(sub: Any) -> None:
    """Add the `profile` command."""
    p = sub.add_parser("profile", help="measure a live server's TPOT curve (feeds simulate, rollout, the controller)",
                       description="Send b concurrent fixed-length requests (ignore_eos) for each batch size b and "
                                   "record the median decode time per token; writes curve JSON.")
    p.add_argument("--endpoint", required=True,
                   help="server base URL, e.g. http://127.0.0.1:8000; several comma-separated: the first is profiled "
                        "and every one's decode speed relative to it is measured (speed_factors in the model file)")
    p.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)),
                   help="batch sizes, comma-separated and/or ranges A..B (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per request (default: %(default)s)")
    p.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)),
                   help="prompt lengths in tokens to measure every batch size at (0: a short prompt); two or more fit "
                        "the whole cost model: τ(b) at zero context, the context (KV) term and the prefill term "
                        "(docs/profile.md); one gives the plain τ(b) curve (default: %(default)s; contexts the "
                        "server's max_model_len cannot hold are dropped)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature (default: %(default)s; speculative acceptance depends on it)")
    p.add_argument("--plain-curve", metavar="CURVE",
                   help="speculative server: the same model's curve without speculation (a profile JSON or built-in "
                        "name); fits draft_cost and verify_cost, and (two or more --batches) the concurrency terms "
                        "acceptance_slope, token_cost, token_cost_slope (needs --method)")
    p.add_argument("--method", choices=[m.value for m in SpecMethod if m is not SpecMethod.NONE],
                   help="the server's speculative method (fixes the drafting-cost shape for --plain-curve)")
    p.add_argument("--draft-cost", type=float, default=None,
                   help="draft_cost c held fixed in the concurrency fit (default: the method's default; for "
                        "MTP/EAGLE-3 only c + token_cost is measurable, docs/speculative.md)")
    p.add_argument("--verify-cost", type=float, default=0.0,
                   help="verify_cost v held fixed in the concurrency fit (default: %(default)s, the extra tokens' cost "
                        "is token_cost + token_cost_slope·log2 b alone, as in mtp-dense:low)")
    p.add_argument("--out", required=True, help="model (curve) JSON to write; `--curve` of simulate, rollout, plan")
    p.add_argument("--plot", help="also save the measured points against the fit (or τ(b) and throughput) to this "
                                  ".png/.pdf/.svg")
    add_served_model_name(p)
    add(p, "--kind")
    add(p, "--no-stream")
    add(p, "--api-key-env")
    add(p, "--stall-timeout")
    add(p, "--deadline")
    add(p, "--retries")
    add(p, "--json")
    p.set_defaults(func=run)


def _out_path(text: str) -> Path:
    """--out checked before anything is measured: a new or regular file (`check_target`) in a folder that exists."""
    path = Path(text)
    if path.is_dir() and not path.is_symlink():
        raise ConfigError(f"--out {text} is a folder; give a file name like curve.json")
    check_target(path, "--out")
    if not path.parent.is_dir():
        raise ConfigError(f"--out {text}: folder {path.parent} does not exist")
    return path


def _endpoints(text: str, kind: str) -> list[Endpoint]:
    """`--endpoint URL[,URL...]`: the replicas, the profiled one first (an empty item or a repeat is an error)."""
    urls = [u.strip() for u in text.split(",")]
    if any(not u for u in urls):
        raise ConfigError(f"--endpoint: an empty URL in {text!r}")
    fleet = [Endpoint.parse(u, kind) for u in urls]
    if len({e.url for e in fleet}) < len(fleet):
        raise ConfigError(f"--endpoint: a replica is named twice in {text!r}")
    return fleet


def _seconds(flag: str, v: float) -> float:
    if not (math.isfinite(v) and v > 0):
        raise ConfigError(f"{flag} must be a finite number of seconds > 0, got {v}")
    return v


def _options(args: argparse.Namespace) -> ClientOptions:
    """The transport flags (every time finite and > 0; --retries >= 0)."""
    if args.retries < 0:
        raise ConfigError(f"--retries must be >= 0, got {args.retries}")
    deadline = None if args.deadline is None else _seconds("--deadline", args.deadline)
    return ClientOptions(stream=not args.no_stream, api_key_env=api_key_env(args),
                         stall_timeout_s=_seconds("--stall-timeout", args.stall_timeout), deadline_s=deadline)


def run(args: argparse.Namespace) -> int:
    """Profile the endpoint, write the curve (or the fitted model), print the table."""
    get_backend(args.kind)  # the engine backend's one unknown-name check (a plugin loads here)
    out = _out_path(args.out)
    plot = plot_path(args.plot) if args.plot else None
    batches = parse_batches(args.batches)
    contexts = parse_contexts(args.contexts)
    plain = _plain(args, batches)
    fleet = _endpoints(args.endpoint, args.kind)
    endpoint = fleet[0]
    opts = _options(args)
    for e in fleet:
        EngineClient(opts).check_endpoint(e)  # credentials in the URL and an API key: refused before any request
    enabled = progress_enabled()
    con = progress_console(enabled)
    bar = Progress(TextColumn("profiling {task.description:<16}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=con, transient=True, disable=not enabled)
    task = bar.add_task("warm-up", total=len(batches) * len(contexts))
    measured: list[ProfilePoint] = []
    clock = Estimate(batches, contexts, args.max_tokens)

    def tick(pt: ProfilePoint) -> None:
        measured.append(pt)
        where = f"b={pt.batch} ctx={pt.prompt_tokens:.0f}, {clock.left(len(measured))}"
        bar.update(task, advance=1, description=where)
        beat.update(advance=1, note=where)

    engine: dict[str, Any] = {}  # the readout: the model's engine keys ("truth") and their provenance ("json")

    def go() -> Coroutine[Any, Any, Measured]:
        return _measure(args, opts, fleet, batches, contexts, tick, engine)

    with (OutputLock(out, "profile", folder=False), bar,  # one writer of --out (its .NAME.lock) from here on
          heartbeat("profile", "points", len(batches) * len(contexts), bar_shown=enabled) as beat):
        curve, model, points, prefill = keeping(args, out, measured, len(batches) * len(contexts), go)
        filed = model  # what the file holds: the engine keys live in cost_model (a plain curve's too, terms 0)
        if model is not None or engine["truth"].to_json():
            filed = replace(model or CostModel(curve), engine=engine["truth"])
        doc, costs = _document(args, curve, filed, points, plain)
        doc["engine_readout"] = engine["json"]
        write_json_atomic(out, doc, "--out")
    return _report(args, out, plot, endpoint.url, doc, costs, (curve, model, points, prefill), plain)


Measured = tuple[TpotCurve, CostModel | None, list[ProfilePoint], list[PrefillPoint]]


async def _measure(args: argparse.Namespace, opts: ClientOptions, fleet: list[Endpoint], batches: tuple[int, ...],
                   contexts: tuple[int, ...], tick: Callable[[ProfilePoint], None], engine: dict[str, Any]) -> Measured:
    """The measurement: each replica's engine readout, the points on the first replica (the curve, or the model when
    several contexts are asked), and with several replicas the speed probe; `engine` gets the readout."""
    endpoint = fleet[0]
    async with EngineClient(opts) as client:
        readouts = [await read_engine_config(client, e) for e in fleet]
        kv = {"kv_tokens": readouts[0].kv_tokens, "block_size": readouts[0].block_size}
        if len(contexts) > 1:
            model, pts, pre = await profile_model(
                client, endpoint, contexts=contexts, batches=batches, max_tokens=args.max_tokens,
                model=args.model, on_point=tick, temperature=args.temperature, retry=Retry(retries=args.retries),
                prefill=not args.no_stream, **kv)
            out: Measured = (model.curve, model, pts, pre)
        else:
            curve, pts = await profile_endpoint(client, endpoint, batches=batches, max_tokens=args.max_tokens,
                                                model=args.model, on_point=tick, temperature=args.temperature,
                                                retry=Retry(retries=args.retries), **kv)
            out = (curve, None, pts, [])
        name = await served_model(client, endpoint, Retry(retries=args.retries), args.model)
        probe = await probe_tpot(client, fleet, name) if len(fleet) > 1 else None
        speeds = None if probe is None else speeds_from_probe(probe[0], probe)
        engine.update(truth=readouts[0].truth(speeds or ()), json=readout_json(fleet, readouts, speeds, probe))
        return out


def _report(args: argparse.Namespace, out: Path, plot: Path | None, url: str, doc: dict[str, Any],
            costs: CostFit | None, measured: Measured, plain: TpotCurve | None) -> int:
    """After the file is written: the plot, then the JSON document or the tables and the closing line."""
    curve, model, points, prefill = measured
    if plot is not None:
        if model is not None:
            save_fit_plot(model, points, prefill, plot)
        else:
            save_plot(points, plot, curve.name)
    if args.json:
        print_json(doc)
        return 0
    print_points(args, url, points, costs, model, plain)
    print_engine(doc)
    conc = (doc.get("speculative") or {}).get("concurrency_fit")
    if conc is not None:
        print_concurrency_fit(conc, args.plain_curve, out)
    CliConsole().print(("model" if model is not None else "curve") + f" written to {out}"
                    + (f"; plot saved to {plot}" if plot else ""))
    return 0


class Estimate:
    """Time left, from the points measured so far: a point's work is taken as b_eff · (max_tokens + c / 8) for batch
    b at context c (b_eff = max(b, 8): below 8 concurrent requests the per-iteration cost dominates; a prompt token
    is prefilled about 8× faster than a token is decoded), and the elapsed time per unit of work done so far prices
    the work left. Schedule order: batch-major, as `profile_model` measures (every context of a batch size, then the
    next batch size)."""

    def __init__(self, batches: tuple[int, ...], contexts: tuple[int, ...], max_tokens: int) -> None:
        self.work = [max(b, 8) * (max_tokens + c / 8) for b in batches for c in contexts]
        self.start = time.monotonic()

    def seconds_left(self, done: int, now: float | None = None) -> float:
        """Seconds left after `done` points (the elapsed time scaled by the work left over the work done)."""
        spent = (time.monotonic() if now is None else now) - self.start
        did = sum(self.work[:done])
        return spent * sum(self.work[done:]) / did if did > 0 else math.nan

    def left(self, done: int) -> str:
        """"about 3 min left" ("done" at the end)."""
        if done >= len(self.work):
            return "done"
        s = self.seconds_left(done)
        if math.isnan(s):
            return "estimating"
        return f"about {s:.0f} s left" if s < 90 else f"about {s / 60:.0f} min left"


def keeping(args: argparse.Namespace, out: Path, measured: list[ProfilePoint], planned: int,
            go: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the measurement; on Ctrl-C, SIGTERM or SIGHUP write the points measured so far (`write_partial`) and end
    with the CLI's one line and 128 + the signal."""
    try:
        with sigterm_as_interrupt():
            return asyncio.run(go())
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        raise Interrupted(signum, write_partial(args, out, measured, planned)) from None


def write_partial(args: argparse.Namespace, out: Path, points: list[ProfilePoint], planned: int) -> str:
    """On an interrupt: the points measured so far to --out, with the τ(b) curve of the first context measured (the
    whole model needs every context), marked `"complete": false`; returns the note of the CLI's one line."""
    if not points:
        return f"nothing was measured; {out} was not written"
    first = [p for p in points if p.requested_context == points[0].requested_context]
    curve = TpotCurve(name=f"profile {args.endpoint} (interrupted)", batch=tuple(p.batch for p in first),
                      tpot_ms=tuple(round(p.tpot_ms, 4) for p in first),
                      description=f"measured by tailsieve profile, interrupted after {len(points)} of {planned} "
                                  f"points: τ(b) at the {first[0].requested_context}-token context only")
    doc, _ = _document(args, curve, None, points, None)
    write_json_atomic(out, doc | {"complete": False, "planned_points": planned}, "--out")
    return (f"the {len(points)} of {planned} points measured are in {out} (a τ(b) curve of {len(first)} batch sizes; "
            "rerun for the context and prefill terms)")


def _document(args: argparse.Namespace, curve: TpotCurve, model: CostModel | None, points: list[ProfilePoint],
              plain: TpotCurve | None) -> tuple[dict[str, Any], CostFit | None]:
    """The file: the curve (or model) keys, the run's settings, every raw point, the speculative measurement."""
    spec = total_spec(points)
    costs = None
    if spec is not None and plain is not None:
        costs = fit_costs([(p.batch, p.tpot_ms, p.spec) for p in points if p.spec is not None], plain,
                          METHOD_DEFAULTS[SpecMethod(args.method)].drafter, spec.depth)
    spec_json = None if spec is None else spec.to_json()
    if spec_json is not None and costs is not None:
        spec_json["fit"] |= {"method": args.method} | costs.to_json()
    if spec_json is not None and spec is not None and plain is not None:
        spec_json["concurrency_fit"] = _concurrency_fit(args, points, plain, spec.depth)
    head = curve.to_json() if model is None else model.to_json()
    return head | {"max_tokens": args.max_tokens, "streamed": not args.no_stream,
                   "temperature": args.temperature, "points": [
        {"batch": p.batch, "requested_context": p.requested_context, "prompt_tokens": p.prompt_tokens,
         "context": p.context, "tpot_ms": p.tpot_ms,
         "tpot_ms_p90": p.tpot_ms_p90,
         "ttft_ms": None if math.isnan(p.ttft_ms) else p.ttft_ms, "step_s": p.step_s, "tokens_per_s": p.tokens_per_s,
         "speculative": None if p.spec is None else p.spec.to_json()}
        for p in points], "speculative": spec_json}, costs


def _plain(args: argparse.Namespace, batches: tuple[int, ...]) -> TpotCurve | None:
    """The checked --temperature and fit flags (before anything is measured), and the --plain-curve."""
    finite(args.temperature, "--temperature", lo=0, hi=MAX_TEMPERATURE)
    if (args.plain_curve is None) != (args.method is None):
        raise ConfigError("--plain-curve and --method go together: the fit needs the plain curve and the method")
    plain = load_curve(args.plain_curve) if args.plain_curve else None
    _check_fit_flags(args, batches)
    return plain


def _check_fit_flags(args: argparse.Namespace, batches: tuple[int, ...]) -> None:
    """--draft-cost/--verify-cost need --plain-curve; the concurrency fit two batch sizes (refused before measuring)."""
    if args.plain_curve is None and (args.draft_cost is not None or args.verify_cost != 0.0):
        raise ConfigError("--draft-cost and --verify-cost fix terms of the --plain-curve fit; give --plain-curve and "
                          "--method too")
    if args.draft_cost is not None:
        finite(args.draft_cost, "--draft-cost", lo=0)
    finite(args.verify_cost, "--verify-cost", lo=0, hi=1)
    if args.plain_curve is not None and len(batches) < 2:
        raise ConfigError(f"--plain-curve fits terms that change with concurrency: give two or more --batches, got "
                          f"{args.batches!r}")


def _concurrency_fit(args: argparse.Namespace, points: list[ProfilePoint], plain: TpotCurve,
                     depth: int) -> dict[str, Any] | None:
    """The concurrency terms fitted on the lowest-context batches (the plain curve's context); a fit the measurement
    cannot support is noted on stderr and left out (the measured points are still written)."""
    low = min(round(p.prompt_tokens, -1) for p in points)
    rows = [(p.batch, p.tpot_ms, p.spec) for p in points if p.spec is not None and round(p.prompt_tokens, -1) == low]
    spec_points, gamma, share = concurrency_points(rows)
    base = SpecConfig(SpecMethod(args.method), depth, decay=gamma, draft_share=share, draft_cost=args.draft_cost,
                      verify_cost=args.verify_cost)
    try:
        return fit_concurrency_terms(spec_points, plain, base).to_json()
    except ConfigError as exc:
        CliConsole(stderr=True).print(f"note: no concurrency fit: {exc}", highlight=False)
        return None
