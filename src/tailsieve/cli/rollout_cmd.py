"""`tailsieve rollout`: synchronous rollout steps on real OpenAI-compatible replicas (vLLM, SGLang) with the
simulator's router and controller. Several policies (comma-separated) run interleaved step by step on the same
prompt stream. Output layout and report keys: docs/engines.md. With `--launch CONFIG` the command starts the
replicas itself (docs/launch.md), moves them between pools as the controller changes m (restarting a replica only
when the two pools' flags differ; the restart seconds count in the step) and stops them when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tailsieve.analysis.balancer import BALANCER, balancer_verdicts, sentence
from tailsieve.analysis.report import batch_columns, fidelity_notes, summarize, summary_table
from tailsieve.cli._common import (
    add_trace_columns,
    api_key_env,
    console,
    print_json,
    progress_console,
    progress_enabled,
    take_warnings,
    trace_columns,
    warn_few_prompts,
)
from tailsieve.cli.flags import add, add_controller_flags, add_served_model_name, controller_config, policy_names_given
from tailsieve.cli.launch_cmd import sigterm_as_interrupt
from tailsieve.cli.width import say
from tailsieve.engines.kinds import DEFAULT_KIND
from tailsieve.engines.launch import ReplicaLauncher, launcher_for, make_launcher
from tailsieve.engines.launch.config import load_launch_config
from tailsieve.engines.rollout.api import Batch, RolloutConfig
from tailsieve.engines.rollout.engine_executor import RequestMode
from tailsieve.engines.rollout.prompts import END, PromptRecord, Template, load_prompts, paper_sampling
from tailsieve.engines.rollout.runner import prepare_runs, run_policies_real
from tailsieve.engines.transport.backends import get_backend
from tailsieve.engines.transport.engine_client import Api, Endpoint, SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.errors import ConfigError, Interrupted
from tailsieve.inputs import MAX_LENGTH, MAX_TEMPERATURE, check_replicas, check_step_size, excerpt, finite, int_in
from tailsieve.loop import SKIP_STEPS, PolicyRun
from tailsieve.model.spec_parse import load_config_file, parse_spec
from tailsieve.model.speculative import PoolSpec
from tailsieve.outputs import OutputLock
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.peers import PEERS
from tailsieve.policy.router import dispatch_of
from tailsieve.policy.router_knobs import router_values
from tailsieve.policy.spec import check_loop_policy
from tailsieve.workloads import load_workload

DEFAULT_POLICY = "tailsieve"  # --policy when none is given
MAX_STEPS = 1_000_000
MAX_WAIT_S = 1e6  # seconds: --stall-timeout, --give-up-after
MAX_RETRIES = 1000


def register(sub: Any) -> None:
    """Add the `rollout` command."""
    p = sub.add_parser("rollout", help="run rollout steps on real vLLM/SGLang replicas with a routing policy",
                       description="Run synchronous rollout steps (N complete groups of G per step) on real "
                                   "OpenAI-compatible replicas, routed by the simulator's router and controller. "
                                   "Writes each step's batch as JSONL and a report with the keys of simulate --json.")
    p.add_argument("--endpoints", help="comma-separated server URLs (one per replica); or --launch")
    p.add_argument("--launch", metavar="CONFIG",
                   help="start the replicas from this config's [launch] table and own them (docs/launch.md)")
    p.add_argument("--prompts", required=True,
                   help="a bundled prompt set (math500) or a prompt JSONL(.gz); text from prompt/problem/question/"
                        "messages")
    add(p, "--groups")
    add(p, "--group-size")
    add(p, "--steps", default=10)
    p.add_argument("--policy", help=f"one of {', '.join([*CONTROLLERS, *PEERS])}; comma-separated: interleaved "
                                    f"(A B A B …) (default: {DEFAULT_POLICY})")
    p.add_argument("--out", required=True, help="output folder")
    add(p, "--json")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument("--template", default="none", choices=[t.value for t in Template],
                   help="prompt template of App. A.1 (math, code) or none (default)")
    p.add_argument("--replay-lengths", metavar="WORKLOAD",
                   help="fixed-length replay: ignore_eos and max_tokens per request from this workload/trace")
    p.add_argument("--replay-mode", default="recorded", help="replay mode of --replay-lengths (recorded|resample)")
    add_trace_columns(p, "a --replay-lengths trace file")
    p.add_argument("--length-scale", type=float, default=1.0, help="multiply replayed lengths (e.g. 0.125)")
    add_model_args(p)
    add(p, "--tail-spec")
    add(p, "--bulk-spec")
    add(p, "--rho")
    add(p, "--q")
    add(p, "--m")
    add(p, "--dispatch")
    add(p, "--ranking")
    add(p, "--max-redraws")
    add(p, "--bias-correction")
    add_training_args(p)
    add_sampling_args(p)
    p.add_argument("--api", default="auto", choices=["auto", *(a.value for a in Api)],
                   help="completions or chat (auto: chat for --template code, else completions)")
    p.add_argument("--request-mode", default="split", choices=[m.value for m in RequestMode],
                   help="split: one request per sample; n: one request per group and replica with n samples")
    add(p, "--kind", default=None,
        help="server kind: a registered engine backend, a plugin pkg.module:Class or an entry point of "
             "tailsieve.backends (default: vllm; with --launch: launch.kind)")
    add_served_model_name(p)
    add(p, "--no-stream")
    add(p, "--seed")
    p.add_argument("--no-seed", action="store_true", help="send no per-request seed")
    add(p, "--shuffle")
    add_fault_args(p)
    add_controller_flags(p)
    p.set_defaults(func=run)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The controller's cost model: curve or model file, its kv term, the tail pool's curve."""
    add(p, "--curve")
    add(p, "--kv-ms-per-1k")
    p.add_argument("--tail-curve", help="the tail pool's own curve (profile of a tail-configured server)")


