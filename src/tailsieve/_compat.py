"""Deprecated module paths of TailSieve 0.1 (flat layout), kept importable until 0.3.

`import tailsieve.sim` (or `.router`, `.curves`, …) still works: a meta-path finder hands back the module at its new
place (the same module object, so `isinstance` and monkey-patching behave) and emits a `DeprecationWarning` naming
it. New code imports the new paths (docs/architecture.md lists them).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "tailsieve.curves": "tailsieve.model.curves",
    "tailsieve.makespan": "tailsieve.model.makespan",
    "tailsieve.oracle": "tailsieve.model.oracle",
    "tailsieve.baselines": "tailsieve.model.baselines",
    "tailsieve.tailstrength": "tailsieve.model.tailstrength",
    "tailsieve.speculative": "tailsieve.model.speculative",
    "tailsieve.router": "tailsieve.policy.router",
    "tailsieve.controller": "tailsieve.policy.controller",
    "tailsieve.predictor": "tailsieve.policy.predictor",
    "tailsieve.replica": "tailsieve.simulation.replica",
    "tailsieve.sim": "tailsieve.simulation.runs",
    "tailsieve.spec_budget": "tailsieve.simulation.spec_budget",
    "tailsieve.traces": "tailsieve.workloads.traces",
    "tailsieve.synthetic": "tailsieve.workloads.synthetic",
    "tailsieve.metrics": "tailsieve.analysis.metrics",
    "tailsieve.analysis_report": "tailsieve.analysis.length_report",
    # 0.2: engines/ split into rooms (transport, rollout, launch, measure)
    "tailsieve.engines.client": "tailsieve.engines.transport.engine_client",
    "tailsieve.engines.replies": "tailsieve.engines.transport.replies",
    "tailsieve.engines.backends": "tailsieve.engines.transport.backends",
    "tailsieve.engines.sglang_native": "tailsieve.engines.transport.sglang_native",
    "tailsieve.engines.health": "tailsieve.engines.transport.health",
    "tailsieve.engines.types": "tailsieve.engines.transport.types",
    "tailsieve.engines.executor": "tailsieve.engines.rollout.engine_executor",
    "tailsieve.engines.batch": "tailsieve.engines.rollout.batch",
    "tailsieve.engines.resume": "tailsieve.engines.rollout.resume",
    "tailsieve.engines.state": "tailsieve.engines.rollout.state",
    "tailsieve.engines.prompts": "tailsieve.engines.rollout.prompts",
    "tailsieve.engines.runner": "tailsieve.engines.rollout.runner",
    "tailsieve.engines.weights": "tailsieve.engines.rollout.weight_sync",
    "tailsieve.engines.launch_config": "tailsieve.engines.launch.config",
    "tailsieve.engines.local": "tailsieve.engines.launch.tiny_vllm",
    "tailsieve.engines.launchers": "tailsieve.engines.launch",
    "tailsieve.engines.launchers.base": "tailsieve.engines.launch.base",
    "tailsieve.engines.launchers.local": "tailsieve.engines.launch.local_launcher",
    "tailsieve.engines.launchers.process": "tailsieve.engines.launch.process",
    "tailsieve.engines.launchers.ray": "tailsieve.engines.launch.ray_launcher",
    "tailsieve.engines.launchers.ray_server": "tailsieve.engines.launch.ray_server",
    "tailsieve.engines.launchers.restart": "tailsieve.engines.launch.restart",
    "tailsieve.engines.launchers.vllm_server": "tailsieve.engines.launch.vllm_server",
    "tailsieve.engines.launchers.amx": "tailsieve.engines.launch.amx",
    "tailsieve.engines.profile": "tailsieve.engines.measure.profile",
    "tailsieve.engines.spec_measure": "tailsieve.engines.measure.spec_measure",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names and loads them as the modules now living at the new names."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for a moved module's old name, else None."""
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes away in TailSieve 0.3", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module is already loaded at its new path."""


def install() -> None:
    """Register the finder once (idempotent)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
