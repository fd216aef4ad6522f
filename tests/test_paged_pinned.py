"""The paged engine's outputs pinned on seeded, realistically sized configurations (KV-bound with preemption storms,
prefix caching on and off, chunked prefill and prefill stalls, a cut, uneven drifting replicas through a whole
policy run): the event loop may be restructured for speed, its results may not move. The values were recorded from
the straightforward event loop of commit 0cdd720 (before the issue-48 speed work); the prefix-caching cases were
pinned again when the free queue became vLLM's (a preempted request's hashed blocks cached, prefix hits counted on
first admissions only), with the cases without prefix caching unchanged to the bit. The exact-against-brute-force
tests stay in tests/test_paged.py."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from tailsieve.model.curve_names import load_curve
from tailsieve.model.engine import FleetSpeed
from tailsieve.policy.router import RouterConfig
from tailsieve.simulation.replica import ReplicaConfig, ReplicaRun, resume_replica, run_replica
from tailsieve.simulation.runs import SimConfig, run_policy
from tailsieve.workloads import load_workload

pytestmark = pytest.mark.usefixtures("paged_engine")  # every test on both engines (conftest.py)

CURVE = "h100-llama3-8b"


def _requests(seed: int, n: int, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lognormal lengths (median ≈ 2 K, capped at 16 K), one prompt per group of `group` requests."""
    rng = np.random.default_rng(seed)
    lens = np.minimum(rng.lognormal(7.6, 0.9, n).astype(np.int64), 16_384)
    lens[rng.random(n) < 0.03] = 0
    prompts = np.repeat(rng.integers(20, 1_500, -(-n // group)), group)[:n]
    keys = np.repeat(np.arange(-(-n // group)), group)[:n]
    return lens, prompts, keys


CASES: dict[str, tuple[int, int, int, ReplicaConfig]] = {  # seed, requests, group size, config
    "kv-prefix-chunked": (1, 160, 8, ReplicaConfig(kv_tokens=150_000, prefix_caching=True, max_num_batched_tokens=8192,
                                                   prefill_ms_per_token=0.02)),
    "kv-tight-stall": (2, 96, 4, ReplicaConfig(kv_tokens=40_000, prefill_ms_per_token=0.05, kv_ms_per_1k_tokens=0.3)),
    "kv-prefix-cap": (3, 128, 16, ReplicaConfig(kv_tokens=60_000, prefix_caching=True, max_num_seqs=48, block_size=32,
                                                prefill_ms_per_token=0.01)),
    "chunked-small-budget": (4, 120, 8, ReplicaConfig(kv_tokens=90_000, max_num_batched_tokens=700,
                                                      prefill_ms_per_token=0.03, kv_ms_per_1k_tokens=0.1)),
    "prefix-unbounded": (5, 64, 8, ReplicaConfig(prefix_caching=True, max_num_batched_tokens=2048,
                                                 prefill_ms_per_token=0.02)),
}


def fingerprint(run: ReplicaRun) -> tuple[str, float, int, int, int, int]:
    """(sha-256 of every array of the run, makespan, preemptions, recomputed tokens, prefix-hit tokens, segments)."""
    h = hashlib.sha256()
    tr = run.paged
    assert tr is not None
    for a in (run.finish_s, run.start_iter, run.seg_k0, run.seg_t0, run.seg_n, run.seg_base, run.seg_inc, tr.spans,
              tr.preempt_k, tr.recompute, tr.hits):
        h.update(np.ascontiguousarray(a).tobytes())
    return (h.hexdigest()[:16], run.makespan, *run.counts(), int(run.seg_n.size))


PINNED = {
    'chunked-small-budget': ('ccce0fb5c565add9', 347.37835574791666, 223, 295057, 0, 1043),
    'kv-prefix-cap': ('04d8054d62bd92ac', 284.55926966874983, 377, 162426, 83520, 791),
    'kv-prefix-chunked': ('15f9991790b53548', 194.73010726041662, 51, 58612, 62512, 293),
    'kv-tight-stall': ('4f31659b9697749c', 573.4948061854167, 183, 251286, 0, 460),
    'prefix-unbounded': ('dc4fa20f9b762696', 152.87239888124998, 0, 0, 36976, 65),
}

PINNED_CUT = {
    'chunked-small-budget': ('3bd4fe3a4309aa2e', 8689.086697100003),
    'kv-prefix-cap': ('c3aabed01816d3a7', 7349.1046443020805),
    'kv-prefix-chunked': ('07d1ae0054cc6362', 6779.509619279163),
    'kv-tight-stall': ('173f2c710bdb9992', 11428.901009724996),
    'prefix-unbounded': ('2119211878269308', 1595.130548277083),
}

PINNED_POLICY = {
    'tailsieve': [
        (375.03641057550635, 832, 1445052, 85680),
        (240.36024501141938, 28, 67848, 10192),
        (112.2890342414363, 160, 183148, 0),
        (160.8162307971798, 632, 723326, 0)],
    'uniform': [
        (375.03641057550635, 832, 1445052, 85680),
        (240.36024501141938, 28, 67848, 10192),
        (118.4509327929539, 198, 325361, 37296),
        (223.739164446104, 516, 781579, 91280)],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_paged_run_is_pinned(name: str) -> None:
    seed, n, group, cfg = CASES[name]
    lens, prompts, keys = _requests(seed, n, group)
    run = run_replica(lens, load_curve(CURVE), cfg, prompts, prefix_keys=keys)
    assert fingerprint(run) == PINNED[name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_paged_cut_is_pinned(name: str) -> None:
    seed, n, group, cfg = CASES[name]
    lens, prompts, keys = _requests(seed, n, group)
    curve = load_curve(CURVE)
    run = run_replica(lens, curve, cfg, prompts, prefix_keys=keys)
    keep = np.random.default_rng(seed).random(n) < 0.5
    out = resume_replica(run, keep, run.makespan * 0.4, curve, cfg, prompts)
    assert (hashlib.sha256(out.tobytes()).hexdigest()[:16], float(out[np.isfinite(out)].sum())) == PINNED_CUT[name]


@pytest.mark.parametrize("policy", ["uniform", "tailsieve"])
def test_policy_run_on_uneven_paged_fleet_is_pinned(policy: str) -> None:
    """A whole run on a KV-bound paged fleet, 10% uneven replicas drifting 5% a step: step makespans and counts."""
    cfg = SimConfig(router=RouterConfig(groups=64, group_size=8, replicas=8), steps=4,
                    replica=replace(CASES["kv-prefix-chunked"][3], kv_tokens=60_000),
                    speed=FleetSpeed(spread=0.1, drift=0.05))
    run = run_policy(policy, load_workload("kodcode-r1", mode="resample"), load_curve(CURVE), cfg)
    got = [(s.makespan_s, s.preemptions, s.recomputed_tokens, s.prefix_hit_tokens) for s in run.steps]
    assert got == PINNED_POLICY[policy]
