"""Paged attention (decode step): a data-dependent orchestration over a paged KV cache.

Run it under pytest (``pytest examples --platform sim --rounds 3``), standalone
(``python examples/paged_attention/test_paged_attention.py -p sim --rounds 3``), or through the
bench (``simpler bench paged_attention --rounds 5 --case B64_8K``).

Arguments, in this order: ``query`` [B, H, D], ``key_cache`` and ``value_cache``
[total_blocks, block_size, 1, D], ``block_table`` [B, max_blocks] int32, ``context_lens`` [B]
int32, ``out`` [B, H, D] float32, then the scalar ``scale``. One KV head is shared by all ``H``
query heads.

``query``, ``key_cache`` and ``value_cache`` are real bfloat16 arrays (``ml_dtypes.bfloat16``):
the kernels and the golden model both widen them with ``.astype(np.float32)`` and compute in
float32, so no float16 stand-in is involved.

The orchestration reads ``context_lens[b]`` once per batch and ``block_table[b, j]`` once per
block (``orch.get_tensor_data``); these reads decide how many tasks are submitted and which
key/value block each task views (the last block of a sequence is viewed only up to its valid
tokens, which is how the context length masks it). Per block it submits four tasks — QK,
block softmax, PV, online update — over run-scoped scratch tensors (``orch.scratch``): one
``scores``/``probs``/``block stats``/``block out`` set reused by every block (tasks execute in
submission order), and a running max / sum / accumulator per batch. A final task per batch
normalizes the accumulator into ``out[b]`` (a batch with context length 0 gets zeros).

Every case comes in three arms (the bench finds them by the ``_Residency_<arm>`` suffix and the
``arm`` param):

* ``Residency_staged`` — every tensor host-staged on every round;
* ``Residency_bulk`` — ``query`` and both caches resident (``child_memory=True``), the control
  tensors and ``out`` staged;
* ``Residency_all`` — the control tensors resident too, reached through host views. ``out``
  stays staged in every arm, so ``all`` vs ``bulk`` differs only in how the control tensors reach
  the orchestrator.

The golden model is an online-softmax paged attention in float32 (numpy), masked by
``context_lens``; outputs are compared at rtol = atol = 1e-3.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

import simpler as sp

BF16 = ml_dtypes.bfloat16

#: The three residency arms of every case.
ARMS = ("Residency_staged", "Residency_bulk", "Residency_all")

#: Which tensors each arm keeps resident (``child_memory=True``).
RESIDENT = {
    "Residency_staged": (),
    "Residency_bulk": ("query", "key_cache", "value_cache"),
    "Residency_all": ("query", "key_cache", "value_cache", "block_table", "context_lens"),
}


# -- kernels (numpy; on sim the arrays view device memory) -------------------------------------


def _qk(q, k, scores, scale):
    """scores[h, t] = scale * q[h] . k[t] over the block's valid tokens."""
    qf = q.reshape(q.shape[-2], q.shape[-1]).astype(np.float32)
    kf = k.reshape(k.shape[1], k.shape[-1]).astype(np.float32)
    scores[...] = (qf @ kf.T) * np.float32(scale)


def _block_softmax(scores, probs, stats):
    """probs = exp(scores - rowmax); stats = [rowmax, rowsum of probs]."""
    m = scores.max(axis=1)
    probs[...] = np.exp(scores - m[:, None])
    stats[0] = m
    stats[1] = probs.sum(axis=1)


def _pv(probs, v, block_out):
    """block_out[h] = probs[h] @ v over the block's valid tokens."""
    block_out[...] = probs @ v.reshape(v.shape[1], v.shape[-1]).astype(np.float32)


def _online_update(stats, block_out, m, s, acc, first):
    """Folds one block into the running (max, sum, acc) of a batch; ``first`` initializes them."""
    m_blk, s_blk = stats[0], stats[1]
    m, s, acc = m.reshape(-1), s.reshape(-1), acc.reshape(acc.shape[-2], acc.shape[-1])
    if first:
        m[...] = m_blk
        s[...] = s_blk
        acc[...] = block_out
        return
    m_new = np.maximum(m, m_blk)
    a_old = np.exp(m - m_new)
    a_blk = np.exp(m_blk - m_new)
    s[...] = s * a_old + s_blk * a_blk
    acc[...] = acc * a_old[:, None] + block_out * a_blk[:, None]
    m[...] = m_new


def _normalize(s, acc, out):
    """out[b] = acc / sum."""
    out[...] = acc / s.reshape(1, -1, 1)


def _zero(out):
    """An empty context attends to nothing: out[b] = 0."""
    out[...] = 0.0


QK = sp.Kernel(_qk, [sp.IN, sp.IN, (sp.OUT, "float32")], name="qk")
SOFTMAX = sp.Kernel(_block_softmax, [sp.IN, sp.OUT, sp.OUT], name="block_softmax")
PV = sp.Kernel(_pv, [sp.IN, sp.IN, sp.OUT], name="pv")
UPDATE = sp.Kernel(_online_update, [sp.IN, sp.IN, sp.INOUT, sp.INOUT, sp.INOUT], name="online_update")
NORMALIZE = sp.Kernel(_normalize, [sp.IN, sp.IN, (sp.OUT, "float32")], name="normalize")
ZERO = sp.Kernel(_zero, [(sp.OUT, "float32")], name="zero")


