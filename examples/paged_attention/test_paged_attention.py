"""Paged attention as a scene test of this repository.

The workload itself (kernels, orchestration, fixtures, golden model, cases) ships with the package
as :mod:`simpler.workloads.paged_attention`, so ``simpler bench paged_attention`` runs from any
install; this file makes it a scene test here: under pytest (``pytest examples
--simpler-platform sim --simpler-rounds 3``) or standalone
(``python examples/paged_attention/test_paged_attention.py -p sim --rounds 3``).
"""

from __future__ import annotations

import numpy as np

import simpler as sp
from simpler.workloads import paged_attention as pa


@sp.scene_test(level=2)
class TestPagedAttention(pa.PagedAttention):
    """The shipped paged attention: three residency arms per case."""


if __name__ == "__main__":
    sp.main()


def test_batched_and_per_task_orchestrations_agree():
    """The batched orchestration and the per-task one submit the same tasks and agree exactly."""
    params = dict(pa._BASES[1][1], arm="Residency_all")
    results = []
    names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
    for callable in (pa.CALLABLE, pa.CALLABLE_PER_TASK):
        x = pa.make_inputs(params)
        with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
            args = [res.add(n, x[n]) for n in names]
            r = w.run(callable, [*args, x["out"], x["scale"]])
        results.append((x["out"], r.counters))
    (out_b, c_b), (out_t, c_t) = results
    np.testing.assert_array_equal(out_b, out_t)
    golden = pa.golden_paged_attention(*(x[n] for n in names), x["scale"])
    np.testing.assert_allclose(out_b, golden, rtol=1e-3, atol=1e-3)
    assert c_b["tasks"] == c_t["tasks"] == 4 * sum(-(-c // 8) for c in params["context_lens"]) + 3
    assert c_b["submits"] < 10 < c_t["submits"] == c_t["tasks"]
    assert c_b["orch_reads"] == 2 and c_t["orch_reads"] == 3 + sum(-(-c // 8) for c in params["context_lens"])
