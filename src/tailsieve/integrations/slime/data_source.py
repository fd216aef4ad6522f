"""`TailSieveDataSource`, slime's `--data-source-path` class: the dataset (slime's own `RolloutDataSourceWithBuffer`
when slime is importable, else a JSONL reader with the same contract) plus TailSieve's carry state, saved and
loaded together so a resumed job consumes each prompt exactly once.

The carry state (`CarryState`): the router and controller state after the last completed step, and the carry
list, i.e. every prompt group drawn from the dataset but not yet consumed (the groups cut last step, regenerated
from scratch first, and any over-provisioned draws waiting in the queue), by TailSieve draw index. It is written
as JSON (atomically) beside slime's own dataset state: `{save}/rollout/tailsieve_state_{rollout_id}.json`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailsieve.engines.rollout.state import control_from_json, control_to_json, router_from_json, router_to_json
from tailsieve.errors import TailSieveError
from tailsieve.inputs import excerpt, read_text
from tailsieve.integrations.slime.sample import sample_class, sample_from_dict, sample_to_dict
from tailsieve.integrations.slime.settings import STANDIN_REFUSED, SlimeIntegrationError, check_flags
from tailsieve.loop import LoopState
from tailsieve.outputs import OutputLock, write_atomic

__all__ = ["CarryState", "JsonlPromptSource", "TailSieveDataSource", "read_rows", "state_path"]

STATE_VERSION = 1


def state_path(folder: str, rollout_id: int) -> Path:
    """Where the carry state of `rollout_id` lives under a checkpoint folder."""
    return Path(folder) / "rollout" / f"tailsieve_state_{rollout_id}.json"


@dataclass
class CarryState:
    """TailSieve's state between slime rollouts (mutated by the rollout function after each complete step)."""

    loop: LoopState | None = None  # router + controller after the last completed step (None: before the first)
    carry: dict[int, list[Any]] = field(default_factory=dict)  # draw index → its group of prompt samples
    shape: dict[str, Any] = field(default_factory=dict)  # groups, group size, replicas the state was made for

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        loop = None if self.loop is None else {"router": router_to_json(self.loop.router),
                                               "control": control_to_json(self.loop.control)}
        carry = [[uid, [sample_to_dict(s) for s in group]] for uid, group in sorted(self.carry.items())]
        return {"version": STATE_VERSION, "shape": self.shape, "loop": loop, "carry": carry}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CarryState:
        """Inverse of `to_json`."""
        if obj.get("version") != STATE_VERSION:
            raise ValueError(f"version {excerpt(obj.get('version'))} is not {STATE_VERSION}")
        raw = obj.get("loop")
        loop = None if raw is None else LoopState(router_from_json(raw["router"]), control_from_json(raw["control"]))
        carry = {int(uid): [sample_from_dict(s) for s in group] for uid, group in obj["carry"]}
        return cls(loop, carry, dict(obj.get("shape") or {}))


def read_rows(path: Any) -> list[dict[str, Any]]:
    """The rows of a JSONL prompt file (one-line error when missing or malformed)."""
    if not path:
        raise SlimeIntegrationError("no prompts: set --prompt-data (JSONL)")
    lines = read_text(Path(str(path)), "prompt data", SlimeIntegrationError).splitlines()
    try:
        return [json.loads(line) for line in lines if line.strip()]
    except ValueError as exc:
        raise SlimeIntegrationError(f"prompt data {path}: {exc}") from None


