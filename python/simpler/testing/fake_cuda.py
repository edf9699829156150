"""Host implementations of device kernels for the fake libcuda (``crates/fake-cuda``).

CI has no GPU: the cuda platform's tests run over a fake driver library (``make test`` links it
at ``target/fake-cuda-libs/libcuda.so.1``; the runtime opens whatever ``SIMPLER_CUDA_LIB`` points
at). The fake cannot run CUDA device code, so each kernel entry a test launches is given a host
implementation in Python: a function of a :class:`Launch` that does with numpy exactly what the
device code does, reading the launch's one parameter (the device address of the first task row)
and the rows the same way the device code reads them.

Register an implementation with :func:`host_impl` (pure Python: a module-level dict, nothing is
loaded), then call :func:`install` once the fake is known to be the driver (:func:`is_fake`):
every implementation in the dict is registered with the fake's C export::

    typedef int (*fake_cuda_host_kernel)(void* user, const char* entry,
        const unsigned long long* params, unsigned int n_params,
        const unsigned int* grid, const unsigned int* block, unsigned int shared_bytes);
    int fake_cuda_register_kernel(const char* entry, fake_cuda_host_kernel fn, void* user);
    void* fake_cuda_translate(unsigned long long dev_addr, unsigned long long len);

and from then on a launch of that entry through the fake runs the implementation (on the fake's
executor thread; ctypes takes the GIL). The callback's answer is the launch's result:
:data:`CUDA_SUCCESS`; :data:`CUDA_ERROR_ILLEGAL_ADDRESS` when the implementation touched memory
outside every live allocation (:class:`IllegalAddress`, raised by :meth:`Launch.array`), which the
fake makes sticky as a real device would; :data:`CUDA_ERROR_LAUNCH_FAILED` when it raised anything
else (the traceback goes to ``stderr``, and :data:`FAILURES` keeps a line per failure). No
exception ever crosses the C boundary.

For tests without the fake library, :class:`HostMemory` is a stand-in address space over numpy
arrays: ``HostMemory.launch(...)`` builds a :class:`Launch` whose memory is those arrays, and
:func:`dispatch` runs it as the callback would.

The ``ctypes`` module is imported here, but no library is opened until :func:`is_fake` or
:func:`install` is called.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import struct
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np

__all__ = [
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_SUCCESS",
    "FAILURES",
    "IMPLS",
    "HostMemory",
    "IllegalAddress",
    "Launch",
    "LaunchFailure",
    "LaunchRace",
    "Region",
    "dispatch",
    "host_impl",
    "install",
    "is_fake",
    "register_noop",
]

#: ``CUresult`` answers of a host implementation (through the callback).
CUDA_SUCCESS = 0
#: The implementation touched memory outside every live allocation (sticky in the fake).
CUDA_ERROR_ILLEGAL_ADDRESS = 700
#: The implementation raised (the device code would have trapped, or the host model is wrong).
CUDA_ERROR_LAUNCH_FAILED = 719

#: Environment override of the driver library's path, as the runtime reads it.
#: The environment setting the runtime reads for the NVRTC library.
ENV_NVRTC_LIB = "SIMPLER_NVRTC_LIB"
ENV_CUDA_LIB = "SIMPLER_CUDA_LIB"
#: Names tried when neither a path nor ``SIMPLER_CUDA_LIB`` is given (as the runtime does).
DEFAULT_CUDA_LIBS = ("libcuda.so.1", "libcuda.so")

#: A host implementation: takes the launch, returns ``None`` (success) or a ``CUresult``.
HostImpl = Callable[["Launch"], "int | None"]

#: Entry name -> host implementation; filled by :func:`host_impl`, registered by :func:`install`.
IMPLS: dict[str, HostImpl] = {}

#: One line per failed host launch (entry and error), most recent last, at most 100 kept.
FAILURES: list[str] = []

_FAILURES_KEPT = 100


def host_impl(entry: str) -> Callable[[HostImpl], HostImpl]:
    """Decorator: registers ``fn`` as the host implementation of device entry ``entry``.

    Fills :data:`IMPLS` (a later definition replaces an earlier one), which :func:`install`
    hands to the fake library; once installed, later implementations reach the library at
    once. Returns ``fn`` unchanged."""
    if not isinstance(entry, str) or not entry:
        raise ValueError(f"host_impl needs an entry name, got {entry!r}")

    def register(fn: HostImpl) -> HostImpl:
        IMPLS[entry] = fn
        with _lock:
            for lib, callback in _installed.values():
                lib.fake_cuda_register_kernel(entry.encode(), callback, None)
        return fn

    return register


class IllegalAddress(Exception):
    """A host implementation touched ``[addr, addr + nbytes)``, which lies in no live allocation
    (the launch answers :data:`CUDA_ERROR_ILLEGAL_ADDRESS`)."""

    def __init__(self, addr: int, nbytes: int) -> None:
        super().__init__(f"illegal address: [{addr:#x}, {addr + nbytes:#x}) is in no live allocation")
        self.addr = addr
        self.nbytes = nbytes


class LaunchFailure(Exception):
    """The device code would fail this launch (a trap, a launch shape it cannot run); the launch
    answers :data:`CUDA_ERROR_LAUNCH_FAILED`."""


class LaunchRace(LaunchFailure):
    """Two tasks of one launch touch the same bytes and at least one writes them: on a device
    they run concurrently, so the result would be undefined (see :meth:`Launch.check_races`)."""


class Region:
    """A byte range one task of a launch touches: ``[addr, addr + nbytes)``, written or only read."""

    __slots__ = ("addr", "name", "nbytes", "write")

    def __init__(self, addr: int, nbytes: int, write: bool, name: str = "") -> None:
        self.addr = int(addr)
        self.nbytes = int(nbytes)
        self.write = bool(write)
        self.name = name

    def __repr__(self) -> str:
        kind = "write" if self.write else "read"
        return f"Region({self.name or '?'}: {kind} [{self.addr:#x}, {self.addr + self.nbytes:#x}))"


def _to_u64(value: Any) -> int:
    """``value`` (an int, a numpy integer, possibly negative) as its 64-bit unsigned pattern."""
    return int(value) & 0xFFFF_FFFF_FFFF_FFFF


class Launch:
    """One launch of a device entry, as the fake's callback sees it.

    ``entry`` (the entry's name), ``grid`` and ``block`` (3-tuples; ``grid`` is the whole launch
    grid, so its z is the per-task z times the number of tasks), ``shared`` (dynamic shared bytes)
    and ``params`` (the kernel's parameters as 64-bit integers; in the simpler ABI exactly one, the
    device address of the first task row). ``translate(addr, nbytes)`` maps device memory to a host
    address, or ``None`` when the range is not inside one live allocation; by default the fake
    library's ``fake_cuda_translate`` (``install`` supplies it), in tests :meth:`HostMemory.translate`.
    """

    __slots__ = ("_translate", "block", "entry", "grid", "params", "shared")

    def __init__(
        self,
        entry: str,
        params: Sequence[int],
        grid: Sequence[int],
        block: Sequence[int],
        shared: int = 0,
        translate: Callable[[int, int], int | None] | None = None,
    ) -> None:
        self.entry = str(entry)
        self.params = tuple(_to_u64(p) for p in params)
        self.grid = tuple(int(g) for g in grid)
        self.block = tuple(int(b) for b in block)
        if len(self.grid) != 3 or len(self.block) != 3:
            raise ValueError(f"grid and block are 3-tuples, got {self.grid} and {self.block}")
        self.shared = int(shared)
        if translate is None:
            raise ValueError("a Launch needs a translate function (the fake library's, or HostMemory's)")
        self._translate = translate

    def __repr__(self) -> str:
        return (
            f"Launch({self.entry!r}, grid={self.grid}, block={self.block}, shared={self.shared}, "
            f"params={[hex(p) for p in self.params]})"
        )

    def n_tasks(self, gz: int = 1) -> int:
        """The number of tasks the launch covers: grid z over the per-task grid z ``gz``."""
        if gz < 1 or self.grid[2] % gz:
            raise LaunchFailure(f"{self.entry}: launch grid z {self.grid[2]} is not a multiple of gz={gz}")
        return self.grid[2] // gz

    def rows(self, n_fields: int, gz: int = 1) -> np.ndarray:
        """The task rows, a ``uint64`` array ``[n_tasks, n_fields]`` (a copy), read from the
        device address in the first parameter; ``gz`` is the per-task grid z."""
        if len(self.params) != 1:
            raise LaunchFailure(
                f"{self.entry}: the ABI passes one parameter (the rows), got {len(self.params)}"
            )
        n = self.n_tasks(gz)
        if n == 0:
            return np.zeros((0, n_fields), np.uint64)
        return self.array(self.params[0], (n, n_fields), np.uint64).copy()

    def array(self, addr: int, shape: Sequence[int] | int, dtype: Any) -> np.ndarray:
        """A writable numpy array of ``shape`` and ``dtype`` (row-major) over device memory at
        ``addr``. Raises :class:`IllegalAddress` when the range is not inside one live
        allocation. A zero-size array is a fresh empty array (nothing is touched)."""
        # np.ndim narrows at run time what mypy cannot: an int (or numpy scalar), else a sequence.
        shape = (
            (int(cast(int, shape)),)
            if np.ndim(shape) == 0
            else tuple(int(s) for s in cast(Sequence[int], shape))
        )
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if any(s < 0 for s in shape):
            raise LaunchFailure(f"{self.entry}: negative extent in shape {shape}")
        if count == 0:
            return np.empty(shape, dt)
        addr = _to_u64(addr)
        nbytes = count * dt.itemsize
        host = self._translate(addr, nbytes)
        if not host:
            raise IllegalAddress(addr, nbytes)
        buf = (ctypes.c_ubyte * nbytes).from_address(host)
        return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)

    @staticmethod
    def i64(field: Any) -> int:
        """A row field (64 bits) read as a signed ``long long``."""
        u = _to_u64(field)
        return u - (1 << 64) if u >> 63 else u

    @staticmethod
    def u64(field: Any) -> int:
        """A row field (64 bits) read as an ``unsigned long long`` (or a device address)."""
        return _to_u64(field)

    @staticmethod
    def f64(field: Any) -> float:
        """A row field (64 bits) read as a ``double``."""
        return struct.unpack("<d", struct.pack("<Q", _to_u64(field)))[0]

    def check_races(self, tasks: Iterable[Iterable[Region]]) -> None:
        """Raises :class:`LaunchRace` when two different tasks of this launch touch overlapping
        bytes and at least one of them writes them (``tasks``: per task, its regions).

        The fake runs a launch's tasks one after another, which hides what a device would do
        with such a launch (run them concurrently): an implementation calls this so the fake
        fails the launch instead of producing the sequential answer."""
        spans = []
        for t, regions in enumerate(tasks):
            for r in regions:
                if r.nbytes > 0:
                    spans.append((r.addr, r.addr + r.nbytes, t, r))
        spans.sort(key=lambda s: (s[0], s[1]))
        active: list[tuple[int, int, int, Region]] = []
        for span in spans:
            start, _, task, region = span
            active = [a for a in active if a[1] > start]
            for _, _, other, seen in active:
                if other != task and (region.write or seen.write):
                    raise LaunchRace(
                        f"{self.entry}: tasks {other} and {task} of one launch race on {seen} / {region}"
                    )
            active.append(span)


def _record_failure(line: str) -> None:
    """Appends ``line`` to :data:`FAILURES`, keeping the most recent ones."""
    FAILURES.append(line)
    del FAILURES[:-_FAILURES_KEPT]


def dispatch(launch: Launch, impls: dict[str, HostImpl] | None = None) -> int:
    """Runs ``launch`` through its host implementation (from ``impls``, default :data:`IMPLS`) and
    returns the ``CUresult`` the fake's callback answers; never raises.

    :class:`IllegalAddress` -> :data:`CUDA_ERROR_ILLEGAL_ADDRESS`; any other exception ->
    :data:`CUDA_ERROR_LAUNCH_FAILED`, with its traceback printed to ``stderr`` and a line added
    to :data:`FAILURES`; ``None`` from the implementation -> :data:`CUDA_SUCCESS`, an int -> it."""
    try:
        impl = (IMPLS if impls is None else impls).get(launch.entry)
        if impl is None:
            raise LaunchFailure(f"no host implementation of entry {launch.entry!r}")
        rc = impl(launch)
        return CUDA_SUCCESS if rc is None else int(rc)
    except IllegalAddress as e:
        _record_failure(f"{launch.entry}: {e} (-> {CUDA_ERROR_ILLEGAL_ADDRESS})")
        print(f"fake_cuda: {launch!r}: {e}", file=sys.stderr)
        return CUDA_ERROR_ILLEGAL_ADDRESS
    except BaseException as e:  # nothing may cross the C boundary (a KeyboardInterrupt neither)
        try:
            _record_failure(f"{launch.entry}: {type(e).__name__}: {e} (-> {CUDA_ERROR_LAUNCH_FAILED})")
            print(
                f"fake_cuda: host implementation of {launch.entry!r} failed; the launch answers "
                f"{CUDA_ERROR_LAUNCH_FAILED}\n{traceback.format_exc()}",
                file=sys.stderr,
            )
        except BaseException:
            pass
        return CUDA_ERROR_LAUNCH_FAILED


class HostMemory:
    """A stand-in device address space over numpy arrays, for tests without the fake library.

    :meth:`add` maps a C-contiguous array at a fresh device address (``base`` upwards, ``align``
    apart, with an unmapped gap after each, so an overrun is an :class:`IllegalAddress`);
    :meth:`translate` is the ``fake_cuda_translate`` of this space; :meth:`launch` builds a
    :class:`Launch` over it. The arrays are kept alive and written in place."""

    def __init__(self, base: int = 0x7E00_0000_0000, align: int = 256) -> None:
        self._next = int(base)
        self._align = int(align)
        self._starts: list[int] = []
        self._arrays: list[np.ndarray] = []

    def add(self, array: np.ndarray) -> int:
        """Maps ``array`` (C-contiguous; writable if a kernel writes it) and returns its device address."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise ValueError("HostMemory maps C-contiguous numpy arrays only")
        addr = self._next
        size = max(array.nbytes, 1)
        self._next = addr + (size + 2 * self._align - 1) // self._align * self._align  # leaves a gap
        self._starts.append(addr)
        self._arrays.append(array)
        return addr

    def translate(self, addr: int, nbytes: int) -> int | None:
        """The host address of device ``addr`` when ``[addr, addr + nbytes)`` lies inside one
        mapped array, else ``None``."""
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        start, arr = self._starts[i], self._arrays[i]
        if addr + nbytes > start + arr.nbytes:
            return None
        return arr.ctypes.data + (addr - start)

    def launch(
        self, entry: str, params: Sequence[int], grid: Sequence[int], block: Sequence[int], shared: int = 0
    ) -> Launch:
        """A :class:`Launch` of ``entry`` whose memory is this address space."""
        return Launch(entry, params, grid, block, shared, translate=self.translate)


