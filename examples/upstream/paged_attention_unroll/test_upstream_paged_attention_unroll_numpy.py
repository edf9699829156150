"""The torch-free twin of ``test_upstream_paged_attention_unroll.py`` (upstream's unrolled paged
attention, ported): the same class body, cases and golden, with inputs made over numpy
(``pau_port.generate_inputs``), so the port runs where torch is absent."""

from __future__ import annotations

import numpy as np
import pau_port
from pau_port import compute_golden as _pa_compute_golden
from pau_port import generate_inputs as _pa_generate_inputs

from simpler import Scalar, SceneTestCase, TaskArgsBuilder, TensorArg, scene_test
from simpler.workloads import paged_attention_unroll as pu


@scene_test(level=2, runtime="tensormap_and_ringbuffer")
class TestPagedAttentionUnrollManualScopeNumpy(SceneTestCase):
    RTOL = 1e-3
    ATOL = 1e-3

    CALLABLE = pu.CALLABLE

    CASES = pau_port.CASES

    def generate_args(self, params):
        inputs = _pa_generate_inputs(params)
        specs = []
        for name, val in inputs:
            if isinstance(val, np.ndarray):
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