class JsonlPromptSource:
    """slime's dataset contract without slime: prompts from `args.prompt_data` (JSONL, `args.input_key`,
    `args.label_key`; a `tokens` list is taken as the prompt's token ids), groups of `n_samples_per_prompt` copies,
    epochs in file order, a buffer for `add_samples`, and its position saved and loaded as JSON."""

    def __init__(self, args: Any, rows: list[dict[str, Any]] | None = None) -> None:
        check_flags(args, STANDIN_REFUSED)
        self.args = args
        self.rows = rows if rows is not None else read_rows(getattr(args, "prompt_data", None))
        self.offset = self.epoch = self.group_index = self.sample_index = 0
        self.buffer: list[list[Any]] = []

    def prompt_sample(self, row: dict[str, Any]) -> Any:
        """A prompt-only sample of one row."""
        key, label = getattr(self.args, "input_key", None) or "prompt", getattr(self.args, "label_key", None)
        out = sample_class()(prompt=row.get(key, ""), label=None if label is None else row.get(label))
        out.tokens = [int(t) for t in row.get("tokens") or []]
        out.metadata = dict(row.get("metadata") or {})
        return out

    def get_samples(self, n: int) -> list[list[Any]]:
        """n groups: the buffer first, then the dataset in order (wrapping to the next epoch)."""
        if not self.rows and len(self.buffer) < n:
            raise SlimeIntegrationError("the prompt data is empty")
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        while len(out) < n:
            if self.offset >= len(self.rows):
                self.offset, self.epoch = 0, self.epoch + 1
            base = self.prompt_sample(self.rows[self.offset])
            self.offset += 1
            group = []
            for _ in range(int(self.args.n_samples_per_prompt)):
                s = copy.deepcopy(base)
                s.group_index, s.index = self.group_index, self.sample_index
                self.sample_index += 1
                group.append(s)
            self.group_index += 1
            out.append(group)
        return out

    def add_samples(self, groups: list[list[Any]]) -> None:
        """Groups handed back (slime's partial rollouts) are served first by the next `get_samples`."""
        self.buffer.extend(groups)

    def state(self) -> dict[str, Any]:
        return {"offset": self.offset, "epoch": self.epoch, "group_index": self.group_index,
                "sample_index": self.sample_index, "buffer": [[sample_to_dict(s) for s in g] for g in self.buffer]}

    def restore(self, obj: dict[str, Any]) -> None:
        self.offset, self.epoch = int(obj["offset"]), int(obj["epoch"])
        self.group_index, self.sample_index = int(obj["group_index"]), int(obj["sample_index"])
        self.buffer = [[sample_from_dict(s) for s in g] for g in obj.get("buffer", [])]

    def save(self, rollout_id: int) -> None:
        """Saved inside the TailSieve state file (see `TailSieveDataSource.save`)."""

    def load(self, rollout_id: int | None = None) -> None:
        """Loaded from the TailSieve state file (see `TailSieveDataSource.load`)."""

    def __len__(self) -> int:
        return len(self.rows)


def _inner_source(args: Any) -> Any:
    """slime's `RolloutDataSourceWithBuffer` when slime is importable, else `JsonlPromptSource`."""
    try:
        from slime.rollout.data_source import RolloutDataSourceWithBuffer  # type: ignore[import-not-found]
    except ImportError:
        return JsonlPromptSource(args)
    return RolloutDataSourceWithBuffer(args)


class TailSieveDataSource:
    """slime's data source with TailSieve's carry state (`--data-source-path
    tailsieve.integrations.slime.TailSieveDataSource`); `source=` replaces the dataset (tests, custom loaders)."""

    def __init__(self, args: Any, source: Any = None) -> None:
        self.args = args
        self.source = source if source is not None else _inner_source(args)
        self.tailsieve = CarryState()
        self._lock: OutputLock | None = None  # on `{save}/rollout/`, from the first save on

    def get_samples(self, n: int) -> list[list[Any]]:
        """n fresh groups from the dataset (slime's contract); TailSieve draws its over-provisioned groups here."""
        return list(self.source.get_samples(n))

    def add_samples(self, groups: list[list[Any]]) -> None:
        """Hand groups back to the dataset's buffer (slime's contract)."""
        self.source.add_samples(groups)

    def save(self, rollout_id: int) -> None:
        """The dataset's own state (slime's file) and TailSieve's carry state, atomically, under `args.save`."""
        self.source.save(rollout_id)
        folder = getattr(self.args, "save", None)
        if not folder:
            return
        obj = self.tailsieve.to_json()
        if isinstance(self.source, JsonlPromptSource):
            obj["dataset"] = self.source.state()
        path = state_path(folder, rollout_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if self._lock is None:  # one job writes this folder's carry states (held for the job's life)
                self._lock = OutputLock(path.parent, "slime data source", folder=True, flag="--save").acquire()
            write_atomic(path, json.dumps(obj), "TailSieve state")
        except (OSError, TailSieveError, TypeError, ValueError) as exc:
            raise SlimeIntegrationError(f"cannot save the TailSieve state: {exc}") from None

    def load(self, rollout_id: int | None = None) -> None:
        """Restore what `save(rollout_id)` wrote under `args.load` (nothing to load: a fresh start)."""
        self.source.load(rollout_id)
        folder = getattr(self.args, "load", None)
        if not folder or rollout_id is None:
            return
        path = state_path(folder, rollout_id)
        if not path.exists():
            return
        text = read_text(path, "TailSieve state", SlimeIntegrationError)
        try:
            obj = json.loads(text)
            self.tailsieve = CarryState.from_json(obj)
            if isinstance(self.source, JsonlPromptSource) and "dataset" in obj:
                self.source.restore(obj["dataset"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SlimeIntegrationError(f"TailSieve state {path} is malformed: {exc}") from None

    def __len__(self) -> int:
        return len(self.source)
