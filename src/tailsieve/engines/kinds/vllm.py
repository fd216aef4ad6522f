"""vLLM as an engine kind: the `VLLMBackend` client (engines/transport/backends.py) and its server half.

The server is vLLM's OpenAI server, started as `python -m tailsieve.engines.launch.vllm_server` (the AMX
permission request, then vLLM in the same process: engines/launch/amx.py). Placement: `VLLM_CPU_OMP_THREADS_BIND`
and `VLLM_CPU_KVCACHE_SPACE` (GiB) on cpu, `--gpu-memory-utilization` on gpu. A pool speculates with one
`--speculative-config` JSON (`SpecConfig.vllm_config()` merged with the pool's `speculative` keys). In-place
weight reload needs the development-mode endpoints (`VLLM_SERVER_DEV_MODE=1`: `VLLMBackend.update_weights`).
Acceptance is read from the `vllm:spec_decode_*` counters on /metrics.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from tailsieve.engines.kinds.kind import Device, ServerHalf, ServerLaunch, SpecCounterNames, register_kind
from tailsieve.engines.transport.backends import VLLMBackend
from tailsieve.errors import ConfigError
from tailsieve.model.speculative import SpecConfig, SpecMethod

# after the Python executable: vLLM's OpenAI server, after the AMX permission request (engines/launch/vllm_server.py)
VLLM_SERVER: tuple[str, ...] = ("-m", "tailsieve.engines.launch.vllm_server")
CPU_DEFAULT_ARGS: tuple[tuple[str, str | None], ...] = (
    ("--enforce-eager", None),  # starts in ~25 s instead of ~60 s
    ("--max-num-batched-tokens", "16384"),  # seeded chunked prefill crashes vllm-cpu 0.32.0 (docs/engines.md)
)
NEEDS_DRAFT_MODEL = frozenset({SpecMethod.EAGLE3, SpecMethod.DFLASH})
VLLM_COUNTERS = SpecCounterNames(
    drafts="vllm:spec_decode_num_drafts_total", draft_tokens="vllm:spec_decode_num_draft_tokens_total",
    accepted="vllm:spec_decode_num_accepted_tokens_total",
    per_position="vllm:spec_decode_num_accepted_tokens_per_pos_total", generated="vllm:generation_tokens_total")


def speculative_config(spec: SpecConfig, extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """vLLM's `speculative_config` JSON object (None when the pool does not speculate)."""
    base = spec.vllm_config()
    return None if base is None else base | dict(extra)


@register_kind("vllm", backend=VLLMBackend)
class VLLMServer(ServerHalf):
    """vLLM's OpenAI server (see the module docstring)."""

    shown_env = ("VLLM_CPU", "CUDA_VISIBLE", "HF_")
    spec_counters = VLLM_COUNTERS
    tokenizer_flag = "--tokenizer"
    tensor_parallel_flags = ("--tensor-parallel-size", "-tp")
    cpu_default_args = CPU_DEFAULT_ARGS
    needs_draft_model = NEEDS_DRAFT_MODEL
    own_keys = ("method", "num_speculative_tokens")

    def default_command(self) -> tuple[str, ...]:
        """This Python running `tailsieve.engines.launch.vllm_server`."""
        return (sys.executable, *VLLM_SERVER)

    def command(self, launch: ServerLaunch, head: tuple[str, ...]) -> list[str]:
        """`--model --host --port [--served-model-name] [--gpu-memory-utilization]`, the CPU defaults, every
        replica's flags, then the pool's."""
        cmd = [*head, "--model", launch.model, "--host", launch.host, "--port", launch.port]
        if launch.served_model_name:
            cmd += ["--served-model-name", launch.served_model_name]
        if launch.device is Device.GPU and launch.memory is not None:
            cmd += ["--gpu-memory-utilization", f"{launch.memory:g}"]
        return [*cmd, *self.cpu_defaults(launch), *launch.args, *launch.pool_flags]

    def env(self, launch: ServerLaunch, environ: Mapping[str, str]) -> dict[str, str]:
        """No usage reports, a private cache, the dev-mode endpoints for in-place reloads, the CPU binding and KV."""
        env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        if "VLLM_CACHE_ROOT" not in environ:
            env["VLLM_CACHE_ROOT"] = launch.cache_dir
        if launch.weight_reload:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /collective_rpc reload_weights (`VLLMBackend.update_weights`)
        if launch.device is Device.CPU:
            if launch.place is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = launch.place
            if launch.memory is not None:
                env["VLLM_CPU_KVCACHE_SPACE"] = str(int(launch.memory))
        return env

    def spec_flags(self, spec: SpecConfig, extra: Mapping[str, Any]) -> tuple[str, ...]:
        """`--speculative-config JSON` (sorted keys)."""
        sc = speculative_config(spec, extra)
        return ("--speculative-config", json.dumps(sc, sort_keys=True)) if sc is not None else ()

    def check_memory(self, device: Device, memory: float) -> None:
        """cpu: whole GiB of KV cache (`VLLM_CPU_KVCACHE_SPACE`)."""
        if device is Device.CPU and (memory < 1 or memory != int(memory)):
            raise ConfigError(f"launch.memory on cpu is the KV cache in whole GiB (>= 1), got {memory}")