def add_fault_args(p: argparse.ArgumentParser) -> None:
    """Transport and fault-handling flags."""
    add(p, "--api-key-env")
    add(p, "--stall-timeout")
    add(p, "--deadline")
    add(p, "--retries")
    p.add_argument("--give-up-after", type=float, default=10.0,
                   help="seconds to wait for a replica to come back when none is healthy (default: %(default)s)")


def fault_policy(args: argparse.Namespace) -> FaultPolicy:
    """The fault flags as a `FaultPolicy` (`check_flags` has made every time finite: no flag can make a run wait
    forever)."""
    return FaultPolicy(stall_timeout_s=args.stall_timeout, retries=args.retries,
                       no_healthy_wait_s=args.give_up_after, deadline_s=args.deadline)


def add_training_args(p: argparse.ArgumentParser) -> None:
    """The flags of a run under a trainer: weight reloads between steps, logprobs in the batch files."""
    p.add_argument("--weights-dir", metavar="DIR",
                   help="before each step, load the newest checkpoint subfolder of DIR (config.json + weights) when it "
                        "changed: every replica reloads it in place (vLLM: VLLM_SERVER_DEV_MODE=1; a --launch config "
                        "with weight_reload = true sets it) or is restarted on it; samples carry the weight version")
    p.add_argument("--logprobs", action="store_true", help="record each generated token's logprob in the batch files")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The sampling flags (App. A.1 names)."""
    p.add_argument("--max-tokens", type=int, default=1024, help="response length cap (default: %(default)s)")
    p.add_argument("--paper-sampling", action="store_true",
                   help="Table A.1: temperature 0.7, top-p 0.8, top-k 20, presence 1.5, stop <END>")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")


def pool_spec(args: argparse.Namespace, base: PoolSpec | None = None) -> PoolSpec:
    """The pools' speculation for the controller's curves: `base` (the --launch config's) with the flags on top."""
    spec = base or PoolSpec()
    tail = parse_spec(args.tail_spec, "--tail-spec") if args.tail_spec else spec.tail
    bulk = parse_spec(args.bulk_spec, "--bulk-spec") if args.bulk_spec else spec.bulk
    return PoolSpec(tail, bulk)


def build_configs(args: argparse.Namespace, spec: PoolSpec | None = None) -> dict[str, RolloutConfig]:
    """Validate the flags and build one `RolloutConfig` per policy."""
    for flag, v in (("--groups", args.groups), ("--group-size", args.group_size), ("--steps", args.steps),
                    ("--max-tokens", args.max_tokens)):
        if v < 1:
            raise ConfigError(f"{flag} must be a positive integer, got {v}")
    check_flags(args)
    names = policy_names_given(args.policy or DEFAULT_POLICY, DEFAULT_POLICY)
    valid = ', '.join([*CONTROLLERS.names(), *PEERS])
    if not names:
        raise ConfigError(f"--policy is empty; valid: {valid}")
    for n in names:
        check_loop_policy(n)
    if (args.q is not None or args.m is not None) and "static" not in names:
        raise ConfigError("--q/--m set the static policy; add static to --policy")
    template = Template(args.template)
    stop = tuple(args.stop or ())
    if args.paper_sampling:
        base = paper_sampling(args.max_tokens)
        sampling = SamplingParams(base.temperature, base.top_p, base.top_k, base.presence_penalty, args.max_tokens,
                                  tuple(dict.fromkeys((*base.stop, *stop))))
    else:
        if template is not Template.NONE and END not in stop:
            stop = (*stop, END)
        sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.presence_penalty, args.max_tokens,
                                  stop)
    api = Api.CHAT if args.api == "auto" and template is Template.CODE else Api(
        "completions" if args.api == "auto" else args.api)
    replay = (load_workload(args.replay_lengths, mode=args.replay_mode, **trace_columns(args))
              if args.replay_lengths else None)
    ctl = controller_config(args)
    faults = fault_policy(args)
    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    knobs = router_values(args) | {"dispatch": dispatch_of(args.dispatch)}  # rho, dispatch, max_redraws, ranking
    return {n: RolloutConfig(groups=args.groups, group_size=args.group_size, **knobs, policy=n, curve=args.curve,
                             kv_ms_per_1k=args.kv_ms_per_1k, tail_curve=args.tail_curve, spec=spec or pool_spec(args),
                             controller=ctl, q=args.q, m=args.m, sampling=sampling, template=template, api=api,
                             request_mode=RequestMode(args.request_mode), stream=not args.no_stream,
                             seed=None if args.no_seed else args.seed, shuffle=args.shuffle, replay=replay,
                             length_scale=args.length_scale, faults=faults, api_key_env=api_key_env(args),
                             model=args.model, bias_correction=getattr(args, "bias_correction", False),
                             logprobs=getattr(args, "logprobs", False))
            for n in names}


