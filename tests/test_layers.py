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


MAX_FILE_LINES = 400


def test_no_file_over_four_hundred_lines() -> None:
    """Small files in folders whose names say what they hold: none under src/tailsieve over 400 lines."""
    lines = {str(f.relative_to(SRC)): len(f.read_text(encoding="utf-8").splitlines()) for f in SRC.rglob("*.py")}
    assert not {f: n for f, n in sorted(lines.items()) if n > MAX_FILE_LINES}


def test_no_function_over_sixty_lines() -> None:
    long = []
    for f in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 60:
                    long.append(f"{f.relative_to(SRC)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, long


# --- Import graph: no cycle between modules, no deferred import that is not on the allow-list (issue 51) -------------

def module_name(path: Path) -> str:
    """`tailsieve.a.b` for src/tailsieve/a/b.py (`tailsieve.a` for a package's __init__.py)."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(f): f for f in sorted(SRC.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): imports only the type checker runs."""
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement names: `from a.b import c` is a.b.c when that is a module, else a.b."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _dynamic(node: ast.AST) -> str | None:
    """The module of `importlib.import_module("literal")`, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def import_sites(path: Path) -> list[tuple[str, int, bool]]:
    """Every runtime import of a file: (module, line, deferred), deferred when inside a function (a literal
    `importlib.import_module` counts as an import); `if TYPE_CHECKING:` blocks are left out."""
    out: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for c in child.orelse:
                    visit_one(c, deferred)
            else:
                visit_one(child, deferred)

    def visit_one(node: ast.AST, deferred: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.extend((m, node.lineno, deferred) for m in _targets(node))
            return
        if (m := _dynamic(node)) is not None:
            out.append((m, node.lineno, deferred))
        visit(node, deferred or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the tailsieve modules it imports at run time (top-level and deferred)."""
    return {name: {m for m, _, _ in import_sites(f) if m in MODULES and m != name} for name, f in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_no_import_cycle_between_modules() -> None:
    """A name is resolved one floor above what it resolves to (`model/curve_names.py`, `workloads/names.py`,
    `model/spec_keys.py`, `make_rollout` in `engines/rollout/peer_rollout.py`), so no module imports one that imports
    it back, directly or around a longer circle; type-only imports (`if TYPE_CHECKING:`) aside."""
    assert cycles(import_graph()) == []


def test_the_cycle_finder_names_a_circle() -> None:
    """The checker itself: a three-module circle is found, a chain beside it is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


# Third-party packages a function may import: optional or heavy, loaded only on the path that uses them.
LAZY_PACKAGES = {
    "ray": "the [ray] extra: only the Ray launcher (`launch --ray`) loads it",
    "vllm": "no TailSieve dependency (docs/engines.md): the tiny-model server and the CPU fix run inside vLLM",
    "torch": "comes with vLLM or TRL, not with TailSieve",
    "transformers": "comes with vLLM or TRL, not with TailSieve",
    "tokenizers": "comes with transformers: only `trace --tokenizer` and the tiny model need it",
    "pyarrow": "the [parquet] extra: only a Parquet trace loads it",
    "slime": "the slime framework: present only inside a slime job",
    "matplotlib": "a few hundred ms to import: loaded only when a plot is asked for",
    "rich.progress": "loaded only when `route` draws its progress bar on a terminal",
}
# TailSieve modules a function may import, (file, module): each a deliberate choice, not the way around a cycle.
LAZY_MODULES = {
    ("__main__.py", "tailsieve.cli"): "a Ctrl-C while the CLI loads is one line and status 130",
    ("cli/__init__.py", "tailsieve.inputs"): "off the path of `--help` / `--version` (bench/bench_startup.py)",
    ("cli/__init__.py", "tailsieve.cli._common"): "rich: off the path of `--help` / `--version`",
    ("cli/__init__.py", "tailsieve.registry"): "entry points: off the path of `--help` / `--version`",
    ("cli/_common.py", "tailsieve.policy.router"): "the router, only for commands that route (not curves, workloads)",
    ("integrations/verl/trainer.py", "tailsieve.integrations.verl.vllm_replica"): "imports vLLM: rollout.name=vllm",
    ("model/paged.py", "tailsieve.model.paged_kernel"): "imports numba (0.2 s): only on the first paged run",
}


def _lazy_reason(file: str, module: str) -> str | None:
    if module.startswith("tailsieve"):
        return LAZY_MODULES.get((file, module))
    return next((r for p, r in LAZY_PACKAGES.items() if module == p or module.startswith(p + ".")), None)


def deferred_imports() -> list[tuple[str, int, str]]:
    """Every import inside a function under src/tailsieve: (file, line, module)."""
    return [(str(f.relative_to(SRC)), line, m) for f in MODULES.values()
            for m, line, deferred in import_sites(f) if deferred]


def test_every_deferred_import_is_on_the_allow_list() -> None:
    """An import inside a function hides a dependency from the reader and from this file's checks: only a heavy or
    optional package, or a TailSieve module kept off a short start-up path on purpose, may be imported there."""
    found = deferred_imports()
    bad = [f"{f}:{line} imports {m} inside a function" for f, line, m in found if _lazy_reason(f, m) is None]
    assert not bad, bad
    used = {(f, m) for f, _, m in found}
    stale = sorted(set(LAZY_MODULES) - used)
    assert not stale, f"allow-list entries no longer used: {stale}"
    unused = sorted(p for p in LAZY_PACKAGES if not any(m == p or m.startswith(p + ".") for _, _, m in found))
    assert not unused, f"allow-list packages no longer imported lazily: {unused}"


def test_the_import_reader_sees_deferred_dynamic_and_type_only_imports(tmp_path: Path) -> None:
    """The checker itself: a function's import and `importlib.import_module("x")` are deferred, a top-level import
    is not, and an `if TYPE_CHECKING:` import is no import at run time."""
    f = tmp_path / "m.py"
    f.write_text("import importlib\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import typeonly\n"
                 "def g():\n    import lazy\n    return importlib.import_module('dyn')\n", encoding="utf-8")
    assert import_sites(f) == [("importlib", 1, False), ("typing", 2, False), ("lazy", 6, True), ("dyn", 7, True)]
