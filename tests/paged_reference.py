"""The brute-force reference of the paged replica (`model.paged`, docs/simulator.md) that tests/test_paged.py
checks it against: one scheduling step per iteration, every KV block by its id in one free queue as vLLM v1's
`BlockPool` keeps it (unhashed blocks prepended, hashed ones appended in reverse order of their request, a hit found
by walking the chain of block hashes)."""

from __future__ import annotations

from tailsieve.model.curves import TpotCurve
from tailsieve.simulation.replica import ReplicaConfig

Hash = tuple[object, ...]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def reference(lens: list[int], prompts: list[int], keys: list[int], curve: TpotCurve, cfg: ReplicaConfig,
              cut: tuple[int, list[bool]] | None = None) -> dict[str, object]:
    """Finish times, engine counts and the tokens of every request at every iteration boundary."""
    return Reference(lens, prompts, keys, curve, cfg).run(cut)


class Blocks:
    """Every block by its id: the free queue (head first) and the hashes of the cached ones."""

    def __init__(self, nb: int) -> None:
        self.queue = list(range(nb))
        self.tag: dict[int, Hash] = {}  # block id → its hash (only hashed blocks)
        self.where: dict[Hash, int] = {}  # hash → block id

    def retag(self, b: int, h: Hash | None) -> None:
        old = self.tag.pop(b, None)
        if old is not None and self.where.get(old) == b:
            del self.where[old]
        if h is not None:
            self.tag[b], self.where[h] = h, b

    def pop(self, count: int) -> list[int]:
        """Allocate from the head, evicting what is taken."""
        out = self.queue[:count]
        del self.queue[:count]
        for b in out:
            self.retag(b, None)
        return out

    def chain(self, hashes: list[Hash]) -> list[int]:
        """The free blocks of the longest cached prefix of `hashes`."""
        out = []
        for h in hashes:
            b = self.where.get(h)
            if b is None or b not in self.queue:
                break
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        """Cached blocks a hit takes out of the free queue."""
        for b in blocks:
            self.queue.remove(b)


