"""Paged attention as the upstream runtime runs it: the unrolled graph, four tasks per group of blocks.

This is the workload every published figure this product is compared with was measured on:
upstream's ``paged_attention_unroll_manual_scope`` (hw-native-sys/simpler,
``examples/a2a3/tensormap_and_ringbuffer/``), written here from its description, not copied. It
ships beside the per-block graph (:mod:`simpler.workloads.paged_attention`, one task per KV
block per kernel), and the bench leads with it: ``simpler bench`` runs its ``Case1`` and
``Case2``.

The graph
---------
Per sequence (and tile of at most :data:`MAX_Q_TILE` query heads), the sequence's KV blocks are
cut into groups of up to :data:`GROUP_BLOCKS` (64) blocks, and each group is four tasks:

* **QK** (``qk``): the scores of the tile's query rows against every block of the group, read
  through the block table (the task views the group's slice of ``block_table`` and the whole
  key cache, as upstream's QK task does), into one tile per block;
* **softmax** (``softmax``): two passes over the whole group: one row maximum of
  ``s * scale`` over all its blocks (the last block masked past the context), then ``p =
  exp(s * scale - max)`` rounded to bfloat16 per block, and the row sums of the rounded ``p``;
* **PV** (``pv``): ``p`` times V, accumulated over the group's blocks into one partial output;
* **update** (``update``): merges the group into the sequence's running (max, sum, output):
  the first group copies, later groups rescale, and the last one normalizes and writes the
  sequence's output rows (there is no separate normalize task).

QK, softmax and PV of different groups are independent; only the updates of one sequence form a
chain. A sequence with an empty context gets zeros (one ``zero`` task per such sequence; upstream's
cases never have one).

Tasks per round: four per group. ``Case1`` (256 sequences of 8,192 tokens in 128-token blocks: one
group each) makes 1,024 kernel tasks, ``Case2`` (64 sequences, 64-token blocks: two groups each)
512. Upstream's graph also has one allocation task per sequence (``alloc_tensors`` of the running
max, sum and output); here those are run-scoped scratch tensors (``orch.scratch``), which are not
tasks, so they are not counted.

Orchestration
-------------
The orchestration reads ``context_lens`` once (``orch.read_tensor``), plans every group with numpy
(position by position: every sequence's first group, then every second group, ..., so the updates
of one batch of groups touch different sequences), and submits in batches (``orch.submit_many``).
The groups' scores and probabilities live in scratch sized for one *wave* of groups (at most
:data:`SCRATCH_BUDGET` bytes, a power of two of groups) that the next wave reuses: ``Case1`` runs
in 4 waves of 64 groups, ``Case2`` in 4 waves of 32, each wave four batched submits (one per
kernel, per distinct group size).

Cost model
----------
Each kernel declares the work of one task (:func:`kernel_work`): QK and PV read whole KV blocks
through the block table, so their bytes cannot be derived from their views (the key cache view
is the whole cache); the softmax reads its scores twice (its two passes). A group of fewer than
64 blocks gets kernels of its own size (:func:`kernels_for`), so its declared work is its own.

Arguments, arms, golden
-----------------------
The arguments are the per-block workload's (``query, key_cache, value_cache, block_table,
context_lens, out`` and ``scale``), and so are the three residency arms
(:data:`~simpler.workloads.paged_attention.RESIDENT`). The inputs follow upstream's recipe
(:func:`make_inputs`, seeded): query and key uniform in [-0.5, 0.5), value in [-1, 1), rounded to
bfloat16; a block table drawn uniformly with replacement over every column; ``scale`` 1.0. The
golden is upstream's: an online softmax block by block with P rounded to bfloat16 before its sum
(:func:`~simpler.workloads.paged_attention.golden_paged_attention`), compared at rtol = atol =
1e-3. The kernels take one maximum per group rather than per block, so their P is rounded at
other points. Over long contexts that difference averages far below the tolerance; over a
context of a few tokens (a block, then one token) it can pass it on a rare draw, which is why
the small cases here draw from fixed seeds.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

import simpler as sp

from . import paged_attention as _pa
from . import paged_attention_unroll_cuda as _pu_cuda

#: The three residency arms of every case (the per-block workload's).
ARMS = _pa.ARMS
#: Which tensors each arm keeps resident (``child_memory=True``).
RESIDENT = _pa.RESIDENT

#: Blocks per group (upstream's ``N_UNROLL``).
GROUP_BLOCKS = 64
#: The most query heads one task takes (upstream's ``q_tile = min(num_heads, 128)``).
MAX_Q_TILE = 128
#: The most bytes of per-group scratch (scores and probabilities) one wave of groups holds.
SCRATCH_BUDGET = 64 << 20


def _bf16() -> np.dtype:
    return sp.np_dtype("bfloat16")


def __getattr__(name: str) -> Any:
    """``BF16``: ``ml_dtypes.bfloat16``, resolved when first read."""
    if name == "BF16":
        return _bf16().type
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- kernels (numpy; on sim the arrays view device memory) -------------------------------------


def _block_ids(block_ids, n_cache_blocks: int, kernel: str) -> np.ndarray:
    """The group's cache block ids, checked against the cache."""
    ids = np.asarray(block_ids).reshape(-1).astype(np.int64)
    bad = (ids < 0) | (ids >= n_cache_blocks)
    if bad.any():
        raise ValueError(
            f"{kernel}: block id {int(ids[bad][0])} is outside the cache's {n_cache_blocks} blocks"
        )
    return ids


