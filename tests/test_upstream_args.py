"""Arguments written for upstream's runtime (hw-native-sys/simpler), as ported scene tests write them.

* torch CPU tensors wherever a host array is taken (``TensorArg``, the builder, runs through a
  builder, ``ResidentTaskArgs.add``), converted to a numpy view of their memory, so what a run
  copies back lands in the tensor;
* ctypes scalars (``ctypes.c_float(1.0)``, ...) wherever a scalar is taken, as their Python value;
* upstream's builder methods (``add_tensor``, ``add_scalar``, ``tensor_names``, ``specs``);
* ``simpler.task_interface.ArgDirection``.

torch is not a dependency (and not installed in CI): the conversion is exercised with
:class:`Tensor` below, a **stand-in** for ``torch.Tensor`` that mimics exactly the members the
conversion uses (``device``, ``is_contiguous``, ``dtype``, ``detach``, ``numpy``, ``view``,
``element_size``, ``shape``, ``stride``) and torch's refusals (``numpy()`` on bfloat16 / float8 or
on a tensor that requires grad). The tests of the real torch path skip without torch.
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import simpler as sp
from simpler import _arrays
from simpler.errors import ArgumentError, ArgumentTypeError

# -- the torch stand-in ---------------------------------------------------------------------------


class _Dtype:
    """Stand-in for ``torch.dtype``: prints as ``torch.<name>``; ``np`` is how the stand-in
    stores its elements; ``numpy_ok`` whether torch's ``numpy()`` supports it."""

    def __init__(self, name: str, np_type: object, numpy_ok: bool):
        self.name, self.np, self.numpy_ok = name, np.dtype(np_type), numpy_ok

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


class _Device:
    def __init__(self, kind: str):
        self.type = kind

    def __str__(self) -> str:
        return self.type if self.type == "cpu" else f"{self.type}:0"


class Tensor:
    """STAND-IN for ``torch.Tensor`` (not torch): a numpy array as its storage. Its class is
    named ``Tensor`` and says it lives in module ``torch``, which is how simpler recognises a
    torch tensor without importing torch. ``calls`` counts the methods the conversion used."""

    def __init__(self, data: np.ndarray, dtype: _Dtype, device: str = "cpu", requires_grad: bool = False):
        self._data = data
        self.dtype = dtype
        self.device = _Device(device)
        self.requires_grad = requires_grad
        self.calls: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self._data.itemsize for s in self._data.strides)

    def is_contiguous(self) -> bool:
        return self._data.flags.c_contiguous

    def element_size(self) -> int:
        return self._data.itemsize

    def detach(self) -> Tensor:
        self._count("detach")
        t = Tensor(self._data, self.dtype, self.device.type)
        t.calls = self.calls  # one log for the tensor and its detached alias
        return t

    def numpy(self) -> np.ndarray:
        self._count("numpy")
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy()")
        if not self.dtype.numpy_ok:
            raise TypeError(f"Got unsupported ScalarType {self.dtype.name}")
        return self._data.view()  # shares the storage, as torch's numpy() does

    def view(self, dtype: _Dtype) -> Tensor:
        self._count("view")
        t = Tensor(self._data.view(dtype.np), dtype, self.device.type)
        t.calls = self.calls
        return t

    def clone(self) -> Tensor:
        self._count("clone")
        return Tensor(self._data.copy(), self.dtype, self.device.type)

    def __getitem__(self, i: object) -> Tensor:
        return Tensor(self._data[i], self.dtype, self.device.type)


Tensor.__module__ = "torch"

_DTYPES = {
    "float32": (np.float32, True),
    "float16": (np.float16, True),
    "int32": (np.int32, True),
    "int64": (np.int64, True),
    "int8": (np.int8, True),
    "int16": (np.int16, True),
    "uint8": (np.uint8, True),
    "bool": (np.bool_, True),
    "uint16": (np.uint16, False),  # older torch: no numpy() for uint16/32/64
    "bfloat16": (ml_dtypes.bfloat16, False),
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, False),
    "float8_e5m2": (ml_dtypes.float8_e5m2, False),
    "float4_e2m1fn_x2": (np.uint8, False),  # two fp4 values packed per byte
    "quint4x2": (np.uint8, False),  # a quantized dtype: no numpy or ml_dtypes counterpart
}