def check_flags(args: argparse.Namespace) -> None:
    """The numeric flags at the boundary: finite, in range, named in the one-line error (sampling parameters are
    sent to servers as JSON, which has no NaN or infinity)."""
    int_in(args.steps, "--steps", 1, MAX_STEPS)
    int_in(args.max_tokens, "--max-tokens", 1, MAX_LENGTH)
    check_step_size(args.groups, args.group_size)
    finite(args.rho, "--rho", lo=0, hi=1)
    if args.kv_ms_per_1k is not None:
        finite(args.kv_ms_per_1k, "--kv-ms-per-1k", lo=0, hi=1e6)
    finite(args.length_scale, "--length-scale", lo=0, lo_open=True, hi=MAX_LENGTH)
    finite(args.temperature, "--temperature", lo=0, hi=MAX_TEMPERATURE)
    finite(args.top_p, "--top-p", lo=0, lo_open=True, hi=1)
    finite(args.presence_penalty, "--presence-penalty", lo=-2, hi=2)
    if args.top_k is not None and args.top_k < -1:
        raise ConfigError(f"--top-k must be -1 (off), 0 (off) or a positive integer, got {args.top_k}")
    finite(args.stall_timeout, "--stall-timeout", lo=0, lo_open=True, hi=MAX_WAIT_S)
    finite(args.give_up_after, "--give-up-after", lo=0, hi=MAX_WAIT_S)
    if args.deadline is not None:
        finite(args.deadline, "--deadline", lo=0, lo_open=True, hi=MAX_WAIT_S)
    int_in(args.retries, "--retries", 0, MAX_RETRIES)


def check_default_policy(args: argparse.Namespace, replicas: int) -> None:
    """With no --policy, a fleet too small for the default (`DEFAULT_POLICY`) is one line naming it as the default
    and what to give instead (the user named no policy)."""
    if args.policy is None:
        more = f"more replicas in {args.launch}" if args.launch else "more --endpoints"
        check_replicas(DEFAULT_POLICY, CONTROLLERS[DEFAULT_POLICY].min_replicas, replicas,
                       default_fix=f"give --policy uniform or {more}")


