"""Fixtures for tests against a real vLLM (CPU build): a tiny random-weight Llama + tokenizer built locally (no
downloads) and two servers on 127.0.0.1, each pinned to one core, started together by `LocalLauncher` and always
stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tailsieve.engines.launch import LocalLauncher
from tailsieve.engines.launch.tiny_vllm import build_tiny_model, tiny_launch_config

requires_vllm = pytest.mark.extra("vllm", "transformers")  # skipped without them (tests/conftest.py: EXTRAS)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight 4-layer Llama (hidden 128) and a 512-token byte-level BPE tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def vllm_pair(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLauncher]:
    """Two replicas (cores 0 and 1 when there are two), started together, stopped at module end."""
    la = LocalLauncher(tiny_launch_config(tiny_model, max_num_seqs=128), tmp_path_factory.mktemp("vllm"))
    try:
        yield la.start()
    finally:
        la.stop()
