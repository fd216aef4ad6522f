"""The layout's import rules (docs/architecture.md), read from the source: policy never imports the mechanisms,
the engines never import the simulator, metrics stay pure, no function grows past 60 lines, and the 0.1 module
paths still import (as the same module objects, with a DeprecationWarning)."""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tailsieve"

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "model": ("tailsieve.policy", "tailsieve.loop", "tailsieve.simulation", "tailsieve.engines", "tailsieve.cli",
              "tailsieve.workloads", "tailsieve.analysis"),
    "policy": ("tailsieve.loop", "tailsieve.simulation", "tailsieve.engines", "tailsieve.cli", "tailsieve.workloads",
               "tailsieve.analysis"),
    "loop.py": ("tailsieve.simulation", "tailsieve.engines", "tailsieve.cli", "tailsieve.workloads"),
    "engines": ("tailsieve.simulation", "tailsieve.cli"),
    "analysis/metrics.py": ("tailsieve.simulation", "tailsieve.engines", "tailsieve.cli"),
    "workloads": ("tailsieve.policy", "tailsieve.simulation", "tailsieve.engines", "tailsieve.cli"),
    "simulation": ("tailsieve.engines", "tailsieve.cli"),
    "integrations": ("tailsieve.simulation", "tailsieve.cli"),
}


def imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_layers_import_only_downwards(part: str) -> None:
    target = SRC / part
    files = [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))
    assert files
    bad = [f"{f.relative_to(SRC)} imports {m}" for f in files for m in sorted(imports(f))
           if m.startswith(FORBIDDEN[part])]
    assert not bad, bad


def test_no_function_over_sixty_lines() -> None:
    long = []
    for f in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 60:
                    long.append(f"{f.relative_to(SRC)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


@pytest.mark.parametrize(("old", "new"), [("tailsieve.sim", "tailsieve.simulation.runs"),
                                          ("tailsieve.router", "tailsieve.policy.router"),
                                          ("tailsieve.curves", "tailsieve.model.curves")])
def test_old_module_paths_still_import_with_a_warning(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)
    if old == "tailsieve.sim":
        assert callable(module.run_policy) and module.SimConfig is not None
