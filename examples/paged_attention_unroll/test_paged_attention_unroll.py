"""Unrolled paged attention (four tasks per group of up to 64 blocks) as a scene test of this
repository.

The workload (kernels, orchestration, fixtures, golden, cases) ships with the package as
:mod:`simpler.workloads.paged_attention_unroll`, so ``simpler bench`` runs it from any install; this
file makes it a scene test here: ``pytest examples --simpler-platform sim --simpler-rounds 3``
runs its small cases in the three residency arms, and ``--simpler-manual include`` adds upstream's
``Case1`` and ``Case2``.
"""

from __future__ import annotations

import numpy as np

import simpler as sp
from simpler.workloads import paged_attention_unroll as pu


@sp.scene_test(level=2)
class TestPagedAttentionUnroll(pu.PagedAttentionUnroll):
    """The shipped unrolled paged attention: three residency arms per case."""


if __name__ == "__main__":
    sp.main()


def test_tasks_per_round_of_upstreams_cases():
    """Case1: 256 sequences x one group x four tasks; Case2: 64 sequences x two groups x four."""
    params = dict(pu._MANUAL)
    case1, case2 = pu.shape_of(params["Case1"]), pu.shape_of(params["Case2"])
    assert pu.tasks_per_round(case1["context_lens"], 128, 16) == 1024
    assert pu.tasks_per_round(case2["context_lens"], 64, 64) == 512


def test_groups_cut_at_64_blocks_and_chain_per_sequence():
    """A sequence of 75 blocks is two groups (64 + 11); its updates copy, then rescale and write."""
    plan = pu.plan_groups(np.array([150, 0, 2]), block_size=2, n_heads=4)
    assert plan["batch"].tolist() == [0, 2, 0]  # position by position
    assert plan["n"].tolist() == [64, 1, 11]
    assert plan["valid_last"].tolist() == [2, 2, 2]
    assert plan["first"].tolist() == [1, 1, 0] and plan["last"].tolist() == [0, 1, 1]


def test_waves_reuse_scratch_and_submit_in_batches():
    """Case-sized scratch stays within the budget: a wave is a power of two of groups."""
    assert pu.wave_groups(16, 128, 64, 256) == 64  # Case1: 4 waves of 64 groups
    assert pu.wave_groups(64, 64, 64, 128) == 32  # Case2: 4 waves of 32
    params = dict(pu._BASES)["CaseTwoGroups"]
    x = pu.make_inputs(params)
    names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
    with sp.Worker("sim") as w:
        r = w.run(pu.CALLABLE, [*(x[n] for n in names), x["out"], x["scale"]])
    golden = pu.golden_paged_attention(*(x[n] for n in names), x["scale"])
    np.testing.assert_allclose(x["out"], golden, rtol=1e-3, atol=1e-3)
    assert r.counters["tasks"] == pu.tasks_per_round(x["context_lens"], 2, 4) == 4 * 6
    assert r.counters["submits"] < r.counters["tasks"] and r.counters["orch_reads"] == 1
