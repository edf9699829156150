"""Numpy plumbing for the native core (private), handed to it once at import.

The native core does its numpy work itself (``crates/python/src/arrays.rs`` and ``capi.rs``):
the bytes of a host array's *extent*, arrays over host windows, staged copies of odd layouts
and their write-back, view offsets, per-task columns. What it is handed here is what must stay
Python: numpy's and ml_dtypes' dtypes by name, and the torch and ctypes adapters.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import _core, _cuda
from .errors import ArgumentError, ArgumentTypeError

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

SUPPORTED_DTYPES: tuple[str, ...] = tuple(_core.DTYPES)

#: The supported dtypes numpy lacks, which the ``ml_dtypes`` package supplies (the dtypes JAX
#: uses). ``ml_dtypes`` is imported only when one of them is first needed, so ``import simpler``
#: works without it (a device machine may not have it).
ML_DTYPES: frozenset[str] = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"})


def ml_dtypes_module(dtype: str = "bfloat16") -> Any:
    """The ``ml_dtypes`` module, imported now; ``dtype`` (the dtype that needs it) names the need
    in the error. Without the package: a ``ModuleNotFoundError`` that names the dtype and the fix
    (``pip install ml-dtypes``)."""
    try:
        import ml_dtypes
    except ImportError as e:
        raise ModuleNotFoundError(
            f"the dtype {dtype} needs the ml_dtypes package: install it with pip install ml-dtypes "
            f"({sys.executable} cannot import it: {e})",
            name="ml_dtypes",
        ) from e
    return ml_dtypes


@functools.cache
def np_dtype(name: str) -> np.dtype:
    """The numpy dtype for a simpler dtype name (``"bfloat16"`` and the other :data:`ML_DTYPES`
    via ``ml_dtypes``, which must then be installed: :func:`ml_dtypes_module`); cached, since
    every kernel argument and ``read_tensor`` looks one up."""
    if name in ML_DTYPES:
        return np.dtype(getattr(ml_dtypes_module(name), name))
    # ml_dtypes' other kinds (int4, ...) are its own, not numpy's same-named aliases ("int4" is
    # numpy's int32): where it is installed, its names come first, as they always did.
    mld = _ml_dtypes_if_installed()
    if mld is not None and hasattr(mld, name):
        return np.dtype(getattr(mld, name))
    return np.dtype(name)


@functools.cache
def _ml_dtypes_if_installed() -> Any:
    """``ml_dtypes`` when it can be imported (imported now), else ``None``."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes


def dtype_name(dtype: object) -> str:
    """The numpy name of ``dtype`` (a name, a numpy dtype or a scalar type); whether simpler
    supports it is the native core's decision."""
    try:
        # ``dtype`` is whatever the caller passed; numpy's TypeError answers for the rest.
        return (np.dtype(cast("DTypeLike", dtype)) if not isinstance(dtype, str) else np_dtype(dtype)).name
    except TypeError as e:
        raise ArgumentTypeError(f"unsupported dtype {dtype!r}") from e


# -- values written for upstream's runtime: torch CPU tensors and ctypes scalars -------------------
#
# Scene tests ported from hw-native-sys/simpler build their fixtures with torch and their scalars
# with ctypes. Both are converted here, in Python, before any value reaches the native core (which
# takes numpy arrays and int/float/bool): the argument specs (``simpler.args``) call these.

#: torch dtypes whose ``Tensor.numpy()`` works in every torch release; the others (bfloat16, the
#: float8 kinds, uint16/32/64 on older releases) go through an integer view of the same width.
_TORCH_NUMPY_DTYPES = frozenset(
    {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}
)


#: Where ``torch.Tensor`` says it lives (``torch``; the module that defines it, for safety).
_TORCH_TENSOR_MODULES = frozenset({"torch", "torch._tensor"})


def is_torch_tensor(x: object) -> bool:
    """Whether ``x`` is a ``torch.Tensor`` (a subclass included), told from its class hierarchy:
    torch is never imported (it is not a dependency)."""
    return any(c.__name__ == "Tensor" and c.__module__ in _TORCH_TENSOR_MODULES for c in type(x).__mro__)


