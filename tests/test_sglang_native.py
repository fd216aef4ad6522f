"""The `sglang-native` backend: the exact native `/generate` body, the OpenAI-shaped mapping of native answers
(token ids, per-token logprobs, prompt token ids, finish reason) for full answers and for cumulative and
incremental streams, `/abort_request` by rid on cancel, and a server-side abort reported as a replica fault."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from sglang_fake import FakeFleet, FakeSGLang, logprob, token
from tailsieve.engines import TokenPrompt, get_backend
from tailsieve.engines.transport.engine_client import (
    Api,
    ClientOptions,
    Completion,
    Endpoint,
    EngineClient,
    ReplicaFault,
    Request,
    SamplingParams,
)


@pytest.fixture
def fake() -> Iterator[FakeSGLang]:
    fleet = FakeFleet([FakeSGLang()]).start()
    yield fleet.servers[0]
    fleet.stop()


PARAMS = SamplingParams(temperature=0.7, top_k=20, max_tokens=9, stop=("<END>",),
                        extra=(("no_stop_trim", True), ("top_logprobs_num", 0)))


@pytest.mark.parametrize("stream", [True, False])
def test_exact_native_body(stream: bool) -> None:
    c = EngineClient(ClientOptions(stream=stream))
    ep = Endpoint("http://h:1", "sglang-native")
    body = c.body(ep, "m", Request("r-1", TokenPrompt([5, 6, 7], "hi"), seed=3), PARAMS)
    expected: dict[str, Any] = {
        "input_ids": [5, 6, 7],
        "sampling_params": {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 9, "top_k": 20, "stop": ["<END>"],
                            "no_stop_trim": True, "sampling_seed": 3},
        "rid": "r-1", "return_logprob": True, "top_logprobs_num": 0}
    if stream:
        expected["stream"] = True
    assert body == expected
    text = c.body(ep, "m", Request("r-2", "plain", n=2), SamplingParams())
    assert text["text"] == "plain" and text["sampling_params"]["n"] == 2 and "input_ids" not in text
    chat = EngineClient(ClientOptions(api=Api.CHAT)).body(ep, "m", Request("r-3", (("user", "a"), ("user", "b"))),
                                                          SamplingParams())
    assert chat["text"] == "a\n\nb" and "messages" not in chat and "model" not in chat
    lp = EngineClient(ClientOptions(logprobs=True)).body(ep, "m", Request("r-4", "p"), SamplingParams())
    assert lp["return_logprob"] is True and "logprobs" not in lp and "logprobs" not in lp["sampling_params"]


def test_token_prompt_is_its_text_and_pickles() -> None:
    import pickle

    p = TokenPrompt([1, 2], "ab")
    assert p == "ab" and p.token_ids == (1, 2)
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, TokenPrompt) and q.token_ids == (1, 2) and q == "ab"


def test_full_answer_maps_to_openai_shape() -> None:
    b = get_backend("sglang-native")
    native = {"text": "xyz", "output_ids": [9, 8, 7],
              "meta_info": {"finish_reason": {"type": "length", "length": 3}, "prompt_tokens": 2,
                            "completion_tokens": 3, "weight_version": "4",
                            "output_token_logprobs": [[-0.1, 9, "x"], [-0.2, 8, "y"], [-0.3, 7, "z"]]}}
    out = b.response(native, Request("r", TokenPrompt([1, 2])))
    assert out == {"choices": [{"index": 0, "text": "xyz", "token_ids": [9, 8, 7], "finish_reason": "length",
                                "logprobs": {"token_logprobs": [-0.1, -0.2, -0.3]}, "prompt_token_ids": [1, 2],
                                "weight_version": "4"}],
                   "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    with pytest.raises(ValueError, match="aborted by the server"):
        b.response({**native, "meta_info": {"finish_reason": {"type": "abort"}}}, Request("r", "p"))


@pytest.mark.parametrize("incremental", [False, True])
def test_stream_events_become_deltas(incremental: bool) -> None:
    b = get_backend("sglang-native")
    req = Request("r", TokenPrompt([1]))
    ids: list[int] = []
    lps: list[float] = []
    prompts = []
    for t in range(4):
        first = t if incremental else 0
        meta = {"completion_tokens": t + 1, "prompt_tokens": 1, "finish_reason": {"type": "stop"} if t == 3 else None,
                "output_token_logprobs": [[-k / 10, 100 + k, "x"] for k in range(first, t + 1)]}
        ch = b.chunk({"text": "x" * (t + 1 - first), "output_ids": list(range(100 + first, 101 + t)),
                      "meta_info": meta}, req)["choices"][0]
        ids += ch["token_ids"]
        lps += ch["logprobs"]["token_logprobs"]
        prompts.append(ch.get("prompt_token_ids"))
        assert ch["text"] == "x" and ch["finish_reason"] == ("stop" if t == 3 else None)
    assert ids == [100, 101, 102, 103] and lps == [0.0, -0.1, -0.2, -0.3]
    assert prompts == [[1], None, None, None]  # once, on the first chunk


def _complete(fake: FakeSGLang, stream: bool, prompt: str, max_tokens: int = 16) -> Completion:
    async def go() -> Completion:
        async with EngineClient(ClientOptions(stream=stream)) as c:
            return await c.complete(Endpoint(fake.url, "sglang-native"), "m", Request("rid-1", prompt),
                                    SamplingParams(max_tokens=max_tokens))

    return asyncio.run(go())


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("stream", [True, False])
def test_complete_against_the_fake(fake: FakeSGLang, stream: bool, incremental: bool) -> None:
    fake.incremental = incremental
    prompt = TokenPrompt([42, 43], "q")
    fake.long_prompts = {42}
    comp = _complete(fake, stream, prompt, max_tokens=12)
    key = json.dumps([42, 43])
    (ch,) = comp.choices
    assert ch.token_ids == tuple(token(key, t) for t in range(12)) and ch.tokens == 12
    assert ch.finish_reason == "length" and comp.prompt_tokens == 2
    assert fake.bodies[0]["input_ids"] == [42, 43] and fake.bodies[0]["rid"] == "rid-1"
    assert ch.logprobs == tuple(logprob(t) for t in range(12))  # the client's trainer-ready fields
    assert ch.prompt_token_ids == (42, 43)


@pytest.mark.parametrize("stream", [True, False])
def test_cancel_posts_abort_request_and_the_server_stops(fake: FakeSGLang, stream: bool) -> None:
    fake.tpot_s = 0.01
    fake.long_prompts = {1}

    async def go() -> None:
        async with EngineClient(ClientOptions(stream=stream)) as c:
            task = asyncio.create_task(c.complete(Endpoint(fake.url, "sglang-native"), "m",
                                                  Request("rid-9", TokenPrompt([1])), SamplingParams(max_tokens=500)))
            await asyncio.sleep(0.2)
            assert fake.running == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    assert fake.aborts == ["rid-9"] and fake.wait_idle()


def test_server_side_abort_is_a_replica_fault(fake: FakeSGLang) -> None:
    fake.tpot_s = 0.01
    fake.long_prompts = {1}

    async def go() -> None:
        async with EngineClient() as c:
            task = asyncio.create_task(c.complete(Endpoint(fake.url, "sglang-native"), "m",
                                                  Request("rid-5", TokenPrompt([1])), SamplingParams(max_tokens=500)))
            await asyncio.sleep(0.1)
            async with c.session.post(fake.url + "/abort_request", json={"rid": "rid-5"}):
                pass
            await task

    with pytest.raises(ReplicaFault, match="aborted by the server"):
        asyncio.run(go())
    assert fake.wait_idle()


def test_health_uses_native_paths(fake: FakeSGLang) -> None:
    async def go() -> bool:
        async with EngineClient() as c:
            return await c.health(Endpoint(fake.url, "sglang-native"))

    assert asyncio.run(go())


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("stream", [True, False])
def test_served_version_and_top_p_kept_ids_reach_the_choice(fake: FakeSGLang, stream: bool,
                                                            incremental: bool) -> None:
    """`meta_info.weight_version` becomes `Choice.served_version`; with slime's patch and custom_params asking,
    the top-p kept ids (base64 int32) and offsets become `Choice.top_p`, whole-response in every stream mode."""
    from sglang_fake import top_p_kept

    fake.incremental, fake.top_p_patch, fake.long_prompts, fake.weight_version = incremental, True, {42}, "11"
    params = SamplingParams(max_tokens=7, top_p=0.8, extra=(("custom_params", {"return_top_p_token_ids": True}),))

    async def go() -> Completion:
        async with EngineClient(ClientOptions(stream=stream, logprobs=True)) as c:
            return await c.complete(Endpoint(fake.url, "sglang-native"), "m", Request("rid-1", TokenPrompt([42, 43])),
                                    params)

    (ch,) = asyncio.run(go()).choices
    key = json.dumps([42, 43])
    kept = [top_p_kept(key, t) for t in range(7)]
    assert ch.served_version == "11" and ch.top_p is not None
    assert ch.top_p.token_ids == tuple(k for ids in kept for k in ids)
    assert ch.top_p.offsets == (0, 1, 3, 6, 7, 9, 12, 13)
    assert fake.bodies[0]["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True}
    fake.top_p_patch = False
    (plain,) = asyncio.run(go()).choices
    assert plain.top_p is None and plain.served_version == "11"


@pytest.mark.parametrize(("meta", "message"), [
    ({"top_p_token_ids": "!!", "top_p_token_offsets": [0]}, "meta_info.top_p_token_ids is not base64"),
    ({"top_p_token_ids": "AAA=", "top_p_token_offsets": [0]}, "holds 2 bytes, not a whole number of int32s"),
    ({"top_p_token_ids": 5, "top_p_token_offsets": [0]}, "is int, expected a list or base64 text"),
    ({"top_p_token_ids": [1, 2]}, "has top_p_token_ids or top_p_token_offsets without the other"),
    ({"top_p_token_ids": [1, 2], "top_p_token_offsets": [0, 3]}, "top_p_token_offsets do not index its 2"),
    ({"top_p_token_ids": [1, 2], "top_p_token_offsets": [0, 2]}, "2 top_p_token_offsets for 2 tokens"),
])
def test_malformed_top_p_arrays_are_one_line(meta: dict[str, Any], message: str) -> None:
    """A reply whose top-p arrays do not describe its tokens is a one-line `ReplyError`/`ValueError` (the client
    reports it as a bad reply of that replica), never a silently wrong training sample."""
    from tailsieve.engines.transport.replies import ReplyError, parse_full

    backend = get_backend("sglang-native")
    data = {"text": "ab", "output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "stop"},
                                                                 "completion_tokens": 2, **meta}}
    with pytest.raises((ReplyError, ValueError)) as e:
        parse_full(backend.response(data, Request("r", "p")), 1, 16, 0.1)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_int32_arrays_decode_from_both_forms() -> None:
    import base64
    import struct

    from tailsieve.engines.transport.sglang_native import int32_list

    raw = base64.b64encode(struct.pack("<4i", 0, 1, -2, 2**31 - 1)).decode("ascii")
    assert int32_list(raw, "x") == [0, 1, -2, 2**31 - 1] and int32_list([3, 4], "x") == [3, 4]


@pytest.mark.parametrize(("paths", "expected"), [(("/model_info", "/get_model_info"), "11"),
                                                 (("/nope", "/get_model_info"), "11"), ((), None),
                                                 (("/nope",), None)])
def test_served_version_reads_model_info(fake: FakeSGLang, paths: tuple[str, ...], expected: str | None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang reports its weight version at GET /model_info (/get_model_info before 0.5.x); a path the server lacks
    (404) falls to the next, and no path at all is "not told" (None)."""
    from tailsieve.engines.transport.sglang_native import SGLangNativeBackend

    fake.weight_version = "11"
    monkeypatch.setattr(SGLangNativeBackend, "version_paths", paths)

    async def go() -> str | None:
        async with EngineClient() as c:
            ep = Endpoint(fake.url, "sglang-native")
            return await c.backend(ep).served_version(c.session, ep)

    assert asyncio.run(go()) == expected
