"""The trainer half of the CPU GRPO example: an initial policy with a real length distribution, a verifiable reward a
tiny random model can learn, a clipped-PPO/GRPO trainer in float32 torch, and an offline (HF `generate`) driver that
shows it learns. Pure torch + transformers: no vLLM, no TailSieve imports.

Weights: the trainer keeps float32 master weights and `save()` writes a bfloat16 copy (`save_pretrained`,
safetensors, same config and tokenizer files), which is what vLLM serves with `--dtype bfloat16`. The engine therefore
samples from the bf16-rounded policy; `step()` reports the gap between the engine's log-probs and the trainer's as
`logprob_gap` (≈1e-3 nats per token against a bf16 copy of the same weights: bf16 noise, not an off-policy bug).

Samples (`step(groups)`): each group is a list of samples, each a `Sample` or a mapping / object with the fields
`prompt_token_ids`, `response_token_ids` (including the EOS token when the engine stopped on it, as vLLM returns it),
`reward` and optionally `old_logprobs` (the engine's log-prob of each response token, sampled at temperature 1).

Run `python examples/grpo_cpu/offline.py --steps 20 --seed 0` for the offline learning demo (HF generate).
"""

from __future__ import annotations

import copy
import math
import random
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
BIAS_DIM = 0  # the residual-stream coordinate make_initial_policy turns into a constant "bias unit"
BIAS_RATIO = 100.0  # the bias unit's value over the RMS of the other embedding coordinates
MIN_LEN = 48  # the reward divides by at least this many tokens: shorter answers cannot score 1
TRUNCATED_FACTOR = 0.5  # reward multiplier of a response cut by max_tokens (finish_reason "length")
PROMPT_WORDS = ("the", "model", "sums", "integers", "primes", "groups", "tokens", "answer", "number", "digits",
                "solve", "compute", "value", "list", "string", "returns", "print", "range", "step", "proof")
_DIGITS = re.compile(r"[0-9]+")


# ---------------------------------------------------------------- task: prompts and reward


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """`n` short distinct-ish prompts built from the tiny tokenizer's words and numbers, e.g.
    "compute the digits of 17 and 4 ="; deterministic in `seed`. Tokenize with `tokenizer(p).input_ids`."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = " ".join(rng.choice(PROMPT_WORDS) for _ in range(rng.randint(2, 5)))
        out.append(f"{words} {rng.randint(0, 40)} and {rng.randint(0, 40)} =")
    return out


_DIGIT_CACHE: dict[int, tuple[Any, frozenset[int]]] = {}


def digit_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the tokens whose text (leading space stripped) is an ASCII digit string ("7", " 25", "225"); cached."""
    hit = _DIGIT_CACHE.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    ids = frozenset(i for i in range(len(tokenizer))
                    if _DIGITS.fullmatch(tokenizer.decode([i], skip_special_tokens=False).strip()))
    _DIGIT_CACHE[id(tokenizer)] = (tokenizer, ids)
    return ids


def reward(response_token_ids: Sequence[int], finish_reason: str | None, tokenizer: Any, *,
           min_len: int = MIN_LEN, truncated_factor: float = TRUNCATED_FACTOR) -> float:
    """Verifiable reward in [0, 1]: "answer in numbers, at least `min_len` tokens, and finish".

    r = n_digit / max(n, min_len), where n counts the response's tokens (a trailing EOS excluded) and n_digit those
    that are digit strings (`digit_token_ids`: "7", " 25", "225", …), times `truncated_factor` (0.5) when the response
    was cut by the length cap (`finish_reason == "length"`). Deterministic; an empty response scores 0.
    At step 0 (≈16% digit tokens, lengths ≈ geometric with mean ≈ 40) r ≈ 0.1. Raising it needs more digit tokens
    (the main lever), answers of at least `min_len` tokens (fewer early EOS) that still end before the cap: so the
    length distribution drifts (the short head thins out) while the truncated tail is penalised.
    """
    ids = list(response_token_ids)
    if ids and ids[-1] == tokenizer.eos_token_id:
        ids.pop()
    digits = digit_token_ids(tokenizer)
    r = sum(1 for t in ids if t in digits) / max(len(ids), min_len, 1)
    return r * truncated_factor if finish_reason == "length" else r


# ---------------------------------------------------------------- initial policy


def _copy_non_weights(src: Path, dst: Path) -> None:
    """Copy config, generation config, tokenizer and chat-template files (everything but weights)."""
    dst.mkdir(parents=True, exist_ok=True)
    if dst.resolve() == src.resolve():
        return
    for f in src.iterdir():
        if f.is_file() and f.name not in WEIGHT_FILES:
            shutil.copy2(f, dst / f.name)


