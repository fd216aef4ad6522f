"""Engine client against the fake OpenAI server: parsing, streaming progress, error classes, API key, aborts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from engine_fake import FakeServer, fake_length
from tailsieve.engines.launch.tiny_vllm import free_port
from tailsieve.engines.transport.engine_client import (
    Api,
    ClientOptions,
    Endpoint,
    EngineClient,
    EngineError,
    FaultKind,
    ReplicaFault,
    Request,
    RequestRejected,
    SamplingParams,
    ServerKind,
    parse_metrics,
)


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as s:
        yield s


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.mark.parametrize("stream", [True, False])
def test_complete_n_choices_with_ignore_eos_and_seed(server: FakeServer, stream: bool) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with EngineClient(ClientOptions(stream=stream)) as c:
            return await c.complete(Endpoint(server.url), "fake", Request("r1", "hi", n=3, seed=7, max_tokens=12),
                                    SamplingParams(ignore_eos=True, temperature=0.7, top_k=20, stop=("<END>",)))

    comp = run(go())
    assert [ch.tokens for ch in comp.choices] == [12, 12, 12]
    assert all(ch.finish_reason == "length" for ch in comp.choices)
    assert comp.choices[0].token_ids is not None and len(comp.choices[0].token_ids) == 12
    body = server.bodies[0]
    assert body["n"] == 3 and body["seed"] == 7 and body["ignore_eos"] is True and body["max_tokens"] == 12
    assert body["top_k"] == 20 and body["stop"] == ["<END>"] and body["return_token_ids"] is True
    assert body.get("stream", False) is stream
    if stream:
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert comp.ttft_s is not None


def test_stream_lengths_follow_eos(server: FakeServer) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with EngineClient() as c:
            return await c.complete(Endpoint(server.url), "fake", Request("r", "p", n=2, seed=3),
                                    SamplingParams(max_tokens=40))

    comp = run(go())
    expect = [fake_length('"p"', 3, i, 40) for i in range(2)]
    assert [ch.tokens for ch in comp.choices] == expect


def test_chat_api_sends_messages(server: FakeServer) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with EngineClient(ClientOptions(api=Api.CHAT)) as c:
            return await c.complete(Endpoint(server.url), "fake",
                                    Request("r", (("system", "S"), ("user", "U")), max_tokens=5),
                                    SamplingParams(ignore_eos=True))

    comp = run(go())
    assert comp.choices[0].text == "xxxxx"
    assert server.bodies[0]["messages"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


def test_progress_counts_tokens_and_cancel_aborts_on_server(server: FakeServer) -> None:
    server.tpot_s = 0.005
    prog = [0, 0]

    async def go() -> None:
        async with EngineClient() as c:
            task = asyncio.create_task(c.complete(Endpoint(server.url), "fake", Request("r", "p", n=2, max_tokens=5000),
                                                  SamplingParams(ignore_eos=True), prog))
            await asyncio.sleep(0.3)
            assert server.running == 2
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(go())
    assert 5 < prog[0] < 5000 and 5 < prog[1] < 5000
    assert server.wait_idle() and server.aborted == 1


def test_error_classes(server: FakeServer) -> None:
    ep = Endpoint(server.url)

    async def one(opts: ClientOptions | None = None, endpoint: Endpoint = ep) -> None:
        async with EngineClient(opts) as c:
            await c.complete(endpoint, "fake", Request("r", "p", max_tokens=5), SamplingParams())

    server.mode = "400"
    with pytest.raises(RequestRejected, match="HTTP 400: max_tokens is too large"):
        run(one())
    server.mode = "500"
    with pytest.raises(ReplicaFault) as err:
        run(one())
    assert err.value.kind is FaultKind.HTTP_5XX
    server.mode = "stall"
    with pytest.raises(ReplicaFault) as err:
        run(one(ClientOptions(stall_timeout_s=0.3)))
    assert err.value.kind is FaultKind.STALL
    server.mode = "drop"
    with pytest.raises(ReplicaFault) as err:
        run(one())
    assert err.value.kind is FaultKind.DISCONNECT
    with pytest.raises(ReplicaFault) as err:
        run(one(endpoint=Endpoint(f"http://127.0.0.1:{free_port()}")))
    assert err.value.kind is FaultKind.REFUSED


def test_api_key_from_env_is_sent_and_never_shown(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-secret-123")
    server.mode = "500"

    async def go() -> str:
        c = EngineClient(ClientOptions(api_key_env="MY_KEY"))
        async with c:
            try:
                await c.complete(Endpoint(server.url), "fake", Request("r", "p"), SamplingParams())
            except ReplicaFault as exc:
                return f"{exc} {c!r}"
        return ""

    shown = run(go())
    assert server.headers[0]["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in shown and "api_key=set" in shown


def test_sglang_kind_sends_rid_and_abort_request(server: FakeServer) -> None:
    server.tpot_s = 0.01
    ep = Endpoint(server.url, ServerKind.SGLANG)

    async def go() -> None:
        async with EngineClient() as c:
            task = asyncio.create_task(c.complete(ep, "fake", Request("rid-9", "p", max_tokens=1000),
                                                  SamplingParams(ignore_eos=True)))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(go())
    assert server.bodies[0]["rid"] == "rid-9" and "return_token_ids" not in server.bodies[0]
    assert "continuous_usage_stats" not in server.bodies[0]["stream_options"]
    assert server.sglang_aborts == ["rid-9"]


def test_health_models_metrics(server: FakeServer) -> None:
    async def go() -> tuple[bool, list[str], dict[str, float], bool]:
        async with EngineClient() as c:
            ep = Endpoint(server.url)
            dead = Endpoint(f"http://127.0.0.1:{free_port()}")
            return await c.health(ep), await c.models(ep), await c.metrics(ep), await c.health(dead)

    ok, models, metrics, dead_ok = run(go())
    assert ok and models == ["fake"] and metrics["vllm:num_requests_running"] == 0 and not dead_ok


def test_endpoint_parse_and_params_validation() -> None:
    assert Endpoint.parse("http://h:1/v1/").url == "http://h:1"
    with pytest.raises(EngineError):
        Endpoint.parse("h:1")
    with pytest.raises(EngineError):
        SamplingParams(max_tokens=0)
    assert parse_metrics('a{x="1"} 2\na{x="2"} 3\n# c\nb 1') == {"a": 5.0, "b": 1.0}


def test_keep_alive_connection_closed_by_the_server_is_retried_once() -> None:
    """A server that promises keep-alive but drops a connection when a second request arrives on it (the race of
    an idle timeout closing it just as the client reuses it): the request fails before any reply and goes out
    again on a new connection, with no fault."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for k in range(2):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed its pooled connection at the end
                return
            size = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n")
                            if ln.lower().startswith(b"content-length")))
            await reader.readexactly(size)
            if k == 1:
                writer.close()  # the second request on this connection: dropped unanswered
                return
            seen.append(head.split(b"\r\n")[0])
            body = (b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ab",'
                    b'"finish_reason":"length","token_ids":[1,2]}],'
                    b'"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}')
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()

    async def go() -> tuple[list[int], int]:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        ep = Endpoint(f"http://127.0.0.1:{port}")
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        async with srv, EngineClient(ClientOptions(stream=False, keepalive_s=30.0)) as c:
            lengths = []
            for i in range(4):
                out = await c.complete(ep, "m", Request(f"r{i}", "hi"), params)
                lengths.append(out.choices[0].tokens)
            return lengths, c.stale_retries

    lengths, retries = run(go())
    assert lengths == [2, 2, 2, 2] and len(seen) == 4
    assert retries == 3  # requests 2-4 each reused the connection the previous one opened, and were re-sent


def test_fresh_connections_and_keepalive_validation() -> None:
    with pytest.raises(EngineError, match="keep-alive must be a finite number of seconds > 0, got 0"):
        ClientOptions(keepalive_s=0)
    assert ClientOptions().fresh_connections is False
