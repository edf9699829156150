"""Paged attention (decode step): a data-dependent orchestration over a paged KV cache.

A workload shipped with the package, so it runs from any install: through the bench
(``simpler bench paged_attention --rounds 5 --case B64_8K``), standalone
(``python -m simpler.workloads.paged_attention -p sim --rounds 3``), or as a scene test of your
own (subclass :class:`PagedAttention` under :func:`simpler.scene_test`, as
``examples/paged_attention/test_paged_attention.py`` in the repository does).

Arguments, in this order: ``query`` [B, H, D], ``key_cache`` and ``value_cache``
[total_blocks, block_size, 1, D], ``block_table`` [B, max_blocks] int32, ``context_lens`` [B]
int32, ``out`` [B, H, D] float32, then the scalar ``scale``. One KV head is shared by all ``H``
query heads.

``query``, ``key_cache`` and ``value_cache`` are real bfloat16 arrays (``ml_dtypes.bfloat16``):
the kernels and the golden model both widen them with ``.astype(np.float32)`` and compute in
float32, so no float16 stand-in is involved. ``ml_dtypes`` is imported when the first bfloat16
array is made (:func:`make_inputs`, or :data:`BF16` read), not when this module is: without it,
the module imports and making the fixtures raises an error that names the fix.

The orchestration reads ``context_lens`` and ``block_table`` in bulk (``orch.read_tensor``: one
numpy array each, through the tensors' host views), computes with numpy which key/value block
each task views, and submits in batches (``orch.submit_many``): per group of up to
``GROUP_BLOCKS`` blocks, four batched submits — QK, block softmax, PV, online update — over
run-scoped scratch tensors (``orch.scratch``) with one slice per block of the group, and a
running max / sum / accumulator per batch. A final batched submit normalizes the accumulators
into ``out`` (a batch with context length 0 gets zeros). Each task views a whole key/value
block; the number of valid tokens of the block is a per-task scalar, which is how the context
length masks the sequence's last, partial block. :func:`orchestrate_per_task` submits exactly
the same tasks one ``submit`` at a time (the single-submit path, kept as a test of it).

Every case comes in three arms (the bench finds them by the ``_Residency_<arm>`` suffix and the
``arm`` param):

* ``Residency_staged`` — every tensor host-staged on every round;
* ``Residency_bulk`` — ``query`` and both caches resident (``child_memory=True``), the control
  tensors and ``out`` staged;
* ``Residency_all`` — the control tensors resident too, reached through host views. ``out``
  stays staged in every arm, so ``all`` vs ``bulk`` differs only in how the control tensors reach
  the orchestrator.

On several devices (``--devices 2``, or ``run_case(..., devices=2)``) the batch is split
(:func:`split_batch`): each device takes a contiguous group of sequences with their query rows,
context lengths and output rows, only the KV-cache blocks those sequences use, and its block
table re-indexed to them; every arm keeps the same tensors resident, on every device. The
devices' ``out`` rows are joined in batch order and compared with the golden of the whole batch.

The golden model is an online-softmax paged attention in float32 (numpy), masked by
``context_lens``; outputs are compared at rtol = atol = 1e-3. As in the upstream runtime, each
block's softmax probabilities P are rounded to the inputs' dtype (bfloat16) before their row sum
and the PV product, in the kernels and in the golden alike. Two differences from upstream's
golden remain, both documented in ``docs/porting.md``: an empty context gives zeros here (NaN,
0/0, upstream), and ``scale`` is honoured here (upstream's golden always uses 1.0).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

import simpler as sp

from . import paged_attention_cuda as _pa_cuda


def _bf16() -> np.dtype:
    """The bfloat16 dtype (imports ``ml_dtypes`` now; a clear error without it)."""
    return sp.np_dtype("bfloat16")


def __getattr__(name: str) -> Any:
    """``BF16``: ``ml_dtypes.bfloat16``, resolved when first read (``ml_dtypes`` is not imported
    with this module)."""
    if name == "BF16":
        return _bf16().type
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The three residency arms of every case.
ARMS = ("Residency_staged", "Residency_bulk", "Residency_all")

#: Which tensors each arm keeps resident (``child_memory=True``).
RESIDENT = {
    "Residency_staged": (),
    "Residency_bulk": ("query", "key_cache", "value_cache"),
    "Residency_all": ("query", "key_cache", "value_cache", "block_table", "context_lens"),
}


# -- kernels (numpy; on sim the arrays view device memory) -------------------------------------


def _qk(q, k, scores, scale, valid):
    """scores[h, t] = scale * q[h] . k[t] over the block's first ``valid`` tokens."""
    qf = q.reshape(q.shape[-2], q.shape[-1]).astype(np.float32)
    kf = k.reshape(k.shape[1], k.shape[-1])[:valid].astype(np.float32)
    scores.reshape(scores.shape[-2], scores.shape[-1])[:, :valid] = (qf @ kf.T) * np.float32(scale)