def _probe_batch(vocab: int, seed: int, rows: int = 16, length: int = 64) -> torch.Tensor:
    """Uniformly random token sequences: the random model's own samples look like this."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (rows, length), generator=g)


@torch.no_grad()
def _final_hidden(model: LlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states [rows, len, hidden] of `ids`."""
    return model.model(input_ids=ids).last_hidden_state.float()


@torch.no_grad()
def eos_probability(model: LlamaForCausalLM, eos_id: int, *, seed: int = 0) -> float:
    """Mean next-token probability of EOS over every position of random token sequences (the per-token stop rate of
    sampling at temperature 1)."""
    ids = _probe_batch(model.config.vocab_size, seed)
    logits = model(input_ids=ids).logits.float()
    return float(torch.softmax(logits, dim=-1)[..., eos_id].mean())


@torch.no_grad()
def _install_bias_unit(model: LlamaForCausalLM, ratio: float) -> None:
    """Make residual coordinate BIAS_DIM a constant: every token embedding gets the same value there (`ratio` × the
    RMS of the other coordinates) and no attention/MLP output writes to it, so after the final RMSNorm it is a
    near-constant feature — the bias a Llama lm_head lacks."""
    emb = model.model.embed_tokens.weight
    others = torch.cat([emb[:, :BIAS_DIM], emb[:, BIAS_DIM + 1:]], dim=1)
    emb[:, BIAS_DIM] = ratio * others.pow(2).mean().sqrt()
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight[BIAS_DIM, :] = 0.0
        layer.mlp.down_proj.weight[BIAS_DIM, :] = 0.0


@torch.no_grad()
def _calibrate_eos(model: LlamaForCausalLM, eos_id: int, eos_rate: float, seed: int) -> None:
    """Set the EOS lm_head row to b·e_BIAS_DIM, with b found by bisection so the mean stop probability over random
    contexts is `eos_rate`."""
    head = model.lm_head.weight
    head[eos_id] = 0.0
    h = _final_hidden(model, _probe_batch(model.config.vocab_size, seed)).reshape(-1, head.shape[1])
    logits = h @ head.float().T
    rest = torch.cat([logits[:, :eos_id], logits[:, eos_id + 1:]], dim=1).logsumexp(dim=1)
    unit = h[:, BIAS_DIM]
    lo, hi = -50.0, 50.0
    for _ in range(60):
        b = (lo + hi) / 2
        p = torch.sigmoid(b * unit - rest).mean()
        lo, hi = (b, hi) if p < eos_rate else (lo, b)
    head[eos_id, BIAS_DIM] = (lo + hi) / 2


def make_initial_policy(src_folder: Path, dst_folder: Path, *, eos_rate: float = 1 / 40, seed: int = 0,
                        bias_ratio: float | None = None) -> Path:
    """Copy the tiny random model from `src_folder` to `dst_folder` with a real length distribution: a constant
    "bias unit" in the residual stream (`_install_bias_unit`) and an EOS lm_head row on it, calibrated so sampling at
    temperature 1 stops with per-token probability ≈ `eos_rate` in any context (lengths ≈ geometric, mean
    ≈ 1/eos_rate, a long tail up to the cap). Saved bf16 safetensors + the same config/tokenizer files; returns
    `dst_folder`. Deterministic in `seed` (it only picks the calibration contexts).

    The bias unit is `bias_ratio` (default BIAS_RATIO = 100) × the RMS of the other embedding coordinates, so it
    dominates every RMSNorm: the EOS logit is then nearly constant across contexts and moves only slowly when
    training nudges the other coordinates (with a weak unit, one Adam step at lr 3e-3 would halve the stop rate and
    lengths would swing between short and always-capped)."""
    src_folder, dst_folder = Path(src_folder), Path(dst_folder)
    model = LlamaForCausalLM.from_pretrained(str(src_folder), dtype=torch.float32)
    _install_bias_unit(model, BIAS_RATIO if bias_ratio is None else bias_ratio)
    model.to(torch.bfloat16).to(torch.float32)  # calibrate on the weights vLLM will serve
    _calibrate_eos(model, model.config.eos_token_id, eos_rate, seed)
    _copy_non_weights(src_folder, dst_folder)
    model.to(torch.bfloat16).save_pretrained(str(dst_folder), safe_serialization=True)
    return dst_folder


# ---------------------------------------------------------------- GRPO maths


