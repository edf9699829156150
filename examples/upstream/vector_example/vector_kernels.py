"""What both files of the ported vector example share: upstream's ``CASES`` and golden (in
:class:`VectorExampleCase`), and the kernels, the Python stand-ins for upstream's three AIV
kernels (add, add a scalar, multiply) with an orchestration over run-scoped scratch tensors,
upstream's signature ``[IN, IN, OUT]``. Each file adds only ``generate_args`` (torch or numpy)."""

from __future__ import annotations

import simpler as sp
from simpler import SceneTestCase
from simpler.task_interface import ArgDirection as D


def _add(x, y, out):
    out[...] = x + y


def _add_scalar(x, out, value):
    out[...] = x + value


def _mul(x, y, out):
    out[...] = x * y


ADD = sp.Kernel(_add, [D.IN, D.IN, D.OUT], name="add")
ADD_SCALAR = sp.Kernel(_add_scalar, [D.IN, D.OUT], name="add_scalar")
MUL = sp.Kernel(_mul, [D.IN, D.IN, D.OUT], name="mul")


def orchestrate(o, a, b, f):
    """c = a + b; d = c + 1; e = c + 2; g = d * e; f = g + c."""
    shape = list(a.shape)
    c, d, e, g = (o.scratch(shape, "float32", name=n) for n in ("c", "d", "e", "g"))
    o.submit(ADD, a, b, c)
    o.submit(ADD_SCALAR, c, d, 1.0)
    o.submit(ADD_SCALAR, c, e, 2.0)
    o.submit(MUL, d, e, g)
    o.submit(ADD, g, c, f)


VECTOR_CALLABLE = sp.Callable(orchestrate, signature=[D.IN, D.IN, D.OUT], name="vector_example")


class VectorExampleCase(SceneTestCase):
    """``f = (a + b + 1) * (a + b + 2) + (a + b)`` over 16,384 float32 values (upstream's vector
    example); subclasses supply ``generate_args`` with ``a`` = 2, ``b`` = 3 and ``f`` = 0."""

    CALLABLE = VECTOR_CALLABLE
    CASES = [
        {
            "name": "default",
            "platforms": ["a2a3sim", "a2a3"],
            "manual": ["a2a3sim"],
            "params": {},
        },
    ]
    SIZE = 128 * 128

    def compute_golden(self, args, params):
        args.f[:] = (args.a + args.b + 1) * (args.a + args.b + 2) + (args.a + args.b)
