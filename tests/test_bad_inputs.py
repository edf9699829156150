"""The bad-input catalogue: every case fails with a clear error and leaks nothing.

Each case is a function that prepares what it needs on a warm worker (the caller's own buffers,
a resident set, ...) and returns the call that must fail. The test checks the exact exception
class, that the message names what is wrong (the tensor, the size, the index, the buffer), and
that the failed call left the live allocations, mappings and the staging arena as they were.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import simpler as sp
from simpler.errors import (
    ArgumentError,
    ArgumentTypeError,
    GeometryError,
    PlatformUnavailableError,
    StateError,
)

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT
CASES = []


def case(exc, pattern):
    """Registers a catalogue case: ``fn(w) -> thunk``; the thunk must raise ``exc`` matching ``pattern``."""

    def deco(fn):
        CASES.append(pytest.param(fn, exc, pattern, id=fn.__name__))
        return fn

    return deco


def _add(x, y, out):
    out[...] = x + y


ADD = sp.Kernel(_add, [IN, IN, OUT], name="add")
ADD_CALL = sp.Callable(lambda o, x, y, out: o.submit(ADD, x, y, out), [IN, IN, OUT], name="add_call")


def _f32(n=8, v=1.0):
    return np.full(n, v, np.float32)


def _orch(w, fn, sig, args):
    """A thunk running a callable whose orchestration is ``fn(o, *tensors)``."""
    return lambda: w.run(sp.Callable(fn, sig, name="probe"), args)


def _buffer_tensor(w, arr):
    buf = w.malloc(arr.nbytes)
    w.copy_to(buf, arr)
    return buf, buf.tensor(arr.shape, arr.dtype)


# ---- argument lists -------------------------------------------------------------------------


@case(ArgumentError, r"add_call: signature has 3 tensor arguments, got 2")
def too_few_tensors(w):
    return lambda: w.run(ADD_CALL, [_f32(), _f32()])


@case(ArgumentError, r"add_call: signature has 3 tensor arguments, got 4")
def too_many_tensors(w):
    return lambda: w.run(ADD_CALL, [_f32(), _f32(), _f32(), _f32()])


@case(ArgumentError, r"tensor 'arg2' after scalar 'arg1' \(tensors come first\)")
def tensor_after_scalar_in_run(w):
    return lambda: w.run(ADD_CALL, [_f32(), 1.0, _f32(), _f32()])


@case(ArgumentError, r"tensor 'late' after a scalar")
def tensor_after_scalar_in_builder(w):
    return lambda: sp.TaskArgsBuilder(
        sp.TensorArg("x", _f32()), sp.Scalar("s", 1), sp.TensorArg("late", _f32())
    )


@case(ArgumentTypeError, r"tensor 'arg2' is float32, signature wants float16")
def dtype_mismatch_with_signature(w):
    call = sp.Callable(lambda o, *t: None, [IN, IN, (OUT, "float16")], name="typed")
    return lambda: w.run(call, [_f32(), _f32(), _f32()])


@case(ArgumentTypeError, r"tensor arg0: unsupported dtype 'complex64'")
def unsupported_dtype_staged(w):
    return lambda: w.run(ADD_CALL, [np.zeros(4, np.complex64), _f32(4), _f32(4)])


@case(ArgumentTypeError, r"resident tensor 'obj': unsupported dtype 'object'")
def unsupported_dtype_resident(w):
    res = sp.ResidentTaskArgs(w)
    return lambda: res.add("obj", np.array([object(), object()]))


@case(ArgumentTypeError, r"run add_call: argument 'arg3': scalars must be int, float or bool, not str")
def scalar_of_wrong_type_in_run(w):
    return lambda: w.run(ADD_CALL, [_f32(), _f32(), _f32(), "three"])


@case(ArgumentTypeError, r"Scalar 'n': scalars must be int, float or bool, not list")
def scalar_spec_of_wrong_type(w):
    return lambda: sp.Scalar("n", [1, 2])


@case(ArgumentError, r"run add_call: tensor 'arg2' is OUT but its array is read-only")
def read_only_output_array(w):
    out = _f32()
    out.flags.writeable = False
    return lambda: w.run(ADD_CALL, [_f32(), _f32(), out])


@case(ArgumentTypeError, r"run: expected a Callable, got Kernel")
def run_of_a_kernel(w):
    return lambda: w.run(ADD, [_f32(), _f32(), _f32()])


# ---- names ----------------------------------------------------------------------------------


@case(ArgumentError, r"duplicate argument name 'x'")
def duplicate_builder_name(w):
    return lambda: sp.TaskArgsBuilder(sp.TensorArg("x", _f32()), sp.TensorArg("x", _f32()))


@case(ArgumentError, r"argument name 'clone' would shadow a builder member")
def shadowing_builder_name(w):
    return lambda: sp.TaskArgsBuilder(sp.TensorArg("clone", _f32()))


@case(ArgumentError, r"resident tensor 'kv' was already added")
def duplicate_resident_name(w):
    res = sp.ResidentTaskArgs(w)
    res.add("kv", _f32())
    return lambda: res.add("kv", _f32(4, 2.0))


# ---- resident fixtures ----------------------------------------------------------------------


@case(ArgumentError, r"resident tensor 'col': array must be C-contiguous .*shape \[4\]")
def non_contiguous_resident_fixture(w):
    res = sp.ResidentTaskArgs(w)
    return lambda: res.add("col", np.zeros((4, 4), np.float32)[:, 1])


@case(ArgumentError, r"resident tensor 'mid': its host storage overlaps resident fixture 'lo'")
def aliased_resident_fixtures(w):
    base = np.zeros(16, np.float32)
    res = sp.ResidentTaskArgs(w)
    res.add("lo", base[:8])
    return lambda: res.add("mid", base[4:12])


@case(ArgumentError, r"build_args: expected 3 tensor arguments, have 2 \(a, b\)")
def expected_count_mismatch(w):
    res = sp.ResidentTaskArgs(w)
    res.add("a", _f32())
    res.add("b", _f32())
    return lambda: res.build_args(expected_count=3)


@case(ArgumentError, r"from_builder: signature has 3 tensor arguments, got 2")
def from_builder_count_mismatch(w):
    b = sp.TaskArgsBuilder(sp.TensorArg("x", _f32(), child_memory=True), sp.TensorArg("y", _f32()))
    return lambda: sp.ResidentTaskArgs.from_builder(w, b, ADD_CALL)


@case(ArgumentError, r"copy_back 'acc': destination is float32\[4\], resident tensor is float32\[8\]")
def copy_back_into_a_wrong_shape(w):
    res = sp.ResidentTaskArgs(w)
    res.add("acc", _f32(), INOUT)
    b = sp.TaskArgsBuilder(sp.TensorArg("acc", _f32(4)))
    return lambda: res.copy_back(b, ["acc"])


@case(ArgumentError, r"TensorArg 'kv': child_memory=True needs a host array")
def child_memory_on_a_device_tensor(w):
    _, t = _buffer_tensor(w, _f32())
    return lambda: sp.TensorArg("kv", t, child_memory=True)


@case(ArgumentError, r"Case::c: child_memory is not supported at scene-test level 3 .*: kv")
def level_3_residency(w):
    @sp.scene_test(level=3)
    class Case(sp.SceneTestCase):
        CALLABLE = sp.Callable(lambda o, kv: None, [IN])
        CASES = [{"name": "c", "params": {}}]

        def generate_args(self, params):
            return sp.TaskArgsBuilder(sp.TensorArg("kv", _f32(), child_memory=True))

        def compute_golden(self, args, params):
            pass

    return lambda: sp.run_case(Case, "c", worker=w)


@case(ArgumentError, r"scene_test: level must be 2 or 3, not 4")
def unknown_scene_level(w):
    return lambda: sp.scene_test(level=4)


# ---- element access in the orchestrator -----------------------------------------------------


@case(ArgumentError, r"tensor arg0: index \[2, 0\] out of bounds for shape \[2, 4\] \(dimension 0\)")
def get_index_out_of_bounds(w):
    return _orch(w, lambda o, t: o.get_tensor_data(t, (2, 0)), [IN], [np.zeros((2, 4), np.float32)])


@case(ArgumentError, r"tensor arg0: index \[0, -1\] out of bounds for shape \[2, 4\] \(dimension 1\)")
def set_negative_index(w):
    return _orch(w, lambda o, t: o.set_tensor_data(t, (0, -1), 1.0), [IN], [np.zeros((2, 4), np.float32)])


@case(ArgumentError, r"tensor arg0: index \[1\] has 1 entries, tensor has rank 2 \(shape \[2, 4\]\)")
def get_wrong_index_rank(w):
    return _orch(w, lambda o, t: o.get_tensor_data(t, 1), [IN], [np.zeros((2, 4), np.float32)])


@case(ArgumentError, r"tensor arg0: index \[0, 0, 0\] has 3 entries, tensor has rank 2")
def set_wrong_index_rank(w):
    return _orch(w, lambda o, t: o.set_tensor_data(t, (0, 0, 0), 1.0), [IN], [np.zeros((2, 4), np.float32)])


@case(ArgumentTypeError, r"tensor arg0: index entries must be integers, not nan")
def nan_index(w):
    return _orch(
        w, lambda o, t: o.get_tensor_data(t, (float("nan"), 0)), [IN], [np.zeros((2, 4), np.float32)]
    )


@case(ArgumentTypeError, r"tensor arg0: index entries must be integers, not True")
def bool_index(w):
    return _orch(w, lambda o, t: o.get_tensor_data(t, True), [IN], [np.zeros(4, np.float32)])


@case(ArgumentTypeError, r"tensor arg0: cannot store float 1\.5 in a int32 tensor")
def float_into_int_tensor(w):
    return _orch(w, lambda o, t: o.set_tensor_data(t, 0, 1.5), [IN], [np.zeros(4, np.int32)])


@case(ArgumentError, r"tensor arg0: value 1180591620717411303424 out of range")
def value_out_of_range(w):
    return _orch(w, lambda o, t: o.set_tensor_data(t, 0, 2**70), [IN], [np.zeros(4, np.int16)])


@case(ArgumentError, r"tensor arg0: index entry 1180591620717411303424 out of bounds")
def index_beyond_64_bits(w):
    return _orch(w, lambda o, t: o.get_tensor_data(t, 2**70), [IN], [np.zeros(4, np.float32)])


@case(ArgumentError, r"tensor arg0: .*70000.*int16")
def value_out_of_the_dtype_range(w):
    return _orch(w, lambda o, t: o.set_tensor_data(t, 0, 70000), [IN], [np.zeros(4, np.int16)])


@case(ArgumentTypeError, r"tensor arg0: values must be int, float or bool, not str")
def value_of_wrong_type(w):
    return _orch(w, lambda o, t: o.set_tensor_data(t, 0, "1"), [IN], [np.zeros(4, np.float32)])


@case(
    ArgumentError,
    r"tensor arg0: view shape \[3, 4\] at offsets \[1, 0\] runs past shape \[2, 4\] \(dimension 0\)",
)
def view_past_its_tensor(w):
    return _orch(w, lambda o, t: t.view([3, 4], [1, 0]), [IN], [np.zeros((2, 4), np.float32)])


@case(ArgumentError, r"tensor arg0: view shape \[1, 4\] at offsets \[-1, 0\] runs past")
def view_at_a_negative_offset(w):
    return _orch(w, lambda o, t: t.view([1, 4], [-1, 0]), [IN], [np.zeros((2, 4), np.float32)])


@case(ArgumentError, r"tensor arg0: view shape \[1\] / offsets \[0\] must both have rank 2")
def view_of_wrong_rank(w):
    return _orch(w, lambda o, t: t.view([1], [0]), [IN], [np.zeros((2, 4), np.float32)])


@case(GeometryError, r"scratch tensor big: .*overflow")
def scratch_overflowing_shape(w):
    return _orch(w, lambda o, t: o.scratch([2**40, 2**40], "float32", name="big"), [IN], [_f32()])


@case(StateError, r"tensor arg0 belongs to another worker")
def handle_from_another_worker(w):
    other = sp.Worker("sim")
    got = {}

    def grab(o, t):
        got["t"] = t

    def use(o, t):
        o.get_tensor_data(got["t"], 0)

    def thunk():
        try:
            other.run(sp.Callable(grab, [IN]), [_f32()])
            w.run(sp.Callable(use, [IN]), [_f32()])
        finally:
            other.close()

    return thunk


@case(StateError, r"run \d+ is not in progress \(this handle belongs to a finished run")
def handle_from_a_finished_run(w):
    got = {}

    def grab(o, t):
        got["t"] = t

    w.run(sp.Callable(grab, [IN]), [_f32()])
    return _orch(w, lambda o, t: o.get_tensor_data(got["t"], 0), [IN], [_f32()])


@case(ArgumentError, r"submit add: signature has 3 tensor arguments, got 2")
def submit_with_wrong_tensor_count(w):
    return _orch(w, lambda o, x, y: o.submit(ADD, x, y), [IN, OUT], [_f32(), _f32()])


@case(ArgumentError, r"submit add: tensor after scalars \(argument 4\)")
def submit_tensor_after_scalar(w):
    return _orch(w, lambda o, x, y: o.submit(ADD, x, x, y, 1, y), [IN, OUT], [_f32(), _f32()])


@case(ArgumentTypeError, r"submit typed: tensor 'arg0' is float32, signature wants int32")
def submit_dtype_mismatch(w):
    k = sp.Kernel(lambda a: None, [(IN, "int32")], name="typed")
    return _orch(w, lambda o, x: o.submit(k, x), [IN], [_f32()])


# ---- geometry of device tensors -------------------------------------------------------------


@case(GeometryError, r"tensor over buffer 0x[0-9a-f]+: negative shape entry -2 in \[-2, 4\]")
def negative_shape(w):
    buf = w.malloc(64)
    return lambda: buf.tensor((-2, 4), "float32")


@case(GeometryError, r"tensor over buffer 0x[0-9a-f]+: negative offset -1")
def negative_offset(w):
    buf = w.malloc(64)
    return lambda: buf.tensor((4,), "float32", offset=-1)


@case(GeometryError, r"tensor over buffer 0x[0-9a-f]+.*overflow")
def overflowing_shape(w):
    buf = w.malloc(64)
    return lambda: buf.tensor((2**40, 2**40), "float32")


@case(GeometryError, r"tensor over buffer 0x[0-9a-f]+.*overflow")
def overflowing_offset(w):
    buf = w.malloc(64)
    return lambda: buf.tensor((4,), "float64", offset=2**62)


@case(ArgumentError, r"tensor spans bytes \[0, 80\) of buffer 0x[0-9a-f]+, which has only 64 bytes")
def tensor_larger_than_its_buffer(w):
    buf = w.malloc(64)
    return lambda: buf.tensor((20,), "float32")


@case(ArgumentError, r"tensor spans bytes \[32, 96\) of buffer 0x[0-9a-f]+, which has only 64 bytes")
def tensor_offset_past_its_buffer(w):
    buf = w.malloc(64)
    return lambda: buf.tensor((16,), "float32", offset=8)


# ---- buffers and lifetimes ------------------------------------------------------------------


@case(ArgumentError, r"malloc of 0 bytes")
def malloc_zero(w):
    return lambda: w.malloc(0)


@case(ArgumentError, r"malloc: negative size -8")
def malloc_negative(w):
    return lambda: w.malloc(-8)


@case(ArgumentTypeError, r"malloc: size must be an int, not float")
def malloc_float(w):
    return lambda: w.malloc(8.0)


@case(ArgumentError, r"copy_to: 64 bytes at offset 32 run past buffer 0x[0-9a-f]+ of 64 bytes")
def copy_past_the_buffer(w):
    buf = w.malloc(64)
    return lambda: w.copy_to(buf, np.zeros(16, np.float32), offset=32)


@case(ArgumentError, r"copy_from: destination array is read-only")
def copy_into_a_read_only_array(w):
    buf = w.malloc(16)
    dst = np.zeros(4, np.float32)
    dst.flags.writeable = False
    return lambda: w.copy_from(dst, buf)


@case(StateError, r"copy_to: device address 0x[0-9a-f]+ is not a live allocation of this worker")
def use_after_free(w):
    buf = w.malloc(16)
    w.free(buf)
    return lambda: w.copy_to(buf, np.zeros(4, np.float32))


@case(StateError, r"free: device address 0x[0-9a-f]+ is not a live allocation")
def double_free(w):
    buf = w.malloc(16)
    w.free(buf)
    return lambda: w.free(buf)


@case(StateError, r"tensor arg0: device address 0x[0-9a-f]+ is not a live allocation")
def run_with_a_freed_buffer(w):
    buf, t = _buffer_tensor(w, _f32())
    w.free(buf)
    return lambda: w.run(ADD_CALL, [t, _f32(), _f32()])


@case(StateError, r"ResidentTaskArgs.add: the set was released")
def add_after_release(w):
    res = sp.ResidentTaskArgs(w)
    res.add("x", _f32())
    res.release()
    return lambda: res.add("y", _f32())


@case(StateError, r"ResidentTaskArgs.\['x'\]: the set was released")
def resident_tensor_after_release(w):
    res = sp.ResidentTaskArgs(w)
    res.add("x", _f32())
    res.release()
    return lambda: res["x"]


@case(StateError, r"tensor x: device address 0x[0-9a-f]+ is not a live allocation")
def run_with_a_released_resident_tensor(w):
    res = sp.ResidentTaskArgs(w)
    res.add("x", _f32())
    args = res.build_args()
    res.release()
    return lambda: w.run(sp.Callable(lambda o, x: None, [IN]), args)


@case(StateError, r"worker is closed")
def malloc_after_close(w):
    other = sp.Worker("sim")
    other.close()
    return lambda: other.malloc(8)


@case(StateError, r"worker is closed")
def run_after_close(w):
    other = sp.Worker("sim")
    other.close()
    return lambda: other.run(ADD_CALL, [_f32(), _f32(), _f32()])


@case(StateError, r"worker is closed")
def resident_set_after_close(w):
    other = sp.Worker("sim")
    other.close()
    return lambda: sp.ResidentTaskArgs(other)


@case(StateError, r"free: buffer 0x[0-9a-f]+ is bound as an argument of the run in progress")
def free_a_buffer_bound_to_the_run(w):
    buf, t = _buffer_tensor(w, _f32())
    return _orch(w, lambda o, t: w.free(buf), [IN], [t])


@case(StateError, r"free: buffer 0x[0-9a-f]+ is owned by a ResidentTaskArgs; release that instead")
def free_a_resident_buffer(w):
    res = sp.ResidentTaskArgs(w)
    t = res.add("kv", _f32())
    return lambda: w.free(t.buffer)


@case(StateError, r"release: resident tensor 'kv' is bound to the run in progress")
def release_a_set_bound_to_the_run(w):
    res = sp.ResidentTaskArgs(w)
    t = res.add("kv", _f32())

    def orch(o, t):
        res.release()  # refused: a tensor of the set is bound to this run

    return _orch(w, orch, [IN], [t])


@case(StateError, r"worker busy: a run is in progress")
def run_inside_a_run(w):
    return _orch(w, lambda o, t: w.run(ADD_CALL, [_f32(), _f32(), _f32()]), [IN], [_f32()])


@case(ArgumentError, r"tensor arg0: buffer 0x[0-9a-f]+ belongs to another worker")
def device_tensor_of_another_worker(w):
    other = sp.Worker("sim")
    buf = other.malloc(32)
    t = buf.tensor((8,), "float32")

    def thunk():
        try:
            w.run(ADD_CALL, [t, _f32(), _f32()])
        finally:
            other.close()

    return thunk


@case(ArgumentError, r"free: buffer 0x[0-9a-f]+ belongs to another worker")
def free_a_buffer_of_another_worker(w):
    other = sp.Worker("sim")
    buf = other.malloc(32)

    def thunk():
        try:
            w.free(buf)
        finally:
            other.close()

    return thunk


# ---- workers --------------------------------------------------------------------------------


@case(ArgumentError, r"unknown platform 'tpu'")
def unknown_platform(w):
    return lambda: sp.Worker("tpu")


@case(ArgumentError, r"staging must be 'arena' or 'fresh', not 'pool'")
def unknown_staging(w):
    return lambda: sp.Worker("sim", staging="pool")


@case(ArgumentError, r"svm.*sometimes")
def unknown_svm_policy(w):
    return lambda: sp.Worker("sim", svm="sometimes")


@case(ArgumentError, r"unknown driver operation 'teleport'")
def unknown_fault_operation(w):
    return lambda: w.inject_fault("teleport")


@case(PlatformUnavailableError, r"libascend_hal\.so.*/nonexistent-simpler-lib")
def missing_vendor_library(w):
    import os

    def thunk():
        saved = os.environ.get("SIMPLER_ASCEND_LIB_DIR")
        os.environ["SIMPLER_ASCEND_LIB_DIR"] = "/nonexistent-simpler-lib"
        try:
            sp.Worker("ascend")
        finally:
            if saved is None:
                del os.environ["SIMPLER_ASCEND_LIB_DIR"]
            else:
                os.environ["SIMPLER_ASCEND_LIB_DIR"] = saved

    return thunk


# ---- the test -------------------------------------------------------------------------------


def _state(w):
    s = w.stats()
    return s["live_allocations"], s["live_mappings"], w.debug_state()["arena"]


@pytest.fixture
def w():
    with sp.Worker("sim", svm=65536) as worker:
        # Warm: the staging arena exists and is large enough for every case.
        worker.run(ADD_CALL, [_f32(4096), _f32(4096), _f32(4096)])
        yield worker


def test_the_catalogue_has_at_least_30_cases():
    assert len(CASES) >= 30


@pytest.mark.parametrize(("make", "exc", "pattern"), CASES)
def test_bad_input(w, make, exc, pattern):
    thunk = make(w)
    before = _state(w)
    with pytest.raises(exc) as ei:
        thunk()
    assert type(ei.value) is exc, f"{type(ei.value).__name__}: {ei.value}"
    assert re.search(pattern, str(ei.value)), f"{ei.value!s} !~ {pattern}"
    assert _state(w) == before, "the failed call leaked (live allocations, mappings, arena)"
    # The worker is still usable.
    out = np.zeros(8, np.float32)
    w.run(ADD_CALL, [_f32(8, 1.0), _f32(8, 2.0), out])
    np.testing.assert_array_equal(out, 3.0)


def _views_ragged(w):
    def orch(o, t):
        t.views([1], [[0], [1, 2]])

    w.run(sp.Callable(orch, [IN]), [_f32()])


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda w: sp.Worker("sim", model=3), ArgumentTypeError),
        (lambda w: sp.Worker("sim", poison="no"), ArgumentTypeError),
        (lambda w: sp.Worker("sim", reuse_addresses="yes"), ArgumentTypeError),
        (lambda w: sp.Worker("sim", malloc_policy=1), ArgumentTypeError),
        (lambda w: w.inject_fault(1), ArgumentTypeError),
        (lambda w: w.inject_fault("h2d", code="x"), ArgumentTypeError),
        (lambda w: sp.Kernel(lambda x: None, [IN], name=7), ArgumentTypeError),
        (lambda w: sp.Callable(lambda o, x: None, [IN], name=b"c"), ArgumentTypeError),
        (_views_ragged, ArgumentError),
    ],
    ids=[
        "model",
        "poison",
        "reuse_addresses",
        "malloc_policy",
        "op",
        "code",
        "kernel-name",
        "callable-name",
        "ragged",
    ],
)
def test_wrong_option_values_are_simpler_errors(w, call, exc):
    """Every constructor and call option given a value of the wrong kind raises a simpler error
    (``ArgumentTypeError`` is a ``TypeError``, ``ArgumentError`` a ``ValueError``) naming it."""
    with pytest.raises(exc) as ei:
        call(w)
    assert isinstance(ei.value, sp.SimplerError)


def test_the_unknown_operation_error_and_the_docstring_list_every_driver_operation(w):
    """One table of driver operations: the error for an unknown one and ``inject_fault``'s
    docstring name all of them (memset, pin and unpin included)."""
    with pytest.raises(ArgumentError) as ei:
        w.inject_fault("teleport")
    for op in ("alloc", "free", "h2d", "d2h", "map", "unmap", "memset", "pin", "unpin"):
        assert op in str(ei.value) and op in sp.Worker.inject_fault.__doc__, op
    assert "cached" in sp.Worker.host_view_info.__doc__
