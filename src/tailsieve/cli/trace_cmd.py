"""`tailsieve trace`: a past run's logs (verl rollout dumps, TRL completion logs, a plain JSONL of responses) to the
length trace `simulate`, `plan` and `analyze` read (`workloads.from_logs`); docs/integrations/verl.md and trl.md,
"Decide first"."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from tailsieve.cli._common import CliConsole, print_json
from tailsieve.cli.flags import add
from tailsieve.errors import ConfigError
from tailsieve.outputs import check_target, write_atomic
from tailsieve.workloads.from_logs import Counter, rows, write_csv


def register(sub: Any) -> None:
    """Add the `trace` command."""
    p = sub.add_parser("trace", help="turn a past run's logs (verl dumps, TRL completions, JSONL) into a length trace",
                       description="Read verl rollout dumps (trainer.rollout_data_dir), TRL completion logs "
                                   "(log_completions=True: OUTPUT_DIR/completions/*.parquet) or a JSONL of responses, "
                                   "and write the length trace (prompt_id, step, length) that simulate, plan and "
                                   "analyze read with --workload.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or folders of the run's logs")
    p.add_argument("--out", required=True, help="the trace CSV to write (then: tailsieve plan --workload OUT ...)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="the model's tokenizer folder (tokenizer.json), to count the tokens of responses logged as "
                        "text (verl and TRL log text)")
    add(p, "--json")
    p.set_defaults(func=run)


def load_counter(folder: str) -> Counter:
    """text → tokens with the tokenizer in `folder` (`tokenizer.json`, read by the `tokenizers` package)."""
    path = Path(folder)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"--tokenizer {folder}: no tokenizer.json there")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError("--tokenizer needs the tokenizers package, which transformers brings: "
                          "pip install -e '.[trl]'") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library raises its own exception type
        raise ConfigError(f"--tokenizer {folder}: not a readable tokenizer.json ({str(exc).splitlines()[0]})") from None

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    return count


def run(args: argparse.Namespace) -> int:
    """Read the logs, write the trace, print what it holds and the next command."""
    out = Path(args.out)
    check_target(out, "--out")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {args.out}: folder {out.parent} does not exist")
    count = load_counter(args.tokenizer) if args.tokenizer else None
    source, trace = rows([Path(p) for p in args.paths], count)
    write_atomic(out, write_csv(trace), "--out")
    lengths = np.array([r.length for r in trace], dtype=np.int64)
    doc = {"source": source.value, "out": str(out), "responses": len(trace),
           "prompts": len({r.prompt_id for r in trace}), "steps": len({r.step for r in trace}),
           "length_p50": float(np.percentile(lengths, 50)), "length_p90": float(np.percentile(lengths, 90)),
           "length_max": int(lengths.max()),
           "next": f"tailsieve plan --workload {out} --curve MODEL.json --replicas R --groups N --group-size G"}
    if args.json:
        print_json(doc)
        return 0
    CliConsole().print(
        f"{doc['responses']} responses of {doc['prompts']} prompts over {doc['steps']} steps ({source.value} logs) "
        f"written to {out}: length P50 {doc['length_p50']:.0f}, P90 {doc['length_p90']:.0f}, max "
        f"{doc['length_max']} tokens. Next, on your fleet: {doc['next']} (docs/profile.md)", highlight=False)
    return 0
