"""Hostile plugins (issue 41, item 9): every kind of failing plugin, at every plugin seam the CLI exposes, is one
stderr line naming the plugin and what went wrong (never `internal error`, a traceback, a silent exit 0 or output
on stdout), and every registry key — flag or TOML — resolves through the one resolver.

Generated: PLUGIN_KINDS (a plugin that raises, exits, returns the wrong type, an iterator or a generator, a subset,
an abstract class, a builtin, a module without the name, a module that fails to import, …) × SEAMS (`simulate
--ranking`, `simulate --policy`, `rollout --policy`, `route --policy`, `launch --kind`, `[launch] kind`, `profile
--kind`), each seam with the kinds it can meet.
"""

from __future__ import annotations

import contextlib
import io
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tailsieve.cli import main
from tailsieve.engines.kinds import KINDS
from tailsieve.engines.transport.backends import BACKENDS
from tailsieve.model.baselines import POLICIES
from tailsieve.policy.controller import CONTROLLERS
from tailsieve.policy.ranking import RANKINGS
from tailsieve.registry import Registry

PLUGIN = '''
from tailsieve.engines.kinds.kind import EngineKind, ServerHalf
from tailsieve.engines.transport.backends import EngineBackend
from tailsieve.model.baselines import Policy
from tailsieve.policy.controller import Controller

NOT_CALLABLE = 3

def rank_raises(cut): raise RuntimeError("ranking failed")
def rank_none(cut): return None
def rank_int(cut): return 3
def rank_iter(cut): return iter(cut)
def rank_gen(cut): yield from cut
def rank_drop(cut): return cut[1:] if cut else cut
def rank_dup(cut): return cut + cut[:1]
def rank_strs(cut): return [str(o.ref.uid) for o in cut]
def rank_exit0(cut): raise SystemExit(0)
def rank_exit1(cut): raise SystemExit(1)
def rank_kbi(cut): raise KeyboardInterrupt

class CtlRaises(Controller):
    def update(self, state, obs): raise ValueError("update failed")
class CtlInit(Controller):
    def __init__(self, *a, **k): raise RuntimeError("init failed")
    def update(self, state, obs): return state
class CtlNone(Controller):
    def update(self, state, obs): return None
class CtlInitial(Controller):
    def initial(self): return 3
    def update(self, state, obs): return state
class CtlDeep(Controller):
    def update(self, state, obs): return self.learn(state, None)[0]
class CtlExit0(Controller):
    def update(self, state, obs): raise SystemExit(0)
class CtlExit1(Controller):
    def update(self, state, obs): raise SystemExit(1)
class CtlKbi(Controller):
    def update(self, state, obs): raise KeyboardInterrupt
class CtlAbstract(Controller):
    pass

class BaseRaises(Policy):
    def assign(self, batch, replicas, curve): raise RuntimeError("assign failed")
class BaseNone(Policy):
    def assign(self, batch, replicas, curve): return None
class BaseExit0(Policy):
    def assign(self, batch, replicas, curve): raise SystemExit(0)
class BaseAbstract(Policy):
    pass

class _Server(ServerHalf):
    def default_command(self): return ("serve",)
    def command(self, launch, head): return [*head, "--port", str(launch.port)]
    def spec_flags(self, spec, extra): return ()
class _Raises(_Server):
    def default_command(self): raise RuntimeError("command failed")
class _Exits(_Server):
    def default_command(self): raise SystemExit(0)
KIND_OK = EngineKind("ts-hp-ok", EngineBackend, _Server())
KIND_RAISES = EngineKind("ts-hp-raises", EngineBackend, _Raises())
KIND_EXIT = EngineKind("ts-hp-exit", EngineBackend, _Exits())
'''
LOUD = "the zen of a plugin, printed on import"
MODULES = {"ts_hp": PLUGIN, "ts_hp_broken": "1 / 0\n", "ts_hp_exits": "raise SystemExit(0)\n",
           "ts_hp_loud": f"print({LOUD!r})\n"}