# -- the fake library -----------------------------------------------------------------------------

_CALLBACK_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,  # user
    ctypes.c_char_p,  # entry
    ctypes.POINTER(ctypes.c_ulonglong),  # params
    ctypes.c_uint,  # n_params
    ctypes.POINTER(ctypes.c_uint),  # grid[3]
    ctypes.POINTER(ctypes.c_uint),  # block[3]
    ctypes.c_uint,  # shared_bytes
)

_lock = threading.Lock()
#: dlopen handle -> (library, its callback). Never emptied: the fake may call a registered
#: callback at any time, so the ctypes objects live as long as the process.
_installed: dict[int, tuple[ctypes.CDLL, Any]] = {}


def _candidates(lib_path: str | os.PathLike[str] | None) -> list[str]:
    """The library names to try, in the runtime's order."""
    if lib_path is not None:
        return [os.fspath(lib_path)]
    env = os.environ.get(ENV_CUDA_LIB, "")
    return [env] if env else list(DEFAULT_CUDA_LIBS)


def _open(lib_path: str | os.PathLike[str] | None) -> ctypes.CDLL | None:
    """The driver library the runtime would open (``lib_path``, else ``SIMPLER_CUDA_LIB``, else
    the default names), or ``None`` when none opens. Opening the same file again yields the
    runtime's handle, so registrations reach the instance the runtime launches through."""
    for name in _candidates(lib_path):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _has_fake_exports(lib: ctypes.CDLL) -> bool:
    """Whether ``lib`` exports the fake's kernel registration and translation."""
    return hasattr(lib, "fake_cuda_register_kernel") and hasattr(lib, "fake_cuda_translate")