def _block_softmax(scores, probs, stats, valid):
    """probs = exp(scores - rowmax) over the valid tokens, stored in the dtype of ``probs`` (the
    inputs' bfloat16: P is rounded, as the upstream runtime's kernel and golden do); stats =
    [rowmax, rowsum of the stored probs]."""
    sc = scores.reshape(scores.shape[-2], scores.shape[-1])[:, :valid]
    pr = probs.reshape(probs.shape[-2], probs.shape[-1])[:, :valid]
    st = stats.reshape(2, -1)
    m = sc.max(axis=1)
    pr[...] = np.exp(sc - m[:, None])
    st[0] = m
    st[1] = pr.astype(np.float32).sum(axis=1)


def _pv(probs, v, block_out, valid):
    """block_out[h] = probs[h] @ v over the block's valid tokens."""
    pr = probs.reshape(probs.shape[-2], probs.shape[-1])[:, :valid].astype(np.float32)
    vf = v.reshape(v.shape[1], v.shape[-1])[:valid].astype(np.float32)
    block_out.reshape(block_out.shape[-2], block_out.shape[-1])[...] = pr @ vf


def _online_update(stats, block_out, m, s, acc, first):
    """Folds one block into the running (max, sum, acc) of a batch; ``first`` initializes them."""
    st = stats.reshape(2, -1)
    m_blk, s_blk = st[0], st[1]
    bo = block_out.reshape(block_out.shape[-2], block_out.shape[-1])
    m, s, acc = m.reshape(-1), s.reshape(-1), acc.reshape(acc.shape[-2], acc.shape[-1])
    if first:
        m[...] = m_blk
        s[...] = s_blk
        acc[...] = bo
        return
    m_new = np.maximum(m, m_blk)
    a_old = np.exp(m - m_new)
    a_blk = np.exp(m_blk - m_new)
    s[...] = s * a_old + s_blk * a_blk
    acc[...] = acc * a_old[:, None] + bo * a_blk[:, None]
    m[...] = m_new


def _normalize(s, acc, out):
    """out[b] = acc / sum."""
    out[...] = acc / s.reshape(1, -1, 1)


def _zero(out):
    """An empty context attends to nothing: out[b] = 0."""
    out[...] = 0.0


# Each kernel also carries its CUDA device code (paged_attention_cuda.py): on the cuda platform
# the runtime launches that natively; the numpy functions above are the reference and run on sim.
_CUDA = {
    name: _pa_cuda.cuda_code(entry)
    for name, entry in (
        ("qk", "pa_qk"),
        ("block_softmax", "pa_block_softmax"),
        ("pv", "pa_pv"),
        ("online_update", "pa_online_update"),
        ("normalize", "pa_normalize"),
        ("zero", "pa_zero"),
    )
}
_BODIES: dict[str, tuple[Any, list[Any]]] = {
    "qk": (_qk, [sp.IN, sp.IN, (sp.OUT, "float32")]),
    "block_softmax": (_block_softmax, [sp.IN, sp.OUT, sp.OUT]),
    "pv": (_pv, [sp.IN, sp.IN, sp.OUT]),
    "online_update": (_online_update, [sp.IN, sp.IN, sp.INOUT, sp.INOUT, sp.INOUT]),
    "normalize": (_normalize, [sp.IN, sp.IN, (sp.OUT, "float32")]),
    "zero": (_zero, [(sp.OUT, "float32")]),
}


