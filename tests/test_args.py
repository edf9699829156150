"""TensorArg / Scalar / TaskArgsBuilder: ordering, access by name, and field-preserving rebuilds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import simpler as sp
from simpler.errors import ArgumentError, ArgumentTypeError


def _builder():
    return sp.TaskArgsBuilder(
        sp.TensorArg("query", np.arange(4, dtype=np.float32), child_memory=True),
        sp.TensorArg("out", np.zeros(4, dtype=np.float32)),
        sp.Scalar("scale", 2.0),
        sp.Scalar("steps", 3),
    )


def test_specs_validate_their_fields():
    with pytest.raises(ArgumentTypeError, match="name"):
        sp.TensorArg("", np.zeros(1))
    with pytest.raises(ArgumentTypeError, match="numpy array or DeviceTensor"):
        sp.TensorArg("x", [1, 2, 3])
    with pytest.raises(ArgumentTypeError, match="child_memory must be a bool"):
        sp.TensorArg("x", np.zeros(1), child_memory="yes")
    with pytest.raises(ArgumentTypeError, match="scalars must be"):
        sp.Scalar("s", np.zeros(1))
    assert sp.TensorArg("x", np.zeros(1)).child_memory is False
    assert sp.Scalar("s", 1).child_memory is False


def test_device_tensor_cannot_be_declared_child_memory():
    with sp.Worker("sim") as w:
        t = w.malloc(16).tensor((4,), "float32")
        assert sp.TensorArg("x", t).value is t
        with pytest.raises(ArgumentError, match="already resident"):
            sp.TensorArg("x", t, child_memory=True)
        w.free(t.buffer)


def test_builder_order_and_access_by_name():
    args = _builder()
    assert args.names == ["query", "out", "scale", "steps"]
    assert [s.name for s in args.tensors()] == ["query", "out"]
    assert [s.name for s in args.scalars()] == ["scale", "steps"]
    assert len(args) == 4 and "scale" in args and "nope" not in args
    assert args.query is args["query"]
    assert args.scale == 2.0 and args["steps"] == 3
    assert [s.name for s in args] == args.names
    assert args.spec("query").child_memory is True
    with pytest.raises(KeyError, match="no argument named 'nope'"):
        args["nope"]
    with pytest.raises(AttributeError, match="nope"):
        _ = args.nope


def test_tensor_after_scalar_is_rejected():
    with pytest.raises(ArgumentError, match="tensor 'b' after a scalar"):
        sp.TaskArgsBuilder(sp.TensorArg("a", np.zeros(1)), sp.Scalar("s", 1), sp.TensorArg("b", np.zeros(1)))
    args = sp.TaskArgsBuilder(sp.Scalar("s", 1))
    with pytest.raises(ArgumentError, match="after a scalar"):
        args.add(sp.TensorArg("t", np.zeros(1)))


def test_duplicate_and_shadowing_names_are_rejected():
    with pytest.raises(ArgumentError, match="duplicate argument name 'a'"):
        sp.TaskArgsBuilder(sp.TensorArg("a", np.zeros(1)), sp.TensorArg("a", np.zeros(1)))
    for bad in ("clone", "specs", "replace", "tensors", "names", "add", "_private", "__len__"):
        with pytest.raises(ArgumentError, match="shadow"):
            sp.TaskArgsBuilder(sp.TensorArg(bad, np.zeros(1)))
    with pytest.raises(ArgumentTypeError, match="TensorArg or Scalar"):
        sp.TaskArgsBuilder(("a", np.zeros(1)))


def test_clone_deep_copies_arrays_and_keeps_every_field():
    args = _builder()
    c = args.clone()
    assert c.names == args.names
    for a, b in zip(args.specs, c.specs):
        assert type(a) is type(b)
        for f in dataclasses.fields(a):
            if f.name != "value":
                assert getattr(a, f.name) == getattr(b, f.name), f.name
    assert c.spec("query").child_memory is True and c.spec("out").child_memory is False
    assert c.query is not args.query and not np.shares_memory(c.query, args.query)
    np.testing.assert_array_equal(c.query, args.query)
    c.query[0] = 99
    assert args.query[0] == 0
    assert c.scale == 2.0


def test_clone_of_a_clone_keeps_child_memory():
    c = _builder().clone().clone()
    assert [s.child_memory for s in c.tensors()] == [True, False]


def test_replace_keeps_fields_and_works_on_scalars():
    args = _builder()
    new = np.ones(4, dtype=np.float32)
    spec = args.replace("query", new)
    assert spec.child_memory is True and args.query is new
    args.replace("scale", 5.0)
    assert args.scale == 5.0 and isinstance(args.spec("scale"), sp.Scalar)
    args.steps = 7  # attribute assignment is replace()
    assert args.steps == 7
    with pytest.raises(AttributeError, match="no argument named"):
        args.other = 1
    with pytest.raises(ArgumentTypeError):
        args.replace("scale", "not a number")


def test_loops_over_specs_do_not_break_on_scalars():
    args = _builder()
    # reading the flag works on every spec
    assert [s.child_memory for s in args.specs] == [True, False, False, False]
    # NamedTuple-style _replace keeps fields; on a scalar, child_memory is ignored (a scalar has
    # no device memory), so a loop that makes every spec resident does not break on scalars.
    rebuilt = [s._replace(value=s.value) for s in args.specs]
    assert rebuilt[0].child_memory is True
    assert [s._replace(child_memory=False).name for s in args.scalars()] == ["scale", "steps"]
    resident = [s._replace(child_memory=True) for s in args.specs]
    assert [s.child_memory for s in resident] == [True, True, False, False]
    assert resident[2] is args.spec("scale") and resident[3] is args.spec("steps")
    # the supported way to make everything resident skips scalars
    args.with_child_memory()
    assert [s.child_memory for s in args.tensors()] == [True, True]
    args.with_child_memory("out", child_memory=False)
    assert args.spec("out").child_memory is False
    with pytest.raises(ArgumentError, match="'scale' is a scalar"):
        args.with_child_memory("scale")


def test_worker_runs_a_builder_host_staged():
    def add(a, b, out):
        out[...] = a + b

    k = sp.Kernel(add, [sp.IN, sp.IN, sp.OUT])
    c = sp.Callable(lambda o, a, b, out, s: o.submit(k, a, b, out), [sp.IN, sp.IN, sp.OUT])
    args = sp.TaskArgsBuilder(
        sp.TensorArg("a", np.arange(4, dtype=np.float32)),
        sp.TensorArg("b", np.ones(4, dtype=np.float32)),
        sp.TensorArg("out", np.zeros(4, dtype=np.float32)),
        sp.Scalar("s", 1),
    )
    with sp.Worker("sim") as w:
        report = w.run(c, args)
        assert report.counters["staged_tensors"] == 3
    np.testing.assert_array_equal(args.out, np.arange(4) + 1)


def test_run_errors_name_the_argument():
    c = sp.Callable(lambda o, x: None, [sp.OUT])
    ro = np.zeros(4, dtype=np.float32)
    ro.flags.writeable = False
    with sp.Worker("sim") as w, pytest.raises(ArgumentError, match="'kv_cache'"):
        w.run(c, sp.TaskArgsBuilder(sp.TensorArg("kv_cache", ro)))
