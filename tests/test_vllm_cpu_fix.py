"""`engines/launch/vllm_cpu_fix.py`: the torch version of vLLM's rejection-sampler `expand_kernel` against the kernel's
contract (a float output written, replace_from swapped, padding left alone), the broken CPU fallback it replaces
(vllm-cpu 0.32.0 never writes a float output), and the plugin entry point."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tailsieve.engines.launch.vllm_cpu_fix import apply, expand_into

pytestmark = pytest.mark.extra("torch")


def test_expand_into_writes_float_and_int_outputs() -> None:
    import torch

    out = torch.full((11,), 123.0)
    expand_into(out, torch.tensor([0.5, 0.0, 0.7]), torch.tensor([4, 6, 9]), 0.0, 1)
    assert out.tolist()[:9] == pytest.approx([0.5] * 4 + [1.0] * 2 + [0.7] * 3)
    assert out.tolist()[9:] == [123.0, 123.0]  # positions past the last request are not touched
    ints = torch.full((5,), -7, dtype=torch.int32)
    expand_into(ints, torch.tensor([3, 9]), torch.tensor([2, 5]), 9, 4)
    assert ints.tolist() == [3, 3, 4, 4, 4]
    empty = torch.full((3,), 5.0)
    expand_into(empty, torch.tensor([2.0, 3.0]), torch.tensor([0, 3]), -1.0, 1)  # a request without drafts
    assert empty.tolist() == [3.0, 3.0, 3.0]


@pytest.mark.extra("vllm")
def test_apply_replaces_the_cpu_fallback_that_never_writes_a_float_output() -> None:
    import torch
    import vllm.utils.cpu_triton_utils as cpu_tl
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("not vLLM's CPU build")
    original = cpu_tl._expand_kernel_impl
    try:
        if original is not expand_into:
            current_platform.import_kernels()
            out = torch.full((4,), 123.0)
            original(out, torch.tensor([0.5, 0.25]), torch.tensor([2, 4]), 0, 1, MAX_NUM_TOKENS=2)
            broken = out.tolist() == [123.0] * 4  # the bug this module exists for (vllm-cpu 0.32.0)
            assert broken or out.tolist() == [0.5, 0.5, 0.25, 0.25]
        assert apply() is True
        assert cpu_tl._expand_kernel_impl is expand_into
    finally:
        cpu_tl._expand_kernel_impl = original


def test_plugin_entry_point_names_apply() -> None:
    doc = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    plugins = doc["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins["tailsieve_cpu_fix"] == "tailsieve.engines.launch.vllm_cpu_fix:apply"