@pytest.fixture
def torch_standin(monkeypatch):
    """A stand-in ``torch`` module (its dtypes and :class:`Tensor`) in ``sys.modules`` for the
    test: the bfloat16 / float8 path looks up ``torch.int16`` & co. there, as with real torch."""
    mod = types.ModuleType("torch")
    for name, (np_type, ok) in _DTYPES.items():
        setattr(mod, name, _Dtype(name, np_type, ok))
    mod.Tensor = Tensor
    monkeypatch.setitem(sys.modules, "torch", mod)

    def tensor(values, dtype="float32", **kw):
        dt = getattr(mod, dtype)
        return Tensor(np.ascontiguousarray(np.asarray(values).astype(dt.np)), dt, **kw)

    mod.tensor = tensor
    return mod


def _add_scaled():
    """``out = a + b * s`` (one kernel, a scalar forwarded by the orchestration); ``seen`` records
    the scalar as the orchestration and the kernel receive it."""
    seen: list[object] = []

    def body(a, b, out, s):
        seen.append(s)
        out[...] = a + b * s

    k = sp.Kernel(body, [sp.IN, sp.IN, sp.OUT])

    def orch(o, a, b, out, s):
        seen.append(s)
        o.submit(k, a, b, out, s)

    return sp.Callable(orch, [sp.IN, sp.IN, sp.OUT]), seen


# -- 1. torch CPU tensors -------------------------------------------------------------------------


def test_standin_is_recognised_and_look_alikes_are_not(torch_standin):
    assert _arrays.is_torch_tensor(torch_standin.tensor([1.0]))

    class Sub(Tensor):  # a subclass of torch.Tensor (torch.nn.Parameter-like)
        pass

    assert _arrays.is_torch_tensor(Sub(np.zeros(1, np.float32), torch_standin.float32))
    LookAlike = type("Tensor", (), {"__module__": "torchvision"})
    assert not _arrays.is_torch_tensor(LookAlike())
    assert not _arrays.is_torch_tensor(np.zeros(1))
    with pytest.raises(ArgumentTypeError, match="numpy array or DeviceTensor"):
        sp.TensorArg("x", LookAlike())


def test_float32_tensor_is_kept_and_read_through_a_numpy_view_of_its_memory(torch_standin):
    t = torch_standin.tensor(np.arange(6).reshape(2, 3), "float32")
    spec = sp.TensorArg("x", t)
    assert spec.value is t  # upstream's goldens get the tensor itself
    v = sp.as_numpy(t)
    assert v.dtype == np.float32 and v.shape == (2, 3)
    assert np.shares_memory(v, t._data)
    v[0, 0] = 42
    assert t._data[0, 0] == 42
    assert t.calls == {"detach": 2, "numpy": 2}  # checked when the spec was made, then viewed


@pytest.mark.parametrize(
    ("dtype", "np_type"),
    [
        ("bfloat16", ml_dtypes.bfloat16),
        ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        ("float8_e5m2", ml_dtypes.float8_e5m2),
        ("uint16", np.uint16),
    ],
)
def test_non_numpy_dtypes_go_through_an_integer_view(torch_standin, dtype, np_type):
    t = torch_standin.tensor([1.0, 2.0, 3.0, 4.0], dtype)
    v = sp.as_numpy(t)
    assert v.dtype == np.dtype(np_type) and v.shape == (4,)
    assert np.shares_memory(v, t._data)
    np.testing.assert_array_equal(v.astype(np.float32), [1, 2, 3, 4])
    # numpy() was called once, on the integer view (the stand-in, like torch, refuses it on the
    # tensor's own dtype), never on the tensor itself
    assert t.calls == {"detach": 1, "view": 1, "numpy": 1}


def test_a_tensor_that_requires_grad_is_detached(torch_standin):
    t = torch_standin.tensor([1.0, 2.0], requires_grad=True)
    v = sp.as_numpy(sp.TensorArg("w", t).value)
    assert np.shares_memory(v, t._data) and t.calls["detach"] == 2


