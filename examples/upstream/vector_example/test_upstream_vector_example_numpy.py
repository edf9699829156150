"""The torch-free twin of ``test_upstream_vector_example.py`` (the upstream vector example, ported): the
same ``CASES``, kernels and golden over numpy arrays, so the port runs where torch is absent."""

from __future__ import annotations

import numpy as np
from vector_kernels import VectorExampleCase

from simpler import SceneTestCase, TaskArgsBuilder, TensorArg, scene_test


@scene_test(level=2, runtime="tensormap_and_ringbuffer")
class TestVectorExampleNumpy(VectorExampleCase):
    """Upstream's vector example over numpy arrays."""

    def generate_args(self, params):
        size = self.SIZE
        return TaskArgsBuilder(
            TensorArg("a", np.full((size,), 2.0, dtype=np.float32)),
            TensorArg("b", np.full((size,), 3.0, dtype=np.float32)),
            TensorArg("f", np.zeros(size, dtype=np.float32)),
        )


if __name__ == "__main__":
    SceneTestCase.run_module(__name__)
