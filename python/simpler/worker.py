"""The worker: device buffers, running callables, and the orchestrator handle."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable as _Fn
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _arrays, _core
from .errors import ArgumentError, ArgumentTypeError

__all__ = [
    "ArgDirection",
    "Buffer",
    "Callable",
    "DeviceTensor",
    "Kernel",
    "Orchestrator",
    "RunReport",
    "Worker",
]

log = logging.getLogger("simpler")


class ArgDirection(enum.Enum):
    """Direction of a tensor argument in a signature."""

    IN = "IN"
    OUT = "OUT"
    INOUT = "INOUT"


def _direction(d: object, what: str) -> ArgDirection:
    if isinstance(d, ArgDirection):
        return d
    if isinstance(d, str) and d.upper() in ArgDirection.__members__:
        return ArgDirection[d.upper()]
    raise ArgumentTypeError(f"{what}: direction must be an ArgDirection, not {d!r}")


def _signature(sig: Sequence[object], what: str) -> tuple[tuple[ArgDirection, str | None], ...]:
    out = []
    for i, entry in enumerate(sig):
        if isinstance(entry, tuple):
            if len(entry) != 2:
                raise ArgumentError(f"{what}: signature entry {i} must be a direction or (direction, dtype)")
            out.append((_direction(entry[0], what), _arrays.dtype_name(entry[1], what)))
        else:
            out.append((_direction(entry, what), None))
    return tuple(out)


_SCALAR_TYPES = (bool, int, float, np.bool_, np.integer, np.floating)
_FAST_SCALARS = frozenset({bool, int, float})


def _check_scalar(v: object, what: str) -> None:
    if not isinstance(v, _SCALAR_TYPES):
        raise ArgumentTypeError(f"{what}: scalars must be int, float or bool, not {type(v).__name__}")


class Kernel:
    """A task body: ``fn(*arrays, *scalars)`` runs once per submitted task.

    Args:
        fn: receives one numpy array per tensor (in ``signature`` order), then the scalars.
            On ``sim`` the arrays view device memory directly; on other platforms they are host
            copies (inputs copied in before, outputs copied out after) — a correctness path.
        signature: the direction of each tensor, optionally with a dtype: ``[IN, (OUT, "float32")]``.
        name: for messages; defaults to ``fn.__name__``.
    """

    def __init__(self, fn: _Fn[..., Any], signature: Sequence[object], name: str | None = None):
        if not callable(fn):
            raise ArgumentTypeError(f"Kernel: fn must be callable, not {type(fn).__name__}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "kernel")
        self.signature = _signature(signature, f"kernel {self.name}")
        # Precomputed for submit, which runs once per task.
        self._dirs = tuple(d.value for d, _ in self.signature)
        self._dtype_checks = tuple((i, dt) for i, (_, dt) in enumerate(self.signature) if dt is not None)

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {list(self._dirs)})"


class Callable:
    """A device program: an orchestration function over tensor arguments.

    Args:
        orchestration: ``fn(orch, *tensors, *scalars)``; reads/writes tensor data through ``orch``
            and submits kernels.
        signature: the direction of each tensor argument (scalars are not listed), optionally
            with a dtype: ``[IN, IN, (OUT, "float32")]``.
        name: for messages; defaults to the function's name.
    """

    def __init__(
        self,
        orchestration: _Fn[..., Any],
        signature: Sequence[object],
        name: str | None = None,
    ):
        if not callable(orchestration):
            raise ArgumentTypeError("Callable: orchestration must be callable")
        self.orchestration = orchestration
        self.name = name or getattr(orchestration, "__name__", "callable")
        self.signature = _signature(signature, f"callable {self.name}")

    def __repr__(self) -> str:
        return f"Callable({self.name}, {[d.value for d, _ in self.signature]})"


class Buffer:
    """A device allocation made by :meth:`Worker.malloc` (or owned by a ResidentTaskArgs)."""

    def __init__(self, worker: Worker, ptr: int, nbytes: int, owner: object | None = None):
        self._worker = worker
        self.ptr = ptr
        self.nbytes = nbytes
        self._owner = owner

    def tensor(
        self,
        shape: Sequence[int],
        dtype: object,
        strides: Sequence[int] | None = None,
        offset: int = 0,
    ) -> DeviceTensor:
        """A device tensor over this buffer: ``strides`` and ``offset`` in elements.

        Raises ``GeometryError`` on overflow and ``ArgumentError`` when the tensor's extent does
        not fit the buffer.
        """
        shape_l = [int(s) for s in shape]
        strides_l = None if strides is None else [int(s) for s in strides]
        name = _arrays.dtype_name(dtype, "Buffer.tensor")
        what = f"tensor over buffer {self.ptr:#x}"
        self._worker._native._check_tensor(what, self.ptr, name, shape_l, strides_l, int(offset))
        return DeviceTensor(self, tuple(shape_l), name, strides_l, int(offset))

    def __repr__(self) -> str:
        return f"Buffer({self.ptr:#x}, {self.nbytes} bytes)"


@dataclass(frozen=True)
class DeviceTensor:
    """A tensor over a device buffer; passed to :meth:`Worker.run` it is resident (no staging)."""

    buffer: Buffer
    shape: tuple[int, ...]
    dtype: str
    strides: list[int] | None = None
    offset: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes of its elements."""
        return int(np.prod(self.shape, dtype=np.int64)) * _arrays.np_dtype(self.dtype).itemsize

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy dtype."""
        return _arrays.np_dtype(self.dtype)


@dataclass
class RunReport:
    """What one run did: ``phases`` (nanoseconds per phase) and ``counters`` (DESIGN section 6)."""

    phases: dict[str, int]
    counters: dict[str, int]
    ok: bool = True
    callable: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dispatch_ns(self) -> int:
        """Every phase but execute: the cost of getting arguments to and from the device."""
        return sum(v for k, v in self.phases.items() if k != "execute")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        return {
            "callable": self.callable,
            "ok": self.ok,
            "phases": dict(self.phases),
            "counters": dict(self.counters),
            **self.extra,
        }


class Orchestrator(_core.Orchestrator):
    """The handle an orchestration function receives.

    ``get_tensor_data(t, idx)`` / ``set_tensor_data(t, idx, value)`` read and write one element
    (``idx`` an int for 1-D tensors, else a tuple), typed by the tensor's dtype;
    ``read_tensor(t)`` returns a read-only numpy array; ``submit(kernel, *tensors, *scalars)``
    queues a task. Views: ``t.view(shape, offsets)``.
    """

    def __init__(self, worker: Worker):
        self._scratch_names: list[str] = []
        self._tasks: list[tuple[Kernel, tuple[Any, ...]]] = []
        self._gen = -1
        self._w = worker

    def __new__(cls, worker: Worker) -> Orchestrator:
        return super().__new__(cls, worker._native)

    def read_tensor(self, t: _core.RunTensor) -> np.ndarray:
        """The tensor's contents as a read-only numpy array (no copy over a mapping or mirror)."""
        return _arrays.window_array(self._read_window(t))

    def scratch(self, shape: Sequence[int], dtype: object, name: str | None = None) -> _core.RunTensor:
        """A run-scoped device tensor for intermediate results (lives until the run's cleanup).

        Its bytes come from the worker's retained scratch pool, so a warm run with the same
        footprint does no device malloc. Uninitialized (poison on sim) until a task writes it.
        """
        dt = _arrays.dtype_name(dtype, "scratch")
        label = name or f"scratch{len(self._scratch_names)}"
        self._scratch_names.append(label)
        return self._w._native._scratch(self._gen, label, dt, [int(s) for s in shape])

    def submit(self, kernel: Kernel, *args: Any) -> int:
        """Queues ``kernel`` over tensors (or views) of this run, then scalars; returns its index."""
        if not isinstance(kernel, Kernel):
            raise ArgumentTypeError(f"submit: expected a Kernel, got {type(kernel).__name__}")
        n = len(kernel._dirs)
        tensors, scalars = args[:n], args[n:]
        run_tensor = _core.RunTensor
        if len(tensors) < n or not all(type(t) is run_tensor for t in tensors):
            got = sum(isinstance(a, run_tensor) for a in args)
            raise ArgumentError(f"submit {kernel.name}: signature takes {n} tensors, got {got}")
        for i, s in enumerate(scalars):
            if type(s) not in _FAST_SCALARS:
                if isinstance(s, run_tensor):
                    raise ArgumentError(f"submit {kernel.name}: tensor after scalars (argument {n + i})")
                _check_scalar(s, f"submit {kernel.name} scalar {i}")
        for i, dt in kernel._dtype_checks:
            t = tensors[i]
            if t.dtype != dt:
                raise ArgumentTypeError(
                    f"submit {kernel.name}: tensor {t.name} is {t.dtype}, signature wants {dt}"
                )
        idx = self._w._native._submit(self._gen, tensors, kernel._dirs)
        self._tasks.append((kernel, scalars))
        return idx