def test_cuda_and_non_contiguous_tensors_are_refused_by_name(torch_standin):
    with pytest.raises(ArgumentError, match=r"TensorArg 'kv'.*cuda:0, not the CPU.*t\.cpu\(\)"):
        sp.TensorArg("kv", torch_standin.tensor([1.0, 2.0], device="cuda"))
    strided = torch_standin.tensor(np.arange(8))[::2]
    with pytest.raises(ArgumentError, match=r"TensorArg 'q'.*not contiguous.*strides \(2,\).*contiguous\(\)"):
        sp.TensorArg("q", strided)
    with pytest.raises(ArgumentError, match=r"resident tensor 'kv'.*cuda"), sp.Worker("sim") as w:
        with sp.ResidentTaskArgs(w) as res:
            res.add("kv", torch_standin.tensor([1.0], device="cuda"), sp.IN)


@pytest.mark.parametrize("dtype", ["float4_e2m1fn_x2", "quint4x2"])
def test_dtypes_without_a_numpy_counterpart_are_refused_by_name(torch_standin, dtype):
    t = torch_standin.tensor([1, 2], dtype)
    with pytest.raises(
        ArgumentTypeError, match=f"TensorArg 'p': torch dtype {dtype} has no numpy counterpart"
    ):
        sp.TensorArg("p", t)
    assert "numpy" not in t.calls


def test_torch_errors_while_viewing_are_argument_errors_naming_the_tensor(torch_standin, monkeypatch):
    t = torch_standin.tensor([1.0])

    def refuse(self):
        raise RuntimeError("Can't call numpy() on Tensor that has conjugate bit set")

    monkeypatch.setattr(Tensor, "numpy", refuse)
    with pytest.raises(
        ArgumentTypeError, match=r"TensorArg 'c': cannot view the torch tensor.*conjugate bit"
    ):
        sp.TensorArg("c", t)


def test_builder_run_copies_back_into_the_torch_tensors(torch_standin):
    c, seen = _add_scaled()
    a = torch_standin.tensor([1.0, 2.0, 3.0, 4.0])
    b = torch_standin.tensor([1.0, 1.0, 1.0, 1.0])
    out = torch_standin.tensor(np.zeros(4))
    args = sp.TaskArgsBuilder(
        sp.TensorArg("a", a),
        sp.TensorArg("b", b),
        sp.TensorArg("out", out),
        sp.Scalar("s", ctypes.c_float(2.0)),
    )
    with sp.Worker("sim") as w:
        report = w.run(c, args)
    assert report.counters["staged_tensors"] == 3
    assert report.counters["copied_back_bytes"] == 16  # out only: 4 float32
    np.testing.assert_array_equal(out._data, [3, 4, 5, 6])  # landed in the tensor itself
    assert seen == [2.0, 2.0] and all(type(s) is float for s in seen)


def test_bfloat16_run_copies_back_into_the_torch_tensor(torch_standin):
    c, _ = _add_scaled()
    a = torch_standin.tensor([1.0, 2.0], "bfloat16")
    b = torch_standin.tensor([0.5, 0.5], "bfloat16")
    out = torch_standin.tensor([0.0, 0.0], "bfloat16")
    args = (
        sp.TaskArgsBuilder().add_tensor("a", a).add_tensor("b", b).add_tensor("out", out).add_scalar("s", 2)
    )
    with sp.Worker("sim") as w:
        report = w.run(c, args)
    assert report.counters["copied_back_bytes"] == 4
    np.testing.assert_array_equal(out._data.astype(np.float32), [2.0, 3.0])


def test_replace_and_attribute_assignment_take_torch_tensors(torch_standin):
    args = sp.TaskArgsBuilder(sp.TensorArg("x", np.zeros(2, np.float32), child_memory=True))
    t = torch_standin.tensor([5.0, 6.0])
    args.x = t
    assert args.x is t and args.spec("x").child_memory is True
    u = torch_standin.tensor([7.0, 8.0], "bfloat16")
    args.replace("x", u)
    assert args.x is u and sp.as_numpy(args.x).dtype == ml_dtypes.bfloat16
    with pytest.raises(ArgumentError, match="TensorArg 'x'"):
        args.replace("x", torch_standin.tensor([1.0], device="cuda"))


def test_clone_of_torch_fixtures_is_a_private_copy(torch_standin):
    t = torch_standin.tensor([1.0, 2.0])
    args = sp.TaskArgsBuilder(sp.TensorArg("x", t))
    golden = args.clone()
    assert golden.x is not t and not np.shares_memory(sp.as_numpy(golden.x), t._data)
    sp.as_numpy(golden.x)[...] = 9
    np.testing.assert_array_equal(t._data, [1, 2])