def group_advantages(rewards: Sequence[Sequence[float]], eps: float = 1e-6) -> list[list[float]]:
    """GRPO advantages per group: A = (r − mean) / (std + eps), std the population std (ddof 0) of the group, so a
    group whose rewards are all equal gets zeros."""
    out = []
    for group in rewards:
        r = torch.tensor(group, dtype=torch.float64)
        out.append(((r - r.mean()) / (r.std(unbiased=False) + eps)).tolist())
    return out


def clipped_pg_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                    clip_eps: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped policy-gradient loss, token-level mean over `mask`: mean(−min(ρA, clip(ρ, 1±ε)A)) with
    ρ = exp(logp − old_logp). `logp`, `old_logp`, `mask`: [B, T]; `adv`: [B] (one per sequence). Returns (loss,
    clip fraction = share of masked tokens whose clipped branch is active, i.e. that carry no gradient)."""
    ratio = torch.exp(logp - old_logp.detach())
    a = adv[:, None].to(logp.dtype)
    unclipped, clipped = ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a
    per_token = -torch.minimum(unclipped, clipped)
    m = mask.to(logp.dtype)
    n = m.sum().clamp_min(1.0)
    is_clipped = ((a > 0) & (ratio > 1 + clip_eps)) | ((a < 0) & (ratio < 1 - clip_eps))
    return (per_token * m).sum() / n, (is_clipped.to(logp.dtype) * m).sum() / n


@dataclass(frozen=True, slots=True)
class Sample:
    """One rollout sample as the trainer reads it (any mapping or object with these fields works too)."""

    prompt_token_ids: Sequence[int]
    response_token_ids: Sequence[int]
    reward: float
    old_logprobs: Sequence[float] | None = None


def _get(sample: Any, name: str) -> Any:
    """A sample's field, from a mapping or an attribute (None when absent)."""
    return sample.get(name) if isinstance(sample, Mapping) else getattr(sample, name, None)


@dataclass(frozen=True, slots=True)
class PaddedBatch:
    """Right-padded prompt+response tokens: `ids`, `attention`, `positions` [B, L]; `response_mask` [B, L−1] marks
    the next-token predictions that are response tokens; `targets` [B, L−1] = ids shifted left."""

    ids: torch.Tensor
    attention: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor
    response_mask: torch.Tensor


def pad_batch(samples: Sequence[Any], pad_id: int) -> PaddedBatch:
    """Concatenate each sample's prompt and response and right-pad to one [B, L] batch."""
    rows = [(list(_get(s, "prompt_token_ids")), list(_get(s, "response_token_ids"))) for s in samples]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    resp = torch.zeros((len(rows), width), dtype=torch.bool)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        attention[i, :len(p) + len(r)] = 1
        resp[i, len(p):len(p) + len(r)] = True
    positions = torch.arange(width).expand(len(rows), width).contiguous()
    return PaddedBatch(ids, attention, positions, ids[:, 1:], resp[:, 1:])


def sequence_logprobs(model: LlamaForCausalLM, batch: PaddedBatch) -> torch.Tensor:
    """Log-prob of every next token [B, L−1] (float32; meaningful where `batch.response_mask`), one forward pass."""
    logits = model(input_ids=batch.ids, attention_mask=batch.attention, position_ids=batch.positions).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, batch.targets[..., None]).squeeze(-1)


def _engine_logprobs(samples: Sequence[Any], batch: PaddedBatch) -> torch.Tensor | None:
    """The engine's per-token log-probs laid out like `batch.response_mask`, or None unless every sample has them."""
    olds = [_get(s, "old_logprobs") for s in samples]
    if any(o is None for o in olds):
        return None
    if [len(o) for o in olds] != batch.response_mask.sum(dim=1).tolist():
        raise ValueError("old_logprobs must have one entry per response token")
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    out[batch.response_mask] = torch.tensor([float(x) for o in olds for x in o], dtype=torch.float32)
    return out


# ---------------------------------------------------------------- trainer


