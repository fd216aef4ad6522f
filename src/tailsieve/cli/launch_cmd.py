"""`tailsieve launch`: start R local vLLM replicas (per-pool flags such as `--speculative-config`), wait for health,
write the endpoint list that `rollout --endpoints` takes, serve until Ctrl-C / SIGTERM / `--duration`, stop all."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.table import Table

from tailsieve.cli._common import CliConsole, fmt, nonneg_int, positive_int, print_json
from tailsieve.engines.kinds import kind_names
from tailsieve.engines.launch import LaunchError, ReplicaLauncher, launcher_for, make_launcher
from tailsieve.engines.launch.bounds import BOUNDS, MAX_CPU_MEMORY_GIB
from tailsieve.engines.launch.config import Device, LaunchConfig, check_model, kind_named, launch_from_mapping
from tailsieve.errors import ConfigError, Interrupted
from tailsieve.inputs import ascii_int, excerpt, finite
from tailsieve.model.spec_parse import load_config_file, parse_spec, read_config
from tailsieve.model.speculative import PoolSpec
from tailsieve.outputs import OutputLock, check_target, write_atomic, write_json_atomic


def register(sub: Any) -> None:
    """Add the `launch` command."""
    p = sub.add_parser("launch", help="start local vLLM (or SGLang, --kind) replicas with per-pool flags; print "
                                      "their endpoints",
                       description="Start R vLLM replicas (or another engine kind's, --kind) on CPU cores via "
                                   "taskset or GPU ids, each pool with its own flags (e.g. --speculative-config "
                                   "from [spec.tail]), wait for /health, write the endpoint list for `rollout "
                                   "--endpoints`, and stop them all on Ctrl-C or SIGTERM.")
    add_launch_args(p)
    p.add_argument("--out", default="tailsieve-launch", help="folder for endpoints.txt, launch.json and server logs")
    p.add_argument("--duration", type=float, help="stop after this many seconds of serving (default: until Ctrl-C)")
    p.add_argument("--dry-run", action="store_true", help="print each replica's command and environment; start none")
    p.add_argument("--json", action="store_true",
                   help="stdout gets one JSON document when the replicas have stopped (launch.json's content), "
                        "instead of the endpoint line; with --dry-run, {\"dry_run\": [lines]}")
    p.set_defaults(func=run)


def add_launch_args(p: argparse.ArgumentParser) -> None:
    """Flags that override the config file's [launch] and [spec] tables."""
    p.add_argument("--config", help="TOML/JSON with [launch], [launch.tail|bulk], [spec.tail|bulk] (docs/launch.md)")
    p.add_argument("--model", help="model folder or hub id")
    p.add_argument("--replicas", type=positive_int, help="R replicas (default: 2)")
    p.add_argument("--kind", metavar="KIND",
                   help=f"engine kind: its server command, environment and pool flags: {', '.join(kind_names())}, a "
                        "plugin pkg.module:KIND (imports that module) or an entry point of tailsieve.kinds (default: "
                        "vllm; docs/engines.md)")
    p.add_argument("--device", choices=[d.value for d in Device], help="cpu (default) or gpu")
    p.add_argument("--cores", help="cpu: one taskset core list per replica, ';'-separated (e.g. '0;1' or '0-3;4-7')")
    p.add_argument("--gpus", help="gpu: CUDA_VISIBLE_DEVICES per replica, ';'-separated (e.g. '0;1' or '0,1;2,3')")
    p.add_argument("--ports", help="comma-separated port per replica (default: free ports)")
    p.add_argument("--base-port", type=positive_int, help="replica i listens on BASE + i")
    p.add_argument("--memory", type=float, help="cpu: KV cache GiB per replica; gpu: --gpu-memory-utilization share")
    p.add_argument("--served-model-name", help="name the servers answer to (default: the model path)")
    p.add_argument("--m", type=nonneg_int, help="tail replicas at launch (the last m; default 0)")
    p.add_argument("--tail-spec", help="tail pool's speculation METHOD[:TOKENS] (overrides [spec.tail])")
    p.add_argument("--bulk-spec", help="bulk pool's speculation METHOD[:TOKENS] (overrides [spec.bulk])")
    p.add_argument("--tail-speculative", help="JSON merged into the tail's --speculative-config")
    p.add_argument("--bulk-speculative", help="JSON merged into the bulk's --speculative-config")
    p.add_argument("--server-args", help="extra vLLM flags for every replica, one shell-quoted string")
    p.add_argument("--tail-args", help="extra vLLM flags for tail replicas")
    p.add_argument("--bulk-args", help="extra vLLM flags for bulk replicas")
    p.add_argument("--startup-timeout", type=float, help="seconds to wait for /health (default: 600)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the replicas as Ray actors on the cluster at ADDRESS "
                                                     "(auto or HOST:PORT; docs/multinode.md)")