def test_resident_add_takes_torch_tensors_and_copy_back_lands_in_them(torch_standin):
    def double(x, y):
        y[...] = 2 * x

    k = sp.Kernel(double, [sp.IN, sp.OUT])
    c = sp.Callable(lambda o, x, y: o.submit(k, x, y), [sp.IN, sp.OUT])
    x = torch_standin.tensor([1.0, 2.0, 3.0])
    y = torch_standin.tensor(np.zeros(3))
    with sp.Worker("sim") as w:
        # directly
        with sp.ResidentTaskArgs(w) as res:
            tx = res.add("x", x, sp.IN)
            assert isinstance(tx, sp.DeviceTensor) and tx.shape == (3,) and tx.dtype == "float32"
            res.add("y", torch_standin.tensor(np.zeros(3)), sp.OUT)
            report = w.run(c, res.build_args(2))
            assert report.counters["resident_tensors"] == 2 and report.counters["staged_tensors"] == 0
        # through a builder's child_memory specs; copy_back writes through the builder's view
        args = (
            sp.TaskArgsBuilder().add_tensor("x", x, child_memory=True).add_tensor("y", y, child_memory=True)
        )
        with sp.ResidentTaskArgs.from_builder(w, args, c) as res:
            report = w.run(c, res.bind(args))
            assert report.counters["resident_tensors"] == 2 and report.counters["copied_back_bytes"] == 0
            assert not y._data.any()  # still on the device
            res.copy_back(args, ["y"])
    np.testing.assert_array_equal(y._data, [2, 4, 6])


# -- 2. ctypes scalars ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (ctypes.c_float(1.5), 1.5),
        (ctypes.c_float(0.1), float(np.float32(0.1))),  # c_float keeps its float32 rounding
        (ctypes.c_double(0.1), 0.1),
        (ctypes.c_int32(-7), -7),
        (ctypes.c_int64(2**40), 2**40),
        (ctypes.c_uint32(2**32 - 1), 2**32 - 1),
        (ctypes.c_uint64(2**64 - 1), 2**64 - 1),
        (ctypes.c_int8(-1), -1),
        (ctypes.c_uint16(65535), 65535),
        (ctypes.c_bool(True), True),
        (ctypes.c_void_p(None), 0),
    ],
)
def test_ctypes_scalars_are_kept_and_run_as_their_python_value(value, expected):
    s = sp.Scalar("s", value)
    assert s.value is value  # upstream's goldens read ``args.s.value``
    seen = []

    def orch(o, x, v):
        seen.append(v)

    args = sp.TaskArgsBuilder(sp.TensorArg("x", np.zeros(1, np.float32))).add_scalar("t", value)
    with sp.Worker("sim") as w:
        w.run(sp.Callable(orch, [sp.IN]), args)
    assert seen == [expected] and type(seen[0]) is type(expected)


def test_ctypes_scalars_in_replace_and_build_args():
    args = sp.TaskArgsBuilder(sp.TensorArg("x", np.zeros(1, np.float32)), sp.Scalar("n", 1))
    args.n = ctypes.c_int64(9)
    assert args.n.value == 9
    args.replace("n", ctypes.c_double(2.5))
    assert args.n.value == 2.5
    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        res.add("x", np.zeros(2, np.float32))
        built = res.build_args(1, [ctypes.c_int32(3), sp.Scalar("scale", ctypes.c_float(0.5))])
        seen = []
        w.run(sp.Callable(lambda o, x, n, s: seen.append((n, s)), [sp.IN]), built)
        assert seen == [(3, 0.5)] and [type(v) for v in seen[0]] == [int, float]


def test_non_numeric_ctypes_values_are_still_refused():
    for bad in (ctypes.c_char(b"x"), ctypes.c_char_p(b"x"), ctypes.c_wchar("x")):
        with pytest.raises(ArgumentTypeError, match=f"Scalar 's'.*{type(bad).__name__}"):
            sp.Scalar("s", bad)


