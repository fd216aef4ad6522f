"""The one registry type: a name → object table filled by a decorator, that also loads a user's plugin.

Every extension point is one `Registry`: controllers (`policy.controller.CONTROLLERS`, entry-point group
`tailsieve.policies`), candidate rankings (`policy.ranking.RANKINGS`, `tailsieve.rankings`), engine backends
(`engines.transport.backends.BACKENDS`, `tailsieve.backends`), replica launchers (`engines.launch.base.LAUNCHERS`,
`tailsieve.launchers`), the known-length baselines (`model.baselines.POLICIES`, `tailsieve.baselines`), the peer
policies (`policy.peers.PEERS`, `tailsieve.peers`) and the engine kinds (`engines.kinds.KINDS`, `tailsieve.kinds`).

- `@REGISTRY.register("name")` (or `add(name, obj)`) adds an object; a name already taken by another object is a
  one-line `DuplicateName`, the same in every registry (registering the same object again is a no-op).
- `resolve(name)` returns the object: a registered name; else `pkg.module:Attr` imports `pkg.module` and takes
  `Attr` (registered under that text from then on); else an entry point of the registry's group with that name
  (`importlib.metadata`, an installed distribution's `entry_points.txt`). An unknown name is one line listing the
  known ones (`unknown KIND 'x' (valid: a, b, c)`), raised as the registry's error class (a `ConfigError`). Every
  flag and config key naming an entry (`--policy`, `--ranking`, `--kind`, `[launch] kind`, …) resolves here, so a
  plugin name imports code wherever a name is accepted, and nowhere else. A flag whose names span several
  registries (`--policy`: a controller or a peer) resolves through `resolve_any`, the same three forms, a plugin
  registered in the registry its object belongs to.
- An abstract class (`inspect.isabstract`) is never an entry: refused at load, naming what it leaves unimplemented.
- Plugins are named in their failures. Every object added whose code is not TailSieve's is recorded (`blame`): an
  exception (SystemExit included; KeyboardInterrupt stays an interrupt) raised while its code runs is reported by
  the CLI as `KIND 'name' raised Type: message`; `calling(name)` does the same around one call of an entry whose
  code may have no Python frame (a C function such as `builtins:print`), and `returned(name, value, expected)` is the
  one message for a plugin's wrong result.

A `Registry` is a `dict`, so `name in R`, `R[name]`, iteration and `", ".join(R)` read the registered objects
directly; only `resolve`/`check` load plugins (I/O: imports), and nothing in the policy core calls them at step time.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from types import CodeType, TracebackType
from typing import Any, Generic, TypeVar, cast

from tailsieve.errors import ConfigError
from tailsieve.redact import excerpt

__all__ = ["DuplicateName", "PluginError", "Registry", "UnknownName", "blame", "describe", "is_ours", "resolve_any"]

T = TypeVar("T")
Obj = TypeVar("Obj")


class UnknownName(ConfigError):
    """A name no registry entry, plugin path or entry point provides."""


class DuplicateName(ConfigError):
    """A name already registered for another object."""


class PluginError(ConfigError):
    """A `pkg.module:Attr` path or an entry point that does not load, or loads the wrong kind of object."""


def _label(obj: object) -> str:
    return str(getattr(obj, "__qualname__", None) or type(obj).__qualname__)


def is_ours(obj: object) -> bool:
    """Whether an entry's code is TailSieve's own (a failure in it is TailSieve's bug, not a plugin's)."""
    module = getattr(obj, "__module__", None) or type(obj).__module__
    return module == "tailsieve" or str(module).startswith("tailsieve.")


def describe(value: object) -> str:
    """What a plugin returned, in a few words: `None`, `a generator`, `a list of 3 items`, `an int (3)`."""
    if value is None:
        return "None"
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    if isinstance(value, list | tuple | set | dict):
        return f"{article} {kind} of {len(value)} items"
    if isinstance(value, int | float | str | bool):
        return f"{article} {kind} ({' '.join(repr(value).split())[:40]})"
    return f"{article} {kind}"


def _failure(exc: BaseException) -> str:
    """`Type: message` of an exception raised by a plugin (its type alone when it has no message)."""
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# the code objects of every entry that is not TailSieve's own → (registry kind, entry name), for `blame`
_PLUGIN_CODE: dict[CodeType, tuple[str, str]] = {}


def _code_of(obj: object) -> CodeType | None:
    func = getattr(obj, "__func__", obj)  # a bound, static or class method: its function
    code = getattr(func, "__code__", None)
    return code if isinstance(code, CodeType) else None


def _codes(obj: object, fields: bool = True) -> Iterator[CodeType]:
    """The code objects an entry runs that are not TailSieve's: a function's; every method (and property) of a class
    and of its bases; an instance's class's, and for a dataclass (`EngineKind`) its fields' objects' too."""
    code = _code_of(obj)
    if code is not None:
        yield from () if is_ours(obj) else (code,)
    elif isinstance(obj, type):
        for cls in obj.__mro__:
            if not is_ours(cls) and cls.__module__ != "builtins":
                for value in vars(cls).values():
                    parts = (value, *(getattr(value, a, None) for a in ("fget", "fset", "fdel")))
                    yield from (c for c in map(_code_of, parts) if c is not None)
    elif obj is not None:
        yield from _codes(type(obj))
        if fields and dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                yield from _codes(getattr(obj, f.name, None), fields=False)


def blame(exc: BaseException) -> str | None:
    """`KIND 'name' raised Type: message` when the innermost plugin frame of `exc`'s traceback is a registered
    plugin's code (see the module docstring); None when no plugin code ran on the way to it."""
    found: tuple[str, str] | None = None
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        found = _PLUGIN_CODE.get(tb.tb_frame.f_code, found)
        tb = tb.tb_next
    if found is None:
        return None
    kind, name = found
    return f"{kind} '{name}' raised {_failure(exc)}"