PRINTED = {LOUD, "[]"}  # what the plugins print (`builtins:print` ranking the empty cut of step 0)
REGISTRIES: tuple[Registry[Any], ...] = (RANKINGS, CONTROLLERS, POLICIES, KINDS, BACKENDS)

SIM = ["simulate", "--steps", "4", "--groups", "8", "--group-size", "2", "--replicas", "3", "--rho", "0.5", "--json"]
ROUTE = ["route", "--json", "--groups", "8", "--group-size", "2"]
LAUNCH = ["launch", "--model", "org/m", "--replicas", "1", "--base-port", "30100", "--dry-run"]
PROFILE = ["profile", "--endpoint", "http://127.0.0.1:1", "--batches", "1"]

Case = tuple[str, str | None]  # (plugin name, a text of the one error line; None: an interrupt, exit 130)
# what every seam says for a plugin that does not load (module, name or object kind)
LOADS: list[Case] = [("ts_hp:missing", "module 'ts_hp' has no attribute 'missing'"),
         ("ts_hp_nomod:x", "failed to load: ModuleNotFoundError: No module named 'ts_hp_nomod'"),
         ("ts_hp_broken:x", "failed to load: ZeroDivisionError: division by zero"),
         ("ts_hp_exits:x", "failed to load: SystemExit: 0"),
         ("ts_hp_loud:Nope", "module 'ts_hp_loud' has no attribute 'Nope'")]
