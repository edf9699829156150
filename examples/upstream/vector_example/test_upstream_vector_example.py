"""The upstream runtime's vector example, ported as a user would port it (docs/porting.md).

Its ``CASES``, params, ``generate_args`` and ``compute_golden`` are upstream's, in upstream's
form (torch tensors, the ``a2a3sim`` / ``a2a3`` platform names, a per-platform ``manual`` list,
``runtime=`` on the decorator, ``SceneTestCase.run_module``); what changed is what the porting
page lists: the imports, and the kernels, which are Python functions here instead of the
upstream AIV sources. ``f = (a + b + 1) * (a + b + 2) + (a + b)`` over 16,384 float32 values.

Torch is not a dependency of simpler (its wheel pulls gigabytes of CUDA libraries), so this file
skips where torch is absent (run standalone, it needs torch); its twin
``test_upstream_vector_example_numpy.py`` is the same test over numpy arrays and always runs.

    pytest examples/upstream --simpler-platform sim --simpler-manual include
    python examples/upstream/vector_example/test_upstream_vector_example.py -p sim --manual include
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed; the numpy twin covers this port")

from vector_kernels import VectorExampleCase  # noqa: E402  (CASES, golden, Python kernels)

from simpler import SceneTestCase, TaskArgsBuilder, TensorArg, scene_test  # noqa: E402


@scene_test(level=2, runtime="tensormap_and_ringbuffer")
class TestVectorExample(VectorExampleCase):
    """Upstream's vector example over torch tensors."""

    def generate_args(self, params):
        size = self.SIZE
        return TaskArgsBuilder(
            TensorArg("a", torch.full((size,), 2.0, dtype=torch.float32)),
            TensorArg("b", torch.full((size,), 3.0, dtype=torch.float32)),
            TensorArg("f", torch.zeros(size, dtype=torch.float32)),
        )


if __name__ == "__main__":
    SceneTestCase.run_module(__name__)
