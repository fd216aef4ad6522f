"""slime's rollout function (`--rollout-function-path tailsieve.integrations.slime.generate_rollout`).

`generate_rollout(args, rollout_id, data_source, evaluation=False)`: a training rollout is one TailSieve step that
returns exactly `args.rollout_batch_size` complete groups of `args.n_samples_per_prompt` slime samples; an
evaluation is plain uniform generation of the eval set (slime's own eval rollout when slime is importable), with no
carry. The session (step loop, workers, event loop) is created on the first call and kept on the data source.
Every failure is one line (`SlimeIntegrationError`), without a chained traceback.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

from tailsieve.engines import TokenPrompt
from tailsieve.engines.transport.engine_client import Request
from tailsieve.errors import TailSieveError
from tailsieve.integrations.slime.data_source import CarryState, JsonlPromptSource, TailSieveDataSource, read_rows
from tailsieve.integrations.slime.sample import status_for
from tailsieve.integrations.slime.session import Session
from tailsieve.integrations.slime.settings import (
    SlimeIntegrationError,
    SlimeSettings,
    discover_workers,
    sampling_params,
)

__all__ = ["close_sessions", "generate_rollout", "session_for"]

_SESSIONS: dict[int, tuple[Any, Session, CarryState]] = {}  # id(data source) → (data source, session, state)


def session_for(args: Any, data_source: Any) -> tuple[Session, CarryState]:
    """The data source's session (created on first use) and the carry state it advances (the data source's own
    for a `TailSieveDataSource`, so it is saved with it; else kept in memory only)."""
    key = id(data_source)
    found = _SESSIONS.get(key)
    if found is None or found[0] is not data_source:
        session = Session(args, SlimeSettings.from_args(args), discover_workers(args))
        state = data_source.tailsieve if isinstance(data_source, TailSieveDataSource) else CarryState()
        found = _SESSIONS[key] = (data_source, session, state)
    if isinstance(data_source, TailSieveDataSource):  # `load` may have replaced it
        return found[1], data_source.tailsieve
    return found[1], found[2]


def close_sessions() -> None:
    """Close every open session (tests; a job's sessions end with its process)."""
    while _SESSIONS:
        _, (_, session, _) = _SESSIONS.popitem()
        session.close()


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout-function contract (see the module docstring)."""
    try:
        if evaluation:
            return _evaluate(args, rollout_id, data_source)
        session, state = session_for(args, data_source)
        groups, metrics = session.step(state, data_source.get_samples, rollout_id,
                                       lambda batch: _rewards(session, args, batch))
    except TailSieveError as exc:
        raise SlimeIntegrationError(f"TailSieve rollout {rollout_id}: {exc}") from None
    return _train_output(groups, metrics)


def _train_output(groups: list[list[Any]], metrics: dict[str, Any]) -> Any:
    """slime's `RolloutFnTrainOutput` when importable; else the groups (slime's legacy return, still accepted)."""
    try:
        from slime.rollout.base_types import RolloutFnTrainOutput  # type: ignore[import-not-found]
    except ImportError:
        return groups
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


def _rewards(session: Session, args: Any, groups: list[list[Any]]) -> None:
    """Rewards by slime's reward hub when slime is importable (else left None for the caller), as slime's own
    rollout scores them: with `--group-rm` each whole group through `batched_async_rm`, else every sample without a
    reward through `async_rm`. They run on slime's event loop (`slime.utils.async_utils.run`), not TailSieve's: the
    hub's shared HTTP session (`--rm-type remote_rm`) binds to the loop it first runs on, and slime's own eval
    rollout uses it from slime's loop."""
    try:
        from slime.rollout.rm_hub import async_rm, batched_async_rm  # type: ignore[import-not-found]
    except ImportError:
        return
    try:
        slime_run(session)(_score(args, groups, async_rm, batched_async_rm))
    except Exception as exc:  # the user's reward model: one line, and the step is not consumed
        text = str(exc).splitlines()[0] if str(exc) else ""
        raise SlimeIntegrationError(f"reward model failed ({type(exc).__name__}: {text[:200]}); the step was not "
                                    "consumed and runs again on the next call") from None


async def _score(args: Any, groups: list[list[Any]], one: Any, batched: Any) -> None:
    if getattr(args, "group_rm", False):
        for g, rewards in zip(groups, await asyncio.gather(*(batched(args, g) for g in groups)), strict=True):
            for s, r in zip(g, rewards, strict=True):
                s.reward = r
        return
    todo = [s for g in groups for s in g if s.reward is None]
    for s, r in zip(todo, await asyncio.gather(*(one(args, s) for s in todo)), strict=True):
        s.reward = r


def slime_run(session: Session) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """slime's `run` (its persistent event loop) when slime is importable, else the session's own loop."""
    try:
        from slime.utils.async_utils import run  # type: ignore[import-not-found]
    except ImportError:
        return session.run
    return cast(Callable[[Coroutine[Any, Any, Any]], Any], run)


def _evaluate(args: Any, rollout_id: int, data_source: Any) -> Any:
    """slime's own eval rollout when importable; else uniform generation over `args.eval_prompt_data`."""
    try:
        from slime.rollout.sglang_rollout import generate_rollout as slime_rollout  # type: ignore[import-not-found]
    except ImportError:
        session, _ = session_for(args, data_source)
        return {name: session.run(_eval_set(session, args, path))
                for name, path in _eval_sets(getattr(args, "eval_prompt_data", None))}
    return slime_rollout(args, rollout_id, data_source, evaluation=True)


def _eval_sets(spec: Any) -> list[tuple[str, str]]:
    """slime's `--eval-prompt-data name path [name path ...]`."""
    items = [str(x) for x in (spec or [])]
    if not items or len(items) % 2:
        raise SlimeIntegrationError("evaluation needs --eval-prompt-data NAME PATH [NAME PATH ...]")
    return list(zip(items[::2], items[1::2], strict=True))


async def _eval_set(session: Session, args: Any, path: str) -> dict[str, Any]:
    """Every eval prompt × `n_samples_per_eval_prompt`, round-robin over the workers, run to completion."""
    source = JsonlPromptSource(args, read_rows(Path(path)))
    n = int(getattr(args, "n_samples_per_eval_prompt", None) or 1)
    params = sampling_params(args, evaluation=True)
    samples = []
    for row in source.rows:
        base = source.prompt_sample(row)
        samples += [copy.deepcopy(base) for _ in range(n)]
    session.open()  # health check; the eval requests go straight through the client
    eps = session.endpoints

    async def one(i: int, s: Any) -> None:
        ids = session.prompt_ids(s)
        text = s.prompt if isinstance(s.prompt, str) else json.dumps(s.prompt)
        prompt = text if ids is None else TokenPrompt(ids, text)
        comp = await session.client.complete(eps[i % len(eps)], "default", Request(f"ts-eval-{i}", prompt), params)
        ch = comp.choices[0]
        resp = list(ch.token_ids or [])
        s.index, s.response, s.response_length = i, ch.text, len(resp)
        s.tokens = list(ch.prompt_token_ids or ids or []) + resp
        s.rollout_log_probs = None if ch.logprobs is None else list(ch.logprobs)
        s.status = status_for(s, ch.finish_reason)

    await asyncio.gather(*(one(i, s) for i, s in enumerate(samples)))
    return {"rewards": [s.reward for s in samples], "truncated": [s.status.value == "truncated" for s in samples],
            "samples": samples}