RANKING_CASES: list[Case] = [
    ("ts_hp:rank_raises", "'ts_hp:rank_raises' raised RuntimeError: ranking failed"),
    ("ts_hp:rank_none", "'ts_hp:rank_none' returned None, expected a list or tuple ordering the"),
    ("ts_hp:rank_int", "'ts_hp:rank_int' returned an int (3), expected a list or tuple"),
    ("ts_hp:rank_iter", "'ts_hp:rank_iter' returned a list_iterator, expected a list or tuple"),
    ("ts_hp:rank_gen", "'ts_hp:rank_gen' returned a generator, expected a list or tuple"),
    ("ts_hp:rank_drop", "outcomes that are not a permutation of the"),
    ("ts_hp:rank_dup", "outcomes that are not a permutation of the"),
    ("ts_hp:rank_strs", "'ts_hp:rank_strs' returned a list of"),
    ("ts_hp:rank_exit0", "'ts_hp:rank_exit0' raised SystemExit: 0"),
    ("ts_hp:rank_exit1", "'ts_hp:rank_exit1' raised SystemExit: 1"),
    ("ts_hp:rank_kbi", None),
    ("builtins:print", "'builtins:print' returned None, expected a list or tuple"),
    ("os.path:join", "'os.path:join' raised TypeError"),
    ("tailsieve.policy.controller:Controller", "Controller is abstract (it does not implement update)"),
    ("ts_hp:NOT_CALLABLE", "'ts_hp:NOT_CALLABLE': not a function of the cut outcomes"),
    *LOADS,
]
CONTROLLER_LOADS: list[Case] = [
    ("ts_hp:CtlInit", "policy 'ts_hp:CtlInit' raised RuntimeError: init failed"),
    ("ts_hp:CtlInitial", "policy 'ts_hp:CtlInitial' returned an int (3), expected a ControlState from initial()"),
    ("ts_hp:CtlAbstract", "CtlAbstract is abstract (it does not implement update)"),
    ("tailsieve.policy.controller:Controller", "Controller is abstract (it does not implement update)"),
    ("tailsieve.policy.controller_base:Controller", "Controller is abstract (it does not implement update)"),
    ("builtins:print", "policy 'builtins:print': not a subclass of Controller"),
    ("ts_hp:NOT_CALLABLE", "policy 'ts_hp:NOT_CALLABLE': not a subclass of Controller"),
    ("ts_hp:rank_none", "policy 'ts_hp:rank_none': not a subclass of Controller"),
    *LOADS,
]
POLICY_CASES: list[Case] = [
    ("ts_hp:CtlRaises", "policy 'ts_hp:CtlRaises' raised ValueError: update failed"),
    ("ts_hp:CtlNone", "policy 'ts_hp:CtlNone' returned None, expected a ControlState from update()"),
    ("ts_hp:CtlDeep", "policy 'ts_hp:CtlDeep' raised AttributeError"),
    ("ts_hp:CtlExit0", "policy 'ts_hp:CtlExit0' raised SystemExit: 0"),
    ("ts_hp:CtlExit1", "policy 'ts_hp:CtlExit1' raised SystemExit: 1"),
    ("ts_hp:CtlKbi", None),
    *CONTROLLER_LOADS,
]
BASELINE_CASES: list[Case] = [
    ("ts_hp:BaseRaises", "policy 'ts_hp:BaseRaises' raised RuntimeError: assign failed"),
    ("ts_hp:BaseNone", "policy 'ts_hp:BaseNone' returned None, expected an Assignment from assign()"),
    ("ts_hp:BaseExit0", "policy 'ts_hp:BaseExit0' raised SystemExit: 0"),
    ("ts_hp:BaseAbstract", "BaseAbstract is abstract (it does not implement assign)"),
    ("tailsieve.model.baselines:Policy", "Policy is abstract (it does not implement assign)"),
    ("builtins:print", "policy 'builtins:print': not a subclass of Policy"),
    ("ts_hp:NOT_CALLABLE", "policy 'ts_hp:NOT_CALLABLE': not a subclass of Policy"),
    *LOADS,
]
KIND_CASES: list[Case] = [
    ("ts_hp:KIND_RAISES", "engine kind 'ts_hp:KIND_RAISES' raised RuntimeError: command failed"),
    ("ts_hp:KIND_EXIT", "engine kind 'ts_hp:KIND_EXIT' raised SystemExit: 0"),
    ("builtins:print", "engine kind 'builtins:print': not an EngineKind"),
    ("ts_hp:NOT_CALLABLE", "engine kind 'ts_hp:NOT_CALLABLE': not an EngineKind"),
    ("ts_hp:_Server", "engine kind 'ts_hp:_Server': not an EngineKind"),
    ("nope", "unknown engine kind 'nope' (valid: sglang, sglang-native, vllm)"),
    *LOADS,
]
BACKEND_CASES: list[Case] = [
    ("builtins:print", "engine backend 'builtins:print': not a subclass of EngineBackend"),
    ("ts_hp:NOT_CALLABLE", "engine backend 'ts_hp:NOT_CALLABLE': not a subclass of EngineBackend"),
    ("ts_hp:CtlRaises", "engine backend 'ts_hp:CtlRaises': not a subclass of EngineBackend"),
    *LOADS,
]


def _launch_toml(root: Path, kind: str) -> list[str]:
    cfg = root / "launch.toml"
    cfg.write_text(f'[launch]\nmodel = "org/m"\nreplicas = 1\nbase_port = 30100\nkind = "{kind}"\n', encoding="utf-8")
    return ["launch", "--config", str(cfg), "--dry-run"]


def _rollout(root: Path, policy: str) -> list[str]:
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "q{i}"}}\n' for i in range(4)), encoding="utf-8")
    return ["rollout", "--endpoints", "http://127.0.0.1:1,http://127.0.0.1:2", "--prompts", str(prompts), "--out",
            str(root / "out"), "--give-up-after", "0", "--steps", "1", "--groups", "2", "--group-size", "1",
            "--policy", policy]


