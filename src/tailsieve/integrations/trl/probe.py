"""The greedy probe: do the replicas serve the trainer's weights? (issue 25 item 4, checked against the servers)

Each replica answers a fixed prompt at temperature 0 (its prompt ids and greedy token ids). The trainer's model
reads the same ids teacher-forced and, at every position, the replica's token must be the model's own argmax up to
`tol` in logits (`gap = max logit - logit of the replica's token`): a replica on other weights picks other tokens.
`exact` counts positions where the replica's token is the model's argmax outright. A replica whose largest gap
exceeds `tol` disagrees, i.e. it does not serve the trainer's weights.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TOL", "ProbeResult", "ReplicaProbe", "greedy_agreement"]

DEFAULT_TOL = 1e-2  # fp32 replica vs fp32 trainer: logits agree to ~1e-5; a stale replica's gaps are ~0.1 and more


@dataclass(frozen=True, slots=True)
class ReplicaProbe:
    """One replica's greedy answer checked against the trainer's logits."""

    replica: int
    tokens: tuple[int, ...]
    exact: int  # positions where the replica's token is the trainer's argmax
    max_gap: float  # largest (trainer's max logit - logit of the replica's token) over the positions

    def agrees(self, tol: float = DEFAULT_TOL) -> bool:
        """Whether the replica's greedy tokens are the trainer's (up to `tol`)."""
        return self.max_gap <= tol


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The probe after one weight push: every replica's check and the version the run says they serve."""

    weight_version: int
    replicas: tuple[ReplicaProbe, ...]
    tol: float = DEFAULT_TOL

    @property
    def agreeing(self) -> int:
        """Replicas that serve the trainer's weights."""
        return sum(r.agrees(self.tol) for r in self.replicas)

    @property
    def stale(self) -> tuple[int, ...]:
        """Replicas that do not (their ids)."""
        return tuple(r.replica for r in self.replicas if not r.agrees(self.tol))

    def label(self) -> str:
        """`2/2` style: agreeing replicas over all."""
        return f"{self.agreeing}/{len(self.replicas)}"


def gaps(model: Any, prompt_ids: Sequence[int], tokens: Sequence[int]) -> tuple[int, float]:
    """(exact argmax matches, largest logit gap) of `tokens` after `prompt_ids` under `model` (teacher-forced)."""
    if not tokens:
        return 0, 0.0
    torch: Any = importlib.import_module("torch")
    ids = torch.tensor([[*prompt_ids, *tokens]], dtype=torch.long)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
    finally:
        model.train(was_training)
    start = len(prompt_ids) - 1
    rows = logits[start:start + len(tokens)]
    chosen = rows[torch.arange(len(tokens)), torch.tensor(list(tokens))]
    best = rows.max(dim=-1).values
    exact = int((rows.argmax(dim=-1) == torch.tensor(list(tokens))).sum())
    return exact, float((best - chosen).max())


def greedy_agreement(model: Any, answers: Sequence[tuple[Sequence[int], Sequence[int]]], weight_version: int,
                     tol: float = DEFAULT_TOL) -> ProbeResult:
    """Check each replica's (prompt ids, greedy ids), as the replica tokenized and generated them, against `model`."""
    probes = []
    for i, (prompt_ids, tokens) in enumerate(answers):
        exact, gap = gaps(model, prompt_ids, tokens)
        probes.append(ReplicaProbe(i, tuple(tokens), exact, gap))
    return ProbeResult(weight_version, tuple(probes), tol)
