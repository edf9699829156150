"""Upstream's unrolled paged attention scene test (hw-native-sys/simpler,
``examples/a2a3/tensormap_and_ringbuffer/paged_attention_unroll_manual_scope``), ported as a user
would port it (docs/porting.md): the imports change, ``CALLABLE`` is the shipped workload's
(``simpler.workloads.paged_attention_unroll``: Python kernels on sim, CUDA code on cuda) instead
of upstream's AIC/AIV sources and C++ orchestration, and upstream's shared golden helpers
(``simpler_setup.goldens.paged_attention``, which do not ship here) are this folder's
``pau_port``. The class, ``generate_args`` and ``compute_golden`` are upstream's; the cases are
upstream's with ``a2a3sim`` added to their platforms and two small cases added (``pau_port``).

Torch is not a dependency of simpler, so this file skips where torch is absent; its twin
``test_upstream_paged_attention_unroll_numpy.py`` builds the same inputs over numpy.

    pytest examples/upstream --simpler-platform sim --simpler-manual include
"""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the numpy twin covers this port")

import pau_port  # noqa: E402  (this folder's stand-ins for upstream's golden helpers, and the cases)
from pau_port import compute_golden as _pa_compute_golden  # noqa: E402

from simpler import Scalar, SceneTestCase, TaskArgsBuilder, TensorArg, scene_test  # noqa: E402
from simpler.workloads import paged_attention_unroll as pu  # noqa: E402


def _pa_generate_inputs(params):
    """Upstream's recipe, in torch; drawn from the case's ``seed`` where it names one (the cases
    this port adds: see ``pau_port``)."""
    s = pu.shape_of(params)
    g = torch.Generator()
    if params.get("seed") is not None:
        g.manual_seed(params["seed"])
    else:
        g.seed()
    dtype = getattr(torch, params.get("dtype", "bfloat16"))
    b, h, d, bs = params["batch"], params["num_heads"], params["head_dim"], params["block_size"]
    nb = s["total_blocks"]
    return [
        ("query", torch.empty(b, h, d).uniform_(-0.5, 0.5, generator=g).to(dtype)),
        ("key_cache", torch.empty(nb, bs, 1, d).uniform_(-0.5, 0.5, generator=g).to(dtype)),
        ("value_cache", torch.empty(nb, bs, 1, d).uniform_(-1, 1, generator=g).to(dtype)),
        ("block_table", torch.randint(0, nb, (b, s["max_blocks"]), generator=g, dtype=torch.int32)),
        ("context_lens", torch.tensor(s["context_lens"], dtype=torch.int32)),
        ("out", torch.zeros(b, h, d, dtype=torch.float32)),
        ("scale", ctypes.c_float(1.0)),
    ]


@scene_test(level=2, runtime="tensormap_and_ringbuffer")
class TestPagedAttentionUnrollManualScope(SceneTestCase):
    RTOL = 1e-3
    ATOL = 1e-3

    CALLABLE = pu.CALLABLE

    CASES = pau_port.CASES

    def generate_args(self, params):
        inputs = _pa_generate_inputs(params)
        specs = []
        for name, val in inputs:
            if isinstance(val, torch.Tensor):
                specs.append(TensorArg(name, val))
            else:
                specs.append(Scalar(name, val))
        return TaskArgsBuilder(*specs)

    def compute_golden(self, args, params):
        tensors = {s.name: s.value for s in args.specs if isinstance(s, TensorArg)}
        _pa_compute_golden(tensors, params)
        for s in args.specs:
            if isinstance(s, TensorArg) and s.name in tensors:
                getattr(args, s.name)[:] = tensors[s.name]


if __name__ == "__main__":
    SceneTestCase.run_module(__name__)
