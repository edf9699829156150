"""The worker: device buffers, running callables, and the orchestrator handle.

The run cycle itself (bind, orchestrate, execute, copy back, clean up) is native: ``Worker.run``
hands the callable and its arguments to ``simpler._core`` in one call, which calls back into
Python only for the orchestration function and the kernels. ``Kernel``, ``Callable``,
``DeviceTensor``, ``Orchestrator`` and ``RunTensor`` are native classes re-exported here.
"""

from __future__ import annotations

import enum
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _arrays, _core
from .errors import ArgumentError, ArgumentTypeError, StateError
from .tensor import DeviceTensor

__all__ = [
    "ArgDirection",
    "Buffer",
    "Callable",
    "DeviceTensor",
    "Kernel",
    "Orchestrator",
    "RunReport",
    "RunTensor",
    "Worker",
]

log = logging.getLogger("simpler")


class ArgDirection(enum.Enum):
    """Direction of a tensor argument in a signature."""

    IN = "IN"
    OUT = "OUT"
    INOUT = "INOUT"


Kernel = _core.Kernel
Callable = _core.Callable
Orchestrator = _core.Orchestrator
RunTensor = _core.RunTensor


class Buffer:
    """A device allocation made by :meth:`Worker.malloc` (or owned by a ResidentTaskArgs).

    A buffer names its allocation by address and generation: after ``free`` (or the release of
    its resident set) every use of it is a ``StateError`` saying it was freed, even if a newer
    allocation starts at the same address.
    """

    def __init__(self, worker: Worker, ptr: int, nbytes: int, owner: object | None = None, *, gen: int = 0):
        self._worker = worker
        self.ptr = ptr
        self.nbytes = nbytes
        self._owner = owner
        self._gen = gen

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
        return DeviceTensor(self, shape, dtype, strides, offset)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        """Frees the buffer, unless it was freed already (or its worker closed)."""
        if self._worker.closed:
            return
        try:
            self._worker.free(self)
        except StateError:
            pass  # freed already: by hand, or with its resident set

    def __reduce__(self) -> Any:
        raise TypeError("a Buffer names device memory of one worker and cannot be pickled")

    def __repr__(self) -> str:
        return f"Buffer({self.ptr:#x}, {self.nbytes} bytes)"


@dataclass
class RunReport:
    """What one run did: ``phases`` (nanoseconds per phase) and ``counters`` (see
    ``docs/concepts.md``)."""

    phases: dict[str, int]
    counters: dict[str, int]
    ok: bool = True
    callable: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Modeled nanoseconds per phase, on a sim worker with a cost model (``Worker(model=...)``);
    #: ``None`` otherwise. See ``docs/cost-model.md``.
    modeled: dict[str, int] | None = None

    @property
    def dispatch_ns(self) -> int:
        """Every phase but execute: the cost of getting arguments to and from the device."""
        return sum(v for k, v in self.phases.items() if k != "execute")

    @property
    def modeled_dispatch_ns(self) -> int | None:
        """The modeled dispatch path (every modeled phase but execute), or ``None``."""
        if self.modeled is None:
            return None
        return sum(v for k, v in self.modeled.items() if k != "execute")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        return {
            "callable": self.callable,
            "ok": self.ok,
            "phases": dict(self.phases),
            "counters": dict(self.counters),
            **({"modeled": dict(self.modeled)} if self.modeled is not None else {}),
            **self.extra,
        }