def _qk(q, key_cache, block_ids, scores):
    """scores[j, h, t] = q[h] . K[block_ids[j], t] for the group's n blocks (unscaled: the
    softmax scales)."""
    n, qt, bs = scores.shape[-3:]
    ids = _block_ids(block_ids, key_cache.shape[0], "qk")
    qf = q.reshape(qt, q.shape[-1]).astype(np.float32)
    k = key_cache[ids, :, 0, :].astype(np.float32)  # [n, BS, D]
    scores.reshape(n, qt, bs)[...] = np.matmul(qf[None], k.transpose(0, 2, 1))


def _softmax(scores, probs, m, total, scale, valid_last):
    """Two passes over the group: m = the row max of ``s * scale`` over every block (tokens of the
    last block from ``valid_last`` on masked), p = bf16(exp(s * scale - m)) (0 where masked),
    total = the row sum of the rounded p."""
    n, qt, bs = scores.shape[-3:]
    s = scores.reshape(n, qt, bs) * np.float32(scale)
    valid = max(0, min(int(valid_last), bs))
    s[-1, :, valid:] = -np.inf
    mx = s.max(axis=(0, 2))  # [qt]
    pr = probs.reshape(n, qt, bs)
    pr[...] = np.exp(s - mx[None, :, None])  # rounded to bfloat16 on the way in
    m.reshape(qt)[...] = mx
    total.reshape(qt)[...] = pr.astype(np.float32).sum(axis=(0, 2))


def _pv(probs, value_cache, block_ids, oi):
    """oi[h] = sum over the group's blocks j of p[j, h] @ V[block_ids[j]]."""
    n, qt, bs = probs.shape[-3:]
    ids = _block_ids(block_ids, value_cache.shape[0], "pv")
    d = value_cache.shape[-1]
    p = probs.reshape(n, qt, bs).astype(np.float32).transpose(1, 0, 2).reshape(qt, n * bs)
    v = value_cache[ids, :, 0, :].astype(np.float32).reshape(n * bs, d)
    oi.reshape(qt, d)[...] = p @ v


def _update(m_g, s_g, oi_g, m, s, acc, out, is_first, is_last):
    """Merges a group (max m_g, sum s_g, output oi_g) into the sequence's running (m, s, acc): the
    first group copies, a later one rescales; the last writes out = acc / s."""
    qt, d = oi_g.shape[-2:]
    mg, sg, og = m_g.reshape(qt), s_g.reshape(qt), oi_g.reshape(qt, d)
    m, s, acc = m.reshape(qt), s.reshape(qt), acc.reshape(qt, d)
    if is_first:
        m[...] = mg
        s[...] = sg
        acc[...] = og
    else:
        m_new = np.maximum(m, mg)
        a_old = np.exp(m - m_new)
        a_grp = np.exp(mg - m_new)
        s[...] = s * a_old + sg * a_grp
        acc[...] = acc * a_old[:, None] + og * a_grp[:, None]
        m[...] = m_new
    if is_last:
        out.reshape(qt, d)[...] = acc / s[:, None]


