"""Start-up cost of the command line: CPU seconds of `tailsieve --help` and `tailsieve --version` (issue 27: under
0.3 s; 0.85 s before the lazy imports).

    python bench/bench_startup.py [--repeat 7]

Each command runs `--repeat` times as `python -m tailsieve …` in a fresh interpreter (this checkout's sources);
the figure is the median of the children's user + system CPU seconds (`resource.getrusage(RUSAGE_CHILDREN)`), so
another job on the machine changes it less than wall time. A benchmark, not a test: it asserts nothing and exits 0.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.3
COMMANDS = (["--help"], ["--version"], ["simulate", "--help"])


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU seconds of one `python -m tailsieve ARGV` run."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "tailsieve", *argv], env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs per command (default: %(default)s)")
    args = ap.parse_args()
    baseline = statistics.median(cpu_seconds_of(["-c", "pass"]) for _ in range(args.repeat))
    print(f"python -c pass (interpreter alone): {baseline:.3f} CPU-s")
    for argv in COMMANDS:
        runs = [cpu_seconds(argv) for _ in range(args.repeat)]
        med = statistics.median(runs)
        mark = "" if argv[0] != "--help" and argv[0] != "--version" else (
            f"  (target < {TARGET_S} s: {'met' if med < TARGET_S else 'NOT met'})")
        print(f"tailsieve {' '.join(argv)}: {med:.3f} CPU-s median of {len(runs)} "
              f"(min {min(runs):.3f}, max {max(runs):.3f}){mark}")
    return 0


def cpu_seconds_of(python_args: list[str]) -> float:
    """User + system CPU seconds of one `python PYTHON_ARGS` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *python_args], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


if __name__ == "__main__":
    raise SystemExit(main())
