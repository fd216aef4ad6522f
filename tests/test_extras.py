"""Each extra installs what its integration imports (issue 50, item 2): a static scan of the integration's imports
against `integrations.extras` and pyproject.toml's extras, verl's undeclared imports checked against its installed
metadata, the verl plugin's WARNING naming the missing module, and the skip reason naming it."""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import missing_extra
from tailsieve.integrations.extras import EXTRAS, missing_modules

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tailsieve"
# the files that hold TailSieve's code for each extra
FILES = {"verl": sorted((SRC / "integrations" / "verl").glob("*.py")),
         "trl": sorted((SRC / "integrations" / "trl").glob("*.py")),
         "ray": [SRC / "engines" / "launch" / "ray_launcher.py", SRC / "engines" / "launch" / "ray_server.py"]}
# import name -> distribution name (PyPI)
DIST = {"verl": "verl", "transfer_queue": "TransferQueue", "omegaconf": "omegaconf", "ray": "ray", "torch": "torch",
        "cachetools": "cachetools", "uvicorn": "uvicorn", "fastapi": "fastapi", "zmq": "pyzmq", "msgspec": "msgspec",
        "sentencepiece": "sentencepiece", "colorama": "colorama", "trl": "trl", "transformers": "transformers"}
CORE = {"numpy", "rich", "matplotlib", "aiohttp", "prometheus_client", "orjson"}  # the project's own dependencies
# imports that degrade: inside `try` with an ImportError fallback (none today), or tests-only helpers
PLUGIN = "tailsieve.integrations.verl.plugin"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0])


def imported(files: list[Path]) -> set[str]:
    """Top-level third-party modules imported anywhere in `files` (module level or inside functions)."""
    out: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return {m for m in out if m not in sys.stdlib_module_names and m != "tailsieve" and m not in CORE}


def declared(extra: str) -> set[str]:
    """Normalised distribution names pyproject.toml's extra `extra` declares."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_req_name(r) for r in project["optional-dependencies"][extra]}


@pytest.mark.parametrize("extra", sorted(FILES))
def test_every_module_the_integration_imports_is_listed_for_its_extra(extra: str) -> None:
    scanned = imported(FILES[extra])
    assert scanned, f"the scan found no import in {extra}'s files"
    unlisted = scanned - set(EXTRAS[extra].modules)
    assert not unlisted, f"{extra}: imported but not listed in integrations.extras: {unlisted}"


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_every_listed_module_is_declared_by_the_extra_in_pyproject(extra: str) -> None:
    wanted = {_norm(DIST[m]) for m in EXTRAS[extra].modules}
    assert wanted <= declared(extra), f".[{extra}] does not declare {wanted - declared(extra)}"


def test_the_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("import os\nimport numpy\nfrom tailsieve import loop\n\ndef g():\n    from ray.util import pg\n"
                 "    import transfer_queue as tq\n")
    assert imported([f]) == {"ray", "transfer_queue"}


def _verl_base_closure() -> set[str]:
    """Distributions verl's base requirements pull in on this platform (its extras left out), from the installed
    metadata, markers evaluated as pip does."""
    from packaging.requirements import Requirement  # pytest's own dependency

    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in md.requires("verl") or []]
    todo = [r for r in todo if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req = todo.pop()
        key = (_norm(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            reqs = [Requirement(r) for r in md.requires(req.name) or []]
        except md.PackageNotFoundError:
            continue
        todo += [r for r in reqs if r.marker is None
                 or any(r.marker.evaluate({"extra": e}) for e in (*req.extras, ""))]
    return {name for name, _ in seen}


@pytest.mark.slow
@pytest.mark.extra("verl")
def test_verls_undeclared_imports_are_on_the_plugins_path_and_outside_verls_base_requirements() -> None:
    code = ("import sys; before = set(sys.modules); import " + PLUGIN + "; "
            "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(proc.stdout.split())
    base = _verl_base_closure()
    framework = [m for m in EXTRAS["verl"].modules if m not in imported(FILES["verl"])]
    assert framework, "the list names none of verl's own undeclared imports"
    for module in framework:
        assert module in loaded, f"{module} is listed for .[verl] but the plugin's import path does not import it"
        assert _norm(DIST[module]) not in base, f"verl declares {DIST[module]} itself: drop it from the list"
    assert "transfer-queue" not in base and "transferqueue" not in base  # TailSieve's own import: ours to declare


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named '{{name}}'", name=name)
sys.meta_path.insert(0, Block())
import {plugin}
"""


def _plugin_with_blocked(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKER.format(module=module, plugin=PLUGIN)], capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("module", ["verl", pytest.param("transfer_queue", marks=pytest.mark.extra("verl"))])
def test_the_plugins_import_failure_is_a_warning_naming_the_module_and_the_install_line(module: str) -> None:
    proc = _plugin_with_blocked(module)
    assert proc.returncode != 0  # re-raised: verl still sees the plugin fail
    # verl's own logging setup may prefix the line ("WARNING:<time>:"): the message ends the line
    line = next((ln for ln in proc.stderr.splitlines() if "tailsieve's verl plugin" in ln), "")
    assert line.endswith("tailsieve's verl plugin is not loaded (the tailsieve trainer and agent loop are "
                         f"unregistered): module '{module}' is missing; install it with pip install -e '.[verl]' "
                         "(CI: pip install --no-deps -r .ci/verl-lock.txt)")


@pytest.mark.slow
@pytest.mark.extra("verl")
def test_a_module_verl_imports_undeclared_is_named_too() -> None:
    proc = _plugin_with_blocked("cachetools")
    assert proc.returncode != 0
    assert "module 'cachetools' is missing; install it with pip install -e '.[verl]'" in proc.stderr


def test_the_skip_reason_names_the_first_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find(name: str, *a: object) -> object:
        return None if name == "cachetools" else real(name, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find)
    assert "cachetools" in missing_modules("verl")
    reason = missing_extra("verl")
    assert reason is not None and reason.startswith("needs the verl extra (no module '")
    assert reason.endswith("): pip install -e '.[verl]' (CI: pip install --no-deps -r .ci/verl-lock.txt)")