_BODIES: dict[str, tuple[Any, list[Any]]] = {
    "qk": (_qk, [sp.IN, sp.IN, (sp.IN, "int32"), (sp.OUT, "float32")]),
    "softmax": (_softmax, [sp.IN, sp.OUT, (sp.OUT, "float32"), (sp.OUT, "float32")]),
    "pv": (_pv, [sp.IN, sp.IN, (sp.IN, "int32"), (sp.OUT, "float32")]),
    "update": (_update, [sp.IN, sp.IN, sp.IN, sp.INOUT, sp.INOUT, sp.INOUT, (sp.INOUT, "float32")]),
}

# Each kernel also carries its CUDA device code (paged_attention_unroll_cuda.py): on the cuda
# platform the runtime launches that natively; the numpy functions above are the reference and
# run on sim. ``zero`` is the per-block workload's.
_CUDA: dict[str, sp.CudaCode] = {
    name: _pu_cuda.cuda_code(f"pu_{name}") for name in ("qk", "softmax", "pv", "pv_m16", "update")
}
_CUDA["zero"] = _pa._CUDA["zero"]


def kernel_work(q_tile: int, head_dim: int, block_size: int, n_blocks: int) -> dict[str, sp.KernelWork]:
    """What one task of each kernel moves and computes on a group of ``n_blocks`` full blocks,
    for the cost models (``docs/cost-model.md``; a multiply-add counts two):

    * ``qk``: reads the tile's query rows, the group's block ids and its K blocks; writes one
      float32 score per (block, head, token); ``2 * q_tile * n_blocks * block_size * head_dim``
      bf16 operations;
    * ``softmax``: reads the scores twice (pass 1 for the maximum, pass 2 for the exponentials),
      writes the bfloat16 probabilities and the row max and sum; six float32 operations per score
      (scale and max; scale, subtract, exponential, add);
    * ``pv``: reads the probabilities, the block ids and the V blocks; writes the float32 partial
      output; bf16 operations as ``qk``;
    * ``update``: reads the group's and the running (max, sum, output), writes the running ones
      and the output rows; per head a max, two subtract-and-exps and the sum's multiply-adds,
      per element two multiplies, an add and a divide.
    """
    qt, d, bs, n = q_tile, head_dim, block_size, n_blocks
    scores = n * qt * bs
    kv = n * bs * d * 2
    matmul = 2 * qt * n * bs * d
    return {
        "qk": sp.KernelWork(
            bytes_read=qt * d * 2 + n * 4 + kv, bytes_written=scores * 4, flops={"bf16": matmul}
        ),
        "softmax": sp.KernelWork(
            bytes_read=2 * scores * 4, bytes_written=scores * 2 + 2 * qt * 4, flops={"fp32": 6 * scores}
        ),
        "pv": sp.KernelWork(
            bytes_read=scores * 2 + n * 4 + kv, bytes_written=qt * d * 4, flops={"bf16": matmul}
        ),
        "update": sp.KernelWork(
            bytes_read=4 * qt * 4 + 2 * qt * d * 4,
            bytes_written=2 * qt * 4 + 2 * qt * d * 4,
            flops={"fp32": 8 * qt + 4 * qt * d},
        ),
    }


@functools.cache
def kernels_for(q_tile: int, head_dim: int, block_size: int, n_blocks: int) -> dict[str, sp.Kernel]:
    """The four kernels (``qk``, ``softmax``, ``pv``, ``update``) for groups of ``n_blocks``
    blocks of this shape, declaring the work of :func:`kernel_work`; made once per shape."""
    work = kernel_work(q_tile, head_dim, block_size, n_blocks)
    cuda = dict(_CUDA)
    if q_tile <= 16:  # one row tile of heads: the lighter PV entry
        cuda["pv"] = _CUDA["pv_m16"]
    return {
        name: sp.Kernel(fn, sig, name=name, cuda=cuda[name], work=work[name])
        for name, (fn, sig) in _BODIES.items()
    }


@functools.cache
def zero_kernel() -> sp.Kernel:
    """``zero``: the output rows of a sequence with an empty context (the per-block workload's)."""
    return sp.Kernel(_pa._zero, [(sp.OUT, "float32")], name="zero", cuda=_CUDA["zero"])


# -- orchestration ---------------------------------------------------------------------------------


