"""What both files of the ported unrolled paged attention share: the stand-ins for upstream's
``simpler_setup.goldens.paged_attention`` helpers (``generate_inputs`` and ``compute_golden``),
which do not ship here, written to upstream's recipe over numpy; and this port's cases.

The cases are upstream's (``Case1``-``Case3`` of ``paged_attention_unroll_manual_scope``, params
and ``manual`` flags kept) with one change: their platforms gain ``a2a3sim``. Upstream leaves its
simulator out because that simulator cannot run the bf16 cube kernels; here ``sim`` runs the
workload's numpy kernels, so the port runs the cases there. Two small cases are added (upstream's
example has none) and list no platform, so they run on every platform here, the fake vendor
libraries of ``make test`` included: short contexts (one and two partial blocks) and sequences
of two groups (64 blocks, then a partial group), at sizes the host path of a fake runs quickly.

The added cases carry a ``seed``: their inputs are drawn from it (numpy's draws), where upstream's cases stay
unseeded. The kernels round P against one maximum per group, the golden against each block's
own; over upstream's 8,192-token contexts that difference averages far below the tolerance, but
over a 17-token context (a full block, then one token) it reaches about 1.1e-3 on about one draw
in 200 (2,000 draws measured), past ``ATOL``. With seed 1 the largest error is 0.45 (short
contexts) and 0.38 (two groups) of the allowed ``ATOL + RTOL * |golden|``.
"""

from __future__ import annotations

import ctypes

import numpy as np

import simpler as sp
from simpler.workloads import paged_attention as pa
from simpler.workloads import paged_attention_unroll as pu

_UPSTREAM = {
    "kv_head_num": 1,
    "head_dim": 128,
    "context_len": 8192,
    "max_model_len": 32768,
    "dtype": "bfloat16",
}

CASES = [
    {
        "name": "Case1",
        "platforms": ["a2a3sim", "a2a3"],
        "params": {**_UPSTREAM, "batch": 256, "num_heads": 16, "block_size": 128},
    },
    {
        "name": "Case2",
        "platforms": ["a2a3sim", "a2a3"],
        "manual": True,
        "params": {**_UPSTREAM, "batch": 64, "num_heads": 64, "block_size": 64},
    },
    {
        "name": "Case3",
        "platforms": ["a2a3sim", "a2a3"],
        "manual": True,
        "params": {**_UPSTREAM, "batch": 64, "num_heads": 64, "head_dim": 256, "block_size": 64},
    },
    # Added by this port: every platform here, fakes included.
    {
        "name": "CaseShortCtx",
        "params": {
            **_UPSTREAM,
            "batch": 2,
            "num_heads": 16,
            "head_dim": 16,
            "block_size": 16,
            "context_len": 33,
            "context_lens_list": [33, 17],
            "max_model_len": 256,
            "seed": 1,
        },
    },
    {
        "name": "CaseTwoGroups",
        "params": {
            **_UPSTREAM,
            "batch": 2,
            "num_heads": 4,
            "head_dim": 16,
            "block_size": 2,
            "context_len": 150,
            "context_lens_list": [150, 129],
            "max_model_len": 512,
            "seed": 1,
        },
    },
]


def generate_inputs(params: dict) -> list[tuple[str, object]]:
    """Upstream's ``generate_inputs`` recipe over numpy: query and key uniform in [-0.5, 0.5) and
    value in [-1, 1), rounded to bfloat16; a block table drawn uniformly with replacement over
    every column; float32 zeros for ``out``; ``scale`` a ``ctypes.c_float(1.0)``. Unseeded, as
    upstream's, unless the case's params name a ``seed``."""
    assert params["kv_head_num"] == 1 and params["context_len"] >= 1
    s = pu.shape_of(params)
    rng = np.random.default_rng(params.get("seed"))
    b, h, d, bs = params["batch"], params["num_heads"], params["head_dim"], params["block_size"]
    nb = s["total_blocks"]
    return [
        ("query", rng.uniform(-0.5, 0.5, (b, h, d)).astype(np.float32).astype(pu.BF16)),
        ("key_cache", rng.uniform(-0.5, 0.5, (nb, bs, 1, d)).astype(np.float32).astype(pu.BF16)),
        ("value_cache", rng.uniform(-1, 1, (nb, bs, 1, d)).astype(np.float32).astype(pu.BF16)),
        ("block_table", rng.integers(0, nb, (b, s["max_blocks"]), dtype=np.int32)),
        ("context_lens", np.asarray(s["context_lens"], dtype=np.int32)),
        ("out", np.zeros((b, h, d), dtype=np.float32)),
        ("scale", ctypes.c_float(1.0)),
    ]


def compute_golden(tensors: dict, params: dict) -> None:
    """Upstream's ``compute_golden(tensors, params)``: the online softmax block by block, P rounded
    to bfloat16, scale 1.0 (as upstream's golden always uses), written into ``tensors["out"]``
    (numpy arrays or CPU torch tensors)."""
    names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
    out = pa.golden_paged_attention(*(sp.as_numpy(tensors[n]) for n in names), 1.0)
    sp.as_numpy(tensors["out"])[...] = out