class Registry(dict[str, T], Generic[T]):
    """See the module docstring. `kind` names the entries in messages ("policy", "engine backend"); `group` is the
    entry-point group; `check(obj)` returns why an object cannot be an entry (None: it can); `on_add(name, obj)`
    runs when an object is added (e.g. sets `cls.name`); `error` is the class of the unknown-name error."""

    def __init__(self, kind: str, group: str | None = None, *, check: Callable[[object], str | None] | None = None,
                 on_add: Callable[[str, T], None] | None = None, error: type[ConfigError] = UnknownName) -> None:
        super().__init__()
        self.kind, self.group, self.error = kind, group, error
        self._check, self._on_add = check, on_add

    def add(self, name: str, obj: T) -> T:
        """Register `obj` as `name` (DuplicateName when another object has the name) and return it."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ConfigError(f"{self.kind} name must be a non-empty string without surrounding spaces, "
                              f"got {excerpt(name)}")
        old = dict.get(self, name)
        if old is not None and old is not obj:
            raise DuplicateName(f"{self.kind} '{name}' is already registered ({_label(old)}); choose another name")
        if isinstance(obj, type) and inspect.isabstract(obj):
            missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
            raise PluginError(f"{self.kind} '{name}': {_label(obj)} is abstract (it does not implement {missing})")
        why = self._check(obj) if self._check is not None else None
        if why is not None:
            raise PluginError(f"{self.kind} '{name}': {why}")
        if self._on_add is not None:
            self._on_add(name, obj)
        dict.__setitem__(self, name, obj)
        self._record(name, obj)
        return obj

    def _record(self, name: str, obj: object) -> None:
        """Remember a plugin's code under `name` (first name wins), so that `blame` can name it."""
        for code in _codes(obj):  # none for TailSieve's own entries
            _PLUGIN_CODE.setdefault(code, (self.kind, name))

    @contextmanager
    def calling(self, name: str) -> Iterator[None]:
        """Around one call of the entry `name`: what it prints goes to stderr; when it is a plugin, any exception it
        raises but KeyboardInterrupt (SystemExit included) becomes a one-line `PluginError` naming it; TailSieve's
        own entries raise as they are."""
        try:
            with redirect_stdout(sys.stderr):  # a plugin's print never mixes into stdout (`--json`)
                yield
        except (KeyboardInterrupt, PluginError):
            raise
        except BaseException as exc:
            if is_ours(self.get(name)):
                raise
            raise PluginError(f"{self.kind} '{name}' raised {_failure(exc)}") from None

    def returned(self, name: str, value: object, expected: str) -> PluginError:
        """The one wrong-result error: `KIND 'name' returned WHAT, expected EXPECTED`."""
        return PluginError(f"{self.kind} '{name}' returned {describe(value)}, expected {expected}")

    def register(self, name: str) -> Callable[[Obj], Obj]:
        """Decorator form of `add` (returns the object unchanged)."""

        def deco(obj: Obj) -> Obj:
            self.add(name, obj)  # type: ignore[arg-type]  # `check` guards the kind of object at run time
            return obj

        return deco

    def entry_point_names(self) -> list[str]:
        """Names the installed distributions offer in this registry's entry-point group (nothing is imported)."""
        if self.group is None:
            return []
        return sorted({ep.name for ep in importlib.metadata.entry_points(group=self.group)})

    def names(self) -> list[str]:
        """Registered names (registration order), then entry-point names not loaded yet."""
        return [*self, *(n for n in self.entry_point_names() if n not in self)]

    def load_entry_points(self) -> list[str]:
        """Load every entry point of the group (a name taken by another object: DuplicateName); their names."""
        if self.group is None:
            return []
        eps = sorted(importlib.metadata.entry_points(group=self.group), key=lambda ep: ep.name)
        for ep in eps:
            obj = self._load(ep.load, f"entry point '{ep.name}' ({ep.value})")
            if ep.name not in self or self[ep.name] is not obj:
                self.add(ep.name, cast(T, obj))
        return [ep.name for ep in eps]

    def resolve(self, name: str, valid: Sequence[str] | None = None) -> T:
        """The object for `name`: registered, `pkg.module:Attr`, or an entry point (see the module docstring); an
        unknown name lists `valid` (default: `names()`; a caller whose namespace holds more lists it all)."""
        name = str(name)
        if name in self:
            return self[name]
        if ":" in name:
            return self._load_path(name)
        found = self._entry_point(name)
        if found is not None:
            return found
        raise self.unknown(name, valid)

    def unknown(self, name: str, valid: Sequence[str] | None = None) -> ConfigError:
        """The one unknown-name error: `unknown KIND 'name' (valid: …)`, listing `valid` (default: `names()`) — a
        caller whose namespace holds more than this registry (`simulate`: the oracles, the peers) lists them all."""
        listed = self.names() if valid is None else valid
        return self.error(f"unknown {self.kind} {excerpt(name)} (valid: {', '.join(listed)})")

    def check(self, name: str, valid: Sequence[str] | None = None) -> str:
        """`name` once `resolve` finds it (the one known-name check of every caller)."""
        self.resolve(name, valid)
        return str(name)

    def _load_path(self, path: str) -> T:
        return self._adopt(path, self._import(path))

    def _import(self, path: str) -> object:
        """The object `pkg.module:Attr` names (imported, not registered); a one-line `PluginError` otherwise."""
        module, _, attr = path.partition(":")
        if not module or not attr:
            raise PluginError(f"{self.kind} plugin '{path}': expected pkg.module:Name")
        mod = self._load(lambda: importlib.import_module(module), f"plugin '{path}'")
        obj: object = mod
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise PluginError(f"{self.kind} plugin '{path}': module '{module}' has no attribute '{attr}'")
            obj = getattr(obj, part)
        return obj

    def _entry_point(self, name: str) -> T | None:
        """The entry point `name` of this registry's group, loaded and registered; None when there is none."""
        if self.group is not None:
            for ep in importlib.metadata.entry_points(group=self.group, name=name):
                return self._adopt(name, self._load(ep.load, f"entry point '{name}' ({ep.value})"))
        return None

    def _load(self, load: Callable[[], object], what: str) -> object:
        try:
            with redirect_stdout(sys.stderr):  # what a plugin prints on import never mixes into stdout (`--json`)
                return load()
        except (KeyboardInterrupt, PluginError):
            raise
        except BaseException as exc:  # a plugin's import error of any kind (SystemExit too) is one line
            raise PluginError(f"{self.kind} {what} failed to load: {_failure(exc)}") from None

    def _adopt(self, name: str, obj: object) -> T:
        """Register a loaded object under `name`; an object its module already registered keeps its own name."""
        entry = cast(T, obj)  # `add` runs the registry's `check` on it
        if any(v is obj for v in self.values()):
            dict.__setitem__(self, name, entry)
            return entry
        return self.add(name, entry)


def resolve_any(name: str, registries: Sequence[Registry[Any]], valid: Sequence[str] | None = None) -> Registry[Any]:
    """The registry of `registries` that holds `name` once it is resolved, for a flag whose names span several (a
    `--policy` is a controller or a peer): a name registered in one of them; else `pkg.module:Attr`, imported once
    and registered in the first registry whose kind it is (an abstract one is refused there), a one-line
    `PluginError` naming every kind when it is none; else an entry point of one's group; else the first registry's
    unknown-name error listing `valid` (default: every registry's names)."""
    name = str(name)
    for reg in registries:
        if name in reg:
            return reg
    first = registries[0]
    if ":" in name:
        obj = first._import(name)
        whys = []
        for reg in registries:
            why = reg._check(obj) if reg._check is not None else None
            if why is None:
                reg._adopt(name, obj)
                return reg
            whys.append(f"{reg.kind} ({why})" if reg is not first else why)
        raise PluginError(f"{first.kind} '{name}': {', nor a '.join(whys)}")
    for reg in registries:
        if reg._entry_point(name) is not None:
            return reg
    raise first.unknown(name, valid if valid is not None else [n for reg in registries for n in reg.names()])
