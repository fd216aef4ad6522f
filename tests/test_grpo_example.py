"""The CPU GRPO example's trainer half (`examples/grpo_cpu/grpo.py`): advantages and the clipped loss against hand
and brute-force computations, the gradient's sign on a real model, the reward on hand-built token lists, the initial
policy's stop rate, save() round-trips, the engine-gap statistic and determinism."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import require_extra

require_extra("torch", "transformers")
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "examples" / "grpo_cpu"))

import grpo  # noqa: E402
from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402

from tailsieve.engines.launch.tiny_vllm import build_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grpo")
    return grpo.make_initial_policy(build_tiny_model(root / "tiny"), root / "policy", eos_rate=1 / 40, seed=0)


@pytest.fixture(scope="module")
def tokenizer(policy: Path) -> object:
    return AutoTokenizer.from_pretrained(str(policy))


def samples(tokenizer: object, rewards: list[float], seed: int = 0) -> list[grpo.Sample]:
    """Fixed prompt + random responses of different lengths (ending in EOS) with the given rewards."""
    g = torch.Generator().manual_seed(seed)
    prompt = tokenizer("compute the digits of 12 and 7 =").input_ids
    out = []
    for i, r in enumerate(rewards):
        resp = [*torch.randint(4, 512, (5 + 3 * i,), generator=g).tolist(), tokenizer.eos_token_id]
        out.append(grpo.Sample(prompt, resp, r))
    return out


def test_group_advantages_by_hand() -> None:
    adv = grpo.group_advantages([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [0.0, 3.0]])
    assert adv[0] == pytest.approx([1, -1, -1, 1], abs=1e-5)  # mean 0.5, population std 0.5
    assert adv[1] == [0.0] * 4
    assert adv[2] == pytest.approx([-1, 1], abs=1e-5)


def test_clipped_loss_gradient_matches_brute_force() -> None:
    g = torch.Generator().manual_seed(1)
    old = torch.randn(3, 6, generator=g, dtype=torch.float64)
    logp = (old + 0.5 * torch.randn(3, 6, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.5, -0.7, 0.0], dtype=torch.float64)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False
    loss, clip = grpo.clipped_pg_loss(logp, old, adv, mask, clip_eps=0.2)
    loss.backward()
    n = int(mask.sum())
    want_grad, want_loss, clipped = torch.zeros_like(old), 0.0, 0
    for b in range(3):
        for t in range(6):
            if not mask[b, t]:
                continue
            rho, a = float(torch.exp(logp[b, t] - old[b, t]).detach()), float(adv[b])
            cut = (a > 0 and rho > 1.2) or (a < 0 and rho < 0.8)
            clipped += cut
            want_loss += -min(rho * a, min(max(rho, 0.8), 1.2) * a) / n
            want_grad[b, t] = 0.0 if cut else -a * rho / n
    assert 0 < clipped < n  # the data exercise both branches
    assert float(loss) == pytest.approx(want_loss, rel=1e-9)
    assert float(clip) == pytest.approx(clipped / n)
    assert torch.allclose(logp.grad, want_grad, atol=1e-12)


def test_reward_on_hand_built_tokens(tokenizer: object) -> None:
    tok = tokenizer
    digit = tok.convert_tokens_to_ids("7")
    word = tok.convert_tokens_to_ids("Ġthe")
    eos = tok.eos_token_id
    ids = grpo.digit_token_ids(tok)
    assert {tok.convert_tokens_to_ids(t) for t in ("0", "9", "Ġ25", "225")} <= ids
    assert word not in ids and eos not in ids and tok.convert_tokens_to_ids("²") not in ids
    assert grpo.reward([digit] * 24 + [word] * 24 + [eos], "stop", tok) == pytest.approx(0.5)
    assert grpo.reward([digit] * 10 + [eos], "stop", tok) == pytest.approx(10 / grpo.MIN_LEN)
    assert grpo.reward([digit] * 60 + [word] * 20 + [eos], "stop", tok) == pytest.approx(0.75)
    assert grpo.reward([digit] * 60 + [word] * 20, "length", tok) == pytest.approx(0.375)
    assert grpo.reward([], "stop", tok) == 0.0
    assert grpo.reward([word] * 50 + [eos], "stop", tok) == 0.0


def test_initial_policy_stops_at_the_target_rate(policy: Path, tmp_path: Path) -> None:
    model = LlamaForCausalLM.from_pretrained(str(policy), dtype=torch.float32)
    rate = grpo.eos_probability(model, model.config.eos_token_id, seed=7)
    assert 1 / 80 < rate < 1 / 20
    raw = LlamaForCausalLM.from_pretrained(str(policy.parent / "tiny"), dtype=torch.float32)
    assert grpo.eos_probability(raw, raw.config.eos_token_id, seed=7) < 1 / 200  # the random model barely stops
    assert json.loads((policy / "config.json").read_text())["dtype"] == "bfloat16"
    assert (policy / "tokenizer.json").read_bytes() == (policy.parent / "tiny" / "tokenizer.json").read_bytes()


def test_positive_advantage_sample_gains_logprob(policy: Path, tokenizer: object) -> None:
    trainer = grpo.GRPOTrainer(policy, lr=1e-4, minibatches=1, seed=0)
    group = samples(tokenizer, [1.0, 0.0, 0.0, 1.0])
    before = [sum(lp) for lp in trainer.logprobs(group)]
    stats = trainer.step([group])
    after = [sum(lp) for lp in trainer.logprobs(group)]
    assert after[0] > before[0] and after[3] > before[3]
    assert after[1] < before[1] and after[2] < before[2]
    assert stats["reward_mean"] == 0.5 and stats["clip_frac"] == 0.0  # one pass: ratio 1 everywhere
    assert stats["len_max"] == len(group[3].response_token_ids)


def test_engine_gap_and_determinism(policy: Path, tokenizer: object) -> None:
    runs = []
    for _ in range(2):
        trainer = grpo.GRPOTrainer(policy, lr=1e-3, minibatches=2, seed=3)
        group = samples(tokenizer, [0.2, 0.9, 0.4, 0.1])
        engine = trainer.logprobs(group)
        with_engine = [grpo.Sample(s.prompt_token_ids, s.response_token_ids, s.reward, lp)
                       for s, lp in zip(group, engine, strict=True)]
        runs.append(trainer.step([with_engine]))
    assert runs[0]["logprob_gap"] < 1e-4
    assert runs[0] == runs[1]
    no_engine = grpo.GRPOTrainer(policy, seed=3).step([samples(tokenizer, [0.2, 0.9])])
    assert no_engine["logprob_gap"] != no_engine["logprob_gap"]  # NaN without engine log-probs


def test_save_round_trips(policy: Path, tokenizer: object, tmp_path: Path) -> None:
    trainer = grpo.GRPOTrainer(policy, lr=1e-3, seed=0)
    trainer.step([samples(tokenizer, [1.0, 0.0, 0.5])])
    out = trainer.save(tmp_path / "ckpt")
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"} <= {
        p.name for p in out.iterdir()}
    loaded = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert next(iter(LlamaForCausalLM.from_pretrained(str(out)).parameters())).dtype == torch.bfloat16
    ids = torch.tensor([tokenizer("the model sums 12 and 7 =").input_ids])
    with torch.no_grad():
        want = trainer.model(input_ids=ids).logits
        got = loaded(input_ids=ids).logits
        rounded = trainer.model.to(torch.bfloat16).to(torch.float32)(input_ids=ids).logits
    assert torch.allclose(got, rounded, atol=1e-5)  # exactly the bf16-rounded weights
    assert torch.allclose(got, want, atol=0.1)  # and within bf16 noise of the float32 master
    assert grpo.sample_group(loaded, tokenizer, "the model", group_size=2, max_tokens=8, seed=1) == \
        grpo.sample_group(loaded, tokenizer, "the model", group_size=2, max_tokens=8, seed=1)