def plan_groups(lens: np.ndarray, block_size: int, n_heads: int) -> dict[str, np.ndarray]:
    """Every group task of a round, in submission order (position by position: the first group of
    every sequence and head tile, then every second group, ...), as numpy columns: ``batch``,
    ``q0`` (first head of the tile), ``start`` (first block position of the group in the
    sequence), ``n`` (its blocks), ``valid_last`` (valid tokens of its last block), ``first``,
    ``last``."""
    lens = np.asarray(lens, dtype=np.int64)
    q_tile = min(n_heads, MAX_Q_TILE)
    nblk = np.where(lens > 0, -(-lens // block_size), 0)
    ngrp = -(-nblk // GROUP_BLOCKS)
    tiles = n_heads // q_tile
    seq = np.repeat(np.arange(len(lens)), ngrp)
    g = np.arange(len(seq)) - np.repeat(np.cumsum(ngrp) - ngrp, ngrp)
    q0 = np.tile(np.arange(tiles) * q_tile, len(seq))
    seq, g = np.repeat(seq, tiles), np.repeat(g, tiles)
    order = np.lexsort((q0, seq, g))
    seq, g, q0 = seq[order], g[order], q0[order]
    start = g * GROUP_BLOCKS
    n = np.minimum(GROUP_BLOCKS, nblk[seq] - start)
    valid_last = np.minimum(block_size, lens[seq] - (start + n - 1) * block_size)
    return {
        "batch": seq,
        "q0": q0,
        "start": start,
        "n": n,
        "valid_last": valid_last,
        "first": (g == 0).astype(np.int64),
        "last": (g == ngrp[seq] - 1).astype(np.int64),
    }


def wave_groups(q_tile: int, block_size: int, n_blocks: int, total: int) -> int:
    """Groups per wave: the largest power of two whose scores (float32) and probabilities
    (bfloat16) fit :data:`SCRATCH_BUDGET`, at least 1 and at most ``total``."""
    per_group = n_blocks * q_tile * block_size * 6
    w = 1
    while w * 2 * per_group <= SCRATCH_BUDGET:
        w *= 2
    return max(1, min(w, total))


def _rows(*columns):
    """An ``(n, k)`` int64 offsets array from k columns (arrays of length n, or scalars)."""
    return _pa._rows(*columns)


def _check_shapes(query, key_cache) -> tuple[int, int, int, int]:
    _, n_heads, head_dim = query.shape
    block_size = key_cache.shape[1]
    q_tile = min(n_heads, MAX_Q_TILE)
    if n_heads % q_tile:
        raise sp.ArgumentError(
            f"paged_attention_unroll: {n_heads} query heads are not whole tiles of {MAX_Q_TILE}"
        )
    if key_cache.shape[2] != 1:
        raise sp.ArgumentError("paged_attention_unroll: one KV head is supported (key_cache [N, BS, 1, D])")
    return n_heads, head_dim, block_size, q_tile


def orchestrate(o, query, key_cache, value_cache, block_table, context_lens, out, scale):
    """Reads ``context_lens``, plans the groups, and submits QK, softmax, PV and update per wave
    of groups in batches; zeros the rows of empty contexts."""
    n_heads, head_dim, block_size, q_tile = _check_shapes(query, key_cache)
    lens = o.read_tensor(context_lens).astype(np.int64)
    plan = plan_groups(lens, block_size, n_heads)
    total = len(plan["batch"])
    if total:
        g_max = int(plan["n"].max())
        wave = wave_groups(q_tile, block_size, g_max, total)
        scores = o.scratch([wave, g_max, q_tile, block_size], "float32", name="scores")
        probs = o.scratch([wave, g_max, q_tile, block_size], query.dtype, name="probs")
        m_g = o.scratch([wave, q_tile], "float32", name="group_max")
        l_g = o.scratch([wave, q_tile], "float32", name="group_sum")
        oi_g = o.scratch([wave, q_tile, head_dim], "float32", name="group_out")
        n_batch = query.shape[0]
        run_m = o.scratch([n_batch, n_heads], "float32", name="running_max")
        run_l = o.scratch([n_batch, n_heads], "float32", name="running_sum")
        run_acc = o.scratch([n_batch, n_heads, head_dim], "float32", name="running_out")
        tile3, tile2 = [1, q_tile, head_dim], [1, q_tile]
        for w0 in range(0, total, wave):
            sl = slice(w0, min(w0 + wave, total))
            b, q0, start, n = plan["batch"][sl], plan["q0"][sl], plan["start"][sl], plan["n"][sl]
            slot = np.arange(len(b))
            for size in np.unique(n)[::-1]:  # full groups first
                at = np.flatnonzero(n == size)
                size = int(size)
                k_ = kernels_for(q_tile, head_dim, block_size, size)
                tiles = [1, size, q_tile, block_size]
                s_rows = _rows(slot[at], 0, 0, 0)
                ids = block_table.views([1, size], _rows(b[at], start[at]))
                q_rows = query.views(tile3, _rows(b[at], q0[at], 0))
                o.submit_many(k_["qk"], q_rows, key_cache, ids, scores.views(tiles, s_rows))
                o.submit_many(
                    k_["softmax"],
                    scores.views(tiles, s_rows),
                    probs.views(tiles, s_rows),
                    m_g.views(tile2, _rows(slot[at], 0)),
                    l_g.views(tile2, _rows(slot[at], 0)),
                    scale,
                    plan["valid_last"][sl][at],
                )
                oi_rows = oi_g.views(tile3, _rows(slot[at], 0, 0))
                o.submit_many(k_["pv"], probs.views(tiles, s_rows), value_cache, ids, oi_rows)
            up = kernels_for(q_tile, head_dim, block_size, int(n.max()))["update"]
            seq2, seq3 = _rows(b, q0), _rows(b, q0, 0)
            o.submit_many(
                up,
                m_g.views(tile2, _rows(slot, 0)),
                l_g.views(tile2, _rows(slot, 0)),
                oi_g.views(tile3, _rows(slot, 0, 0)),
                run_m.views(tile2, seq2),
                run_l.views(tile2, seq2),
                run_acc.views(tile3, seq3),
                out.views(tile3, seq3),
                plan["first"][sl],
                plan["last"][sl],
            )
    empty = np.flatnonzero(lens <= 0)
    if len(empty):
        o.submit_many(zero_kernel(), out.views([1, n_heads, head_dim], _rows(empty, 0, 0)))


SIGNATURE = _pa.SIGNATURE
CALLABLE = sp.Callable(orchestrate, signature=SIGNATURE, name="paged_attention_unroll")


def tasks_per_round(lens, block_size: int, n_heads: int) -> int:
    """Kernel tasks of one round: four per group, one per empty context (scratch allocations are
    not tasks)."""
    lens = np.asarray(lens, dtype=np.int64)
    return 4 * len(plan_groups(lens, block_size, n_heads)["batch"]) + int((lens <= 0).sum())


# -- fixtures and golden -----------------------------------------------------------------------


def shape_of(params: dict) -> dict:
    """The sizes upstream's generator derives from a case's params: the per-sequence context
    lengths, the block table's columns (``max_model_len // block_size``) and the cache's blocks
    (``batch * ceil(max(context_lens) / block_size)``)."""
    batch, bs = params["batch"], params["block_size"]
    lens = params.get("context_lens_list") or [params["context_len"]]
    lens = [int(lens[i % len(lens)]) for i in range(batch)]
    return {
        "context_lens": lens,
        "max_blocks": params["max_model_len"] // bs,
        "total_blocks": max(1, batch * -(-max(lens) // bs)),
    }


def make_inputs(params: dict) -> dict[str, np.ndarray | float]:
    """Upstream's recipe over numpy, seeded with ``params['seed']`` (default 0): query and key
    uniform in [-0.5, 0.5) and value in [-1, 1), rounded to bfloat16; a block table drawn
    uniformly with replacement over every column; float32 zeros for ``out``; ``scale`` 1.0
    (``params['scale']`` overrides it)."""
    s = shape_of(params)
    rng = np.random.default_rng(params.get("seed", 0))
    b, h, d, bs = params["batch"], params["num_heads"], params["head_dim"], params["block_size"]
    bf16 = _bf16()
    nb = s["total_blocks"]
    return {
        "query": rng.uniform(-0.5, 0.5, (b, h, d)).astype(np.float32).astype(bf16),
        "key_cache": rng.uniform(-0.5, 0.5, (nb, bs, 1, d)).astype(np.float32).astype(bf16),
        "value_cache": rng.uniform(-1, 1, (nb, bs, 1, d)).astype(np.float32).astype(bf16),
        "block_table": rng.integers(0, nb, (b, s["max_blocks"]), dtype=np.int32),
        "context_lens": np.asarray(s["context_lens"], dtype=np.int32),
        "out": np.zeros((b, h, d), dtype=np.float32),
        "scale": float(params.get("scale", 1.0)),
    }


golden_paged_attention = _pa.golden_paged_attention


# -- cases -------------------------------------------------------------------------------------

_UPSTREAM = {"max_model_len": 32768}
#: Upstream's cases of this example (``Case3``, head dimension 256, is left out here as in
#: upstream's benchmarks); the bench runs ``Case1`` and ``Case2`` by default.
_MANUAL: list[tuple[str, dict[str, Any]]] = [
    ("Case1", {**_UPSTREAM, "batch": 256, "num_heads": 16, "head_dim": 128, "block_size": 128}),
    ("Case2", {**_UPSTREAM, "batch": 64, "num_heads": 64, "head_dim": 128, "block_size": 64}),
]
for _name, _p in _MANUAL:
    _p["context_len"] = 8192
_SMALL = {"num_heads": 16, "head_dim": 16, "block_size": 16, "max_model_len": 256}
#: Small cases for CI: upstream's small shapes (one and two partial blocks, variable lengths), two
#: groups per sequence with a partial tail group, and an empty context beside a one-token one.
_BASES: list[tuple[str, dict[str, Any]]] = [
    ("CaseSmall1", {**_SMALL, "batch": 1, "context_len": 33}),
    ("CaseVarSeq4", {**_SMALL, "batch": 4, "context_len": 128, "context_lens_list": [33, 64, 128, 15]}),
    (
        "CaseTwoGroups",
        {
            "num_heads": 4,
            "head_dim": 16,
            "block_size": 2,
            "max_model_len": 512,
            "batch": 3,
            "context_len": 150,
            "context_lens_list": [150, 129, 256],
            "seed": 1,
        },
    ),
    (
        "CaseEmpty",
        {
            "num_heads": 2,
            "head_dim": 32,
            "block_size": 8,
            "max_model_len": 64,
            "batch": 3,
            "context_len": 50,
            "context_lens_list": [0, 1, 50],
            "seed": 2,
        },
    ),
]

#: The cases ``simpler bench`` runs when none is named.
BENCH_CASES = ("Case1", "Case2")
#: The cost models ``simpler bench`` prices every round with on sim when ``--model`` is not given.
BENCH_MODELS = ("ascend-a3", "h200")

#: What the bench's "tasks per round" counts for this workload.
TASKS_NOTE = (
    "four kernel tasks per group of up to 64 blocks; the running max, sum and output of each "
    "sequence are run-scoped scratch, not tasks, where upstream's graph adds one allocation task "
    "per sequence (Case1: 1,024 + 256, Case2: 512 + 64)"
)

#: The warm ``chip.run`` upstream published for its unrolled paged attention on an A2/A3 card
#: (hw-native-sys/simpler, pull request "Perf: declare L2 tensor residency per argument"), per
#: residency arm (ms, low and high over its two ten-round repetitions): host staging of every
#: argument, bulk residency (query and KV caches resident), and the control tensors resident
#: too, read through host views.
#: ``simpler bench`` prints their ratios beside the measured and modeled ones.
PUBLISHED_CHIP_RUN_MS = {
    "Residency_staged": (1.006, 1.013),
    "Residency_bulk": (0.597, 0.695),
    "Residency_all": (0.566, 0.597),
}


def _cases() -> list[dict]:
    cases = []
    for base, p, manual in [(n, p, False) for n, p in _BASES] + [(n, p, True) for n, p in _MANUAL]:
        for arm in ARMS:
            case: dict[str, Any] = {"name": f"{base}_{arm}", "params": {**p, "case": base, "arm": arm}}
            if manual:
                case["manual"] = True
            cases.append(case)
    return cases


@sp.scene_test(level=2)
class PagedAttentionUnroll(_pa.PagedAttention):
    """Unrolled paged attention over bfloat16 query/caches; three residency arms per case. The
    per-block workload's arguments, golden and split, with this graph and its cases."""

    CALLABLE = CALLABLE
    CASES = _cases()
    make_inputs = staticmethod(make_inputs)


if __name__ == "__main__":
    sp.main()
