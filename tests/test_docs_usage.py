"""Docs that cannot drift: every usage block in the docs (`<!-- regen: help CMD -->`) equals `tailsieve CMD --help`,
every command has one, and the regeneration script (scripts/regen_docs.py) finds every kind of block it writes."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from tailsieve.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def regen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regen_docs", ROOT / "scripts" / "regen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REGEN = regen()
HELP_BLOCKS = [(path, m) for path in REGEN.doc_files() for m in REGEN.blocks(path.read_text(encoding="utf-8"))
               if m.group("spec").split()[0] == "help"]


@pytest.mark.parametrize(("path", "block"), HELP_BLOCKS,
                         ids=[f"{p.name}:{m.group('spec').split()[1]}" for p, m in HELP_BLOCKS])
def test_usage_block_equals_help(path: Path, block: object) -> None:
    command = block.group("spec").split()[1]  # type: ignore[attr-defined]
    assert block.group("body") == REGEN.help_text(command), (  # type: ignore[attr-defined]
        f"{path.name}: the usage block of {command} differs from --help; run python scripts/regen_docs.py")


def test_every_command_has_a_usage_block() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    documented = {m.group("spec").split()[1] for _, m in HELP_BLOCKS}
    assert documented == set(sub.choices)


def test_every_block_kind_renders_and_unknown_kinds_fail() -> None:
    kinds = {m.group("spec").split()[0] for p in REGEN.doc_files() for m in REGEN.blocks(p.read_text("utf-8"))}
    assert kinds == {"help", "run", "simulate-json", "real-rollout", "real-grpo"}
    assert REGEN.render("run curves").splitlines()[0] == "$ tailsieve curves"
    with pytest.raises(SystemExit, match="unknown block 'nosuch'"):
        REGEN.render("nosuch")
    with pytest.raises(SystemExit, match="exited 1"):
        REGEN.render("run simulate --steps 0")


def test_real_blocks_run_only_with_real_and_compare_structure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real-server block is not run by a plain regeneration or --check (CI), and with --real only a change of its
    structure (the text with its numbers masked: the lines, the policies, the verdict's words) counts as stale."""
    doc = tmp_path / "d.md"
    old = "step 1: 1.25s q=4 m=1\ntailsieve pays here: 1.300× verl's balancer"
    doc.write_text(f"<!-- regen: real-grpo --steps 2 -->\n```text\n{old}\n```\n", encoding="utf-8")
    monkeypatch.setattr(REGEN, "real_grpo", lambda args: pytest.fail("a real block ran without --real"))
    assert REGEN.regenerate(doc) == (doc.read_text(encoding="utf-8"), [])
    for new, stale in [("step 1: 0.97s q=4 m=1\ntailsieve pays here: 1.112× verl's balancer", []),
                       ("step 1: 0.97s q=0 m=0\ntailsieve pays here: 1.112× verl's balancer", []),
                       ("step 1: 0.97s q=4 m=1\ntailsieve does not pay here: 1.112× verl's balancer",
                        ["real-grpo --steps 2"])]:
        monkeypatch.setattr(REGEN, "real_grpo", lambda args, new=new: new)
        assert REGEN.regenerate(doc, real=True)[1] == stale