def _json_table(text: str, flag: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag}: invalid JSON: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{flag}: expected a JSON object, got {excerpt(text)}")
    return obj


def _table(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be a table, got {excerpt(obj)}")
    return dict(obj)


def _split(text: str, flag: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def launch_config(args: argparse.Namespace) -> tuple[LaunchConfig, PoolSpec]:
    """The config file's tables with the flags applied on top, validated."""
    table: dict[str, Any] = {}
    spec = PoolSpec()
    if args.memory is not None:
        finite(args.memory, "--memory", lo=0, lo_open=True, hi=MAX_CPU_MEMORY_GIB)
    if args.startup_timeout is not None:
        BOUNDS["startup_timeout_s"].check(args.startup_timeout, "--startup-timeout")
    if args.config:
        path = Path(args.config)
        spec = load_config_file(path)
        table = _table(read_config(path).get("launch", {}), f"config {path}: launch")
        for key in ("tail", "bulk"):
            if key in table:
                table[key] = _table(table[key], f"config {path}: launch.{key}")
        for key, sub in (("args", table), ("tail.args", table.get("tail", {})), ("bulk.args", table.get("bulk", {}))):
            v = sub.get(key.split(".")[-1])
            if v is not None and (isinstance(v, str) or not isinstance(v, list)):
                raise ConfigError(f"config {path}: launch.{key} must be a list of strings, got {excerpt(v)}")
    tail, bulk = spec.tail, spec.bulk
    if args.tail_spec:
        tail = parse_spec(args.tail_spec, "--tail-spec")
    if args.bulk_spec:
        bulk = parse_spec(args.bulk_spec, "--bulk-spec")
    if args.kind is not None:  # the one resolver of `[launch] kind` too (`kind_named`), named as the flag
        kind_named(args.kind, "--kind", flag=True)
    for key, val in (("model", args.model), ("replicas", args.replicas), ("device", args.device), ("kind", args.kind),
                     ("base_port", args.base_port), ("memory", args.memory), ("tail_replicas", args.m),
                     ("served_model_name", args.served_model_name), ("startup_timeout_s", args.startup_timeout),
                     ("ray", getattr(args, "ray", None))):
        if val is not None:
            table[key] = val
    if args.cores is not None:
        table["cores"] = [c.strip() for c in args.cores.split(";")]
    if args.gpus is not None:
        table["gpus"] = [g.strip() for g in args.gpus.split(";")]
    if args.ports is not None:
        try:
            table["ports"] = [ascii_int(x, "--ports", lo=0, hi=65535) for x in args.ports.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--ports: expected comma-separated integers, got {excerpt(args.ports)}") from None
    if args.server_args is not None:
        table["args"] = [*table.get("args", []), *_split(args.server_args, "--server-args")]
    for pool in ("tail", "bulk"):
        sub = dict(table.get(pool, {}))
        extra_json, extra_args = getattr(args, f"{pool}_speculative"), getattr(args, f"{pool}_args")
        if extra_json is not None:
            sub["speculative"] = dict(sub.get("speculative", {})) | _json_table(extra_json, f"--{pool}-speculative")
        if extra_args is not None:
            sub["args"] = [*sub.get("args", []), *_split(extra_args, f"--{pool}-args")]
        table[pool] = sub
    if "model" not in table:
        raise ConfigError("no model: pass --model or set model in the config's [launch] table")
    return launch_from_mapping(table, tail, bulk), PoolSpec(tail, bulk)


@contextlib.contextmanager
def sigterm_as_interrupt(launcher: ReplicaLauncher | None = None) -> Iterator[None]:
    """SIGTERM, SIGHUP and SIGINT raise `Interrupted` (a KeyboardInterrupt naming the signal) so `finally` blocks
    stop the servers and release the output locks, and the CLI exits 128 + the signal's number; first they tell
    `launcher` to give up any start-up it is waiting on (a restart in a worker thread would otherwise hold up the
    event loop's shutdown)."""

    def handler(signum: int, frame: object) -> None:
        if launcher is not None:
            launcher.request_stop()
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(args: argparse.Namespace) -> int:
    """Start, report, serve, stop."""
    cfg, _ = launch_config(args)
    if args.duration is not None:
        finite(args.duration, "--duration", lo=0)
    out = Path(args.out)
    check_target(out, "--out", folder=True)
    check_model(cfg.model)
    launcher = make_launcher(launcher_for(cfg), cfg, out)
    err = CliConsole(stderr=True, width=max(120, CliConsole(stderr=True).width))
    if args.dry_run:
        if args.json:
            print_json({"dry_run": list(launcher.dry_run())})
            return 0
        for line in launcher.dry_run():
            print(line)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    with OutputLock(out, "launch", folder=True), sigterm_as_interrupt(launcher):  # one launch per --out folder
        try:
            err.print(f"starting {cfg.replicas} replica(s) of {cfg.model} on {cfg.device.value} …")
            launcher.start()
        except KeyboardInterrupt:
            err.print("interrupted during start-up: every replica stopped")
            return 130
        try:
            rc = serve(launcher, out, args.duration, err, endpoint_line=not args.json)
        except KeyboardInterrupt:
            err.print(f"stopping {cfg.replicas} replica(s) …")
            rc = 0
        finally:
            launcher.stop()
            final = launcher.describe() | {"stopped": True}
            write_json_atomic(out / "launch.json", final)
    if args.json:
        print_json(final)
    return rc


def serve(launcher: ReplicaLauncher, out: Path, duration: float | None, err: CliConsole, *,
          endpoint_line: bool = True) -> int:
    """Write the endpoint files, print the table and the endpoint line, then watch the replicas."""
    line = ",".join(launcher.endpoints)
    write_atomic(out / "endpoints.txt", line + "\n", "endpoint list")
    doc = launcher.describe()
    write_json_atomic(out / "launch.json", doc | {"stopped": False})
    table = Table(title=f"{len(launcher.endpoints)} replica(s) of {launcher.config.model}")
    for i, col in enumerate(("replica", "pool", "url", "cores/gpus", "pid", "start-up s", "pool flags")):
        table.add_column(col, justify="left" if i in (1, 2, 6) else "right")
    for r in doc["replicas"]:
        table.add_row(str(r["index"]), r["pool"], r.get("url", "-"), r.get("place") or "-",
                      str(r.get("pid") or "-"), fmt(r["boot_s"]), " ".join(r["flags"]) or "-")
    err.print(table)
    if endpoint_line:
        print(line, flush=True)
    err.print(f"endpoints in {out / 'endpoints.txt'} (rollout --endpoints $(cat {out / 'endpoints.txt'})); "
              "Ctrl-C stops every replica")
    end = None if duration is None else time.monotonic() + duration
    while end is None or time.monotonic() < end:
        events = launcher.drain_events()
        for ev in events:  # a replica died / is restarting / is back: the others keep serving
            err.print(ev, markup=False, highlight=False)
        if events:
            write_json_atomic(out / "launch.json", launcher.describe() | {"stopped": False})
        lost = launcher.failure()
        if lost is not None:
            raise LaunchError(lost)
        time.sleep(0.5 if end is None else max(0.0, min(0.5, end - time.monotonic())))
    return 0