class Reference:
    """One replica's requests, run iteration by iteration (`run`)."""

    def __init__(self, lens: list[int], prompts: list[int], keys: list[int], curve: TpotCurve,
                 cfg: ReplicaConfig) -> None:
        n, bs = len(lens), cfg.block_size
        need_all = sum(ceil_div(p + max(x, 1), bs) for p, x in zip(prompts, lens, strict=True))
        self.blocks = Blocks(10 * need_all + 100 if cfg.kv_tokens is None else cfg.kv_tokens // bs)
        self.lens, self.prompts, self.keys, self.curve, self.cfg, self.bs = lens, prompts, keys, curve, cfg, bs
        self.cap = n if cfg.max_num_seqs is None else cfg.max_num_seqs
        self.m = cfg.max_num_batched_tokens
        self.share = [((p - 1) // bs if cfg.prefix_caching and key >= 0 and p > 0 else 0)
                      for p, key in zip(prompts, keys, strict=True)]
        self.gen, self.pending, self.epoch = [0] * n, [0] * n, [0] * n  # epoch: hashed anew at each preemption
        self.own: list[list[int]] = [[] for _ in range(n)]  # private block ids, in sequence order
        self.uses, self.again = [False] * n, [False] * n
        self.phase = ["wait"] * n
        self.finish = [float("inf")] * n
        self.prompt_of: dict[int, list[int]] = {}  # prompt key → its blocks while a running request holds it
        self.refs: dict[int, int] = {}
        self.dead = 0
        self.waiting: list[int] = []
        for i in range(n):
            if lens[i] == 0 and self.m is not None:
                self.finish[i], self.phase[i] = 0.0, "done"
            else:
                self.waiting.append(i)
        self.running: list[int] = []
        self.counts = {"preemptions": 0, "recomputed": 0, "hits": 0}
        self.history: list[tuple[float, list[int]]] = [(0.0, [0] * n)]
        self.t, self.k = 0.0, 0

    def run(self, cut: tuple[int, list[bool]] | None) -> dict[str, object]:
        """Iterations until every request left; with `cut`, the requests not kept leave at iteration cut[0]."""
        while True:
            if cut is not None and self.k == cut[0]:
                self.abort(cut[1])
            preempted = self.allocate()
            empty = [] if preempted else self.admit()
            for i in empty:
                self.finish[i] = self.t
            if not self.running:
                assert not self.waiting
                break
            self.iterate()
            if not self.running and not self.waiting:
                break
        return {"finish": self.finish, "counts": self.counts, "history": self.history}

    def release(self, i: int, preempted: bool) -> None:
        """Request i's blocks back to the free queue: unhashed ones to the head, hashed ones to the tail (its last
        first), then its prompt prefix's if it was the last holding them."""
        b_ = self.blocks
        s = self.share[i] if self.uses[i] else 0
        computed = self.prompts[i] + self.gen[i] - (self.pending[i] if self.phase[i] == "prefill" else 1)
        hashed = min(max(computed // self.bs - s, 0), len(self.own[i]))
        if preempted:
            self.epoch[i] += 1
        for j, b in enumerate(self.own[i]):
            if j >= hashed or not self.cfg.prefix_caching:
                b_.retag(b, None)
            elif preempted:
                b_.retag(b, ("r", i, self.epoch[i], s + j))
            else:
                self.dead += 1
                b_.retag(b, ("dead", self.dead))
        last: list[int] = []
        for b in reversed(self.own[i]):
            if b in b_.tag:
                last.append(b)
            else:
                b_.queue.insert(0, b)
        if self.uses[i]:
            key = self.keys[i]
            self.refs[key] -= 1
            if self.refs[key] == 0:
                del self.refs[key]
                last.extend(reversed(self.prompt_of.pop(key)))
            self.uses[i] = False
        b_.queue.extend(last)
        self.own[i] = []

    def abort(self, keep: list[bool]) -> None:
        for i in list(self.running):
            if not keep[i]:
                self.release(i, False)
                self.running.remove(i)
                self.phase[i] = "done"
        self.waiting = [i for i in self.waiting if keep[i]]

    def allocate(self) -> bool:
        """Every decoder its next block, in admission order, preempting the newest when the queue is empty."""
        preempted = False
        for i in list(self.running):
            if self.phase[i] != "decode":
                continue
            held = len(self.own[i]) + (self.share[i] if self.uses[i] else 0)
            need = ceil_div(self.prompts[i] + self.gen[i] + 1, self.bs) - held
            if need <= 0:
                continue
            while len(self.blocks.queue) < need:
                v = self.running.pop()
                self.release(v, True)
                self.phase[v], self.pending[v], self.again[v] = "wait", 0, True
                self.waiting.insert(0, v)
                self.counts["preemptions"] += 1
                preempted = True
                if v == i:
                    return True
            self.own[i].extend(self.blocks.pop(need))
        return preempted

    def admit(self) -> list[int]:
        """FCFS admission while blocks, the seq cap and the token budget allow; the requests with nothing to
        decode (they leave once the prefill stall is paid)."""
        m, empty, stall = self.m, [], 0
        budget = 0 if m is None else sum(1 for i in self.running if self.phase[i] == "decode") + sum(
            self.pending[i] for i in self.running)
        while self.waiting and len(self.running) < self.cap and (m is None or budget < m):
            i = self.waiting[0]
            key, s = self.keys[i], self.share[i]
            total = ceil_div(self.prompts[i] + self.gen[i] + 1, self.bs)
            if total - (s if s and key in self.refs else 0) > len(self.blocks.queue):
                break
            self.waiting.pop(0)
            fill = self.admit_one(i, total)
            self.running.append(i)
            if m is None:
                stall += fill
                if self.gen[i] == self.lens[i]:  # nothing to decode: it leaves with its prefill computed
                    empty.append(i)
                    self.phase[i] = "prefill"
                    self.release(i, False)
                    self.running.remove(i)
                    self.phase[i] = "done"
                else:
                    self.phase[i] = "decode"
            else:
                self.phase[i], self.pending[i] = "prefill", fill
                budget += fill
        self.t += self.cfg.prefill_ms_per_token / 1e3 * stall
        return empty

    def admit_one(self, i: int, total: int) -> int:
        """Request i takes the longest cached prefix of its blocks (its group's prompt, then its own), allocates
        the rest; the tokens it prefills."""
        b_, key, s = self.blocks, self.keys[i], self.share[i]
        found: list[int] = []
        if s and key in self.refs:
            hit, fresh_prompt = s, 0
            self.refs[key] += 1
        elif s:
            found = b_.chain([("p", key, j) for j in range(s)])
            hit, fresh_prompt = len(found), s - len(found)
            b_.touch(found)
            self.refs[key] = 1
        else:
            hit = fresh_prompt = 0
        mine = []
        if self.again[i] and hit == s:
            mine = b_.chain([("r", i, self.epoch[i], j) for j in range(s, total)])
            b_.touch(mine)
        if s and fresh_prompt + hit == s and key not in self.prompt_of:
            blocks = found + b_.pop(fresh_prompt)
            for j, b in enumerate(blocks):
                b_.retag(b, ("p", key, j))
            self.prompt_of[key] = blocks
        self.own[i] = mine + b_.pop(total - s - len(mine))
        self.uses[i] = s > 0
        fill = self.prompts[i] + self.gen[i] - (hit + len(mine)) * self.bs
        if self.again[i]:
            self.counts["recomputed"] += fill
        else:
            self.counts["hits"] += hit * self.bs
        return fill

    def iterate(self) -> None:
        """One iteration: the decoders and the prefills it completes decode a token; the chunk's prefill cost."""
        running, phase, pending = self.running, self.phase, self.pending
        decoders = [i for i in running if phase[i] == "decode"]
        chunk, completing = 0, []
        if self.m is not None:
            rem = max(self.m - len(decoders), 0)
            for i in running:
                if phase[i] != "prefill" or rem <= 0:
                    continue
                step = min(rem, pending[i])
                rem -= step
                chunk += step
                pending[i] -= step
                if pending[i] == 0:
                    completing.append(i)
        batch = decoders + completing
        ctx = sum(self.prompts[i] + self.gen[i] for i in batch)
        cfg = self.cfg
        self.t += self.curve.tpot_s(len(batch)) + cfg.kv_ms_per_1k_tokens / 1e6 * ctx + \
            cfg.prefill_ms_per_token / 1e3 * chunk
        self.k += 1
        for i in batch:
            self.gen[i] += 1
            phase[i] = "decode"
        for i in [i for i in batch if self.gen[i] == self.lens[i]]:
            self.finish[i] = self.t
            self.release(i, False)
            running.remove(i)
            phase[i] = "done"
        self.history.append((self.t, list(self.gen)))
