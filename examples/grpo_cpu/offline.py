"""The offline learning demo of the CPU GRPO example: HF `generate` samples from the trainer's own weights (no
vLLM), `grpo.reward` scores them, `GRPOTrainer` steps. Shows the task is learnable; `train.py` is the real loop.

    python examples/grpo_cpu/offline.py --steps 20 --seed 0
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo import GRPOTrainer, Sample, make_initial_policy, make_prompts, reward, sample_group

from tailsieve.cli import CliParser


def offline_demo(steps: int = 20, *, seed: int = 0, groups: int = 8, group_size: int = 4, max_tokens: int = 128,
                 eos_rate: float = 1 / 40, lr: float = 3e-3, workdir: Path | None = None,
                 log: bool = True) -> list[dict[str, float]]:
    """Build the tiny model and the initial policy in `workdir` (a temp folder by default), then `steps` times:
    sample `groups` prompts × `group_size` with HF generate from the trainer's own weights, reward them and take a
    GRPO step. Returns the per-step stats (plus trunc_frac and seconds)."""
    import tempfile

    from tailsieve.engines.launch.tiny_vllm import build_tiny_model

    workdir = Path(workdir or tempfile.mkdtemp(prefix="grpo_offline_"))
    policy = make_initial_policy(build_tiny_model(workdir / "tiny"), workdir / "policy", eos_rate=eos_rate, seed=seed)
    trainer = GRPOTrainer(policy, lr=lr, seed=seed)
    prompts, rng, history = make_prompts(64, seed), random.Random(seed), []
    for step in range(steps):
        t0 = time.perf_counter()
        batch = []
        for prompt in rng.sample(prompts, groups):
            rows = sample_group(trainer.model, trainer.tokenizer, prompt, group_size=group_size,
                                max_tokens=max_tokens, seed=rng.randrange(2**31))
            batch.append([Sample(p, r, reward(r, f, trainer.tokenizer)) for p, r, f in rows])
        stats = trainer.step(batch)
        stats["trunc_frac"] = sum(len(s.response_token_ids) >= max_tokens for g in batch for s in g) / (
            groups * group_size)
        stats["seconds"] = time.perf_counter() - t0
        history.append(stats)
        if log:
            print(json.dumps({"step": step} | {k: round(v, 4) for k, v in stats.items()}), flush=True)
    return history


def main(argv: Sequence[str] | None = None) -> None:
    """CLI for `offline_demo`."""
    ap = CliParser(prog="offline.py", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for this tiny model)")
    a = ap.parse_args(argv)
    for name, hi in {"steps": 100_000, "max_tokens": 4096, "threads": 256}.items():  # before anything starts
        if not 1 <= getattr(a, name) <= hi:
            ap.error(f"--{name.replace('_', '-')} must be an integer in 1..{hi}, got {getattr(a, name)}")
    if not 0 <= a.seed < 2**32:
        ap.error(f"--seed must be an integer in 0..{2**32 - 1}, got {a.seed}")
    if not (math.isfinite(a.lr) and 0 < a.lr <= 1):
        ap.error(f"--lr must be a finite learning rate in (0, 1], got {a.lr}")
    torch.set_num_threads(a.threads)
    offline_demo(a.steps, seed=a.seed, lr=a.lr, max_tokens=a.max_tokens, workdir=a.workdir)


if __name__ == "__main__":
    main()
