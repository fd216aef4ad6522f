"""The prompt stream the router draws from (§3.1): a deterministic, optionally shuffled, epoch-counting order.

Pure and trace-free: the router imports this module, never the trace loaders of `tailsieve.workloads`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailsieve.errors import ConfigError
from tailsieve.inputs import MAX_INT, int_in, json_object, one_of

_TAG_SHUFFLE = 22


@dataclass(frozen=True, slots=True)
class PromptRef:
    """One draw from the prompt stream."""

    index: int
    prompt_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class StreamState:
    """Everything needed to resume a `PromptStream` (with the same prompt list)."""

    position: int
    shuffle: bool
    seed: int
    n_prompts: int

    def to_json(self) -> dict[str, Any]:
        """Plain dict for checkpoints."""
        return {"position": self.position, "shuffle": self.shuffle, "seed": self.seed, "n_prompts": self.n_prompts}

    @classmethod
    def from_json(cls, obj: Any, where: str = "stream") -> StreamState:
        """Inverse of `to_json`, field by field: non-negative integers (at least one prompt) and a boolean; a
        ConfigError naming the field otherwise."""
        d = json_object(obj, where, ("position", "shuffle", "seed", "n_prompts"))
        position, seed = (int_in(d[k], f"{where}.{k}", 0, MAX_INT) for k in ("position", "seed"))
        return cls(position, one_of(d["shuffle"], f"{where}.shuffle", (False, True)), seed,
                   int_in(d["n_prompts"], f"{where}.n_prompts", 1, MAX_INT))


class PromptStream:
    """Cycles over the prompts, epoch after epoch; with `shuffle`, epoch e uses a permutation seeded by (seed, e)."""

    __slots__ = ("_cache", "_position", "_prompts", "seed", "shuffle")

    def __init__(self, prompts: Sequence[str], *, shuffle: bool = False, seed: int = 0) -> None:
        if len(prompts) == 0:
            raise ConfigError("prompt stream needs at least one prompt")
        if seed < 0:
            raise ConfigError(f"prompt stream seed must be >= 0, got {seed}")
        self._prompts = tuple(prompts)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self._position = 0
        self._cache: dict[int, NDArray[np.int64]] = {}

    @property
    def position(self) -> int:
        """Number of prompts drawn so far (the index of the next `PromptRef`)."""
        return self._position

    @property
    def epoch(self) -> int:
        """Epoch of the next prompt (0-based)."""
        return self._position // len(self._prompts)

    @property
    def prompts(self) -> tuple[str, ...]:
        """The prompt list in base order."""
        return self._prompts

    def _order(self, epoch: int) -> NDArray[np.int64]:
        n = len(self._prompts)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        if epoch not in self._cache:
            if len(self._cache) > 4:
                self._cache.clear()
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, _TAG_SHUFFLE, epoch]))
            self._cache[epoch] = rng.permutation(n).astype(np.int64)
        return self._cache[epoch]

    def take(self, k: int) -> list[PromptRef]:
        """The next k prompts, advancing the stream."""
        if k < 0:
            raise ConfigError(f"take needs k >= 0, got {k}")
        n = len(self._prompts)
        out: list[PromptRef] = []
        pos = self._position
        end = pos + k
        while pos < end:
            epoch, off = divmod(pos, n)
            stop = min(end - pos, n - off)
            prompts = self._prompts
            order: list[int] = self._order(epoch)[off : off + stop].tolist()
            out.extend([PromptRef(pos + j, prompts[o], epoch) for j, o in enumerate(order)])
            pos += stop
        self._position = end
        return out

    def prompt_at(self, index: int) -> str:
        """The prompt id the stream draws at position `index` (any position, drawn or not; the stream does not move)."""
        epoch, off = divmod(index, len(self._prompts))
        return self._prompts[int(self._order(epoch)[off])]

    def state(self) -> StreamState:
        """A snapshot for save/restore."""
        return StreamState(self._position, self.shuffle, self.seed, len(self._prompts))

    @classmethod
    def from_state(cls, prompts: Sequence[str], state: StreamState) -> PromptStream:
        """Resume a stream from `state` over the same prompt list."""
        if len(prompts) != state.n_prompts:
            raise ConfigError(f"stream state is for {state.n_prompts} prompts, got {len(prompts)}")
        if state.position < 0:
            raise ConfigError(f"stream state position must be >= 0, got {state.position}")
        s = cls(prompts, shuffle=state.shuffle, seed=state.seed)
        s._position = state.position
        return s
