"""The greedy probe (`integrations/trl/probe.py`) on the real tiny Llama (transformers, CPU): the model's own greedy
tokens agree exactly with gap 0; a token swapped at one position has exactly the gap brute force gives; another
model's greedy tokens (a replica on other weights) disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tailsieve.integrations.trl.probe import DEFAULT_TOL, ProbeResult, ReplicaProbe, gaps, greedy_agreement
from vllm_fixtures import tiny_model  # noqa: F401

pytestmark = pytest.mark.extra("torch", "transformers")

PROMPT = (5, 17, 33, 90, 12)


def load(folder: Path) -> Any:
    import torch
    import transformers as tf
    return tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)


def greedy(model: Any, n: int) -> list[int]:
    """Greedy tokens by repeated full forward passes (brute force)."""
    import torch
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(PROMPT):]


def test_own_greedy_agrees_and_a_swapped_token_has_the_brute_force_gap(tiny_model: Path) -> None:  # noqa: F811
    import torch
    model = load(tiny_model)
    toks = greedy(model, 6)
    result = greedy_agreement(model, [(PROMPT, toks), (PROMPT, toks)], 3)
    assert result.label() == "2/2" and result.stale == () and result.weight_version == 3
    assert [(r.exact, r.max_gap) for r in result.replicas] == [(6, 0.0), (6, 0.0)]
    swapped = [*toks[:3], (toks[3] + 1) % 500, *toks[4:]]
    want_gap, want_exact = 0.0, 0
    with torch.no_grad():  # brute force: one forward pass per position, on the swapped prefix
        for k, t in enumerate(swapped):
            row = model(input_ids=torch.tensor([[*PROMPT, *swapped[:k]]])).logits[0, -1].float()
            want_gap = max(want_gap, float(row.max() - row[t]))
            want_exact += int(row.argmax()) == t
    exact, gap = gaps(model, PROMPT, swapped)
    assert gap == pytest.approx(want_gap, abs=1e-5) and gap > 0
    assert exact == want_exact and exact <= 5


def test_training_mode_is_restored(tiny_model: Path) -> None:  # noqa: F811
    model = load(tiny_model)
    model.train()
    gaps(model, PROMPT, [1, 2])
    assert model.training
    model.eval()
    gaps(model, PROMPT, [1, 2])
    assert not model.training


def test_a_replica_on_other_weights_disagrees(tiny_model: Path) -> None:  # noqa: F811
    import torch
    trained, other = load(tiny_model), load(tiny_model)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    stale = greedy(other, 8)
    result = greedy_agreement(trained, [(PROMPT, greedy(trained, 8)), (PROMPT, stale)], 1)
    assert stale != greedy(trained, 8)
    assert result.stale == (1,) and result.label() == "1/2"
    assert result.replicas[1].max_gap > DEFAULT_TOL


def test_labels_and_tolerance() -> None:
    r = ProbeResult(2, (ReplicaProbe(0, (1,), 1, 0.0), ReplicaProbe(1, (2,), 0, DEFAULT_TOL),
                        ReplicaProbe(2, (3,), 0, DEFAULT_TOL * 1.01)))
    assert r.agreeing == 2 and r.stale == (2,) and r.label() == "2/3"
    assert gaps(None, PROMPT, []) == (0, 0.0)  # nothing generated: nothing to disagree with
