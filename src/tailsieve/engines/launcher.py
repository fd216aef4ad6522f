"""Compatibility: the local replica launcher now lives in `tailsieve.engines.launchers` (docs/launch.md).
`Launcher` is `LocalLauncher`; `assign` takes the tail pool's replica ids (`plan.tail_replicas`), not m."""

from tailsieve.engines.launchers.base import LaunchError
from tailsieve.engines.launchers.local import LocalLauncher, Replica
from tailsieve.engines.launchers.process import port_free, server_error

Launcher = LocalLauncher

__all__ = ["LaunchError", "Launcher", "LocalLauncher", "Replica", "port_free", "server_error"]
