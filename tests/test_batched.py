"""Many tasks per call: ``orch.submit_many`` against single ``submit``.

A batched submit records exactly the tasks the equivalent single submits would (same order,
views, scalars, counters and results), with the same checks; each refusal names what is wrong
and leaves the run usable.
"""

from __future__ import annotations

import numpy as np
import pytest

import simpler as sp

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT
ROWS, COLS = 48, 8


def _scale(x, y, a, b):
    y[...] = x * a + b


SCALE = sp.Kernel(_scale, [IN, (OUT, "float32")])


def _single(o, k, x, y, a):
    for r in range(ROWS):
        o.submit(k, x.view([1, COLS], [r, 0]), y.view([1, COLS], [r, 0]), int(a[r]), 0.5)


def _batched(o, k, x, y, a):
    rows = np.stack([np.arange(ROWS), np.zeros(ROWS, np.int64)], axis=1)
    first = o.submit_many(k, x.views([1, COLS], rows), y.views([1, COLS], rows), a, 0.5)
    assert first == 0


def _run(orch, svm):
    """Runs ``orch`` with a kernel that records what each task received."""
    seen = []

    def record(x, y, a, b):
        seen.append((x.tolist(), a, b))
        _scale(x, y, a, b)

    k = sp.Kernel(record, [IN, (OUT, "float32")], name="scale")
    a = np.arange(ROWS, dtype=np.int64) % 5
    x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    y = np.zeros_like(x)
    with sp.Worker("sim", svm=svm) as w, sp.ResidentTaskArgs(w) as res:
        rx = res.add("x", x)
        r = w.run(sp.Callable(lambda o, x, y: orch(o, k, x, y, a), [IN, OUT]), [rx, y])
        stats = w.stats()
    return y, r, seen, stats


@pytest.mark.parametrize("svm", ["always", "never"])
def test_batched_and_single_submits_are_identical(svm):
    y1, r1, seen1, s1 = _run(_single, svm)
    y2, r2, seen2, s2 = _run(_batched, svm)
    np.testing.assert_array_equal(y1, y2)
    a = np.arange(ROWS) % 5
    x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    np.testing.assert_array_equal(y1, x * a[:, None] + 0.5)
    assert seen1 == seen2 and len(seen1) == ROWS
    assert all(type(s[1]) is int and type(s[2]) is float for s in seen2)
    c1, c2 = dict(r1.counters), dict(r2.counters)
    assert (c1.pop("submits"), c2.pop("submits")) == (ROWS, 1)
    assert c1 == c2 and c1["tasks"] == ROWS
    assert s1 == s2  # the same driver calls


def _errors_orch(errors):
    def orch(o, x, y):
        rows = np.stack([np.arange(ROWS), np.zeros(ROWS, np.int64)], axis=1)
        bad = [
            # A view of row ROWS (one past the end).
            lambda: y.views([1, COLS], rows + np.array([1, 0])),
            # The kernel's signature wants float32 where an int32 tensor is given.
            lambda: o.submit_many(SCALE, x.views([1, COLS], rows), ints.views([1, COLS], rows), 1, 0.5),
            # Offsets of the wrong shape: (n, 1) for a rank-2 tensor.
            lambda: y.views([1, COLS], rows[:, :1]),
            # Per-task scalars whose length differs from the views'.
            lambda: o.submit_many(
                SCALE, x.views([1, COLS], rows), y.views([1, COLS], rows), np.ones(ROWS - 1), 0.5
            ),
            # Offsets that are not integers.
            lambda: y.views([1, COLS], rows.astype(np.float64)),
        ]
        ints = o.scratch([ROWS, COLS], "int32", name="ints")
        for f in bad:
            with pytest.raises(sp.SimplerError) as ei:
                f()
            errors.append(ei.value)
        # The run is still usable: a valid batch, then a read it would make stale is refused.
        o.submit_many(SCALE, x.views([1, COLS], rows), y.views([1, COLS], rows), 2, 0.0)
        with pytest.raises(sp.HazardError) as ei:
            o.get_tensor_data(y, (7, 3))
        errors.append(ei.value)
        assert o.get_tensor_data(x, (7, 3)) == 7 * COLS + 3  # x is only read by the tasks

    return orch


