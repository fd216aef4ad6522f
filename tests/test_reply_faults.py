"""Server replies are untrusted (issue 15): the fault matrix, one misbehaving fake server beside a healthy one.

Every row runs one `Rollout` step on replicas [bad, healthy] and checks that the step completes with every group
exactly once, that the bad replica is marked down with the reason in the table, that no traceback escapes and that
the hangs end within a bound. What the user sees for each reply kind (`tailsieve rollout`, the `Rollout` API):

| reply kind                                         | stream | seen as             | what the user sees           |
|----------------------------------------------------|--------|---------------------|------------------------------|
| `: keep-alive` comment lines, no tokens            | yes    | `stall`             | replica down after           |
|                                                    |        |                     | `--stall-timeout`, work      |
|                                                    |        |                     | re-dispatched, step done     |
| `data: {"choices": []}` forever                    | yes    | `stall`             | same                         |
| body dripping one space at a time, never ending    | no     | `stall`             | same (whole request bounded) |
| a token per tick, never finishing                  | yes    | `deadline`          | down after `--deadline`      |
| `choices` a string                                 | both   | `bad-reply`         | down at once, re-dispatched  |
| a stream chunk that is a JSON list                 | yes    | `bad-reply`         | same                         |
| a body that is a JSON list / not JSON              | both   | `bad-reply`         | same                         |
| `"index": null` / index outside [0, n)             | both   | `bad-reply`         | same                         |
| `completion_tokens` `Infinity`, 10^30 or negative  | both   | `bad-reply`         | same (no negative lengths)   |
| `{"choices": []}`                                  | no     | `bad-reply`         | same                         |
| `{"choices": [{}]}` (no finish reason)             | both   | `bad-reply`         | same (no empty "finished")   |
| fewer choices than `n`                             | both   | `bad-reply`         | same (the step goes on)      |
| `/v1/models` malformed or 5xx on the first replica | -      | `bad-reply` / `5xx` | next endpoint names the model|
| `/v1/models` bad on every replica                  | -      | `ConfigError`       | one line naming each reason  |
| malformed `/metrics` text                          | -      | `bad-reply`         | one-line error               |
| 4xx/5xx whose body echoes `Authorization`          | -      | `RequestRejected` / | one-line error, the key      |
|                                                    |        | `5xx`               | shown as `[redacted]`        |
| `--give-up-after inf` (every server dead)          | -      | flag error          | `--give-up-after must be a   |
|                                                    |        |                     | finite number of seconds...` |
| `profile`: 5xx, refused, stall, deadline           | both   | retried             | batch measured again         |
|                                                    |        |                     | (`--retries`, backoff)       |

Issue 23 adds GENERATED classes (`CLASSES`: class × variant × stream/full × split/n request mode): finish reasons
that are not `stop`/`length` (`abort`, unknown words), token ids that do not match the text or the counts, and
replies over the byte cap (refused before parsing; the healthy replica's stall timer never fires); plus a replica
shutting down (down after `liveness_s`, not the stall timeout). Endpoint URLs and their credentials:
tests/test_endpoints.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bad_fake import BadFake
from conftest import all_text
from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.engines.rollout.api import Batch, Rollout, RolloutConfig
from tailsieve.engines.rollout.engine_executor import RequestMode
from tailsieve.engines.rollout.prompts import PromptRecord
from tailsieve.engines.transport.engine_client import ClientOptions, Endpoint, EngineClient, EngineError, parse_metrics
from tailsieve.engines.transport.health import FaultPolicy
from tailsieve.engines.transport.replies import ReplyError
from tailsieve.engines.transport.types import FaultKind, SamplingParams
from tailsieve.errors import ConfigError
from tailsieve.policy.step import GroupStatus

PROMPTS = tuple(PromptRecord(f"p{i}", f"prompt number {i}") for i in range(40))
# the bad replica is probed back only after the step: every fault shows once, and nothing flaps
POLICY = FaultPolicy(stall_timeout_s=0.5, backoff_s=0.01, probe_interval_s=30.0, probe_max_s=30.0,
                     no_healthy_wait_s=0.5)
BOUND_S = 10.0  # a whole step, hangs included

BAD = FaultKind.BAD_REPLY.value
MATRIX: list[tuple[str, bool, str, dict[str, object]]] = [
    ("keepalive", True, "stall", {}),
    ("empty-events", True, "stall", {}),
    ("drip", False, "stall", {}),
    ("endless", True, "deadline", {"deadline_s": 1.5}),
    ("choices-string", True, BAD, {}),
    ("choices-string", False, BAD, {}),
    ("chunk-list", True, BAD, {}),
    ("list", False, BAD, {}),
    ("not-json", True, BAD, {}),
    ("not-json", False, BAD, {}),
    ("index-null", True, BAD, {}),
    ("index-null", False, BAD, {}),
    ("index-out-of-range", True, BAD, {}),
    ("tokens-inf", True, BAD, {}),
    ("tokens-inf", False, BAD, {}),
    ("tokens-huge", True, BAD, {}),
    ("tokens-huge", False, BAD, {}),
    ("tokens-negative", True, BAD, {}),
    ("tokens-negative", False, BAD, {}),
    ("choices-empty", False, BAD, {}),
    ("empty-choice", True, BAD, {}),
    ("empty-choice", False, BAD, {}),
    ("few-choices", True, BAD, {"mode": RequestMode.N}),
    ("few-choices", False, BAD, {"mode": RequestMode.N}),
    ("models-bad", True, BAD, {}),
    ("models-500", True, "5xx", {}),
]


def cfg(stream: bool, deadline_s: float | None = None, mode: RequestMode = RequestMode.SPLIT,
        stall_s: float = POLICY.stall_timeout_s) -> RolloutConfig:
    return RolloutConfig(groups=4, group_size=3, rho=0.5, policy="static", q=1, m=1, stream=stream,
                         request_mode=mode, sampling=SamplingParams(max_tokens=20),
                         faults=replace(POLICY, deadline_s=deadline_s, stall_timeout_s=stall_s))


async def one_step(urls: list[str], c: RolloutConfig) -> tuple[Batch, list[tuple[int, bool, str]]]:
    async with Rollout(urls, c, PROMPTS) as r:
        batch = await r.step()
        assert r.replicas is not None
        return batch, [(e.replica, e.up, e.reason) for e in r.replicas.events]


def check_complete(batch: Batch, n: int = 4, g: int = 3) -> None:
    assert len(batch.groups) == n and len({x.uid for x in batch.groups}) == n
    assert all(len(x.samples) == g for x in batch.groups)
    assert sum(o.status is GroupStatus.DONE for o in batch.outcomes) == n
    for grp in batch.groups:
        for s in grp.samples:
            assert s.replica == 1 and s.tokens >= 1 and s.finish_reason in ("stop", "length")


@pytest.mark.parametrize(("reply", "stream", "reason", "extra"), MATRIX,
                         ids=[f"{r}-{'stream' if s else 'full'}" for r, s, _, _ in MATRIX])
def test_bad_reply_marks_the_replica_down_and_the_step_completes(reply: str, stream: bool, reason: str,
                                                                 extra: dict[str, object]) -> None:
    with BadFake(reply=reply) as bad, FakeServer() as good:
        t0 = time.monotonic()
        c = cfg(stream, extra.get("deadline_s"), extra.get("mode", RequestMode.SPLIT))  # type: ignore[arg-type]
        batch, events = asyncio.run(one_step([bad.url, good.url], c))
        assert time.monotonic() - t0 < BOUND_S
    check_complete(batch)
    downs = [why for i, up, why in events if i == 0 and not up]
    assert downs and downs[0].startswith(f"{reason}:"), events
    assert all(i == 0 for i, _, _ in events)  # the healthy replica never went down


def test_models_on_every_endpoint_bad_is_one_line() -> None:
    with BadFake(reply="models-bad") as a, BadFake(reply="models-empty") as b, \
            pytest.raises(ConfigError, match=r"no endpoint names a served model .*bad-reply.*serves no model"):
        asyncio.run(one_step([a.url, b.url], cfg(True)))


def test_reply_errors_never_escape_as_tracebacks() -> None:
    """The client raises only its own one-line errors for every reply kind (the executor relies on it)."""
    from bad_fake import FULL, STREAM

    async def go(url: str, stream: bool) -> None:
        async with EngineClient(ClientOptions(stream=stream, stall_timeout_s=1.0)) as c:
            from tailsieve.engines.transport.types import Request
            await c.complete(Endpoint(url), "fake", Request("r", "hi", n=2), SamplingParams(max_tokens=5))

    for stream, kinds in ((True, STREAM), (False, FULL)):
        for kind in kinds:
            with BadFake(reply=kind) as bad:
                with pytest.raises(EngineError) as info:
                    asyncio.run(go(bad.url, stream))
                assert "\n" not in str(info.value) and str(info.value).startswith(bad.url)


def test_metrics_read_with_the_prometheus_parser() -> None:
    assert parse_metrics('a{x="1"} 2\na{x="2"} 3\n# c\nb 1') == {"a": 5.0, "b": 1.0}
    text = '# TYPE vllm:x counter\nvllm:x_total{e="0"} 2\nvllm:x_total{e="1"} 3\n'
    assert parse_metrics(text) == {"vllm:x_total": 5.0}
    with pytest.raises(ReplyError):
        parse_metrics('vllm:num_requests_running{model_name="fake" 3\n')

    async def go(url: str) -> object:
        async with EngineClient() as c:
            return await c.metrics(Endpoint(url))

    with BadFake(reply="metrics-bad") as bad, pytest.raises(EngineError, match="bad-reply: malformed /metrics"):
        asyncio.run(go(bad.url))


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_give_up_after_must_be_finite(value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question_id": "q0", "question": "1+1?"}) + "\n")
    t0 = time.monotonic()
    rc = main(["rollout", "--endpoints", "http://127.0.0.1:9", "--prompts", str(prompts), "--groups", "2",
               "--group-size", "2", "--give-up-after", value, "--out", str(tmp_path / "o")])
    assert rc == 1 and time.monotonic() - t0 < BOUND_S
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--give-up-after must be a finite number >= 0" in err


@pytest.mark.parametrize("flag", ["--stall-timeout", "--deadline"])
def test_time_flags_must_be_finite(flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["profile", "--endpoint", "http://127.0.0.1:9", flag, "inf", "--out", str(tmp_path / "c.json")])
    assert rc == 1 and f"{flag} must be a finite number of seconds > 0" in capsys.readouterr().err


@pytest.mark.parametrize("status", [401, 500])
def test_api_key_echoed_by_a_server_is_never_shown(status: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    key = "tsk-very-secret-0123456789"
    monkeypatch.setenv("TAILSIEVE_API_KEY", key)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": f"q{i}", "question": f"{i}+1?"}) + "\n" for i in range(8)))
    with BadFake(echo=status) as a, BadFake(echo=status) as b:
        rc = main(["rollout", "--endpoints", f"{a.url},{b.url}", "--prompts", str(prompts), "--groups", "2",
                   "--group-size", "2", "--max-tokens", "8", "--retries", "1", "--give-up-after", "0.2",
                   "--out", str(tmp_path / "run")])
        assert a.started + b.started >= 1
    cap = capsys.readouterr()
    assert rc == 1 and f"HTTP {status}" in cap.err and "[redacted]" in cap.err
    assert key not in all_text(tmp_path, (cap.out, cap.err))
    with BadFake(echo=status) as bad:
        rc = main(["profile", "--endpoint", bad.url, "--model", "fake", "--batches", "1", "--max-tokens", "4",
                   "--out", str(tmp_path / "c.json")])
    cap = capsys.readouterr()
    assert rc == 1 and "[redacted]" in cap.err and key not in all_text(tmp_path, (cap.out, cap.err))


def test_profile_retries_transient_faults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer() as srv:
        flip = _flip_after(srv, 3)  # three 5xx replies, then the server answers
        rc = main(["profile", "--endpoint", srv.url, "--model", "fake", "--batches", "1,2", "--max-tokens", "6",
                   "--contexts", "0", "--stall-timeout", "5", "--retries", "4", "--out", str(tmp_path / "c.json")])
        flip()
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "c.json").read_text())
    assert [p["batch"] for p in doc["points"]] == [1, 2] and all(p["tokens_per_s"] > 0 for p in doc["points"])


def _flip_after(srv: FakeServer, k: int) -> object:
    """Make `srv` answer 500 to its first k completions, then normally (FakeServer counts `started`)."""
    srv.mode, srv.fail_after, srv.then = "500", None, "500"
    original = srv._mode

    def mode() -> str:
        return "500" if srv.started <= k else "ok"

    srv._mode = mode  # type: ignore[method-assign]
    return lambda: setattr(srv, "_mode", original)


def test_profile_gives_up_after_its_retries_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(mode="500") as srv:
        t0 = time.monotonic()
        rc = main(["profile", "--endpoint", srv.url, "--model", "fake", "--batches", "1", "--max-tokens", "4",
                   "--retries", "2", "--out", str(tmp_path / "c.json")])
        assert time.monotonic() - t0 < BOUND_S
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0 and "attempt 3 of 3" in err and "5xx" in err


def test_profile_stall_flag_ends_a_keepalive_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with BadFake(reply="keepalive") as bad:
        t0 = time.monotonic()
        rc = main(["profile", "--endpoint", bad.url, "--model", "fake", "--batches", "1", "--max-tokens", "4",
                   "--stall-timeout", "0.3", "--retries", "1", "--out", str(tmp_path / "c.json")])
        assert time.monotonic() - t0 < BOUND_S
    err = capsys.readouterr().err
    assert rc == 1 and "stall: no tokens for 0.3s" in err


@pytest.mark.parametrize("reply", ["choices-string", "tokens-negative", "empty-choice"])
def test_a_bad_replica_that_answers_its_probes_does_not_fail_the_step(reply: str) -> None:
    """Probed back within milliseconds (its /health is fine), the bad replica may get work again and fail again;
    a failed request is re-dispatched after the replica is marked down, so the step still completes."""
    flappy = replace(POLICY, probe_interval_s=0.02, probe_max_s=0.02, backoff_s=0.1, retries=2)
    with BadFake(reply=reply) as bad, FakeServer() as good:
        c = replace(cfg(True), faults=flappy, groups=4)
        batch, events = asyncio.run(one_step([bad.url, good.url], c))
    check_complete(batch)
    assert sum(1 for i, up, _ in events if i == 0 and not up) >= 1


# ---- issue 23: generated classes of replies that look complete but are not -------------------------------------
# Each class is a list of variants; a variant builds, from the request body, the non-streamed body (`full`) and/or
# the streamed `data:` events (`stream`). Every (class, variant, mode) is one case of the matrix test above: the bad
# replica is marked down as `bad-reply`, its work re-dispatched, and the step completes on the healthy replica.
HUGE = 32 << 20  # bytes: far over the cap of a 20-token request (about 1.1 MB), and slow to parse if it were read
Make = Callable[[dict[str, Any]], str | list[str]]


def _choice(i: int, text: str, ids: list[int] | None, finish: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"index": i, "text": text, "finish_reason": finish}
    if ids is not None:
        out["token_ids"] = ids
    return out


def _n(body: dict[str, Any]) -> int:
    return int(body.get("n", 1))


def finish_full(reason: str) -> Make:
    return lambda b: json.dumps({"choices": [_choice(i, "xx", [1, 2], reason) for i in range(_n(b))],
                                 "usage": {"prompt_tokens": 3, "completion_tokens": 2 * _n(b)}})


def finish_stream(reason: str) -> Make:
    """Two tokens, then the (partial output's) finish event with `reason`."""
    return lambda b: [json.dumps({"choices": [_choice(i, "x", [1], None)]}) for i in range(_n(b)) for _ in (0, 1)] \
        + [json.dumps({"choices": [_choice(i, "", [], reason)]}) for i in range(_n(b))]


def ids_full(text: str, ids: list[int] | None, usage: int | None) -> Make:
    def make(b: dict[str, Any]) -> str:
        doc: dict[str, Any] = {"choices": [_choice(i, text, ids, "stop") for i in range(_n(b))]}
        if usage is not None:
            doc["usage"] = {"prompt_tokens": 3, "completion_tokens": usage * _n(b)}
        return json.dumps(doc)

    return make


def ids_stream(chunks: list[tuple[str, list[int] | None]], usage: int | None) -> Make:
    """Token events (text, ids or None) per choice, the last one finishing it, then a usage-only event."""
    def make(b: dict[str, Any]) -> list[str]:
        events = [json.dumps({"choices": [_choice(i, t, ids, "stop" if k == len(chunks) - 1 else None)]})
                  for i in range(_n(b)) for k, (t, ids) in enumerate(chunks)]
        if usage is not None:
            usage_doc = {"prompt_tokens": 3, "completion_tokens": usage * _n(b)}
            events.append(json.dumps({"choices": [], "usage": usage_doc}))
        return events

    return make


def _huge(*choices: dict[str, Any]) -> str:
    """A document of 32 MB claiming one finished token per choice (built once per shape: dumping it per request
    would hold the GIL that the client's loop shares with the fake's thread for longer than the stall timeout)."""
    text = json.dumps({"choices": list(choices), "pad": ""})
    return text[:-2] + " " * HUGE + '"}'


@functools.cache
def _huge_n(n: int) -> str:
    """`_huge` with n choices (`--request-mode n`), cached: a CI run once failed when it was dumped per request
    (the healthy replica's stall timer fired while the fake's thread held the GIL)."""
    return _huge(*(_choice(i, "x", [1], "stop") for i in range(n)))


HUGE_FULL = _huge(_choice(0, "x", [1], "stop"))
HUGE_EVENTS = [_huge(_choice(i, "x", [1], "stop")) for i in range(3)]
PAD = "p" * 100_000


def _padded(i: int, finish: str | None) -> str:
    return json.dumps({"choices": [_choice(i, "x", [1], finish)], "pad": PAD})


def huge_full(b: dict[str, Any]) -> str:
    return HUGE_FULL if _n(b) == 1 else _huge_n(_n(b))


def huge_line(b: dict[str, Any]) -> list[str]:
    """One `data:` line of 32 MB per choice (each arrives in many reads)."""
    return HUGE_EVENTS[:_n(b)]


def many_events(b: dict[str, Any]) -> list[str]:
    """max_tokens well-formed token events per choice, the last one finishing it (`length`), each padded to 100 kB:
    every count is right, only the whole stream is past the cap (about 1.1 MB for 20 tokens)."""
    cap = int(b.get("max_tokens", 20))
    return [_padded(i, "length" if t == cap - 1 else None) for i in range(_n(b)) for t in range(cap)]


CLASSES: dict[str, dict[str, dict[str, Make]]] = {
    "finish-reason": {r: {"full": finish_full(r), "stream": finish_stream(r)}
                      for r in ("abort", "banana", "error", "tool_calls", "Stop")},
    "ids-vs-text": {
        "text-empty-ids": {"full": ids_full("xxxxx", [], None), "stream": ids_stream([("x", [])] * 5, None)},
        "text-empty-ids-usage": {"full": ids_full("xxxxx", [], 5), "stream": ids_stream([("x", [])] * 5, 5)},
        "ids-below-usage": {"full": ids_full("xxx", [1, 2, 3], 5), "stream": ids_stream([("x", [1])] * 3, 5)},
        "ids-above-usage": {"full": ids_full("xxx", [1, 2, 3], 1), "stream": ids_stream([("x", [1])] * 3, 1)},
        "ids-on-some-events": {"stream": ids_stream([("x", [1]), ("x", None), ("x", None)], None)},
    },
    "size": {"huge": {"full": huge_full, "stream": huge_line}, "many-events": {"stream": many_events}},
}
GENERATED = [(cls, var, mode, make) for cls, variants in CLASSES.items() for var, modes in variants.items()
             for mode, make in modes.items()]


@pytest.mark.parametrize(("cls", "variant", "mode", "make"), GENERATED,
                         ids=[f"{c}-{v}-{m}" for c, v, m, _ in GENERATED])
@pytest.mark.parametrize("request_mode", [RequestMode.SPLIT, RequestMode.N], ids=["split", "n"])
def test_generated_incomplete_replies_are_bad_replies(cls: str, variant: str, mode: str, make: Make,
                                                      request_mode: RequestMode) -> None:
    """Only stop/length complete a sample; ids must match text and counts; a reply over its byte cap is refused
    before it is parsed, so the healthy replica's stall timer never fires while the bad one is read. That timer is
    0.5 s, and 2 s for the replies of tens of megabytes: the fake servers share the test's process, and on a loaded
    2-core machine their threads writing 32 MB held the GIL past 0.5 s (a CI-like run failed so, once in a
    thousand-test suite), which tests the machine, not the byte cap."""
    stall = 2.0 if cls == "size" else POLICY.stall_timeout_s
    with BadFake(custom=make) as bad, FakeServer() as good:
        t0 = time.monotonic()
        batch, events = asyncio.run(one_step([bad.url, good.url], cfg(mode == "stream", mode=request_mode,
                                                                       stall_s=stall)))
        assert time.monotonic() - t0 < BOUND_S
    check_complete(batch)
    downs = [why for i, up, why in events if i == 0 and not up]
    # a huge reply is refused at its byte cap, before it is parsed; on a loaded 2-core machine its first megabyte
    # can take longer than the 0.5 s stall timer to arrive (the fake server shares the process), and then the timer
    # refuses it first: either way it is not a sample. Every other class must be a bad reply.
    reasons = (f"{BAD}:", "stall:") if cls == "size" else (f"{BAD}:",)
    assert downs and downs[0].startswith(reasons), events
    assert all(i == 0 for i, _, _ in events)  # the healthy replica never went down (no starved stall timer)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "full"])
def test_a_replica_shutting_down_is_down_without_waiting_for_the_stall_timeout(stream: bool) -> None:
    """Issue 23: vLLM keeps streams open while it shuts down after SIGTERM; its /health fails. With a 30 s stall
    timeout, the quiet replica's /health is asked after `liveness_s` (0.3 s) and the step ends within seconds."""
    c = replace(cfg(stream), faults=replace(POLICY, stall_timeout_s=30.0, liveness_s=0.3))
    with BadFake(reply="shutdown") as bad, FakeServer() as good:
        t0 = time.monotonic()
        batch, events = asyncio.run(one_step([bad.url, good.url], c))
        took = time.monotonic() - t0
    check_complete(batch)
    assert took < 5.0, took
    downs = [why for i, up, why in events if i == 0 and not up]
    assert downs and downs[0].startswith("disconnect:") and "/health fails while its requests made no progress for " \
        "0.3s" in downs[0], events