def kernel_work(heads: int, head_dim: int, block_size: int) -> dict[str, sp.KernelWork]:
    """The operations one task of each kernel does on a full block, for the cost models
    (``docs/cost-model.md``; a multiply-add counts two). The bytes are left to the model, which
    derives them from each task's views. QK and PV are matrix products in the inputs' bfloat16
    (``2 * heads * block_size * head_dim`` each); the rest is float32 vector work: the scale
    (one per score), the block softmax (max, subtract, exp, sum: four per score), the online
    update (per head: a max, two subtract-and-exps, the sum's two multiplies and an add: eight;
    per accumulator element two multiplies and an add) and the normalization (a divide per
    output element)."""
    scores, acc = heads * block_size, heads * head_dim
    matmul = 2 * heads * block_size * head_dim
    return {
        "qk": sp.KernelWork(flops={"bf16": matmul, "fp32": scores}),
        "block_softmax": sp.KernelWork(flops={"fp32": 4 * scores}),
        "pv": sp.KernelWork(flops={"bf16": matmul}),
        "online_update": sp.KernelWork(flops={"fp32": 8 * heads + 3 * acc}),
        "normalize": sp.KernelWork(flops={"fp32": acc}),
        "zero": sp.KernelWork(),
    }


@functools.cache
def kernels_for(heads: int, head_dim: int, block_size: int) -> dict[str, sp.Kernel]:
    """The six kernels (by name: ``qk``, ``block_softmax``, ``pv``, ``online_update``,
    ``normalize``, ``zero``), declaring the work of :func:`kernel_work` for this shape; made
    once per shape, sharing their device code."""
    work = kernel_work(heads, head_dim, block_size)
    return {
        name: sp.Kernel(fn, sig, name=name, cuda=_CUDA[name], work=work[name])
        for name, (fn, sig) in _BODIES.items()
    }


# The kernels without declared work (their bytes alone are priced), for code that submits
# them by hand.
QK, SOFTMAX, PV, UPDATE, NORMALIZE, ZERO = (
    sp.Kernel(fn, sig, name=name, cuda=_CUDA[name]) for name, (fn, sig) in _BODIES.items()
)

#: Blocks whose QK / softmax / PV / update are submitted together; the per-block scratch (about
#: 24 KiB per block at 16 heads x 128 dims) is sized for one group and reused by the next.
GROUP_BLOCKS = 512