@dataclass
class _Staged:
    arr: np.ndarray  # the caller's array
    work: np.ndarray  # what is staged (the array itself, or a contiguous copy)
    direction: ArgDirection
    extent: np.ndarray  # uint8 view of work's byte extent: uploaded at bind, copied back into


class Worker:
    """A device and everything allocated on it.

    Args:
        platform: ``"sim"``, ``"ascend"`` or ``"cuda"``.
        staging: ``"arena"`` (retained staging arena; default) or ``"fresh"`` (malloc/free per
            staged tensor per run, the upstream mainline, kept observable).
        svm: sim only: ``"always"``, ``"never"`` or a minimum allocation size in bytes that
            ``map_host`` grants (smaller allocations get a mirror).
        poison: sim only: fill fresh allocations with a poison byte (default True).
        capacity: sim only: simulated device memory in bytes.
        device_id: ascend / cuda: the logical device id.
        malloc_policy: ascend only: ``"huge_first"`` (default), ``"huge_only"``, ``"normal_only"``.

    On ``ascend`` and ``cuda`` the vendor library is opened at run time (see docs/platforms.md);
    when it is missing, ``PlatformUnavailableError`` names the library and every path tried.

    A context manager; :meth:`close` is idempotent and frees whatever is still live (with a
    warning naming how much).
    """

    def __init__(
        self,
        platform: str = "sim",
        *,
        staging: str = "arena",
        svm: str | int | None = None,
        poison: bool | None = None,
        capacity: int | None = None,
        device_id: int | None = None,
        malloc_policy: str | None = None,
    ):
        if not isinstance(platform, str):
            raise ArgumentTypeError(f"platform must be a string, not {type(platform).__name__}")
        self._native = _core.Worker(
            platform,
            staging=staging,
            svm=None if svm is None else str(svm),
            poison=poison,
            capacity=capacity,
            device_id=device_id,
            malloc_policy=malloc_policy,
        )
        self.platform = platform

    # -- lifetime --
    def close(self) -> None:
        """Releases everything (resident sets, buffers, the arena; views first), then the device."""
        if self._native.closed:
            return
        summary = self._native._close()
        for e in summary["errors"]:
            log.error("worker close: %s", e)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._native.closed

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Worker(platform={self.platform!r}, staging={self._native.staging!r})"

    # -- buffers --
    def malloc(self, nbytes: int) -> Buffer:
        """Allocates a device buffer of ``nbytes`` (> 0)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
            raise ArgumentTypeError(f"malloc: nbytes must be an int, not {type(nbytes).__name__}")
        if nbytes < 0:
            raise ArgumentError(f"malloc: negative size {nbytes}")
        return Buffer(self, self._native._malloc(int(nbytes)), int(nbytes))

    def free(self, buf: Buffer) -> None:
        """Frees a buffer from :meth:`malloc` (its host view first)."""
        self._check_buffer(buf, "free")
        self._native._free(buf.ptr)

    def _check_buffer(self, buf: object, what: str) -> Buffer:
        if isinstance(buf, DeviceTensor):
            buf = buf.buffer
        if not isinstance(buf, Buffer):
            raise ArgumentTypeError(f"{what}: expected a Buffer, got {type(buf).__name__}")
        if buf._worker is not self:
            raise ArgumentError(f"{what}: buffer {buf.ptr:#x} belongs to another worker")
        return buf

    def copy_to(self, buf: Buffer, arr: np.ndarray, offset: int = 0) -> None:
        """Copies a C-contiguous array into ``buf`` at byte ``offset``."""
        buf = self._check_buffer(buf, "copy_to")
        _check_offset(offset, "copy_to")
        arr = _arrays.require_array(arr, "copy_to")
        _arrays.require_contiguous(arr, "copy_to")
        self._native._copy_to(buf.ptr, int(offset), arr.reshape(-1).view(np.uint8))

    def copy_from(self, arr: np.ndarray, buf: Buffer, offset: int = 0) -> None:
        """Fills a C-contiguous, writable array from ``buf`` at byte ``offset``."""
        buf = self._check_buffer(buf, "copy_from")
        _check_offset(offset, "copy_from")
        arr = _arrays.require_array(arr, "copy_from")
        _arrays.require_contiguous(arr, "copy_from")
        if not arr.flags.writeable:
            raise ArgumentError("copy_from: destination array is read-only")
        self._native._copy_from(buf.ptr, int(offset), arr.reshape(-1).view(np.uint8))

    # -- observability --
    def stats(self) -> dict[str, int]:
        """Cumulative driver counters (DESIGN section 6)."""
        return self._native.stats()

    def call_log(self) -> list[tuple[str, int, int, int]]:
        """Recent driver calls as ``(op, device address, bytes, code)``, oldest first."""
        return self._native.call_log()

    def inject_fault(self, op: str, nth: int = 1, code: int | None = None) -> None:
        """Makes the ``nth`` next call of ``op`` (alloc, free, h2d, d2h, map, unmap) fail."""
        if isinstance(nth, bool) or not isinstance(nth, (int, np.integer)) or nth < 1:
            raise ArgumentError(f"inject_fault: nth must be an int >= 1 (1 = the next call), not {nth!r}")
        self._native.inject_fault(op, int(nth), code)

    def clear_faults(self) -> None:
        """Drops pending injected faults."""
        self._native.clear_faults()

    def host_view_info(self, buf: Buffer | DeviceTensor) -> str | None:
        """``"mapping"`` or ``"mirror"`` once a host view of the allocation exists, else ``None``."""
        buf = self._check_buffer(buf, "host_view_info")
        kind = self._native._host_view_info(buf.ptr)
        return None if kind == "refused" else kind

    def trim_staging(self) -> None:
        """Frees the retained staging arena (it is re-created on the next staged run)."""
        self._native._trim_staging()

    # -- running --
    def run(self, callable: Callable, args: Sequence[Any] | Any) -> RunReport:
        """Runs ``callable`` once over ``args``: tensors in signature order (numpy arrays are
        host-staged, :class:`DeviceTensor` are resident), then scalars; or what
        ``TaskArgsBuilder``/``ResidentTaskArgs.build_args`` returned. Returns the report."""
        if not isinstance(callable, Callable):
            raise ArgumentTypeError(f"run: expected a Callable, got {type(callable).__name__}")
        names, values = _split_args(args)
        sig = callable.signature
        tensors: list[Any] = []
        scalars: list[Any] = []
        for i, v in enumerate(values):
            if isinstance(v, (np.ndarray, DeviceTensor)):
                if scalars:
                    raise ArgumentError(
                        f"run {callable.name}: tensor '{names[i]}' after a scalar (tensors come first)"
                    )
                tensors.append(v)
            else:
                _check_scalar(v, f"run {callable.name}: argument '{names[i]}'")
                scalars.append(v)
        if len(tensors) != len(sig):
            raise ArgumentError(
                f"run {callable.name}: signature has {len(sig)} tensor arguments, got {len(tensors)}"
            )
        specs: list[tuple[Any, ...]] = []
        staged: dict[int, _Staged] = {}
        for i, (t, (d, want)) in enumerate(zip(tensors, sig)):
            name = names[i]
            if isinstance(t, DeviceTensor):
                b = t.buffer
                if b._worker is not self:
                    raise ArgumentError(f"run: tensor '{name}' lives on another worker")
                dt = t.dtype
                specs.append(("device", name, b.ptr, dt, list(t.shape), t.strides, t.offset, d.value))
            else:
                dt = _arrays.dtype_name(t.dtype, f"tensor {name}")
                if d is not ArgDirection.IN and not t.flags.writeable:
                    raise ArgumentError(f"run: tensor '{name}' is {d.value} but its array is read-only")
                work = (
                    t if _arrays.stageable(t) else np.ascontiguousarray(t).astype(t.dtype.newbyteorder("="))
                )
                s = staged[i] = _Staged(t, work, d, _arrays.extent_bytes(work))
                specs.append(
                    ("staged", name, dt, list(work.shape), _arrays.element_strides(work), d.value, s.extent)
                )
            if want is not None and dt != want:
                raise ArgumentTypeError(
                    f"run {callable.name}: tensor '{name}' is {dt}, signature wants {want}"
                )
        native = self._native
        gen = native._begin_run(specs)
        orch = Orchestrator(self)
        orch._gen = gen
        failure: BaseException | None = None
        try:
            handles = [native._tensor(gen, i) for i in range(len(tensors))]
            callable.orchestration(orch, *handles, *scalars)
            native._begin_execute(gen)
            ok = False
            try:
                for ti, (kernel, kscalars) in enumerate(orch._tasks):
                    arrays = [_arrays.window_array(w) for w in native._task_buffers(gen, ti)]
                    kernel.fn(*arrays, *kscalars)
                    del arrays
                    native._finish_task(gen, ti)
                ok = True
            finally:
                native._end_execute(gen, ok)
            hosts = [
                staged[i].extent if i in staged and staged[i].direction is not ArgDirection.IN else None
                for i in range(len(tensors))
            ]
            native._copy_back(gen, hosts)
            for s in staged.values():
                if s.work is not s.arr and s.direction is not ArgDirection.IN:
                    s.arr[...] = s.work
        except BaseException as e:
            failure = e
            native._fail_run(gen)
            raise
        finally:
            try:
                phases, counters, ok_run = native._finish_run(gen)
            except BaseException:
                if failure is None:
                    raise
                log.exception("cleanup after a failed run also failed")
        return RunReport(phases, counters, ok_run, callable.name)


def _check_offset(offset: object, what: str) -> None:
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise ArgumentTypeError(f"{what}: offset must be an int, not {type(offset).__name__}")
    if offset < 0:
        raise ArgumentError(f"{what}: negative byte offset {offset}")


def _split_args(args: Any) -> tuple[list[str], list[Any]]:
    """Names and values of run arguments (built args carry names; plain lists get positions)."""
    named = getattr(args, "_named_values", None)
    if named is not None:
        pairs = named()
        return [n for n, _ in pairs], [v for _, v in pairs]
    if isinstance(args, (np.ndarray, DeviceTensor)) or not isinstance(args, Sequence):
        raise ArgumentTypeError("run: args must be a sequence (tensors, then scalars) or built args")
    return [f"arg{i}" for i in range(len(args))], list(args)