def is_fake(lib_path: str | os.PathLike[str] | None = None) -> bool:
    """Whether the CUDA driver library the runtime would open (``lib_path``, else
    ``SIMPLER_CUDA_LIB``, else ``libcuda.so.1`` / ``libcuda.so``) is the fake: it exports
    ``fake_cuda_register_kernel`` (and ``fake_cuda_translate``). ``False`` when none opens."""
    lib = _open(lib_path)
    return lib is not None and _has_fake_exports(lib)


def _make_callback(lib: ctypes.CDLL) -> Any:
    """The ``fake_cuda_host_kernel`` callback for ``lib``: builds a :class:`Launch` over its
    ``fake_cuda_translate`` and answers :func:`dispatch`'s code; never raises."""
    translate_fn = lib.fake_cuda_translate
    translate_fn.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong]
    translate_fn.restype = ctypes.c_void_p

    def translate(addr: int, nbytes: int) -> int | None:
        """``fake_cuda_translate``: a host address, or ``None`` (NULL)."""
        return translate_fn(addr, nbytes)

    def callback(user, entry, params, n_params, grid, block, shared):  # type: ignore[no-untyped-def]
        """The C callback (on the fake's executor thread; ctypes holds the GIL)."""
        try:
            launch = Launch(
                entry.decode("utf-8", "replace") if entry else "",
                [params[i] for i in range(n_params)],
                [grid[i] for i in range(3)],
                [block[i] for i in range(3)],
                shared,
                translate=translate,
            )
        except BaseException:
            try:
                traceback.print_exc()
            except BaseException:
                pass
            return CUDA_ERROR_LAUNCH_FAILED
        return dispatch(launch)

    return _CALLBACK_TYPE(callback)


