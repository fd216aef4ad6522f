"""Engine backends behind `EngineClient`: the registry, the exact body each built-in sends, and a custom backend
(its body fields, path, health paths, response hooks and abort hook) used by the client against the fake server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine_fake import FakeServer
from tailsieve.cli import main
from tailsieve.engines.transport.backends import (
    BACKENDS,
    EngineBackend,
    OpenAIBackend,
    SGLangBackend,
    UnknownBackend,
    VLLMBackend,
    backend_names,
    get_backend,
    register_backend,
)
from tailsieve.engines.transport.engine_client import (
    Api,
    ClientOptions,
    Endpoint,
    EngineClient,
    EngineError,
    Request,
    RequestRejected,
    SamplingParams,
    ServerKind,
)
from tailsieve.errors import ConfigError


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as s:
        yield s


@pytest.fixture
def custom() -> Iterator[type[EngineBackend]]:
    """A backend registered for one test only: a body field, upper-cased text, and a recorded abort."""

    @register_backend("tagged")
    class Tagged(EngineBackend):
        aborted: list[tuple[str, str]] = []  # noqa: RUF012 (per-test class)

        def extra_body(self, body: Mapping[str, Any], req: Request, options: ClientOptions) -> dict[str, Any]:
            return {"tag": f"{req.rid}/{body['n']}"}

        def response(self, data: Any, req: Request) -> Any:
            for ch in data["choices"]:
                ch["text"] = ch["text"].upper()
            return data

        def chunk(self, chunk: dict[str, Any], req: Request) -> dict[str, Any]:
            for ch in chunk.get("choices", []):
                ch["text"] = ch["text"].upper()
            return chunk

        async def abort(self, session: aiohttp.ClientSession, endpoint: Endpoint, req: Request) -> None:
            self.aborted.append((endpoint.url, req.rid))
            raise aiohttp.ClientError("abort endpoint down")  # the client ignores abort failures

    yield Tagged
    BACKENDS.pop("tagged")


def test_registry_holds_the_builtins_by_name() -> None:
    assert {"vllm": VLLMBackend, "sglang": SGLangBackend, "openai": OpenAIBackend}.items() <= BACKENDS.items()
    assert backend_names() == sorted(BACKENDS) and all(k.value in BACKENDS for k in ServerKind)
    assert all(get_backend(n).name == n for n in BACKENDS)
    assert isinstance(get_backend(ServerKind.SGLANG), SGLangBackend)


def test_unknown_name_is_one_line_naming_the_valid_ones(server: FakeServer) -> None:
    with pytest.raises(UnknownBackend) as err:
        get_backend("tgi")
    assert isinstance(err.value, EngineError) and isinstance(err.value, ConfigError)
    assert str(err.value) == "unknown engine backend 'tgi' (valid: openai, vllm, sglang, sglang-native)"

    async def go() -> None:
        async with EngineClient() as c:
            await c.complete(Endpoint(server.url, "tgi"), "fake", Request("r", "p"), SamplingParams())

    with pytest.raises(UnknownBackend, match=r"\(valid: openai, vllm, sglang, sglang-native\)"):
        asyncio.run(go())
    assert server.bodies == []


def test_endpoint_kind_takes_names() -> None:
    assert Endpoint("http://h:1", "sglang").kind is ServerKind.SGLANG
    assert Endpoint("http://h:1", "sglang") == Endpoint("http://h:1", ServerKind.SGLANG)
    assert Endpoint.parse("http://h:1/v1", "my-engine").kind == "my-engine"


GENERIC = [("model", "fake"), ("temperature", 0.7), ("top_p", 1.0), ("max_tokens", 9), ("top_k", 20),
           ("stop", ["<END>"]), ("n", 2)]
PROMPT = {Api.COMPLETIONS: ("prompt", "S\n\nU"),
          Api.CHAT: ("messages", [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])}
TAIL: dict[tuple[str, bool], list[tuple[str, Any]]] = {
    ("vllm", True): [("stream", True), ("stream_options", {"include_usage": True, "continuous_usage_stats": True}),
                     ("return_token_ids", True)],
    ("vllm", False): [("return_token_ids", True)],
    ("sglang", True): [("stream", True), ("stream_options", {"include_usage": True}), ("rid", "r-1")],
    ("sglang", False): [("rid", "r-1")],
    ("openai", True): [("stream", True), ("stream_options", {"include_usage": True})],
    ("openai", False): [],
}


@pytest.mark.parametrize("api", list(Api))
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("kind", ["vllm", "sglang", "openai"])
def test_exact_body_per_backend(server: FakeServer, kind: str, stream: bool, api: Api) -> None:
    expected = [*GENERIC, PROMPT[api], ("seed", 5), *TAIL[(kind, stream)]]
    req = Request("r-1", (("system", "S"), ("user", "U")), n=2, seed=5, max_tokens=9)
    params = SamplingParams(temperature=0.7, top_k=20, stop=("<END>",))

    async def go() -> dict[str, Any]:
        async with EngineClient(ClientOptions(api=api, stream=stream)) as c:
            body = c.body(Endpoint(server.url, kind), "fake", req, params)
            await c.complete(Endpoint(server.url, ServerKind(kind)), "fake", req, params)
            return body

    assert list(asyncio.run(go()).items()) == expected  # key order included
    assert list(server.bodies[0].items()) == expected  # what went over the wire


def test_vllm_token_ids_follow_the_option() -> None:
    c = EngineClient(ClientOptions(return_token_ids=False))
    body = c.body(Endpoint("http://h:1"), "m", Request("r", "p"), SamplingParams())
    assert "return_token_ids" not in body and body["stream_options"]["continuous_usage_stats"] is True


@pytest.mark.parametrize("stream", [True, False])
def test_custom_backend_is_used_by_complete(server: FakeServer, custom: type[EngineBackend], stream: bool) -> None:
    async def go() -> str:
        async with EngineClient(ClientOptions(stream=stream)) as c:
            comp = await c.complete(Endpoint(server.url, "tagged"), "fake", Request("r-7", "p", n=2, max_tokens=3),
                                    SamplingParams(ignore_eos=True))
            return "".join(ch.text for ch in comp.choices)

    assert asyncio.run(go()) == "XXXXXX"  # the response hooks ran
    assert server.bodies[0]["tag"] == "r-7/2" and "return_token_ids" not in server.bodies[0]


def test_custom_path_and_health_paths(server: FakeServer) -> None:
    @register_backend("native")
    class Native(EngineBackend):
        def path(self, options: ClientOptions) -> str:
            return "/generate"

    async def health(paths: tuple[str, ...]) -> bool:
        Native.health_paths = paths
        async with EngineClient() as c:
            return await c.health(Endpoint(server.url, "native"))

    async def go() -> None:
        async with EngineClient() as c:
            await c.complete(Endpoint(server.url, "native"), "fake", Request("r", "p"), SamplingParams())

    try:
        assert asyncio.run(health(("/get_model_info", "/metrics")))  # the fake has no /get_model_info: next path
        assert not asyncio.run(health(("/get_model_info",)))  # every path 404: down
        with pytest.raises(RequestRejected, match="HTTP 404"):  # the fake serves no /generate
            asyncio.run(go())
    finally:
        BACKENDS.pop("native")
    assert server.bodies == []


def test_cancel_calls_the_abort_hook(server: FakeServer, custom: Any) -> None:
    server.tpot_s = 0.01

    async def go() -> None:
        async with EngineClient() as c:
            task = asyncio.create_task(c.complete(Endpoint(server.url, "tagged"), "fake",
                                                  Request("rid-3", "p", max_tokens=1000),
                                                  SamplingParams(ignore_eos=True)))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    assert custom.aborted == [(server.url, "rid-3")]
    assert server.wait_idle() and server.aborted == 1 and server.sglang_aborts == []


def test_cli_kind_takes_a_registered_backend(server: FakeServer, custom: Any, tmp_path: Path) -> None:
    out = tmp_path / "curve.json"
    rc = main(["profile", "--endpoint", server.url, "--kind", "tagged", "--batches", "1,2", "--max-tokens", "4",
               "--out", str(out)])
    assert rc == 0 and out.exists() and all("tag" in b for b in server.bodies)