def torch_array(t: Any, what: str) -> np.ndarray:
    """A numpy array over the memory of the CPU torch tensor ``t`` (no copy: a run's copy-back
    lands in ``t``). ``what`` names the argument in errors.

    ``t.detach().numpy()`` where numpy knows the dtype; bfloat16 and the float8 kinds as an
    integer view of the same width, re-typed with ml_dtypes' type of that name
    (``t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)``). A tensor on another device
    (CUDA, meta) or a non-contiguous one is an ``ArgumentError``; a dtype with no numpy
    counterpart (e.g. the packed ``float4_e2m1fn_x2``) an ``ArgumentTypeError``.
    """
    device = t.device
    if getattr(device, "type", str(device)) != "cpu":
        raise ArgumentError(
            f"{what}: the torch tensor is on {device}, not the CPU: a host array must be in host "
            "memory (pass t.cpu(), and read outputs from that copy)"
        )
    if not t.is_contiguous():
        raise ArgumentError(
            f"{what}: the torch tensor is not contiguous (shape {tuple(t.shape)}, strides "
            f"{tuple(t.stride())}); pass t.contiguous() (outputs then land in that copy)"
        )
    name = str(t.dtype).removeprefix("torch.")
    t = t.detach()  # shares the storage; numpy() refuses a tensor that requires grad
    target = None
    if name not in _TORCH_NUMPY_DTYPES:
        bits = t.element_size() * 8
        try:
            target = np_dtype(name)
        except TypeError:
            pass
        if target is None or target.itemsize * 8 != bits or bits not in (8, 16, 32, 64):
            raise ArgumentTypeError(
                f"{what}: torch dtype {name} has no numpy counterpart simpler can stage "
                f"(supported: {', '.join(SUPPORTED_DTYPES)})"
            )
    try:
        if target is None:
            return t.numpy()
        torch = sys.modules["torch"]  # loaded: t is one of its tensors
        return t.view(getattr(torch, f"int{bits}")).numpy().view(target)
    except (RuntimeError, TypeError) as e:  # what torch raises for a tensor numpy cannot view
        raise ArgumentTypeError(f"{what}: cannot view the torch tensor ({name}) as a numpy array: {e}") from e


def host_array(value: object, what: str) -> object:
    """``value`` as the native core takes a host array: a torch tensor becomes a numpy view of its
    memory (:func:`torch_array`); anything else is returned unchanged (and checked by the caller)."""
    if isinstance(value, np.ndarray) or not is_torch_tensor(value):
        return value
    return torch_array(value, what)


#: The ctypes type codes of numbers (``c_int8`` ... ``c_uint64``, ``c_float``, ``c_double``,
#: ``c_longdouble``, ``c_bool``) and of ``c_void_p`` (an address, ``None`` being 0). ``c_char`` and the
#: string pointers are not numbers and stay as they are (and are refused as scalars).
_CTYPES_NUMBER_CODES = frozenset("bBhHiIlLqQfdg?P")


def host_scalar(value: object) -> object:
    """``value`` as the native core takes a scalar: a numeric ctypes value (``ctypes.c_float(1.0)``,
    ``c_int64``, ``c_bool``, ...) becomes its Python value (float, int, bool); anything else is
    returned unchanged (and checked by the caller)."""
    if (
        isinstance(value, ctypes._SimpleCData)
        and getattr(type(value), "_type_", None) in _CTYPES_NUMBER_CODES
    ):
        v = value.value
        return 0 if v is None else v  # c_void_p(None): the null address
    return value


# The native module imports nothing from this package: it gets the helpers it calls here.
_core.install_helpers(
    dtype_name=dtype_name,
    np_dtype=np_dtype,
    nvrtc_dirs=_cuda.nvrtc_dirs,
    device_array=_cuda.device_array,
    host_array=host_array,
    host_scalar=host_scalar,
)


def as_numpy(value: Any) -> np.ndarray:
    """A numpy array over the memory of a host array: ``value`` itself when it is a numpy array,
    a view of a CPU torch tensor's memory otherwise (no copy; bfloat16 and the float8 kinds as
    ml_dtypes arrays over the tensor's bits), so writes through it land in the tensor. For
    goldens shared between numpy and torch fixtures."""
    host = host_array(value, "as_numpy")
    if not isinstance(host, np.ndarray):
        raise ArgumentTypeError(f"as_numpy: a numpy array or a CPU torch tensor, not {type(value).__name__}")
    return host