def install(lib_path: str | os.PathLike[str] | None = None) -> list[str]:
    """Registers every implementation in :data:`IMPLS` with the fake library (``lib_path``, else
    ``SIMPLER_CUDA_LIB``, else the default names) and returns the registered entry names.

    Idempotent: one callback per library for the life of the process, re-registered for each
    entry (so implementations added since the last call are picked up). The callback looks the
    implementation up at launch time, so a later :func:`host_impl` of a registered entry takes
    effect at once. Raises ``OSError`` when no library opens and ``RuntimeError`` when it is not
    the fake or refuses a registration."""
    lib = _open(lib_path)
    if lib is None:
        raise OSError(f"no CUDA driver library opens from {_candidates(lib_path)}")
    if not _has_fake_exports(lib):
        raise RuntimeError(f"{lib._name} is not the fake libcuda (no fake_cuda_register_kernel)")
    with _lock:
        if lib._handle not in _installed:
            register = lib.fake_cuda_register_kernel
            register.argtypes = [ctypes.c_char_p, _CALLBACK_TYPE, ctypes.c_void_p]
            register.restype = ctypes.c_int
            _installed[lib._handle] = (lib, _make_callback(lib))
        lib, callback = _installed[lib._handle]
        entries = sorted(IMPLS)
        for entry in entries:
            rc = lib.fake_cuda_register_kernel(entry.encode(), callback, None)
            if rc != 0:
                raise RuntimeError(f"fake_cuda_register_kernel({entry!r}) answered {rc}")
    return entries


