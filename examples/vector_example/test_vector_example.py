"""Vector example: ``out = a + b`` and an accumulator ``acc += x``, host-staged and resident.

Run it under pytest (``pytest examples --simpler-platform sim --simpler-rounds 3``) or standalone
(``python examples/vector_example/test_vector_example.py -p sim --rounds 3``).

* ``TestVectorAdd`` — ``out = a + b`` (IN, IN, OUT). ``staged`` stages everything on every round;
  ``resident_inputs`` keeps ``a`` and ``b`` on the device for the whole case;
  ``resident_all`` also keeps ``out`` there (allocated, never uploaded, read back once).
* ``TestAccumulate`` — ``acc += scale * x`` (IN, INOUT, scalar). Host-staged, ``acc`` is restored
  before every round, so every round computes the same thing; resident, ``acc`` carries across
  rounds and the golden evolves with it (one golden step per round, one readback at the end).
* The manual ``Residency_staged`` / ``Residency_bulk`` pair is a larger matched comparison.
"""

from __future__ import annotations

import numpy as np

import simpler as sp


def _add(a, b, out):
    out[...] = a + b


def _axpy(x, acc, scale):
    acc += scale * x


ADD = sp.Kernel(_add, [sp.IN, sp.IN, sp.OUT])
AXPY = sp.Kernel(_axpy, [sp.IN, sp.INOUT])


def _orch_add(orch, a, b, out):
    orch.submit(ADD, a, b, out)


def _orch_accumulate(orch, x, acc, scale):
    orch.submit(AXPY, x, acc, scale)


@sp.scene_test(level=2)
class TestVectorAdd(sp.SceneTestCase):
    """``out = a + b`` over float32 vectors."""

    CALLABLE = sp.Callable(_orch_add, signature=[sp.IN, sp.IN, sp.OUT])
    CASES = [
        {"name": "staged", "params": {"n": 1024, "resident": ()}},
        {"name": "resident_inputs", "params": {"n": 1024, "resident": ("a", "b")}},
        {"name": "resident_all", "params": {"n": 1024, "resident": ("a", "b", "out")}},
        {"name": "Residency_staged", "params": {"n": 1 << 20, "resident": ()}, "manual": True},
        {"name": "Residency_bulk", "params": {"n": 1 << 20, "resident": ("a", "b", "out")}, "manual": True},
    ]

    def generate_args(self, params):
        rng = np.random.default_rng(0)
        n, resident = params["n"], params["resident"]
        return sp.TaskArgsBuilder(
            sp.TensorArg("a", rng.standard_normal(n, dtype=np.float32), child_memory="a" in resident),
            sp.TensorArg("b", rng.standard_normal(n, dtype=np.float32), child_memory="b" in resident),
            sp.TensorArg("out", np.zeros(n, dtype=np.float32), child_memory="out" in resident),
        )

    def compute_golden(self, args, params):
        args.out[...] = args.a + args.b


@sp.scene_test(level=2)
class TestAccumulate(sp.SceneTestCase):
    """``acc += scale * x``: restored per round when staged, carried across rounds when resident."""

    CALLABLE = sp.Callable(_orch_accumulate, signature=[sp.IN, sp.INOUT])
    CASES = [
        {"name": "acc_staged", "params": {"n": 256, "resident": ()}},
        {"name": "acc_resident", "params": {"n": 256, "resident": ("x", "acc")}},
        {"name": "acc_resident_state_only", "params": {"n": 256, "resident": ("acc",)}},
    ]

    def generate_args(self, params):
        n, resident = params["n"], params["resident"]
        return sp.TaskArgsBuilder(
            sp.TensorArg("x", np.linspace(0.0, 1.0, n, dtype=np.float32), child_memory="x" in resident),
            sp.TensorArg("acc", np.full(n, 2.0, dtype=np.float32), child_memory="acc" in resident),
            sp.Scalar("scale", 0.5),
        )

    def compute_golden(self, args, params):
        args.acc[...] += args.scale * args.x


if __name__ == "__main__":
    sp.main()