class GRPOTrainer:
    """On-policy GRPO on CPU: float32 `LlamaForCausalLM` master weights + Adam.

    `step(groups)`: group-normalised advantages, the pre-update log-probs of the trainer itself as the PPO "old"
    policy (detached), then `epochs` passes of `minibatches` Adam steps on the clipped loss (token-level mean per
    minibatch; gradients clipped to `max_grad_norm`). No KL term, no reference model.
    """

    def __init__(self, folder: Path, *, lr: float = 3e-3, clip_eps: float = 0.2, epochs: int = 1,
                 minibatches: int = 2, max_grad_norm: float = 1.0, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.folder = Path(folder)
        self.model = LlamaForCausalLM.from_pretrained(str(self.folder), dtype=torch.float32)
        self.model.train()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.clip_eps, self.epochs, self.minibatches, self.max_grad_norm = clip_eps, epochs, minibatches, max_grad_norm
        self.generator = torch.Generator().manual_seed(seed)
        self.steps = 0

    @property
    def pad_id(self) -> int:
        """Padding token id (the tokenizer's `<pad>`)."""
        return int(self.tokenizer.pad_token_id)

    @torch.no_grad()
    def logprobs(self, samples: Sequence[Any]) -> list[list[float]]:
        """The current weights' log-prob of each response token of each sample."""
        batch = pad_batch(samples, self.pad_id)
        lp = sequence_logprobs(self.model, batch)
        return [row[m].tolist() for row, m in zip(lp, batch.response_mask, strict=True)]

    def step(self, groups: Sequence[Sequence[Any]]) -> dict[str, float]:
        """One GRPO update on complete groups; returns loss, reward_mean, len_mean, len_max, clip_frac, logprob_gap
        (mean |engine − trainer| log-prob per token before the update; NaN when the samples carry none),
        zero_adv_groups (groups whose rewards were all equal: no signal) and grad_norm."""
        samples = [s for g in groups for s in g]
        rewards = [[float(_get(s, "reward")) for s in g] for g in groups]
        adv = torch.tensor([a for g in group_advantages(rewards) for a in g], dtype=torch.float32)
        batch = pad_batch(samples, self.pad_id)
        with torch.no_grad():
            old = sequence_logprobs(self.model, batch)
        engine = _engine_logprobs(samples, batch)
        gap = float((engine - old).abs()[batch.response_mask].mean()) if engine is not None else math.nan
        loss, clip, norm = self._update(samples, adv, old, batch)
        self.steps += 1
        lengths = batch.response_mask.sum(dim=1).float()
        return {"loss": loss, "reward_mean": sum(map(sum, rewards)) / len(samples), "len_mean": float(lengths.mean()),
                "len_max": float(lengths.max()), "clip_frac": clip, "logprob_gap": gap, "grad_norm": norm,
                "zero_adv_groups": float(sum(max(r) == min(r) for r in rewards))}

    def _update(self, samples: Sequence[Any], adv: torch.Tensor, old: torch.Tensor,
                batch: PaddedBatch) -> tuple[float, float, float]:
        """The epochs × minibatches Adam steps; returns mean loss, mean clip fraction, mean pre-clip grad norm."""
        losses, clips, norms = [], [], []
        for _ in range(self.epochs):
            order = torch.randperm(len(samples), generator=self.generator)
            for idx in order.chunk(self.minibatches):
                sub = pad_batch([samples[i] for i in idx.tolist()], self.pad_id)
                width = sub.targets.shape[1]
                logp = sequence_logprobs(self.model, sub)
                loss, clip = clipped_pg_loss(logp, old[idx, :width], adv[idx], sub.response_mask, self.clip_eps)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)))
                self.optimizer.step()
                losses.append(loss.item())
                clips.append(float(clip))
        return sum(losses) / len(losses), sum(clips) / len(clips), sum(norms) / len(norms)

    def save(self, folder: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
        """Write the current weights as `dtype` (bf16 by default, what vLLM serves) safetensors plus the source
        folder's config/tokenizer files to `folder` (created; old weights there replaced); returns `folder`."""
        folder = Path(folder)
        _copy_non_weights(self.folder, folder)
        for name in WEIGHT_FILES:
            (folder / name).unlink(missing_ok=True)
        copy.deepcopy(self.model).to(dtype).save_pretrained(str(folder), safe_serialization=True)
        return folder


# ---------------------------------------------------------------- offline driver (HF generate instead of vLLM)


@torch.no_grad()
def sample_group(model: LlamaForCausalLM, tokenizer: Any, prompt: str, *, group_size: int, max_tokens: int,
                 seed: int) -> list[tuple[list[int], list[int], str]]:
    """`group_size` temperature-1 samples of one prompt with HF `generate`: (prompt ids, response ids incl. EOS when
    it stopped, finish reason "stop" | "length"), like vLLM's. Deterministic in `seed`."""
    prompt_ids = tokenizer(prompt).input_ids
    ids = torch.tensor([prompt_ids] * group_size)
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, max_new_tokens=max_tokens, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    model.train(was_training)
    rows = []
    for row in out[:, len(prompt_ids):].tolist():
        if tokenizer.eos_token_id in row:
            rows.append((prompt_ids, row[:row.index(tokenizer.eos_token_id) + 1], "stop"))
        else:
            rows.append((prompt_ids, row, "length"))
    return rows