def register_noop(*entries: str, lib_path: str | os.PathLike[str] | None = None) -> None:
    """Makes launches of ``entries`` do nothing, natively in the fake library (no callback into
    Python), so a benchmark of the host's side measures the host alone. :func:`install` gives
    the entries their :data:`IMPLS` implementations back. Raises ``OSError`` when no library
    opens and ``RuntimeError`` when it is not the fake."""
    lib = _open(lib_path)
    if lib is None:
        raise OSError(f"no CUDA driver library opens from {_candidates(lib_path)}")
    if not hasattr(lib, "fake_cuda_register_noop_kernel"):
        raise RuntimeError(f"{lib._name} is not the fake libcuda (no fake_cuda_register_noop_kernel)")
    fn = lib.fake_cuda_register_noop_kernel
    fn.argtypes = [ctypes.c_char_p]
    fn.restype = ctypes.c_int
    for e in entries:
        if fn(e.encode()) != 0:
            raise RuntimeError(f"fake_cuda_register_noop_kernel({e!r}) failed")


def install_if_fake(lib_path: str | os.PathLike[str] | None = None) -> bool:
    """On a machine whose CUDA driver library is the fake: :func:`install`, and point NVRTC at
    the fake's own (``SIMPLER_NVRTC_LIB``, unless it is set), whose images the fake loads.
    Returns whether the library is the fake; does nothing otherwise (a real GPU)."""
    if not is_fake(lib_path):
        return False
    install(lib_path)
    lib = _open(lib_path)
    if lib is not None and not os.environ.get(ENV_NVRTC_LIB):
        os.environ[ENV_NVRTC_LIB] = lib._name
    return True
