"""The per-device side of a device group: one :class:`DeviceHost` per child process (or Ray
actor), owning one :class:`~simpler.Worker` and its resident sets. The backends only carry its
method calls; everything a child does is here, once.
"""

from __future__ import annotations

import os
from collections.abc import Callable as Fn
from typing import TYPE_CHECKING, Any

import numpy as np

from ..args import ResidentTaskArgs
from ..errors import ArgumentError, StateError
from ..worker import CloseSummary, RunReport, Worker, WorkerStats
from ._errors import crossing
from ._transport import Attached, GroupTensor, ShmRef, walk

if TYPE_CHECKING:
    from .._core import _DriverOp, _Platform


class DeviceContext:
    """What a round's function receives in the child: its device and the worker on it.

    ``worker`` is the device's :class:`~simpler.Worker`; ``device`` the device id; ``index`` the
    device's position in the group; ``callable(make)`` the :class:`~simpler.Callable` that
    ``make()`` builds, built once per child and kept; ``run(make, args)`` runs it on the worker
    and returns its :class:`~simpler.RunReport`.
    """

    def __init__(self, host: DeviceHost):
        self._host = host

    @property
    def worker(self) -> Worker:
        """The device's worker."""
        assert self._host.worker is not None
        return self._host.worker

    @property
    def device(self) -> int:
        """The device id."""
        return self._host.device

    @property
    def index(self) -> int:
        """The device's position in the group."""
        return self._host.index

    def callable(self, make: Fn[[], Any]) -> Any:
        """The callable ``make()`` builds, built once per child."""
        cache = self._host.callables
        if make not in cache:
            cache[make] = make()
        return cache[make]

    def run(self, make: Fn[[], Any], args: Any) -> RunReport:
        """Runs ``make()``'s callable with ``args`` on the worker; its report."""
        return self.worker.run(self.callable(make), args)


class DeviceHost:
    """One device of a group, in its own process (see the module docs)."""

    def __init__(self, platform: _Platform, device: int, index: int, options: dict[str, Any]):
        self.platform = platform
        self.device = device
        self.index = index
        self.options = dict(options)
        self.worker: Worker | None = None
        self.sets: dict[int, tuple[int, ResidentTaskArgs]] = {}
        self.callables: dict[Any, Any] = {}
        self.attached = Attached()

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> int:
        """Opens the device's worker; the child's process id."""
        opts = dict(self.options)
        if self.platform != "sim":
            opts.setdefault("device_id", self.device)
        self.worker = Worker(self.platform, **opts)
        return os.getpid()

    def close(self) -> CloseSummary:
        """Releases every resident set (newest first), then closes the worker; the worker's
        close summary (nothing counted when it was not open), with the sets' errors first."""
        errors = []
        for set_id in sorted(self.sets, reverse=True):
            try:
                self.release_set(set_id)
            except Exception as e:  # every set is attempted
                errors.append(f"resident set {set_id}: {e}")
        summary = self.worker.close() if self.worker is not None else None
        self.attached.release()
        if summary is None:
            summary = CloseSummary(
                user_buffers=0, resident_sets=0, leaked_allocations=0, leaked_mappings=0, errors=[]
            )
        summary["errors"] = errors + summary["errors"]
        return summary

    # -- values ------------------------------------------------------------------------------

    def resolve(self, value: Any) -> Any:
        """``value`` with shared-memory references viewed in place and group tensors replaced by
        this device's tensors (a handle of another device is refused)."""

        def leaf(x: Any) -> Any:
            if isinstance(x, ShmRef):
                return self.attached.view(x)
            if isinstance(x, GroupTensor):
                return self.tensor(x)
            return x

        return walk(value, leaf)

    def tensor(self, h: GroupTensor) -> Any:
        """The device tensor a group handle names, on this device only."""
        if h.device != self.device:
            raise ArgumentError(
                f"resident tensor {h.name!r} of set {h.set_id} lives on device {h.device}; it was "
                f"used on device {self.device} (a resident handle belongs to one device)"
            )
        held = self.sets.get(h.set_id)
        if held is None or held[0] != h.generation:
            raise StateError(
                f"resident tensor {h.name!r} of set {h.set_id} on device {self.device} was released"
            )
        return held[1][h.name]

    # -- rounds ------------------------------------------------------------------------------

    def call(self, fn: Fn[..., Any], args: tuple[Any, ...], block: str | None) -> Any:
        """Runs ``fn(context, *args)``; ``block`` is the parent's current shared block."""
        try:
            return fn(DeviceContext(self), *self.resolve(args))
        finally:
            self.attached.release(keep=block)

    def inject_fault(self, op: _DriverOp, nth: int | None, code: int | None) -> None:
        """The worker's fault injection, through the group."""
        assert self.worker is not None
        self.worker.inject_fault(op, nth, code)

    def stats(self) -> WorkerStats:
        """The worker's counters."""
        assert self.worker is not None
        return self.worker.stats()

    # -- resident sets ----------------------------------------------------------------------

    def open_set(self, set_id: int, generation: int) -> None:
        """An empty resident set."""
        assert self.worker is not None
        self.sets[set_id] = (generation, ResidentTaskArgs(self.worker))

    def add(self, set_id: int, name: str, value: Any, direction: Any) -> tuple[tuple[int, ...], str]:
        """Adds one tensor to the set: its shape and dtype on this device."""
        host = self.resolve(value)
        if isinstance(host, np.ndarray) and host.nbytes == 0:
            # A zero-byte tensor allocates nothing: the set keeps the host array itself, which
            # must not be a view of the parent's shared memory (unmapped after the call).
            host = host.copy()
        t = self.sets[set_id][1].add(name, host, direction)
        return tuple(t.shape), str(t.dtype)

    def release_set(self, set_id: int) -> None:
        """Releases the set in LIFO order (the runtime's rule), idempotently."""
        held = self.sets.pop(set_id, None)
        if held is not None:
            held[1].release()

    def read(self, set_id: int, names: list[str]) -> dict[str, np.ndarray]:
        """The current contents of resident tensors (one D2H each)."""
        assert self.worker is not None
        out = {}
        for name in names:
            t = self.tensor(GroupTensor(self.device, set_id, name, self.sets[set_id][0]))
            if isinstance(t, np.ndarray):  # a zero-byte tensor: no allocation, the host array
                out[name] = t.copy()
                continue
            arr = np.empty(t.shape, t.np_dtype)
            self.worker.copy_from(arr, t)
            out[name] = arr
        return out

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, method: str, args: tuple[Any, ...]) -> tuple[str, Any]:
        """One call from the parent: ``("ok", result)`` or ``("err", (exception, trace))``, the
        exception as it crosses (:func:`~simpler.group._errors.crossing`)."""
        try:
            return "ok", getattr(self, method)(*args)
        except BaseException as e:  # carried back, never raised here
            return "err", crossing(e)
