"""SGLang as an engine kind: one server half, two clients. `sglang` talks to SGLang's OpenAI server
(`SGLangBackend`), `sglang-native` to its native `/generate` with token ids and logprobs (`SGLangNativeBackend`,
engines/transport/sglang_native.py); both launch the same `python -m sglang.launch_server`.

Command line (SGLang's documented server arguments): `--model-path --host --port [--served-model-name]`,
`--mem-fraction-static SHARE` on gpu, `--device cpu` on cpu (with `SGLANG_USE_CPU_ENGINE=1` and the cores in
`SGLANG_CPU_OMP_THREADS_BIND`), every replica's flags, then the pool's. A pool speculates with
`--speculative-algorithm` (eagle3 → EAGLE3, mtp → EAGLE, ngram → NGRAM) and its depth d: EAGLE's
`--speculative-num-steps d --speculative-eagle-topk 1 --speculative-num-draft-tokens d+1` (a chain), NGRAM's
`--speculative-num-draft-tokens d`; the pool's `speculative.model` is `--speculative-draft-model-path`, any other
`speculative` key K is `--speculative-K` (underscores as dashes). suffix and dflash are refused. In-place weight
reload (`/update_weights_from_disk`) needs no flag; the tokenizer is kept on a reload by restart with
`--tokenizer-path`; `--tp-size` / `--tp` count a replica's GPUs. SGLang's /metrics (`--enable-metrics`) reports
acceptance as a gauge, not as draft counters, so `profile` measures no acceptance on it.
Not run here: no SGLang server is started by the tests (tests/test_engine_kinds.py pins these command lines).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from tailsieve.engines.kinds.kind import Device, ServerHalf, ServerLaunch, register_kind
from tailsieve.engines.transport.backends import SGLangBackend
from tailsieve.engines.transport.sglang_native import SGLangNativeBackend
from tailsieve.errors import ConfigError
from tailsieve.model.speculative import SpecConfig, SpecMethod

SGLANG_SERVER: tuple[str, ...] = ("-m", "sglang.launch_server")
ALGORITHMS = {SpecMethod.EAGLE3: "EAGLE3", SpecMethod.MTP: "EAGLE", SpecMethod.NGRAM: "NGRAM"}
OWN_KEYS = ("algorithm", "num_steps", "method", "num_speculative_tokens")  # set from the spec table


def _flag(key: str) -> str:
    return "--speculative-" + key.replace("_", "-")


@register_kind("sglang", backend=SGLangBackend)
@register_kind("sglang-native", backend=SGLangNativeBackend)
class SGLangServer(ServerHalf):
    """SGLang's HTTP server (see the module docstring)."""

    shown_env = ("SGLANG_", "CUDA_VISIBLE", "HF_")
    spec_counters = None
    tokenizer_flag = "--tokenizer-path"
    tensor_parallel_flags = ("--tp-size", "--tp")
    methods = frozenset(ALGORITHMS)
    needs_draft_model = frozenset({SpecMethod.EAGLE3})
    own_keys = OWN_KEYS

    def default_command(self) -> tuple[str, ...]:
        """This Python running `sglang.launch_server`."""
        return (sys.executable, *SGLANG_SERVER)

    def command(self, launch: ServerLaunch, head: tuple[str, ...]) -> list[str]:
        """`--model-path --host --port [--served-model-name] [--mem-fraction-static | --device cpu]`, every
        replica's flags, then the pool's."""
        cmd = [*head, "--model-path", launch.model, "--host", launch.host, "--port", launch.port]
        if launch.served_model_name:
            cmd += ["--served-model-name", launch.served_model_name]
        if launch.device is Device.GPU and launch.memory is not None:
            cmd += ["--mem-fraction-static", f"{launch.memory:g}"]
        if launch.device is Device.CPU and "--device" not in launch.args:
            cmd += ["--device", "cpu"]
        return [*cmd, *launch.args, *launch.pool_flags]

    def env(self, launch: ServerLaunch, environ: Mapping[str, str]) -> dict[str, str]:
        """cpu: the CPU engine and its core binding."""
        if launch.device is not Device.CPU:
            return {}
        env = {"SGLANG_USE_CPU_ENGINE": "1"}
        if launch.place is not None:
            env["SGLANG_CPU_OMP_THREADS_BIND"] = launch.place
        return env

    def spec_flags(self, spec: SpecConfig, extra: Mapping[str, Any]) -> tuple[str, ...]:
        """`--speculative-algorithm …` and the depth flags of the module docstring, then the pool's extra keys."""
        if not spec.enabled:
            return ()
        d = spec.depth
        keys: dict[str, Any] = {"algorithm": ALGORITHMS[spec.method]}
        if "model" in extra:
            keys["draft_model_path"] = extra["model"]
        if spec.method is SpecMethod.NGRAM:
            keys["num_draft_tokens"] = d
        else:
            keys |= {"num_steps": d, "eagle_topk": 1, "num_draft_tokens": d + 1}
        keys |= {k: v for k, v in sorted(extra.items()) if k != "model"}
        out: list[str] = []
        for k, v in keys.items():
            out += [_flag(k)] if v is True else [_flag(k), str(v)]
        return tuple(out)

    def check_memory(self, device: Device, memory: float) -> None:
        """cpu has no memory setting here (pass SGLang's own flags); gpu: `--mem-fraction-static`."""
        if device is Device.CPU:
            raise ConfigError("launch.memory on cpu has no SGLang setting: leave it out and put "
                              "--max-total-tokens or --mem-fraction-static in launch.args")