# seam → (argv for a plugin name, the line's prefix after `error: `, the cases it meets)
Argv = Callable[[Path, str], list[str]]
SEAMS: dict[str, tuple[Argv, str, list[Case]]] = {
    "simulate --ranking": (lambda root, name: [*SIM, "--policy", "static", "--q", "1", "--m", "1", "--ranking", name],
                           "", RANKING_CASES),
    "simulate --policy": (lambda root, name: [*SIM, "--policy", name], "", POLICY_CASES),
    "rollout --policy": (_rollout, "", CONTROLLER_LOADS),
    "route --policy": (lambda root, name: [*ROUTE, "--policy", name], "", BASELINE_CASES),
    "launch --kind": (lambda root, name: [*LAUNCH, "--kind", name], "--kind: ", KIND_CASES),
    "[launch] kind": (_launch_toml, "launch.kind: ", KIND_CASES),
    "profile --kind": (lambda root, name: [*PROFILE, "--out", str(root / "c.json"), "--kind", name], "",
                       BACKEND_CASES),
}
CASES = [pytest.param(seam, name, expect, id=f"{seam}-{name}")
         for seam, (_, _, cases) in SEAMS.items() for name, expect in cases]


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin modules on sys.path; the entries and modules a test loaded are removed afterwards."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name, text in MODULES.items():
        (lib / f"{name}.py").write_text(textwrap.dedent(text), encoding="utf-8")
    monkeypatch.syspath_prepend(str(lib))
    before = [set(r) for r in REGISTRIES]
    yield tmp_path
    for r, names in zip(REGISTRIES, before, strict=True):
        for name in set(r) - names:
            r.pop(name)
    for mod in [m for m in sys.modules if m.startswith("ts_hp")]:
        del sys.modules[mod]


def run(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # a plugin's SystemExit must never get here
            rc = -1 if exc.code in (None, 0) else 1000
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("seam", "name", "expect"), CASES)
def test_a_failing_plugin_is_one_line_naming_it(plugins: Path, seam: str, name: str, expect: str | None) -> None:
    argv, prefix, _ = SEAMS[seam]
    rc, out, err = run(argv(plugins, name))
    command = argv(plugins, name)[0]
    lines = [line for line in err.splitlines() if line not in PRINTED]  # the plugins' prints, moved to stderr
    assert out == "", (seam, name, out)  # nothing on stdout: not a plugin's print, not a half document
    assert len(lines) == 1 and "Traceback" not in err and "internal error" not in err, (seam, name, err)
    if expect is None:  # a KeyboardInterrupt is an interrupt, wherever it comes from
        assert (rc, lines[0]) == (130, f"tailsieve {command}: interrupted")
        return
    assert rc == 1, (seam, name, rc, err)
    at_load = " raised " not in expect  # refused when resolved: the line names the flag or key; later: the plugin
    assert lines[0].startswith(f"tailsieve {command}: error: {prefix if at_load else ''}"), (seam, name, err)
    assert expect in lines[0], (seam, name, err)


@pytest.mark.parametrize("how", ["--kind", "[launch] kind"])
def test_a_plugin_kind_resolves_the_same_way_by_flag_and_by_toml(plugins: Path, how: str) -> None:
    """One resolver: the flag takes what the TOML key takes (a plugin `pkg.module:KIND`), with the same result."""
    argv, _, _ = SEAMS["launch --kind" if how == "--kind" else "[launch] kind"]
    rc, out, err = run(argv(plugins, "ts_hp:KIND_OK"))
    assert (rc, err) == (0, "")
    assert "serve --port 30100" in out


def test_a_plugin_that_prints_on_import_leaves_stdout_clean(plugins: Path) -> None:
    """`--json` stays one document: what a plugin module prints while it loads goes to stderr."""
    rc, out, err = run([*SIM, "--policy", "static", "--q", "1", "--m", "1", "--ranking", "ts_hp_loud:Nope"])
    assert out == "" and rc == 1
    assert err.splitlines() == [LOUD, "tailsieve simulate: error: candidate ranking plugin 'ts_hp_loud:Nope': "
                                "module 'ts_hp_loud' has no attribute 'Nope'"]
