"""Write or check the golden decision traces (issue 40, build item 7): `tailsieve` on three workloads, one seed, 20
steps, (q, m, reason) per step. A change of the controller's behaviour shows as a diff of these files in review.

Usage (from the repository root):

    python scripts/golden_decisions.py           # rewrite tests/data/golden/decisions.json
    python scripts/golden_decisions.py --check   # exit 1 and name each trace that differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "data" / "golden" / "decisions.json"
# (workload, curve): isolation pays by far (rare cap hits: a leave, then the split held); pays with tool waits (an
# agent: moves of m on a flat optimum); pays a little on a steep MoE knee (video: a leave and a return)
CASES = (("rare-cap", "h100-llama3-8b"), ("agent-search", "h100-llama3-8b"), ("video-rl", "a100x4-mixtral-8x7b"))
POLICY, SEED, STEPS = "tailsieve", 0, 20


def traces() -> dict[str, list[list[Any]]]:
    """Per case 'workload/curve': [step, q, m, reason of the decision taken after it] for every step."""
    sys.path.insert(0, str(ROOT / "src"))
    from tailsieve.model.curve_names import load_curve
    from tailsieve.simulation.runs import SimConfig, run_policy
    from tailsieve.workloads import load_workload

    out: dict[str, list[list[Any]]] = {}
    for workload, curve in CASES:
        run = run_policy(POLICY, load_workload(workload), load_curve(curve), SimConfig(steps=STEPS, seed=SEED))
        out[f"{workload}/{curve}"] = [[s.step, s.q, s.m, s.decision.reason.value if s.decision else None]
                                      for s in run.steps]
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the traces, or with --check compare them with the file."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args(argv)
    now = traces()
    if not args.check:
        GOLDEN.write_text(json.dumps(now, indent=None, separators=(",", ":")).replace('],[', '],\n[') + "\n")
        print(f"wrote {GOLDEN.relative_to(ROOT)}")
        return 0
    saved = json.loads(GOLDEN.read_text())
    bad = [k for k in now if saved.get(k) != now[k]]
    for k in bad:
        print(f"golden decisions differ: {k}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