def test_batched_submit_errors_are_clear_and_leave_the_run_usable():
    errors = []
    x = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    y = np.zeros_like(x)
    with sp.Worker("sim") as w:
        r = w.run(sp.Callable(_errors_orch(errors), [IN, OUT]), [x, y])
    np.testing.assert_array_equal(y, x * 2)
    assert r.counters["tasks"] == ROWS
    msgs = [str(e) for e in errors]
    assert isinstance(errors[0], sp.ArgumentError)
    assert "(row 47 of the offsets): view shape [1, 8] at offsets [48, 0] runs past shape [48, 8]" in msgs[0]
    assert isinstance(errors[1], sp.ArgumentTypeError)
    assert "tensor 'ints' is int32, signature wants float32" in msgs[1], msgs[1]
    assert "view offsets must have shape (n, 2), not (48, 1)" in msgs[2], msgs[2]
    assert "scalar 0 has 47 rows, expected 48 (one per task)" in msgs[3], msgs[3]
    assert isinstance(errors[4], sp.ArgumentTypeError) and "integers" in msgs[4], msgs[4]
    assert isinstance(errors[5], sp.HazardError)
    assert "which task 7 (kernel _scale) submitted earlier in this run writes" in msgs[5], msgs[5]


def test_shared_positions_need_a_count_and_views_of_a_finished_run_are_refused():
    kept = {}

    def orch(o, x, y):
        with pytest.raises(sp.ArgumentError, match="the task count must be given"):
            o.submit_many(SCALE, x.view([1, COLS], [0, 0]), y.view([1, COLS], [0, 0]), 1, 0.0)
        o.submit_many(SCALE, x.view([1, COLS], [0, 0]), y.view([1, COLS], [0, 0]), 3, 0.0, count=2)
        kept["views"] = y.views([1, COLS], [[1, 0]])

    x = np.ones((ROWS, COLS), np.float32)
    y = np.zeros_like(x)
    with sp.Worker("sim") as w:
        r = w.run(sp.Callable(orch, [IN, OUT]), [x, y])
        assert r.counters["tasks"] == 2 and r.counters["submits"] == 1
        np.testing.assert_array_equal(y[0], 3)

        def later(o, x, y):
            o.submit_many(SCALE, x.views([1, COLS], [[1, 0]]), kept["views"], 1, 0.0)

        with pytest.raises(sp.StateError, match="is not in progress"):
            w.run(sp.Callable(later, [IN, OUT]), [x, y])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int64])
def test_per_task_integer_scalars_arrive_as_single_submits_give_them(dtype):
    """Every integer dtype of a per-task scalar column: the kernel receives the same Python ints
    as from single submits (an unsigned value past 2**63 stays unsigned, never negative)."""
    info = np.iinfo(dtype)
    values = np.array([info.min, 0, 1, info.max], dtype)
    got: dict[str, list[int]] = {"many": [], "single": []}

    def make(arm):
        return sp.Kernel(lambda x, s: got[arm].append(s), [IN], name=f"k_{arm}")

    k_many, k_single = make("many"), make("single")

    def orch(o, t):
        o.submit_many(k_many, t, values)
        for v in values:
            o.submit(k_single, t, v)

    with sp.Worker("sim") as w:
        w.run(sp.Callable(orch, [IN]), [np.zeros(4, np.float32)])
    assert got["many"] == got["single"] == [int(v) for v in values]


def test_an_empty_batch_records_no_task():
    """``submit_many(..., count=0)`` is checked like any batch and records nothing: a later
    read of its tensor is no hazard, and no task runs."""
    ran = []
    k = sp.Kernel(lambda y: ran.append(1), [OUT], name="w")

    def orch(o, t):
        o.submit_many(k, t, count=0)
        o.submit_many(k, t.views([2], np.zeros((0, 1), np.int64)))
        assert o.read_tensor(t).tolist() == [1.0, 2.0]
        with pytest.raises(sp.ArgumentError, match="count"):
            o.submit_many(k, t, count=-1)

    with sp.Worker("sim") as w:
        rep = w.run(sp.Callable(orch, [INOUT]), [np.array([1, 2], np.float32)])
    assert ran == [] and rep.counters["tasks"] == 0


_K = sp.Kernel(lambda x, *s: None, [IN], name="k")

