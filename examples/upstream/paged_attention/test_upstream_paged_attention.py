"""The upstream runtime's paged attention scene test, ported as a user would port it
(docs/porting.md): upstream's ``CASES`` and params (plus one short-context case), inputs built
with torch to upstream's recipe (bfloat16 query and caches, an int32 block table drawn with
replacement, float32 ``out``, ``scale`` a ``ctypes.c_float``), and upstream's golden. The kernels
are the shipped workload's instead of upstream's AIC/AIV sources (Python on sim, CUDA on cuda).

Torch is not a dependency of simpler, so this file skips where torch is absent; its twin
``test_upstream_paged_attention_numpy.py`` builds the same inputs over numpy and always runs.

    pytest examples/upstream --simpler-platform sim --simpler-manual include
"""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the numpy twin covers this port")

import pa_port  # noqa: E402  (this folder's shared cases, recipe and golden)

from simpler import SceneTestCase, scene_test  # noqa: E402


def generate_inputs(params):
    """Upstream's recipe, in torch."""
    s = pa_port.shape_of(params)
    dtype = getattr(torch, params.get("dtype", "bfloat16"))
    b, h, d, bs = params["batch"], params["num_heads"], params["head_dim"], params["block_size"]
    return [
        ("query", torch.empty(b, h, d).uniform_(-0.5, 0.5).to(dtype)),
        ("key_cache", torch.empty(s["total_blocks"], bs, 1, d).uniform_(-0.5, 0.5).to(dtype)),
        ("value_cache", torch.empty(s["total_blocks"], bs, 1, d).uniform_(-1, 1).to(dtype)),
        ("block_table", torch.randint(0, max(s["total_blocks"], 1), (b, s["max_blocks"]), dtype=torch.int32)),
        ("context_lens", torch.tensor(s["context_lens"], dtype=torch.int32)),
        ("out", torch.zeros(b, h, d, dtype=torch.float32)),
        ("scale", ctypes.c_float(1.0)),
    ]


@scene_test(level=2, runtime="tensormap_and_ringbuffer")
class TestPagedAttention(pa_port.PagedAttentionCase):
    """Paged attention over bfloat16 torch inputs, upstream's cases."""

    def generate_inputs(self, params):
        return generate_inputs(params)


if __name__ == "__main__":
    SceneTestCase.run_module(__name__)