def orchestrate(o, query, key_cache, value_cache, block_table, context_lens, out, scale):
    """Submits QK -> softmax -> PV -> update per block, then one normalization per batch."""
    n_batch, n_heads, head_dim = query.shape
    block_size = key_cache.shape[1]
    run_max = o.scratch([n_batch, n_heads], "float32", name="running_max")
    run_sum = o.scratch([n_batch, n_heads], "float32", name="running_sum")
    run_acc = o.scratch([n_batch, n_heads, head_dim], "float32", name="running_acc")
    scores = o.scratch([n_heads, block_size], "float32", name="scores")
    probs = o.scratch([n_heads, block_size], "float32", name="probs")
    stats = o.scratch([2, n_heads], "float32", name="block_stats")
    block_out = o.scratch([n_heads, head_dim], "float32", name="block_out")
    kv_shape = [1, block_size, 1, head_dim]
    for b in range(n_batch):
        ctx = int(o.get_tensor_data(context_lens, b))
        out_b = out.view([1, n_heads, head_dim], [b, 0, 0])
        if ctx <= 0:
            o.submit(ZERO, out_b)
            continue
        q_b = query.view([1, n_heads, head_dim], [b, 0, 0])
        m_b = run_max.view([1, n_heads], [b, 0])
        s_b = run_sum.view([1, n_heads], [b, 0])
        acc_b = run_acc.view([1, n_heads, head_dim], [b, 0, 0])
        for j in range(-(-ctx // block_size)):
            blk = int(o.get_tensor_data(block_table, (b, j)))
            valid = min(block_size, ctx - j * block_size)
            if valid == block_size:
                k, v, sc, pr = (
                    key_cache.view(kv_shape, [blk, 0, 0, 0]),
                    value_cache.view(kv_shape, [blk, 0, 0, 0]),
                    scores,
                    probs,
                )
            else:  # the sequence's last, partial block: only its valid tokens are viewed
                k = key_cache.view([1, valid, 1, head_dim], [blk, 0, 0, 0])
                v = value_cache.view([1, valid, 1, head_dim], [blk, 0, 0, 0])
                sc = scores.view([n_heads, valid], [0, 0])
                pr = probs.view([n_heads, valid], [0, 0])
            o.submit(QK, q_b, k, sc, scale)
            o.submit(SOFTMAX, sc, pr, stats)
            o.submit(PV, pr, v, block_out)
            o.submit(UPDATE, stats, block_out, m_b, s_b, acc_b, int(j == 0))
        o.submit(NORMALIZE, s_b, acc_b, out_b)


CALLABLE = sp.Callable(
    orchestrate,
    signature=[sp.IN, sp.IN, sp.IN, (sp.IN, "int32"), (sp.IN, "int32"), (sp.OUT, "float32")],
    name="paged_attention",
)


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
    return {
        "query": rng.standard_normal((n_batch, heads, dim), dtype=np.float32).astype(BF16),
        "key_cache": rng.standard_normal((total, bs, 1, dim), dtype=np.float32).astype(BF16),
        "value_cache": rng.standard_normal((total, bs, 1, dim), dtype=np.float32).astype(BF16),
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
        s = np.einsum("hd,ntd->nht", q, k) * np.float32(scale)  # [n, H, bs]
        valid = (np.arange(nblk * bs).reshape(nblk, 1, bs)) < ctx
        s = np.where(valid, s, -np.inf)
        m_blk = s.max(axis=2)  # [n, H]
        p = np.exp(s - m_blk[:, :, None])
        s_blk = p.sum(axis=2)
        o_blk = np.einsum("nht,ntd->nhd", p, v)
        m, tot, acc = m_blk[0], s_blk[0], o_blk[0]
        for j in range(1, nblk):
            m_new = np.maximum(m, m_blk[j])
            a, c = np.exp(m - m_new), np.exp(m_blk[j] - m_new)
            tot = tot * a + s_blk[j] * c
            acc = acc * a[:, None] + o_blk[j] * c[:, None]
            m = m_new
        out[b] = acc / tot[:, None]
    return out


# -- cases -------------------------------------------------------------------------------------

_BASES = [
    # Small, for CI: a partial last block, an empty context, several heads.
    ("Small1", {"heads": 4, "head_dim": 16, "block_size": 16, "max_blocks": 4, "context_lens": [37, 64]}),
    (
        "Small2",
        {"heads": 2, "head_dim": 32, "block_size": 8, "max_blocks": 8, "context_lens": [0, 1, 50], "seed": 1},
    ),
]
_MANUAL = [
    # 8K-token contexts with 128-token blocks: 64 block_table reads per batch.
    ("B64_8K", {"heads": 16, "head_dim": 128, "block_size": 128, "max_blocks": 256, "batch": 64}),
    # block_table (256, 256): 256 x 64 = 16,384 block_table reads per round.
    ("B256_8K", {"heads": 16, "head_dim": 128, "block_size": 128, "max_blocks": 256, "batch": 256}),
]


def _cases() -> list[dict]:
    cases = []
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
class TestPagedAttention(sp.SceneTestCase):
    """Paged attention over bfloat16 query/caches; three residency arms per case."""

    CALLABLE = CALLABLE
    CASES = _cases()
    RTOL = ATOL = 1e-3

    def generate_args(self, params):
        x = make_inputs(params)
        resident = RESIDENT[params["arm"]]
        names = ("query", "key_cache", "value_cache", "block_table", "context_lens", "out")
        return sp.TaskArgsBuilder(
            *(sp.TensorArg(n, x[n], child_memory=n in resident) for n in names),
            sp.Scalar("scale", x["scale"]),
        )

    def compute_golden(self, args, params):
        args.out[...] = golden_paged_attention(
            args.query, args.key_cache, args.value_cache, args.block_table, args.context_lens, args.scale
        )


if __name__ == "__main__":
    sp.main()