_EDGES = {
    # name: (call over a 0-d tensor t0 and an 8-element tensor t1, exception or None)
    "0-d view": (lambda o, t0, t1: t0.view([], []), None),
    "0-d views, (n, 0) offsets": (
        lambda o, t0, t1: o.submit_many(_K, t0.views([], np.zeros((3, 0), np.int64))),
        None,
    ),
    "0-d views, (n, 1) offsets": (
        lambda o, t0, t1: o.submit_many(_K, t0.views([], np.full((3, 1), 2**40, np.int64))),
        sp.ArgumentError,
    ),
    "0-d views, (n, 1) offsets as a list": (
        lambda o, t0, t1: o.submit_many(_K, t0.views([], [[0], [0]])),
        sp.ArgumentError,
    ),
    "0-d element": (lambda o, t0, t1: o.get_tensor_data(t0, ()), None),
    "0-d read_tensor": (lambda o, t0, t1: o.read_tensor(t0), None),
    "numpy integer index": (lambda o, t0, t1: o.get_tensor_data(t1, np.int64(2)), None),
    "0-d array index": (lambda o, t0, t1: o.get_tensor_data(t1, np.array(2)), None),
    "numpy count": (lambda o, t0, t1: o.submit_many(_K, t1, count=np.int64(2)), None),
    "numpy array shape": (
        lambda o, t0, t1: o.submit_many(_K, t1.views(np.array([2]), np.array([[0], [1]]))),
        None,
    ),
    "numpy array scratch shape": (lambda o, t0, t1: o.scratch(np.array([2, 2]), "int32"), None),
    "bool count": (lambda o, t0, t1: o.submit_many(_K, t1, count=True), sp.ArgumentTypeError),
    "count past 2**32": (lambda o, t0, t1: o.submit_many(_K, t1, count=2**40), sp.ArgumentError),
    "2-d scalar column": (
        lambda o, t0, t1: o.submit_many(_K, t1, np.zeros((2, 2), np.int64)),
        sp.ArgumentError,
    ),
    "uint64 offset past int64": (
        lambda o, t0, t1: o.submit_many(_K, t1.views([2], np.array([[2**63]], np.uint64))),
        sp.ArgumentError,
    ),
    "70000 scalars": (lambda o, t0, t1: o.submit(_K, t1, *([1] * 70000)), sp.ArgumentError),
}


@pytest.mark.parametrize("edge", sorted(_EDGES))
def test_edges_of_the_view_and_batch_api_work_or_say_what_is_wrong(edge):
    """0-d tensors, zero and huge counts, numpy integers and arrays where ints are expected,
    counts past the task store's integer widths: each works, or is an error of the right class
    that names the problem (never a wrapped number or a run of 2**40 tasks)."""
    call, exc = _EDGES[edge]
    errors = []

    def orch(o, t0, t1):
        try:
            call(o, t0, t1)
        except sp.SimplerError as e:
            errors.append(e)

    with sp.Worker("sim") as w:
        w.run(sp.Callable(orch, [IN, IN]), [np.array(5, np.int32), np.arange(8, dtype=np.int32)])
    if exc is None:
        assert errors == []
    else:
        assert len(errors) == 1 and isinstance(errors[0], exc), errors
        assert "-9223372036854775808" not in str(errors[0])


def test_a_0d_views_offset_row_has_no_coordinates():
    """A view of a 0-d tensor has no dimensions, so each row of its offsets has no coordinates:
    an ``(n, 1)`` row (of any value, 2**40 included) is refused naming the tensor, the columns
    wanted and the columns given, whether it comes as an int64 array or as a list, and no task
    runs; ``(n, 0)`` rows give n tasks."""
    ran = []
    k = sp.Kernel(lambda x: ran.append(int(x)), [IN], name="k")
    msgs = []

    def orch(o, t0):
        for rows in (np.full((3, 1), 2**40, np.int64), [[0], [0]]):
            with pytest.raises(sp.ArgumentError) as ei:
                o.submit_many(k, t0.views([], rows))
            msgs.append(str(ei.value))
        o.submit_many(k, t0.views([], np.zeros((2, 0), np.int64)))

    with sp.Worker("sim") as w:
        rep = w.run(sp.Callable(orch, [IN]), [np.array(5, np.int32)])
    assert rep.counters["tasks"] == 2 and ran == [5, 5]
    assert "tensor arg0: view offsets must have shape (n, 0), not (3, 1)" in msgs[0], msgs[0]
    assert "tensor arg0: view offsets must have shape (n, 0), not (2, 1)" in msgs[1], msgs[1]