def test_ctypes_scalars_reach_the_orchestration_and_kernel_as_python_values():
    c, seen = _add_scaled()
    args = sp.TaskArgsBuilder(
        sp.TensorArg("a", np.ones(2, np.float32)),
        sp.TensorArg("b", np.ones(2, np.float32)),
        sp.TensorArg("out", np.zeros(2, np.float32)),
    ).add_scalar("s", ctypes.c_int64(3))
    with sp.Worker("sim") as w:
        w.run(c, args)
    assert seen == [3, 3] and all(type(s) is int for s in seen)
    np.testing.assert_array_equal(args.out, [4, 4])


# -- 3. upstream's builder methods ----------------------------------------------------------------


def test_upstream_builder_methods():
    args = sp.TaskArgsBuilder(sp.TensorArg("a", np.zeros(2)))
    assert args.add_tensor("b", np.ones(2)) is args
    args.add_tensor("kv", np.ones(2), child_memory=True)
    assert args.add_scalar("scale", ctypes.c_float(1.0)) is args
    args.add_scalar("n", 4)
    assert args.tensor_names() == ["a", "b", "kv"]
    assert [s.name for s in args.specs] == ["a", "b", "kv", "scale", "n"]
    assert [type(s) for s in args.specs] == [sp.TensorArg] * 3 + [sp.Scalar] * 2
    assert args.spec("kv").child_memory is True and args.spec("b").child_memory is False
    # upstream's compute_golden idiom
    tensors = {s.name: s.value for s in args.specs if isinstance(s, sp.TensorArg)}
    assert list(tensors) == args.tensor_names() and tensors["b"] is args.b
    assert sp.TaskArgsBuilder().tensor_names() == []


def test_a_tensor_after_a_scalar_is_a_value_error_as_upstream():
    args = sp.TaskArgsBuilder().add_tensor("a", np.zeros(1)).add_scalar("s", 1)
    with pytest.raises(ValueError, match="tensor 'b' after a scalar") as e:
        args.add_tensor("b", np.zeros(1))
    assert isinstance(e.value, ArgumentError)
    assert args.tensor_names() == ["a"] and args.names == ["a", "s"]  # unchanged
    with pytest.raises(ValueError, match="duplicate argument name 'a'"):
        args.add_scalar("a", 1)
    for member in ("add_tensor", "add_scalar", "tensor_names"):
        with pytest.raises(ValueError, match="shadow"):
            sp.TaskArgsBuilder().add_tensor(member, np.zeros(1))


def test_new_public_members_have_docstrings():
    for member in (
        sp.TaskArgsBuilder.add_tensor,
        sp.TaskArgsBuilder.add_scalar,
        sp.TaskArgsBuilder.tensor_names,
        sp.TaskArgsBuilder.specs,
        sp.ResidentTaskArgs.add,
        sp.ResidentTaskArgs.build_args,
        _arrays.is_torch_tensor,
        _arrays.torch_array,
        _arrays.host_array,
        _arrays.host_scalar,
    ):
        assert inspect.getdoc(member), member


# -- 4. simpler.task_interface --------------------------------------------------------------------


def test_task_interface_reexports_arg_direction():
    import simpler.task_interface as ti
    from simpler.task_interface import ArgDirection as D

    assert D is sp.ArgDirection
    assert (D.IN, D.OUT, D.INOUT) == (sp.IN, sp.OUT, sp.INOUT)
    assert ti.__all__ == ["ArgDirection"]
    assert "from simpler.task_interface import ArgDirection as D" in ti.__doc__
    c = sp.Callable(lambda o, a, f: None, [D.IN, D.OUT])
    assert [d for d, _ in c.signature] == [sp.IN, sp.OUT]


# -- the real torch path (skipped without torch) --------------------------------------------------

_NO_TORCH = "torch is not installed (not a dependency); the stand-in tests above cover the conversion"


def test_real_torch_tensors_run_and_copy_back_in_place():
    torch = pytest.importorskip("torch", reason=_NO_TORCH)
    c, seen = _add_scaled()
    a = torch.full((16,), 2.0)
    b = torch.full((16,), 3.0)
    f = torch.zeros(16)
    args = sp.TaskArgsBuilder(
        sp.TensorArg("a", a),
        sp.TensorArg("b", b),
        sp.TensorArg("f", f),
        sp.Scalar("scale", ctypes.c_float(1.0)),
    )
    assert args.f is f and np.shares_memory(sp.as_numpy(args.f), f.numpy())
    with sp.Worker("sim") as w:
        report = w.run(c, args)
    assert report.counters["copied_back_bytes"] == 64
    assert torch.equal(f, torch.full((16,), 5.0))
    assert seen == [1.0, 1.0]