def _check_weights_dir(args: argparse.Namespace, runs: int) -> None:
    """`--weights-dir`: a folder, for one training run."""
    if args.weights_dir and not Path(args.weights_dir).is_dir():
        raise ConfigError(f"--weights-dir {args.weights_dir} is not a folder")
    if args.weights_dir and runs != 1:
        raise ConfigError("--weights-dir drives one training run: give exactly one --policy")


def run(args: argparse.Namespace) -> int:
    """Run the steps, writing the output folder as they complete; print the simulate-style table."""
    kind = args.kind or DEFAULT_KIND
    get_backend(kind)  # the engine backend's one unknown-name check (a plugin loads here)
    launcher: ReplicaLauncher | None = None
    out = Path(args.out)
    if args.launch:
        if args.endpoints:
            raise ConfigError("give --endpoints or --launch, not both")
        launch_path = Path(args.launch)
        lc = load_launch_config(launch_path)
        if args.kind is not None and args.kind != lc.kind:
            raise ConfigError(f"--kind {args.kind} contradicts launch.kind = {excerpt(lc.kind)} of {launch_path}: the "
                              "launched servers' kind is their clients' kind")
        kind = lc.kind
        if args.weights_dir:
            lc = replace(lc, weight_reload=True)
        launcher = make_launcher(launcher_for(lc), lc, out / "launch")
        configs = build_configs(args, pool_spec(args, load_config_file(launch_path)))
        endpoints: list[Endpoint] = []  # known once the launcher has started (a Ray replica's node and port)
        replicas = lc.replicas
    elif not args.endpoints:
        raise ConfigError("give the replicas: --endpoints URL,URL… or --launch CONFIG")
    else:
        configs = build_configs(args)
        endpoints = [Endpoint.parse(u, kind) for u in args.endpoints.split(",") if u.strip()]
        if not endpoints:
            raise ConfigError("--endpoints is empty")
        replicas = len(endpoints)
    check_default_policy(args, replicas)
    for cfg in configs.values():
        cfg.policy_spec(replicas)  # every policy check once, before any replica starts (`PolicySpec`)
    prompts = load_prompts(args.prompts)
    warn_few_prompts(args, len({p.prompt_id for p in prompts}), f"prompt set {args.prompts}")
    _check_weights_dir(args, len(configs))
    # the folder's checks before any replica starts; with --launch the URLs are known only after start(), so the
    # checks run on stand-ins, one per replica (a Rollout built for checking opens no connection)
    stand_ins = endpoints or [Endpoint.parse(f"http://127.0.0.1:{i + 1}", kind) for i in range(replicas)]
    lock = OutputLock(out, "rollout", folder=True)
    lock.check()  # another writer first: its step in progress would look like damage to the checks
    prepared = prepare_runs(stand_ins, prompts, configs, out, resume=args.resume)
    out.mkdir(parents=True, exist_ok=True)
    try:  # SIGTERM / SIGHUP / Ctrl-C: every completed step is on disk already; one line, 128 + the signal
        with lock, sigterm_as_interrupt(launcher):
            for _, po in prepared.values():
                if po.note:
                    say(f"tailsieve rollout: {po.note}")
            if launcher is None:
                return _run(args, configs, endpoints, prompts, out, None, lock)
            try:
                launcher.start()
                endpoints = [Endpoint.parse(u, kind) for u in launcher.endpoints]  # after start: Ray places them
                # the slowest start-up prices a pool move, unless --move-cost-s was given
                priced = configs if hasattr(args, "move_cost_s") else with_move_price(configs, launcher)
                return _run(args, priced, endpoints, prompts, out, launcher, lock)
            finally:
                launcher.stop()
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        raise Interrupted(signum, f"the completed steps are kept in {out} (rollout --resume continues)") from None


def with_move_price(configs: dict[str, RolloutConfig], launcher: ReplicaLauncher) -> dict[str, RolloutConfig]:
    """The controllers' prior price of a pool move: the slowest replica start-up just measured, when the pools'
    flags differ (a move restarts the replica); the measured restarts refine it as the run goes."""
    if launcher.config.restart_free:
        return configs
    boot = max((rep.boot_s for rep in launcher.slots), default=0.0)
    return {n: replace(c, controller=replace(c.controller, move_cost_s=boot)) for n, c in configs.items()}


