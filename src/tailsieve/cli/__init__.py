"""Command-line interface: `tailsieve <command>`; each command lives in its own module with `register()`.

Only the command being run is imported (`build_parser(only=…)`): `tailsieve --help` and `--version` list the
commands from `SUMMARIES` and import none of them (no numpy, rich or aiohttp; bench/bench_startup.py measures it).
`tests/test_cli_common.py` checks that each summary equals the help its module registers."""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from tailsieve import __version__
from tailsieve.cli.streams import ascii_safe, broken_pipe
from tailsieve.cli.width import say
from tailsieve.errors import Interrupted, TailSieveError
from tailsieve.redact import line as shown_line

ERROR_LINE_CHARS = 1000  # the longest error line of a command's own (argparse's: `redact.LINE_CHARS`, 300)
# One module per command; each exposes `register(subparsers)` that sets `func(args) -> int` on its parser.
COMMANDS: tuple[str, ...] = (
    "tailsieve.cli.curves_cmd",
    "tailsieve.cli.workloads_cmd",
    "tailsieve.cli.analyze_cmd",
    "tailsieve.cli.trace_cmd",
    "tailsieve.cli.route_cmd",
    "tailsieve.cli.simulate_cmd",
    "tailsieve.cli.plan_cmd",
    "tailsieve.cli.oracle_cmd",
    "tailsieve.cli.profile_cmd",
    "tailsieve.cli.rollout_cmd",
    "tailsieve.cli.launch_cmd",
)
# Each command's one-line help, for `tailsieve --help` without importing the command modules.
SUMMARIES: dict[str, str] = {
    "curves": "list built-in TPOT curves (or show one curve or file)",
    "workloads": "list bundled workloads (traces and synthetic generators)",
    "trace": "turn a past run's logs (verl dumps, TRL completions, JSONL) into a length trace",
    "analyze": "App. B analyses of a trace or workload: stats, tail AUC, variance shares",
    "route": "known-length routing baselines per trace step: makespan and speedup",
    "simulate": "simulate every routing policy on one prompt stream: step time, speedup, q/m, bias",
    "plan": "will TailSieve pay on this fleet? best static (q, m), the controller's speedup, the bias",
    "oracle": "exact two-lane routing optimum with known lengths vs best-k isolation and uniform (App. A.4)",
    "profile": "measure a live server's TPOT curve (feeds simulate, rollout, the controller)",
    "rollout": "run rollout steps on real vLLM/SGLang replicas with a routing policy",
    "launch": "start local vLLM (or SGLang, --kind) replicas with per-pool flags; print their endpoints",
}


class CliParser(argparse.ArgumentParser):
    """argparse with errors as exactly one line `tailsieve CMD: error: …` (no usage block) and exit status 2; every
    command's parser is one (`add_subparsers` makes the subparsers of the parser's own class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--m` is never `--model`, `--q` never `--q0` (cli/flags.py)
        super().__init__(*args, **kwargs)
        # `type=int` / `type=float` read ASCII digits only, bounded before conversion, and quote a bad value as an
        # excerpt (argparse's own message would echo it whole: issue 49)
        self.register("type", int, _flag_int)
        self.register("type", float, _flag_float)

    def error(self, message: str) -> NoReturn:
        """Print one line (redacted, control characters escaped, at most `redact.LINE_CHARS` characters; wrapped
        within 120 columns on a terminal) and exit 2."""
        head = f"{self.prog}: error: "
        say(head + shown_line(" ".join(str(message).split()), prefix=head))
        raise SystemExit(2)


def _flag_int(text: str) -> int:
    """argparse's `type=int`: ASCII digits only, bounded before conversion (`inputs.ascii_int`)."""
    from tailsieve.inputs import ascii_int, excerpt

    try:
        return ascii_int(text, "value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {excerpt(text)}") from None


def _flag_float(text: str) -> float:
    """argparse's `type=float`: a number written in ASCII (`inputs.ascii_float`)."""
    from tailsieve.inputs import ascii_float, excerpt

    try:
        return ascii_float(text, "value")
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {excerpt(text)}") from None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser: every command registered (`only=None`), or just `only` (the others, and all of them
    for `only=""`, as name-and-help placeholders that import nothing)."""
    parser = CliParser(
        prog="tailsieve",
        description="Partial-rollout-guided tail routing for synchronous LLM rollouts.",
    )
    parser.add_argument("--version", action="version", version=f"tailsieve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        name = module.rsplit(".", 1)[1].removesuffix("_cmd")
        if only is None or name == only:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=SUMMARIES[name], add_help=False)
    return parser


class SigintSeen:
    """Whether a Ctrl-C reached the process while a command ran (`interrupt_signals`)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