@pytest.mark.parametrize(
    "name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float16", "int32", "uint8", "bool"]
)
def test_real_torch_dtypes_view_the_same_memory(name):
    torch = pytest.importorskip("torch", reason=_NO_TORCH)
    if not hasattr(torch, name):
        pytest.skip(f"this torch has no {name}")
    t = torch.ones(4, 3).to(getattr(torch, name))
    v = sp.as_numpy(sp.TensorArg("x", t).value)
    assert v.dtype == _arrays.np_dtype(name) and v.shape == (4, 3)
    assert v.ctypes.data == t.data_ptr()
    v[...] = np.zeros((), v.dtype)
    assert not t.to(torch.float32).any()  # written through the view


def test_real_torch_refusals():
    torch = pytest.importorskip("torch", reason=_NO_TORCH)
    with pytest.raises(ArgumentError, match=r"TensorArg 'q'.*not contiguous"):
        sp.TensorArg("q", torch.zeros(4, 4).t())
    w = torch.zeros(3, requires_grad=True)
    assert sp.as_numpy(sp.TensorArg("w", w).value).ctypes.data == w.data_ptr()
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device (the CUDA refusal is covered by the stand-in test)")
    with pytest.raises(ArgumentError, match=r"TensorArg 'g'.*cuda"):
        sp.TensorArg("g", torch.zeros(2, device="cuda"))


def test_every_native_entry_point_takes_torch_tensors_and_ctypes_scalars(torch_standin):
    """Not only the builder: ``Worker.run`` with a plain list (a one-element float tensor stays
    a tensor, never a scalar), ``submit`` scalars, buffer copies, resident ``add`` and
    ``copy_back``, all through the one conversion in ``simpler._arrays``."""
    c, seen = _add_scaled()
    a = torch_standin.tensor([1.0])
    b = torch_standin.tensor([2.0])
    out = torch_standin.tensor([0.0])
    with sp.Worker("sim") as w:
        report = w.run(c, [a, b, out, ctypes.c_double(3.0)])
        assert report.counters["staged_tensors"] == 3
        np.testing.assert_array_equal(out._data, [7.0])
        assert seen == [3.0, 3.0]
        buf = w.malloc(16)
        buf.copy_to(torch_standin.tensor([1.0, 2.0, 3.0, 4.0]))
        back = torch_standin.tensor(np.zeros(4))
        buf.copy_from(back)
        np.testing.assert_array_equal(back._data, [1, 2, 3, 4])
        w.copy_to(buf, torch_standin.tensor([5.0, 6.0, 7.0, 8.0]))
        w.copy_from(back, buf)
        np.testing.assert_array_equal(back._data, [5, 6, 7, 8])
        buf.free()


def test_real_torch_goldens_written_with_torch_work():
    """Upstream's goldens use torch on the fixtures (``torch.matmul``, ``.copy_``, ``.to``): the
    builder keeps the tensors, so a ported golden runs unchanged."""
    torch = pytest.importorskip("torch", reason=_NO_TORCH)

    def mm(a, b, c):
        c[...] = a @ b

    k = sp.Kernel(mm, [sp.IN, sp.IN, sp.OUT])

    @sp.scene_test(level=2, runtime="tensormap_and_ringbuffer")
    class TestTorchGolden(sp.SceneTestCase):
        CALLABLE = sp.Callable(lambda o, a, b, c, _k: o.submit(k, a, b, c), [sp.IN, sp.IN, sp.OUT])
        CASES = [{"name": "mm", "platforms": ["a2a3sim"], "params": {}}]
        RTOL = ATOL = 1e-4

        def generate_args(self, params):
            args = sp.TaskArgsBuilder()
            args.add_tensor("a", torch.rand(8, 4))
            args.add_tensor("b", torch.rand(4, 8))
            args.add_tensor("c", torch.zeros(8, 8))
            args.add_scalar("k", ctypes.c_float(1.0))
            return args

        def compute_golden(self, args, params):
            args.c.copy_(torch.matmul(args.a, args.b).to(torch.float32) * args.k.value)

    reports = sp.run_case(TestTorchGolden, "mm", platform="sim", rounds=2)  # raises on a mismatch
    assert len(reports) == 2
