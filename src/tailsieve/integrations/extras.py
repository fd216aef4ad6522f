"""What each optional extra of pyproject.toml must bring: the top-level modules TailSieve's code for it
imports, and those its framework imports on that path without declaring them in its own base requirements. verl 0.9.1
lists cachetools, uvicorn, fastapi, pyzmq and msgspec only under its `verl-core` extra and imports sentencepiece and
colorama undeclared; each was found by blocking it and importing the plugin. pyproject.toml's extras declare every
one (`tests/test_extras.py` scans the integration's imports and resolves them against it), the test suite skips a
test whose extra is incomplete naming the first missing module (`tests/conftest.py`), and the verl plugin logs the
missing module with the install line at WARNING (`integrations.verl.plugin`)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

__all__ = ["EXTRAS", "Extra", "missing_modules"]


@dataclass(frozen=True, slots=True)
class Extra:
    """An extra: the modules it must make importable, and the line that installs it."""

    name: str
    modules: tuple[str, ...]  # top-level import names, the framework first
    install: str
    ci: str  # how CI installs the verified set instead (.ci lock files)

    @property
    def advice(self) -> str:
        """The install line, with CI's locked alternative."""
        return f"{self.install} (CI: {self.ci})"


# module name -> what TailSieve's code imports it for (the scan in tests/test_extras.py checks the first group, the
# framework's undeclared imports are listed here because a static scan of TailSieve cannot see them)
EXTRAS: dict[str, Extra] = {
    "verl": Extra("verl", ("verl", "transfer_queue", "omegaconf", "ray", "cachetools", "uvicorn", "fastapi", "zmq",
                           "msgspec", "sentencepiece", "colorama"),
                  "pip install -e '.[verl]'", "pip install --no-deps -r .ci/verl-lock.txt"),
    "trl": Extra("trl", ("trl", "transformers", "torch"), "pip install -e '.[trl]'",
                 "pip install --no-deps -r .ci/trl-lock.txt"),
    "ray": Extra("ray", ("ray",), "pip install -e '.[ray]'", "pip install --no-deps -r .ci/ray-lock.txt"),
}


def missing_modules(name: str) -> tuple[str, ...]:
    """The modules of extra `name` that cannot be found here (found without importing them)."""
    out = []
    for module in EXTRAS[name].modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(module)
    return tuple(out)