class Worker:
    """A device and everything allocated on it.

    Args:
        platform: ``"sim"``, ``"ascend"`` or ``"cuda"``.
        staging: ``"arena"`` (retained staging arena; default) or ``"fresh"`` (malloc/free per
            staged tensor per run, the upstream mainline, kept observable).
        svm: sim only: ``"always"``, ``"never"`` or a minimum allocation size in bytes that
            ``map_host`` grants (smaller allocations get a mirror).
        poison: never-written memory shows (default True): at the start of every run a staged OUT
            tensor and every scratch tensor hold the poison byte 0xA5 (a device memset), so a
            kernel that writes nothing cannot pass with an earlier run's bytes; on sim fresh
            allocations are filled too.
        capacity: sim only: simulated device memory in bytes.
        device_id: ascend / cuda: the device id.
        malloc_policy: ascend only: ``"huge_first"`` (default), ``"huge_only"``, ``"normal_only"``.
        model: sim only: price every driver operation and every access through a mapping with a
            cost model of real hardware, ``"ascend-a3"`` or ``"h200"`` (default ``None``):
            reports then carry modeled time per phase beside the measured time (nothing
            sleeps; see docs/cost-model.md).
        view_policy: how resident tensors are reached from the host (docs/host-views.md):
            ``"auto"`` (default: a mapping where the driver grants one, read through a host
            cache once reads dominate; else a mirror), ``"mapping"``, ``"cached"`` or
            ``"mirror"``; ``ResidentTaskArgs.add(..., host_view=...)`` overrides it per tensor.
            Staged tensors the orchestration reads follow it per run (a host copy of their span
            once reads dominate under ``"auto"``; see "Staged tensors" there).
        reuse_addresses: sim only: hand a freed device address out again to the next allocation
            of the same size, as real drivers do (default False: every address is new, so a use
            after free is an error). Handles (``Buffer``, ``DeviceTensor``) carry a generation,
            so one kept past ``free`` gets a "freed" error even when its address was reused.

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
        reuse_addresses: bool | None = None,
        model: str | None = None,
        view_policy: str | None = None,
    ):
        if not isinstance(platform, str):
            raise ArgumentTypeError(f"platform must be a string, not {type(platform).__name__}")
        self._native = _core.Worker(
            platform,
            staging=staging,
            svm=svm,
            poison=poison,
            capacity=capacity,
            device_id=device_id,
            malloc_policy=malloc_policy,
            reuse_addresses=reuse_addresses,
            model=model,
            view_policy=view_policy,
        )
        self.platform = platform
        #: The device id the worker was opened on.
        self.device_id = 0 if device_id is None else int(device_id)

    def __del__(self) -> None:
        native = getattr(self, "_native", None)
        if native is not None and not native.closed:
            warnings.warn(
                f"unclosed {self!r}: close it (or use it as a context manager); closing it now",
                ResourceWarning,
                stacklevel=2,
                source=self,
            )
            self.close()

    def __reduce__(self) -> Any:
        raise TypeError("a Worker owns a device and cannot be pickled")

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
        ptr, gen = self._native._malloc(nbytes)
        return Buffer(self, ptr, int(nbytes), gen=gen)

    def free(self, buf: Buffer) -> None:
        """Frees a buffer from :meth:`malloc` (its host view first)."""
        buf = self._check_buffer(buf, "free")
        self._native._free(buf.ptr, buf._gen)

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
        arr = _arrays.require_array(arr, "copy_to")
        _arrays.require_contiguous(arr, "copy_to")
        self._native._copy_to(buf.ptr, buf._gen, offset, arr.reshape(-1).view(np.uint8))

    def copy_from(self, arr: np.ndarray, buf: Buffer, offset: int = 0) -> None:
        """Fills a C-contiguous, writable array from ``buf`` at byte ``offset``."""
        buf = self._check_buffer(buf, "copy_from")
        arr = _arrays.require_array(arr, "copy_from")
        _arrays.require_contiguous(arr, "copy_from")
        if not arr.flags.writeable:
            raise ArgumentError("copy_from: destination array is read-only")
        self._native._copy_from(buf.ptr, buf._gen, offset, arr.reshape(-1).view(np.uint8))

    # -- observability --
    def stats(self) -> dict[str, int]:
        """Cumulative driver counters (see ``docs/concepts.md``)."""
        return self._native.stats()

    def call_log(self) -> list[tuple[str, int, int, int, str]]:
        """Recent driver calls as ``(op, device address, bytes, code, phase)``, oldest first.

        ``phase`` is what the worker was doing: ``buffer``, ``resident_add``, ``release``,
        ``bind``, ``orchestrate``, ``execute``, ``copy_back``, ``cleanup`` or ``close``.
        """
        return self._native.call_log()

    def inject_fault(self, op: str, nth: int = 1, code: int | None = None) -> None:
        """Makes the ``nth`` next call of ``op`` (alloc, free, h2d, d2h, map, unmap) fail."""
        self._native.inject_fault(op, nth, code)

    def clear_faults(self) -> None:
        """Drops pending injected faults."""
        self._native.clear_faults()

    def host_view_info(self, buf: Buffer | DeviceTensor) -> str | None:
        """``"mapping"`` or ``"mirror"`` once a host view of the allocation exists, else ``None``."""
        buf = self._check_buffer(buf, "host_view_info")
        kind = self._native._host_view_info(buf.ptr, buf._gen)
        return None if kind == "refused" else kind

    def trim_staging(self) -> None:
        """Frees the retained staging arena and scratch pool (re-created when next needed)."""
        self._native._trim_staging()

    # -- running --
    def run(self, callable: Callable, args: Sequence[Any] | Any) -> RunReport:
        """Runs ``callable`` once over ``args``: tensors in signature order (numpy arrays are
        host-staged, :class:`DeviceTensor` are resident), then scalars; or what
        ``TaskArgsBuilder``/``ResidentTaskArgs.build_args`` returned. Returns the report.

        Whatever is raised during the run (by the orchestration, a kernel, or a ``Ctrl+C``), the
        run is finished and cleaned up before the exception reaches the caller, and the worker is
        ready for the next run.
        """
        if not isinstance(callable, Callable):
            raise ArgumentTypeError(f"run: expected a Callable, got {type(callable).__name__}")
        phases, counters, ok, modeled = self._native.run(callable, args)
        return RunReport(phases, counters, ok, callable.name, modeled=modeled)