def _plan(o, query, key_cache, block_table, context_lens):
    """Reads the control tensors in bulk; returns the blocks to process, position by position
    (every sequence's first block, then every second block, ...): ``(batch, position in the
    sequence, cache block, valid tokens)`` as numpy arrays.

    Each sequence's blocks still come in order, which is all its online update needs; taking
    positions across sequences makes a group's updates touch many sequences a few blocks each,
    so they depend on each other in short chains (a group of 512 blocks over 64 sequences: 8
    dependent steps, not 64), which is what a device runs in few launches."""
    block_size = key_cache.shape[1]
    lens = o.read_tensor(context_lens).astype(np.int64)
    table = o.read_tensor(block_table)
    nblk = np.where(lens > 0, -(-lens // block_size), 0)
    batch = np.repeat(np.arange(len(lens)), nblk)
    starts = np.repeat(np.cumsum(nblk) - nblk, nblk)
    pos = np.arange(len(batch)) - starts
    blk = table[batch, pos].astype(np.int64)
    valid = np.minimum(block_size, lens[batch] - pos * block_size)
    order = np.lexsort((batch, pos))
    return lens, batch[order], pos[order], blk[order], valid[order]


def _rows(*columns):
    """An ``(n, k)`` int64 offsets array from k columns (arrays of length n, or scalars)."""
    n = max(np.size(c) for c in columns)
    out = np.zeros((n, len(columns)), np.int64)
    for i, c in enumerate(columns):
        if np.ndim(c) or c:
            out[:, i] = c
    return out


def _scratch(o, query, key_cache, group):
    n_batch, n_heads, head_dim = query.shape
    block_size = key_cache.shape[1]
    return {
        "run_max": o.scratch([n_batch, n_heads], "float32", name="running_max"),
        "run_sum": o.scratch([n_batch, n_heads], "float32", name="running_sum"),
        "run_acc": o.scratch([n_batch, n_heads, head_dim], "float32", name="running_acc"),
        "scores": o.scratch([group, n_heads, block_size], "float32", name="scores"),
        # P in the inputs' dtype (bfloat16), as the upstream runtime keeps it.
        "probs": o.scratch([group, n_heads, block_size], query.dtype, name="probs"),
        "stats": o.scratch([group, 2, n_heads], "float32", name="block_stats"),
        "block_out": o.scratch([group, n_heads, head_dim], "float32", name="block_out"),
    }


def orchestrate(o, query, key_cache, value_cache, block_table, context_lens, out, scale):
    """Bulk reads, then QK -> softmax -> PV -> update per group of blocks in batched submits, then
    one batched normalization (and zeroing of empty contexts)."""
    _, n_heads, head_dim = query.shape
    block_size = key_cache.shape[1]
    k_ = kernels_for(n_heads, head_dim, block_size)
    QK, SOFTMAX, PV, UPDATE = k_["qk"], k_["block_softmax"], k_["pv"], k_["online_update"]
    NORMALIZE, ZERO = k_["normalize"], k_["zero"]
    lens, batch, pos, blk, valid = _plan(o, query, key_cache, block_table, context_lens)
    group = max(1, min(GROUP_BLOCKS, len(batch)))
    sc = _scratch(o, query, key_cache, group)
    q_shape, kv_shape = [1, n_heads, head_dim], [1, block_size, 1, head_dim]
    per_block = {}  # this group's slice of each per-block scratch, by group size
    for g0 in range(0, len(batch), group):
        b, p, k, v_ok = (
            batch[g0 : g0 + group],
            pos[g0 : g0 + group],
            blk[g0 : g0 + group],
            valid[g0 : g0 + group],
        )
        if len(b) not in per_block:
            slot3 = _rows(np.arange(len(b)), 0, 0)
            per_block[len(b)] = (
                sc["scores"].views([1, n_heads, block_size], slot3),
                sc["probs"].views([1, n_heads, block_size], slot3),
                sc["stats"].views([1, 2, n_heads], slot3),
                sc["block_out"].views([1, n_heads, head_dim], slot3),
            )
        scores, probs, stats, block_out = per_block[len(b)]
        b2, b3, kv = _rows(b, 0), _rows(b, 0, 0), _rows(k, 0, 0, 0)
        o.submit_many(QK, query.views(q_shape, b3), key_cache.views(kv_shape, kv), scores, scale, v_ok)
        o.submit_many(SOFTMAX, scores, probs, stats, v_ok)
        o.submit_many(PV, probs, value_cache.views(kv_shape, kv), block_out, v_ok)
        o.submit_many(
            UPDATE,
            stats,
            block_out,
            sc["run_max"].views([1, n_heads], b2),
            sc["run_sum"].views([1, n_heads], b2),
            sc["run_acc"].views([1, n_heads, head_dim], b3),
            (p == 0).astype(np.int64),
        )
    live = np.flatnonzero(lens > 0)
    empty = np.flatnonzero(lens <= 0)
    if len(live):
        o.submit_many(
            NORMALIZE,
            sc["run_sum"].views([1, n_heads], _rows(live, 0)),
            sc["run_acc"].views([1, n_heads, head_dim], _rows(live, 0, 0)),
            out.views([1, n_heads, head_dim], _rows(live, 0, 0)),
        )
    if len(empty):
        o.submit_many(ZERO, out.views([1, n_heads, head_dim], _rows(empty, 0, 0)))


def orchestrate_per_task(o, query, key_cache, value_cache, block_table, context_lens, out, scale):
    """The same tasks as :func:`orchestrate`, in the same order, one ``submit`` (and element read)
    at a time: the single-submit path."""
    n_batch, n_heads, head_dim = query.shape
    block_size = key_cache.shape[1]
    k_ = kernels_for(n_heads, head_dim, block_size)
    QK, SOFTMAX, PV, UPDATE = k_["qk"], k_["block_softmax"], k_["pv"], k_["online_update"]
    NORMALIZE, ZERO = k_["normalize"], k_["zero"]
    lens = [int(o.get_tensor_data(context_lens, b)) for b in range(n_batch)]
    blocks = []  # (batch, position, cache block, valid tokens)
    for b, ctx in enumerate(lens):
        for j in range(-(-ctx // block_size) if ctx > 0 else 0):
            blk = int(o.get_tensor_data(block_table, (b, j)))
            blocks.append((b, j, blk, min(block_size, ctx - j * block_size)))
    blocks.sort(key=lambda t: (t[1], t[0]))  # position by position, as _plan orders them
    group = max(1, min(GROUP_BLOCKS, len(blocks)))
    sc = _scratch(o, query, key_cache, group)
    q_shape, kv_shape = [1, n_heads, head_dim], [1, block_size, 1, head_dim]
    for g0 in range(0, len(blocks), group):
        tasks = []
        for i, (b, j, blk, ok) in enumerate(blocks[g0 : g0 + group]):
            tasks.append(
                {
                    "q": query.view(q_shape, [b, 0, 0]),
                    "k": key_cache.view(kv_shape, [blk, 0, 0, 0]),
                    "v": value_cache.view(kv_shape, [blk, 0, 0, 0]),
                    "scores": sc["scores"].view([1, n_heads, block_size], [i, 0, 0]),
                    "probs": sc["probs"].view([1, n_heads, block_size], [i, 0, 0]),
                    "stats": sc["stats"].view([1, 2, n_heads], [i, 0, 0]),
                    "out": sc["block_out"].view([1, n_heads, head_dim], [i, 0, 0]),
                    "m": sc["run_max"].view([1, n_heads], [b, 0]),
                    "s": sc["run_sum"].view([1, n_heads], [b, 0]),
                    "acc": sc["run_acc"].view([1, n_heads, head_dim], [b, 0, 0]),
                    "valid": ok,
                    "first": int(j == 0),
                }
            )
        for t in tasks:
            o.submit(QK, t["q"], t["k"], t["scores"], scale, t["valid"])
        for t in tasks:
            o.submit(SOFTMAX, t["scores"], t["probs"], t["stats"], t["valid"])
        for t in tasks:
            o.submit(PV, t["probs"], t["v"], t["out"], t["valid"])
        for t in tasks:
            o.submit(UPDATE, t["stats"], t["out"], t["m"], t["s"], t["acc"], t["first"])
    for b in (b for b, ctx in enumerate(lens) if ctx > 0):
        o.submit(
            NORMALIZE,
            sc["run_sum"].view([1, n_heads], [b, 0]),
            sc["run_acc"].view([1, n_heads, head_dim], [b, 0, 0]),
            out.view([1, n_heads, head_dim], [b, 0, 0]),
        )
    for b in (b for b, ctx in enumerate(lens) if ctx <= 0):
        o.submit(ZERO, out.view([1, n_heads, head_dim], [b, 0, 0]))


SIGNATURE = [sp.IN, sp.IN, sp.IN, (sp.IN, "int32"), (sp.IN, "int32"), (sp.OUT, "float32")]
CALLABLE = sp.Callable(orchestrate, signature=SIGNATURE, name="paged_attention")
CALLABLE_PER_TASK = sp.Callable(orchestrate_per_task, signature=SIGNATURE, name="paged_attention_per_task")


# -- fixtures and golden -----------------------------------------------------------------------


def make_inputs(params: dict) -> dict[str, np.ndarray | float]:
    """The case's fixtures (deterministic in ``params['seed']``)."""
    rng = np.random.default_rng(params.get("seed", 0))
    lens = np.asarray(params["context_lens"], dtype=np.int32)
    n_batch, heads, dim, bs, max_blocks = (
        len(lens),
        params["heads"],
        params["head_dim"],
        params["block_size"],
        params["max_blocks"],
    )
    need = [-(-int(c) // bs) for c in lens]
    if max(need, default=0) > max_blocks:
        raise ValueError(f"a context of {int(lens.max())} tokens needs more than {max_blocks} blocks")
    total = sum(need) + params.get("spare_blocks", 2)
    table = np.full((n_batch, max_blocks), -1, dtype=np.int32)  # unused slots are never read
    perm = rng.permutation(total).astype(np.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[at : at + n]
        at += n
    bf16 = _bf16()
    return {
        "query": rng.standard_normal((n_batch, heads, dim), dtype=np.float32).astype(bf16),
        "key_cache": rng.standard_normal((total, bs, 1, dim), dtype=np.float32).astype(bf16),
        "value_cache": rng.standard_normal((total, bs, 1, dim), dtype=np.float32).astype(bf16),
        "block_table": table,
        "context_lens": lens,
        "out": np.zeros((n_batch, heads, dim), dtype=np.float32),
        "scale": 1.0 / math.sqrt(dim),
    }


def golden_paged_attention(query, key_cache, value_cache, block_table, context_lens, scale):
    """Online-softmax paged attention in float32: block by block, masked by ``context_lens``."""
    n_batch, heads, dim = query.shape
    bs = key_cache.shape[1]
    out = np.zeros((n_batch, heads, dim), dtype=np.float32)
    for b in range(n_batch):
        ctx = int(context_lens[b])
        if ctx <= 0:
            continue
        nblk = -(-ctx // bs)
        blocks = block_table[b, :nblk]
        q = query[b].astype(np.float32)  # [H, D]
        k = key_cache[blocks, :, 0, :].astype(np.float32)  # [n, bs, D]
        v = value_cache[blocks, :, 0, :].astype(np.float32)
        s = np.matmul(q[None], k.transpose(0, 2, 1)) * np.float32(scale)  # [n, H, bs]
        valid = (np.arange(nblk * bs).reshape(nblk, 1, bs)) < ctx
        s = np.where(valid, s, -np.inf)
        m_blk = s.max(axis=2)  # [n, H]
        p = np.exp(s - m_blk[:, :, None]).astype(query.dtype).astype(np.float32)  # P rounded
        s_blk = p.sum(axis=2)
        o_blk = np.matmul(p, v)  # [n, H, D]
        m, tot, acc = m_blk[0], s_blk[0], o_blk[0]
        for j in range(1, nblk):
            m_new = np.maximum(m, m_blk[j])
            a, c = np.exp(m - m_new), np.exp(m_blk[j] - m_new)
            tot = tot * a + s_blk[j] * c
            acc = acc * a[:, None] + o_blk[j] * c[:, None]
            m = m_new
        out[b] = acc / tot[:, None]
    return out


def split_batch(args: sp.TaskArgsBuilder, n: int) -> list[sp.TaskArgsBuilder]:
    """The case's arguments for ``n`` devices: the batch cut into ``n`` contiguous groups of
    sequences (``np.array_split``: the first devices take one more when ``n`` does not divide
    it). Device ``i`` gets its sequences' ``query``, ``context_lens`` and ``out`` rows, the
    ``key_cache`` / ``value_cache`` blocks they use (in block-id order) and their
    ``block_table`` rows re-indexed to those blocks (``-1`` where unused, as in the whole
    table); ``scale`` and every ``child_memory`` flag as in ``args``."""
    table = np.asarray(args.block_table)
    lens = np.asarray(args.context_lens).astype(np.int64)
    if len(lens) < n:
        raise sp.ArgumentError(f"paged attention: cannot split a batch of {len(lens)} over {n} devices")
    block_size = args.key_cache.shape[1]
    parts = []
    for idx in np.array_split(np.arange(len(lens)), n):
        rows = table[idx]
        need = np.where(lens[idx] > 0, -(-lens[idx] // block_size), 0)
        used = np.arange(table.shape[1])[None, :] < need[:, None]
        blocks, local = np.unique(rows[used], return_inverse=True)
        local_table = np.full_like(rows, -1)
        local_table[used] = local
        if not len(blocks):  # every context empty: one block, never read, keeps the caches
            blocks = np.zeros(1, np.int64)
        values = {
            "query": args.query[idx],
            "key_cache": args.key_cache[blocks],
            "value_cache": args.value_cache[blocks],
            "block_table": local_table,
            "context_lens": np.asarray(args.context_lens)[idx],
            "out": args.out[idx],
        }
        tensors = [
            sp.TensorArg(t.name, np.array(values[t.name], copy=True, order="C"), child_memory=t.child_memory)
            for t in args.tensors()
        ]
        parts.append(sp.TaskArgsBuilder(*tensors, *args.scalars()))
    return parts


# -- cases -------------------------------------------------------------------------------------

_BASES: list[tuple[str, dict[str, Any]]] = [
    # Small, for CI: a partial last block, an empty context, several heads.
    ("Small1", {"heads": 4, "head_dim": 16, "block_size": 16, "max_blocks": 4, "context_lens": [37, 64]}),
    (
        "Small2",
        {"heads": 2, "head_dim": 32, "block_size": 8, "max_blocks": 8, "context_lens": [0, 1, 50], "seed": 1},
    ),
]
_MANUAL: list[tuple[str, dict[str, Any]]] = [
    # 8K-token contexts with 128-token blocks: 64 block_table reads per batch.
    ("B64_8K", {"heads": 16, "head_dim": 128, "block_size": 128, "max_blocks": 256, "batch": 64}),
    # block_table (256, 256): 256 x 64 = 16,384 block_table reads per round.
    ("B256_8K", {"heads": 16, "head_dim": 128, "block_size": 128, "max_blocks": 256, "batch": 256}),
]


def _cases() -> list[dict]:
    cases: list[dict[str, Any]] = []
    for base, p in _BASES:
        for arm in ARMS:
            cases.append({"name": f"{base}_{arm}", "params": {**p, "case": base, "arm": arm}})
    for base, p in _MANUAL:
        p = dict(p)
        p["context_lens"] = [8192] * p.pop("batch")
        for arm in ARMS:
            cases.append({"name": f"{base}_{arm}", "params": {**p, "case": base, "arm": arm}, "manual": True})
    return cases


@sp.scene_test(level=2)
class PagedAttention(sp.SceneTestCase):
    """Paged attention over bfloat16 query/caches; three residency arms per case."""

    CALLABLE = CALLABLE
    CASES = _cases()
    RTOL = ATOL = 1e-3
    #: The case's inputs from its params (:func:`make_inputs`; a workload built on this class
    #: gives its own).
    make_inputs = staticmethod(make_inputs)

    def generate_args(self, params):
        x = self.make_inputs(params)
        resident = RESIDENT[params["arm"]]
        names = ("query", "key_cache", "value_cache", "block_table", "context_lens", "out")
        return sp.TaskArgsBuilder(
            *(sp.TensorArg(n, x[n], child_memory=n in resident) for n in names),
            sp.Scalar("scale", x["scale"]),
        )

    def split_args(self, args, params, n):
        """The batch split across ``n`` devices (:func:`split_batch`); ``out`` is joined along
        the batch by the default ``merge_outputs``."""
        return split_batch(args, n)

    def compute_golden(self, args, params):
        args.out[...] = golden_paged_attention(
            args.query, args.key_cache, args.value_cache, args.block_table, args.context_lens, args.scale
        )


if __name__ == "__main__":
    sp.main()
