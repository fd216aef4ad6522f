"""Replica launchers behind one interface (`ReplicaLauncher`, docs/launch.md): `local` (process groups on this
machine). A new launcher (e.g. Ray: one actor per replica) is a module here whose class is decorated with
`@register_launcher(NAME)` and imported below; `make_launcher(NAME, config, log_dir)` then builds it."""

from tailsieve.engines.launch.base import (
    DEFAULT_LAUNCHER,
    LAUNCHERS,
    LaunchError,
    ReplicaLauncher,
    ReplicaSlot,
    initial_pools,
    launcher_for,
    make_launcher,
    register_launcher,
)
from tailsieve.engines.launch.local_launcher import LocalLauncher, Replica
from tailsieve.engines.launch.ray_launcher import RayLauncher  # registers "ray" (imports ray only when started)

__all__ = [
    "DEFAULT_LAUNCHER",
    "LAUNCHERS",
    "LaunchError",
    "LocalLauncher",
    "RayLauncher",
    "Replica",
    "ReplicaLauncher",
    "ReplicaSlot",
    "initial_pools",
    "launcher_for",
    "make_launcher",
    "register_launcher",
]