def _run(args: argparse.Namespace, configs: dict[str, RolloutConfig], endpoints: list[Endpoint],
         prompts: tuple[PromptRecord, ...], out: Path, launcher: ReplicaLauncher | None, lock: OutputLock) -> int:
    meta = {"endpoints": [e.url for e in endpoints], "prompts": args.prompts, "replicas": len(endpoints),
            "groups": args.groups, "group_size": args.group_size, "rho": args.rho, "curve": args.curve,
            "template": args.template, "replay": args.replay_lengths, "length_scale": args.length_scale,
            "dispatch": args.dispatch,
            "ranking": args.ranking, "max_redraws": args.max_redraws, "seed": None if args.no_seed else args.seed,
            "tail_curve": args.tail_curve,
            "spec": next(iter(configs.values())).spec.to_json(),
            "launch": None if launcher is None else launcher.describe()}
    if getattr(args, "bias_correction", False):
        meta["bias_correction"] = True
    enabled = progress_enabled()
    con = progress_console(enabled)
    bar = Progress(TextColumn("{task.description:<18}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=con, transient=True, disable=not enabled)
    task = bar.add_task("rollout", total=args.steps * len(configs))

    def tick(name: str, batch: Batch) -> None:
        bar.update(task, advance=1, description=f"{name} step {batch.step}")
        for line in take_warnings():  # the run went ahead: say it now, not at the end
            con.print(line, markup=False, highlight=False, soft_wrap=True)
        for ev in [] if launcher is None else launcher.drain_events():  # a replica died / restarts / is back
            con.print(ev, markup=False, highlight=False)
        if not enabled:
            r = batch.record
            print(f"{name} step {r.step}: {r.makespan_s:.2f}s q={r.q} m={r.m}"
                  + (f" restart={batch.restart_s:.1f}s" if batch.restart_s else "")
                  + (f" redraws={batch.redraws_max}/{batch.redraws_mean:.2f}" if batch.redraws_max else "")
                  + (f" redispatched={batch.redispatched}" if batch.redispatched else "")
                  + (f" weights=v{batch.weight_version}" if batch.weight_version else "")
                  + (f" down={list(batch.down)}" if batch.down else ""), file=sys.stderr)

    with bar:
        runs = asyncio.run(run_policies_real(endpoints, prompts, configs, args.steps, out, resume=args.resume,
                                             meta=meta, on_step=tick,
                                             pools=None if launcher is None else launcher.pool_hook,
                                             weights_dir=Path(args.weights_dir) if args.weights_dir else None,
                                             reload=None if launcher is None else launcher.reload, lock=lock,
                                             live_meta=None if launcher is None else (
                                                 lambda: {"launch": launcher.describe()})))
    if args.json:  # the final summary: report.json's document, as `simulate --json` prints its own
        print_json(json.loads((out / "report.json").read_text(encoding="utf-8")))
        return 0
    print_table(runs, title=(f"Real rollouts on {len(endpoints)} replica(s): {Path(args.prompts).name}, "
                             f"N={args.groups} × G={args.group_size}, {args.steps} steps, ρ={args.rho}"))
    console().print(f"batches, steps and state in {out}/<policy>/, report in {out}/report.json")
    return 0


def print_table(runs: dict[str, PolicyRun], *, title: str) -> None:
    """`simulate`'s comparison table (`tailsieve.analysis.report`; speedup, bias: against uniform when it ran)."""
    con = console()
    summaries = summarize(runs)
    con.print(summary_table(summaries, title=title, extra_columns=batch_columns(summaries)))  # simulate's columns
    for line in fidelity_notes(summaries):
        con.print(line, highlight=False)
    verdicts = balancer_verdicts(runs)
    for name, v in verdicts.items():
        con.print(sentence(v, summaries[name].speedup), highlight=False)
    if not verdicts and BALANCER not in runs and any(n in CONTROLLERS and n != "uniform" for n in runs):
        con.print(f"add {BALANCER} to --policy to judge against verl's request balancer (what a verl user runs).",
                  highlight=False)
    con.print(f"mean step: mean wall-clock makespan over all steps but the first {SKIP_STEPS} (warm-up, first "
              "steady step); speedup = uniform's mean / the policy's (interleaved on the same prompt stream). "
              "wasted: aborted-group tokens / all generated. length ratio, KS: consumed lengths vs uniform; "
              "off-policy, dropped, delayed, batch CV: docs/peers.md. ±2σ: two "
              "standard errors of the speedup, steps paired with uniform; ~: within noise or never off the uniform "
              "boundary.")
