"""The one registry type (`tailsieve.registry`): duplicate names refused the same way in every registry, plugins
loaded by module path (`pkg.module:Name`) and by entry point, unknown names one line listing the known ones."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import tailsieve.engines  # noqa: F401  (registers the built-in backends and launchers)
from tailsieve.engines.launch.base import LAUNCHERS, ReplicaLauncher
from tailsieve.engines.transport.backends import BACKENDS, EngineBackend, UnknownBackend, get_backend
from tailsieve.loop import make_controller
from tailsieve.model.baselines import POLICIES, Policy
from tailsieve.model.curves import TpotCurve
from tailsieve.policy.controller import CONTROLLERS, Controller, ControlState
from tailsieve.policy.ranking import RANKINGS
from tailsieve.policy.router import Router, RouterConfig
from tailsieve.policy.step import GroupOutcome, GroupStatus, Pool, StepResult
from tailsieve.registry import DuplicateName, PluginError, Registry, UnknownName

CURVE = TpotCurve("flat", (1, 1024), (0.01, 0.01))

# (registry, its kind in messages, a built-in name, the base class a plugin must subclass; None: any callable)
ALL = [(CONTROLLERS, "policy", "uniform", Controller), (RANKINGS, "candidate ranking", "least-progress", None),
       (BACKENDS, "engine backend", "vllm", EngineBackend), (LAUNCHERS, "launcher", "local", ReplicaLauncher),
       (POLICIES, "policy", "uniform", Policy)]
IDS = ["controllers", "rankings", "backends", "launchers", "baselines"]

PLUGIN = '''
from tailsieve.policy.controller import Controller, ControlState

def reverse(cut):
    """Candidates newest first."""
    return sorted(cut, key=lambda o: -o.ref.uid)

class Hold(Controller):
    """Keeps (q, m) = (1, 1) forever."""
    def initial(self):
        return ControlState(q=1, m=1)
    def update(self, state, obs):
        return state

NOT_A_CLASS = 3
'''


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path holding the module `ts_plug` (and, when a test writes one, a distribution's
    dist-info); registry entries and modules the test loaded are removed afterwards."""
    (tmp_path / "ts_plug.py").write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {id(r): set(r) for r, *_ in ALL}
    yield tmp_path
    for r, *_ in ALL:
        for name in set(r) - before[id(r)]:
            r.pop(name)
    for mod in [m for m in sys.modules if m.startswith("ts_plug")]:
        del sys.modules[mod]


def entry_points_dist(root: Path, text: str) -> None:
    """An installed distribution in `root` whose entry_points.txt is `text`."""
    info = root / "ts_plug_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ts-plug-dist\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(textwrap.dedent(text), encoding="utf-8")


@pytest.mark.parametrize(("registry", "kind", "builtin", "base"), ALL, ids=IDS)
def test_a_taken_name_is_refused_the_same_way_everywhere(registry: Registry[object], kind: str, builtin: str,
                                                         base: type | None) -> None:
    old = registry[builtin]
    other: object = type("Other", (base,), {}) if base is not None else (lambda cut: list(cut))
    with pytest.raises(DuplicateName) as err:
        registry.register(builtin)(other)
    label = getattr(old, "__qualname__", "")
    assert str(err.value) == f"{kind} '{builtin}' is already registered ({label}); choose another name"
    assert registry[builtin] is old  # nothing replaced
    assert registry.register(builtin)(old) is old  # the same object again: a no-op


@pytest.mark.parametrize(("registry", "kind", "builtin", "base"), ALL, ids=IDS)
def test_an_unknown_name_is_one_line_listing_the_known_ones(registry: Registry[object], kind: str, builtin: str,
                                                            base: type | None) -> None:
    with pytest.raises(UnknownName if registry is not BACKENDS else UnknownBackend) as err:
        registry.resolve("no-such-thing")
    assert str(err.value) == f"unknown {kind} 'no-such-thing' (valid: {', '.join(registry)})"
    assert builtin in str(err.value) and "\n" not in str(err.value)


def test_the_wrong_kind_of_object_is_refused(plugin_dir: Path) -> None:
    with pytest.raises(PluginError) as err:
        CONTROLLERS.resolve("ts_plug:reverse")
    assert str(err.value) == "policy 'ts_plug:reverse': not a subclass of Controller"
    with pytest.raises(PluginError) as err:
        RANKINGS.resolve("ts_plug:NOT_A_CLASS")
    assert str(err.value) == "candidate ranking 'ts_plug:NOT_A_CLASS': not a function of the cut outcomes"
    assert "ts_plug:reverse" not in CONTROLLERS and "ts_plug:NOT_A_CLASS" not in RANKINGS


