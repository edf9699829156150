"""The torch-free twin of ``test_upstream_vector_example.py`` (the upstream vector example, ported): the
same ``CASES``, kernels and golden over numpy arrays, so the port runs where torch is absent."""

from __future__ import annotations

import numpy as np
from vector_kernels import VECTOR_CALLABLE

from simpler import SceneTestCase, TaskArgsBuilder, TensorArg, scene_test


@scene_test(level=2, runtime="tensormap_and_ringbuffer")
class TestVectorExampleNumpy(SceneTestCase):
    """``f = (a + b + 1) * (a + b + 2) + (a + b)`` over numpy arrays."""

    CALLABLE = VECTOR_CALLABLE
    CASES = [
        {
            "name": "default",
            "platforms": ["a2a3sim", "a2a3"],
            "manual": ["a2a3sim"],
            "params": {},
        },
    ]

    def generate_args(self, params):
        size = 128 * 128
        return TaskArgsBuilder(
            TensorArg("a", np.full((size,), 2.0, dtype=np.float32)),
            TensorArg("b", np.full((size,), 3.0, dtype=np.float32)),
            TensorArg("f", np.zeros(size, dtype=np.float32)),
        )

    def compute_golden(self, args, params):
        args.f[:] = (args.a + args.b + 1) * (args.a + args.b + 2) + (args.a + args.b)


if __name__ == "__main__":
    SceneTestCase.run_module(__name__)