def test_offsets_and_columns_are_converted_or_refused_by_what_they_are():
    """View offsets and per-task scalars that are not already the arrays the runtime takes are
    converted (a list, a uint64 array within int64, a rank-1 vector for a rank-1 tensor, no
    offsets of any dtype) or refused with the tensor or the scalars named: ragged rows, floats,
    an unsigned offset past int64, a 2-D column of scalars."""
    seen = []
    k = sp.Kernel(lambda x, a: seen.append((x.tolist(), a)), [IN], name="k")
    errors = []

    def orch(o, v):
        o.submit_many(k, v.views([2], [[0], [2]]), [1, 2])
        o.submit_many(k, v.views([2], np.array([1], np.uint64)), np.array([3], np.uint8))
        o.submit_many(k, v.views([2], np.zeros((0,), np.float64)), np.zeros(0, np.float64))
        bad = [
            (sp.ArgumentError, lambda: v.views([2], [[0], [1, 2]])),
            (sp.ArgumentTypeError, lambda: v.views([2], np.array([[0.5]]))),
            (sp.ArgumentError, lambda: v.views([2], np.array([[2**63]], np.uint64))),
            (sp.ArgumentError, lambda: o.submit_many(k, v.views([2], [[0], [1]]), np.ones((2, 1)))),
        ]
        for exc, f in bad:
            with pytest.raises(exc) as ei:
                f()
            errors.append(str(ei.value))

    with sp.Worker("sim") as w:
        w.run(sp.Callable(orch, [IN]), [np.arange(4, dtype=np.int32)])
    assert seen == [([0, 1], 1), ([2, 3], 2), ([1, 2], 3)]
    assert "tensor arg0: view offsets must be a rectangular array of numbers" in errors[0], errors[0]
    assert "tensor arg0: view offsets must be integers, not float64" in errors[1], errors[1]
    assert "view offset 9223372036854775808 is out of range (at most 2**63 - 1)" in errors[2], errors[2]
    assert "per-task scalars must be a 1-D array, not shape (2, 1)" in errors[3], errors[3]


@pytest.mark.parametrize("n", [65_536, 65_537])
def test_a_kernel_of_more_tensors_than_a_task_holds_is_refused(n):
    """A task keeps its tensor count in 16 bits: a kernel of 65,536 or 65,537 tensors is refused
    at submit (single and batched), naming the count and the limit, instead of running with 0 or
    1 array; 65,535 tensors reach the kernel as 65,535 arrays."""
    got, errors = [], []

    def kernel(*arrays):
        got.append(len(arrays))

    wide = sp.Kernel(kernel, [IN] * n, name="wide")
    widest = sp.Kernel(kernel, [IN] * 65_535, name="widest")

    def orch(o, x):
        for call in (lambda: o.submit(wide, *[x] * n), lambda: o.submit_many(wide, *[x] * n, count=2)):
            with pytest.raises(sp.ArgumentError) as ei:
                call()
            errors.append(str(ei.value))
        o.submit(widest, *[x] * 65_535)

    with sp.Worker("sim") as w:
        rep = w.run(sp.Callable(orch, [IN]), [np.arange(4, dtype=np.float32)])
    assert got == [65_535] and rep.counters["tasks"] == 1
    assert f"submit wide: {n} tensors per task exceeds the limit of 65535" in errors[0], errors
    assert f"submit_many wide: {n} tensors per task exceeds the limit of 65535" in errors[1], errors


def test_a_refused_large_batch_records_none_of_its_tasks():
    """A batch of a million tasks and more is recorded in parts (to answer Ctrl+C between them);
    when its last task is refused, the parts before it go too: the call is all or nothing, as
    for a small batch, and the next task is task 0."""
    k = sp.Kernel(lambda x, y: None, [IN, (OUT, "float32")], name="k")
    n = (1 << 20) + 5
    seen = {}

    def orch(o, x):
        ri = np.arange(n, dtype=np.int64)[:, None]
        ro = ri + n
        ro[-1] = ri[-1]  # the last task's input is its output
        with pytest.raises(sp.HazardError, match=f"task {n - 1} reads a view that shares bytes"):
            o.submit_many(k, x.views([1], ri), x.views([1], ro))
        seen["next"] = o.submit(k, x.view([1], [0]), x.view([1], [n]))

    with sp.Worker("sim") as w:
        r = w.run(sp.Callable(orch, [INOUT]), [np.zeros(2 * n, np.float32)])
    assert seen["next"] == 0
    assert (r.counters["tasks"], r.counters["submits"]) == (1, 1)
