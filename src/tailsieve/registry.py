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
  known ones (`unknown KIND 'x' (valid: a, b, c)`), raised as the registry's error class (a `ConfigError`).

A `Registry` is a `dict`, so `name in R`, `R[name]`, iteration and `", ".join(R)` read the registered objects
directly; only `resolve`/`check` load plugins (I/O: imports), and nothing in the policy core calls them at step time.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar, cast

from tailsieve.errors import ConfigError

__all__ = ["DuplicateName", "PluginError", "Registry", "UnknownName"]

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
            raise ConfigError(f"{self.kind} name must be a non-empty string without surrounding spaces, got {name!r}")
        old = dict.get(self, name)
        if old is not None and old is not obj:
            raise DuplicateName(f"{self.kind} '{name}' is already registered ({_label(old)}); choose another name")
        why = self._check(obj) if self._check is not None else None
        if why is not None:
            raise PluginError(f"{self.kind} '{name}': {why}")
        if self._on_add is not None:
            self._on_add(name, obj)
        dict.__setitem__(self, name, obj)
        return obj

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

    def resolve(self, name: str) -> T:
        """The object for `name`: registered, `pkg.module:Attr`, or an entry point (see the module docstring)."""
        name = str(name)
        if name in self:
            return self[name]
        if ":" in name:
            return self._load_path(name)
        if self.group is not None:
            for ep in importlib.metadata.entry_points(group=self.group, name=name):
                return self._adopt(name, self._load(ep.load, f"entry point '{name}' ({ep.value})"))
        raise self.unknown(name)

    def unknown(self, name: str, valid: Sequence[str] | None = None) -> ConfigError:
        """The one unknown-name error: `unknown KIND 'name' (valid: …)`, listing `valid` (default: `names()`) — a
        caller whose namespace holds more than this registry (`simulate`: the oracles, the peers) lists them all."""
        listed = self.names() if valid is None else valid
        return self.error(f"unknown {self.kind} '{name}' (valid: {', '.join(listed)})")

    def check(self, name: str) -> str:
        """`name` once `resolve` finds it (the one known-name check of every caller)."""
        self.resolve(name)
        return str(name)

    def _load_path(self, path: str) -> T:
        module, _, attr = path.partition(":")
        if not module or not attr:
            raise PluginError(f"{self.kind} plugin '{path}': expected pkg.module:Name")
        mod = self._load(lambda: importlib.import_module(module), f"plugin '{path}'")
        obj: object = mod
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise PluginError(f"{self.kind} plugin '{path}': module '{module}' has no attribute '{attr}'")
            obj = getattr(obj, part)
        return self._adopt(path, obj)

    def _load(self, load: Callable[[], object], what: str) -> object:
        try:
            return load()
        except Exception as exc:  # a plugin's import error of any kind is the user's one-line error
            detail = " ".join(str(exc).split())[:200]
            raise PluginError(f"{self.kind} {what} failed to load: {type(exc).__name__}: {detail}") from None

    def _adopt(self, name: str, obj: object) -> T:
        """Register a loaded object under `name`; an object its module already registered keeps its own name."""
        entry = cast(T, obj)  # `add` runs the registry's `check` on it
        if any(v is obj for v in self.values()):
            dict.__setitem__(self, name, entry)
            return entry
        return self.add(name, entry)