@contextlib.contextmanager
def interrupt_signals() -> Iterator[SigintSeen]:
    """SIGTERM and SIGHUP raise `Interrupted` (a KeyboardInterrupt naming the signal) from here on, so that every
    command, from its first line, ends on them with one line and 128 + the signal's number (`main`); the previous
    handlers come back at the end. A Ctrl-C still raises KeyboardInterrupt and is also noted in the yielded
    `SigintSeen`: a C extension that runs Python's signal handler and then drops or replaces its exception (seen in
    numpy) cannot lose it (`main`). SIGINT left ignored (`nohup`) stays ignored. Only in the main thread (the one place
    Python delivers signals)."""
    watch = SigintSeen()
    if threading.current_thread() is not threading.main_thread():
        yield watch
        return

    def handler(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    def on_sigint(signum: int, frame: object) -> None:
        watch.seen = True
        raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        old[signal.SIGINT] = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield watch
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def interrupted_line(command: str, exc: KeyboardInterrupt) -> int:
    """Print `tailsieve CMD: interrupted[ by SIG…][; note]` and return 128 + the signal's number."""
    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    how = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
    note = f"; {exc.note}" if isinstance(exc, Interrupted) and exc.note else ""
    say(f"tailsieve{' ' + command if command else ''}: interrupted{how}{note}")
    return 128 + signum


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; user errors print one line to stderr and return a non-zero exit code; SIGTERM, SIGHUP and
    Ctrl-C, from the first line on, one line and 128 + the signal's number."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    watch = SigintSeen()
    try:
        with interrupt_signals() as watch:
            rc = _main(argv, command, watch)
    except KeyboardInterrupt as exc:  # before the command ran (its own handler below says the rest)
        return interrupted_line(command if command in SUMMARIES else "", exc)
    except Exception:  # while the command's modules load: Python 3.11 wraps a Ctrl-C raised in a class's
        if watch.seen:  # `__set_name__` (a dataclass field) in RuntimeError; the interrupt is the cause
            return interrupted_line(command if command in SUMMARIES else "", KeyboardInterrupt())
        raise
    if watch.seen and rc != 128 + signal.SIGINT:  # a Ctrl-C whose exception a library dropped: still an interrupt
        return interrupted_line(command if command in SUMMARIES else "", KeyboardInterrupt())
    return rc


def _main(argv: list[str], command: str, watch: SigintSeen) -> int:
    """`main` inside its signal handlers."""
    ascii_safe()
    parser = build_parser(only=command)
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the command's own parser, so the line names the command
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        owner = sub.choices.get(args.command, parser) if args.command else parser
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = int(args.func(args))
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's final flush
    except BrokenPipeError:
        return broken_pipe()
    except KeyboardInterrupt as exc:  # Ctrl-C, or a signal turned into `Interrupted`: 128 + its number
        return interrupted_line(args.command, exc)
    except SystemExit as exc:  # a plugin's exit() is its failure; the CLI's own exits (argparse) pass
        if (who := _blame(exc)) is None:
            raise
        _error_line(args.command, who)
        return 1
    except Exception as exc:
        if watch.seen:  # a Ctrl-C that a library turned into another error: the interrupt is the cause
            return interrupted_line(args.command, KeyboardInterrupt())
        return _failed(args.command, exc)
    finally:
        warnings = _take_warnings()  # dropped after an error: its one line stays alone
    if watch.seen:  # a Ctrl-C whose exception a library dropped: `main` says it, without the warnings
        return rc
    for line in warnings if rc == 0 else ():
        say(line)
    return rc


def _take_warnings() -> list[str]:
    """The warnings the command noted (`cli._common.take_warnings`)."""
    from tailsieve.cli._common import take_warnings

    return take_warnings()


def _failed(command: str, exc: Exception) -> int:
    """Report an exception of a command as one line (see `_error_line`); 1. Raised inside a plugin's code: the line
    names the plugin (`registry.blame`); a bug of TailSieve's own: `internal error` (TAILSIEVE_DEBUG=1 re-raises)."""
    if (who := _blame(exc)) is not None:
        _error_line(command, who)
    elif isinstance(exc, TailSieveError | ValueError | OSError | OverflowError | RecursionError | MemoryError
                    | csv.Error):
        _error_line(command, exc)
    else:
        if os.environ.get("TAILSIEVE_DEBUG"):
            raise exc
        _error_line(command, exc, internal=True)
    return 1


def _blame(exc: BaseException) -> str | None:
    """`registry.blame` (imported here, so that `--help` loads no registry), None for a `PluginError`, whose
    message already names the plugin."""
    from tailsieve.registry import PluginError, blame

    return None if isinstance(exc, PluginError) else blame(exc)


def _error_line(command: str, exc: BaseException | str, *, internal: bool = False) -> None:
    """`tailsieve CMD: error: …`, the exception's first line (its type when it has no message)."""
    text = str(exc).strip()
    head = f"tailsieve {command}: error: "
    if internal or isinstance(exc, OverflowError | RecursionError | MemoryError | csv.Error):
        head += f"{'internal error: ' if internal else ''}{type(exc).__name__}: "
    # our own messages quote user content as excerpts already; this guard only stops a runaway line
    msg = shown_line(text, ERROR_LINE_CHARS, prefix=head) if text else type(exc).__name__
    say(f"{head}{msg}")
