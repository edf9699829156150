"""Batched and single submits against a model.

Each example builds a tensor (rank 0 to 2, any supported integer or float dtype), then an
orchestration that interleaves ``submit_many`` batches (per-task views at random offsets,
in-bounds or out of bounds, empty batches, per-task scalar columns of every integer dtype with
their extreme values), single submits, and host reads of the tensor. A model says what every
task must receive (the elements of its view, its scalars as Python ints), which calls are
refused, and what every host read returns; the kernel records what it received.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import simpler as sp

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
TENSOR_DTYPES = ["int8", "uint16", "int32", "int64", "float32", "uint64"]


@st.composite
def scalar_columns(draw, n):
    """A per-task scalar column of ``n`` values of a random integer dtype, extremes included."""
    dt = draw(st.sampled_from(INT_DTYPES))
    info = np.iinfo(dt)
    values = draw(
        st.lists(st.sampled_from([info.min, info.max, 0, 1, info.max // 3]), min_size=n, max_size=n)
    )
    return np.array(values, dtype=dt)


@st.composite
def batches(draw, shape):
    """One operation of the orchestration: a batch, a single submit or a host read."""
    kind = draw(st.sampled_from(["many", "many", "single", "read"]))
    rank = len(shape)
    if kind == "read":
        index = tuple(draw(st.integers(0, max(d - 1, 0))) for d in shape)
        return ("read", index)
    view = [draw(st.integers(1, max(d, 1))) if d else 0 for d in shape]
    n = draw(st.integers(0, 5)) if kind == "many" else 1
    huge = draw(st.booleans()) and draw(st.booleans())  # a quarter of them reach out of bounds
    rows = []
    for _ in range(n):
        row = []
        for d, v in zip(shape, view):
            hi = d - v
            row.append(draw(st.integers(hi + 1, hi + 2**40)) if huge else draw(st.integers(0, max(hi, 0))))
        rows.append(row)
    offsets = np.array(rows, dtype=np.int64).reshape(n, max(rank, 1)) if rank else np.zeros((n, 1), np.int64)
    column = draw(scalar_columns(n))
    return (kind, view, offsets, column)


@st.composite
def programs(draw):
    rank = draw(st.integers(0, 2))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(rank))
    dtype = draw(st.sampled_from(TENSOR_DTYPES))
    ops = draw(st.lists(batches(shape), min_size=1, max_size=6))
    return shape, dtype, ops


def _fits(shape, view, row):
    return all(o + v <= d for d, v, o in zip(shape, view, row))


@given(programs())
def test_batched_and_single_submits_match_the_model(program):
    shape, dtype, ops = program
    host = (np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64) % 100).astype(dtype).reshape(shape)
    got: list[tuple[list, int]] = []
    k = sp.Kernel(lambda x, s: got.append((x.tolist(), s)), [sp.IN], name="record")
    want: list[tuple[list, int]] = []
    refused: list[bool] = []

    def view_of(view, row):
        if not shape:
            return host.tolist()
        sl = tuple(slice(o, o + v) for o, v in zip(row, view))
        return host[sl].tolist()

    def orch(o, t):
        for op in ops:
            if op[0] == "read":
                idx = op[1] if shape else 0
                expected = host[op[1]] if shape else host[()]
                assert o.get_tensor_data(t, idx if shape else ()) == expected.item()
                continue
            kind, view, offsets, column = op
            rows = [list(r)[: len(shape)] for r in offsets]
            fits = all(_fits(shape, view, r) for r in rows)
            try:
                if kind == "many":
                    slot = t.views(view, offsets) if shape else t
                    if shape:
                        o.submit_many(k, slot, column)
                    else:
                        o.submit_many(k, slot, column, count=len(column))
                else:
                    tv = t.view(view, rows[0]) if shape else t
                    o.submit(k, tv, column[0])
            except (sp.ArgumentError, sp.GeometryError):
                refused.append(True)
                assert not fits, (view, rows)
                continue
            refused.append(False)
            assert fits, (view, rows)
            want.extend((view_of(view, r), int(c)) for r, c in zip(rows or [[]] * len(column), column))

    with sp.Worker("sim") as w:
        w.run(sp.Callable(orch, [sp.IN]), [host])
    assert got == want