def test_a_plugin_path_that_does_not_load_is_one_line(plugin_dir: Path) -> None:
    cases = {"ts_plug_missing:reverse": "candidate ranking plugin 'ts_plug_missing:reverse' failed to load: "
                                       "ModuleNotFoundError: No module named 'ts_plug_missing'",
             "ts_plug:nope": "candidate ranking plugin 'ts_plug:nope': module 'ts_plug' has no attribute 'nope'",
             "ts_plug:": "candidate ranking plugin 'ts_plug:': expected pkg.module:Name"}
    for path, message in cases.items():
        with pytest.raises(PluginError) as err:
            RANKINGS.resolve(path)
        assert str(err.value) == message


def test_a_ranking_loaded_by_module_path_ranks_the_router_candidates(plugin_dir: Path) -> None:
    rc = RouterConfig(groups=4, group_size=2, replicas=2, rho=0.5, ranking="ts_plug:reverse")
    assert RANKINGS["ts_plug:reverse"] is sys.modules["ts_plug"].reverse  # loaded once by the config check
    router = Router(rc, [f"p{i}" for i in range(20)])
    state = router.initial_state()
    plan = router.plan(state, 1, 1)  # the warm-up step: N + E = 6 groups on every replica, the bulk quota N = 4
    bulk = list(plan.bulk)
    cut = {bulk[1].uid, bulk[4].uid}  # two groups are cut
    outcomes = tuple(GroupOutcome(r, Pool.BULK, GroupStatus.ABORTED if r.uid in cut else GroupStatus.DONE,
                                  None if r.uid in cut else 1.0, (3, 3) if r.uid not in cut else (1, 0),
                                  0 if r.uid in cut else 2) for r in bulk)
    after = router.observe(state, plan, StepResult(plan.step, outcomes, 0.0, 1.0, 1.0))
    assert [r.uid for r in after.candidates] == sorted(cut, reverse=True)  # the plugin's order, not least-progress
    assert [r.uid for r in Router(replace(rc, ranking="stream-order"), [f"p{i}" for i in range(20)]).observe(
        state, plan, StepResult(plan.step, outcomes, 0.0, 1.0, 1.0)).candidates] == sorted(cut)


def test_a_controller_loaded_by_module_path_drives_the_loop(plugin_dir: Path) -> None:
    rc = RouterConfig(groups=4, group_size=2, replicas=3)
    ctl = make_controller("ts_plug:Hold", rc, bulk_curve=CURVE)
    assert type(ctl) is sys.modules["ts_plug"].Hold and ctl.initial() == ControlState(q=1, m=1)
    assert CONTROLLERS.check("ts_plug:Hold") == "ts_plug:Hold" and "ts_plug:Hold" in CONTROLLERS.names()


def test_entry_points_are_listed_unloaded_and_loaded_by_name(plugin_dir: Path) -> None:
    entry_points_dist(plugin_dir, """
        [tailsieve.rankings]
        newest-first = ts_plug:reverse
        [tailsieve.policies]
        hold = ts_plug:Hold
        [tailsieve.backends]
        broken = ts_plug_missing:Backend
    """)
    assert "ts_plug" not in sys.modules  # listed without importing anything
    assert RANKINGS.entry_point_names() == ["newest-first"] and CONTROLLERS.names()[-1] == "hold"
    with pytest.raises(UnknownName) as err:
        RANKINGS.resolve("oldest-first")
    assert str(err.value).endswith(", stream-order, newest-first)")  # the error lists the installed ones too
    assert RANKINGS.resolve("newest-first") is sys.modules["ts_plug"].reverse
    assert "newest-first" in RANKINGS  # registered from now on
    hold = CONTROLLERS.resolve("hold")
    assert hold.name == "hold" and RouterConfig(ranking="newest-first").ranking == "newest-first"
    with pytest.raises(PluginError) as perr:
        get_backend("broken")
    assert str(perr.value) == ("engine backend entry point 'broken' (ts_plug_missing:Backend) failed to load: "
                               "ModuleNotFoundError: No module named 'ts_plug_missing'")


def test_an_entry_point_cannot_take_a_builtin_name(plugin_dir: Path) -> None:
    entry_points_dist(plugin_dir, """
        [tailsieve.rankings]
        least-progress = ts_plug:reverse
    """)
    assert RANKINGS.resolve("least-progress").__module__ == "tailsieve.policy.ranking" and "ts_plug" not in sys.modules
    assert RANKINGS.names().count("least-progress") == 1
    with pytest.raises(DuplicateName, match=r"^candidate ranking 'least-progress' is already registered"):
        RANKINGS.load_entry_points()
