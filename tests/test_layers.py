"""The layout's import rules (docs/architecture.md), read from the source as an allow-list per room: policy never
imports the mechanisms, the engines never import the simulator, transport imports no other engine room, no two modules
share a name, and no function grows past 60 lines. `engines/kinds` (one module per engine
flavour: client backend + server half) sits between transport and the launchers/measurement."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tailsieve"

# The allow-list: the rooms of `tailsieve` each room may import (docs/architecture.md). A room is a top-level module
# or package; `engines/` and `integrations/` are split one level further. An import of a room not listed fails.
BASE = ("errors.py", "inputs.py", "hashing.py", "outputs.py", "redact.py", "registry.py")
ALLOWED: dict[str, tuple[str, ...]] = {
    "model": ("errors.py", "inputs.py", "registry.py"),
    "policy": ("errors.py", "inputs.py", "registry.py", "model"),
    "loop.py": ("model", "policy"),
    "workloads": (*BASE, "model"),
    "analysis": (*BASE, "loop.py", "model", "policy", "workloads"),
    "simulation": (*BASE, "analysis", "loop.py", "model", "policy", "workloads"),
    "engines/transport": BASE,
    "engines/kinds": (*BASE, "engines/transport", "model"),
    "engines/launch": (*BASE, "engines/kinds", "model", "policy"),
    "engines/measure": (*BASE, "engines/kinds", "engines/transport", "model"),
    "engines/rollout": (*BASE, "analysis", "engines/transport", "loop.py", "model", "policy", "workloads"),
    "engines": ("engines/rollout", "engines/transport", "engines/kinds", "engines/launch", "engines/measure"),
    "integrations/verl": (*BASE, "integrations", "loop.py", "model", "policy", "engines", "engines/rollout",
                          "engines/transport"),
    "integrations/slime": (*BASE, "loop.py", "model", "policy", "engines", "engines/rollout", "engines/transport"),
    "integrations/trl": (*BASE, "loop.py", "model", "policy", "engines", "engines/rollout", "engines/transport"),
    "cli": (*BASE, "analysis", "engines", "engines/kinds", "engines/launch", "engines/measure", "engines/rollout",
            "engines/transport", "loop.py", "model", "policy", "simulation", "workloads"),
}
SPLIT = ("engines", "integrations")


def room(parts: tuple[str, ...]) -> str:
    """The room of a path inside the package (its parts relative to src/tailsieve)."""
    if parts[0] in SPLIT and len(parts) > 2 and (SRC / parts[0] / parts[1]).is_dir():
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def room_of_module(name: str) -> str | None:
    """The room an absolute `tailsieve.…` import lands in, or None for an import of the package root."""
    parts = name.split(".")[1:]
    if not parts:
        return None
    if (SRC / parts[0]).is_dir():
        return room((*parts, "x")) if len(parts) > 1 else parts[0]
    return f"{parts[0]}.py"


def imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_rooms_import_only_what_the_allow_list_names(part: str) -> None:
    files = [f for f in sorted(SRC.rglob("*.py")) if room(f.relative_to(SRC).parts) == part]
    assert files, f"no files in room {part}"
    bad = []
    for f in files:
        for m in sorted(imports(f)):
            target = room_of_module(m) if m.startswith("tailsieve.") else None
            if target is not None and target != part and target not in ALLOWED[part]:
                bad.append(f"{f.relative_to(SRC)} imports {m} (room {target})")
    assert not bad, bad


def test_every_room_is_on_the_allow_list() -> None:
    rooms = {room(f.relative_to(SRC).parts) for f in SRC.rglob("*.py") if f.parent != SRC}
    assert rooms <= set(ALLOWED) | {"integrations"}, sorted(rooms - set(ALLOWED))


def test_no_two_modules_share_a_name() -> None:
    """One name, one module: framework adapters may mirror each other (integrations/<framework>/session.py)."""
    seen: dict[str, list[str]] = {}
    for f in sorted(SRC.rglob("*.py")):
        rel = f.relative_to(SRC)
        if f.name != "__init__.py" and rel.parts[0] != "integrations":
            seen.setdefault(f.name, []).append(str(rel))
    assert not {k: v for k, v in seen.items() if len(v) > 1}


def test_the_allow_list_refuses_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a policy module importing the simulator is named."""
    f = tmp_path / "bad.py"
    f.write_text("from tailsieve.simulation.runs import run_policy\nimport tailsieve.errors\n", encoding="utf-8")
    found = [m for m in sorted(imports(f)) if room_of_module(m) not in ALLOWED["policy"]]
    assert found == ["tailsieve.simulation.runs"]


def test_no_function_over_sixty_lines() -> None:
    long = []
    for f in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 60:
                    long.append(f"{f.relative_to(SRC)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long
