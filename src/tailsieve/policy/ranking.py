"""Candidate ranking (§3.1, §2.3): which groups cut at the cutoff are the likeliest tails of the next generation.

A ranking is one pure function from the cut groups' outcomes to the same outcomes, most likely tail first; the
router isolates the first q of them next step. Rankings are chosen by name (`RouterConfig.ranking`) from
`RANKINGS`, filled by the `@ranking(name)` decorator; a new tail signal is a new function here, not an edit of the
router. `rank` runs one: a ranking must return a list (or tuple) holding exactly the cut outcomes; anything else
(an iterator, None, a subset, an exception or SystemExit from a plugin) is one line naming the ranking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tailsieve.policy.step import GroupOutcome
from tailsieve.registry import PluginError, Registry

Ranking = Callable[[Sequence[GroupOutcome]], list[GroupOutcome]]

def _callable(obj: object) -> str | None:
    return None if callable(obj) else "not a function of the cut outcomes"


# candidate rankings (`tailsieve.registry.Registry`; plugins: `pkg.module:function`, group tailsieve.rankings)
RANKINGS: Registry[Ranking] = Registry("candidate ranking", "tailsieve.rankings", check=_callable)
DEFAULT_RANKING = "least-progress"


def rank(name: str, cut: Sequence[GroupOutcome]) -> list[GroupOutcome]:
    """The cut outcomes as ranking `name` orders them, checked to be a permutation of `cut` (`PluginError` naming
    the ranking and what it returned otherwise)."""
    fn = RANKINGS.resolve(name)
    with RANKINGS.calling(name):
        ranked = fn(list(cut))  # a copy: a ranking that sorts in place leaves the router's list alone
    expected = f"a list or tuple ordering the {len(cut)} cut outcomes"
    if not isinstance(ranked, list | tuple) or not all(isinstance(o, GroupOutcome) for o in ranked):
        raise RANKINGS.returned(name, ranked, expected)
    if sorted(o.ref.uid for o in ranked) != sorted(o.ref.uid for o in cut):
        raise PluginError(f"{RANKINGS.kind} '{name}' returned {len(ranked)} outcomes that are not a permutation of "
                          f"the {len(cut)} cut outcomes")
    return list(ranked)


def ranking(name: str) -> Callable[[Ranking], Ranking]:
    """Function decorator adding a ranking to `RANKINGS` under `name` (a name taken by another function is refused)."""
    return RANKINGS.register(name)


@ranking("least-progress")
def least_progress(cut: Sequence[GroupOutcome]) -> list[GroupOutcome]:
    """The paper's partial-rollout signal: most earlier cuts, fewest finished members, fewest generated tokens
    (ties: earlier in the prompt stream)."""
    return sorted(cut, key=lambda o: (-o.ref.cuts, o.finished_members, o.tokens, o.ref.uid))


@ranking("stream-order")
def stream_order(cut: Sequence[GroupOutcome]) -> list[GroupOutcome]:
    """No tail signal: candidates in prompt-stream order (a control for measuring what the signal is worth)."""
    return sorted(cut, key=lambda o: o.ref.uid)
