"""Paged attention's numerics follow the upstream runtime's: each block's softmax probabilities P
are rounded to the inputs' bfloat16 before their row sum and the PV product, in the numpy
kernels (sim), the CUDA kernels (here through the fake's stand-ins) and the golden alike. Short
contexts are where keeping P in float32 showed (a port failed upstream's golden on most seeds)."""

from __future__ import annotations

import numpy as np
import pytest

import simpler as sp
from simpler.workloads import paged_attention as pa

NAMES = ("query", "key_cache", "value_cache", "block_table", "context_lens")


def _short_case(seed: int) -> dict:
    return {
        "heads": 16,
        "head_dim": 16,
        "block_size": 16,
        "max_blocks": 16,
        "context_lens": [5, 3],
        "seed": seed,
    }


def _run(platform: str, params: dict) -> tuple[np.ndarray, dict]:
    x = pa.make_inputs(params)
    out = np.zeros_like(x["out"])
    with sp.Worker(platform) as w:
        w.run(pa.CALLABLE, [*(x[n] for n in NAMES), out, x["scale"]])
    return out, x


def _golden(x: dict) -> np.ndarray:
    return pa.golden_paged_attention(*(x[n] for n in NAMES), x["scale"])


def test_the_golden_rounds_p_to_bfloat16():
    """Independent of the kernels: the golden equals a direct computation with P rounded."""
    x = pa.make_inputs(_short_case(3))
    got = _golden(x)
    for b, ctx in enumerate(x["context_lens"]):
        q = x["query"][b].astype(np.float32)
        blocks = x["block_table"][b, : -(-int(ctx) // 16)]
        k = x["key_cache"][blocks, :, 0, :].reshape(-1, 16)[:ctx].astype(np.float32)
        v = x["value_cache"][blocks, :, 0, :].reshape(-1, 16)[:ctx].astype(np.float32)
        s = (q @ k.T) * np.float32(x["scale"])
        p = np.exp(s - s.max(axis=1, keepdims=True)).astype(pa.BF16).astype(np.float32)
        want = (p @ v) / p.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(got[b], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(16))
def test_short_contexts_match_the_golden_on_sim(seed):
    out, x = _run("sim", _short_case(seed))
    np.testing.assert_allclose(out, _golden(x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_short_contexts_match_the_golden_on_cuda(fake_vendor, seed):
    fake_vendor.use("cuda")
    from simpler.testing import fake_kernels

    fake_kernels.install_if_fake()
    out, x = _run("cuda", _short_case(seed))
    np.testing.assert_allclose(out, _golden(x), rtol=1e-3, atol=1e-3)
