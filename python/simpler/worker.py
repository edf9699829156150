"""The worker: device buffers, running callables, and the orchestrator handle.

Every class here is native (``simpler._core``), re-exported: the run cycle itself (bind,
orchestrate, execute, copy back, clean up) is one native call that calls back into Python only
for the orchestration function and the kernels (and not even for a kernel's device code,
:class:`CudaCode`, which the runtime launches natively on cuda). :class:`Worker` is a short subclass that adds
the ``ResourceWarning`` of a worker that was never closed.
"""

from __future__ import annotations

import warnings
from typing import TypedDict

from . import _core

__all__ = [
    "ArgDirection",
    "Buffer",
    "Callable",
    "CloseSummary",
    "CudaCode",
    "DebugState",
    "DeviceArray",
    "DeviceTensor",
    "HostViews",
    "Kernel",
    "KernelWork",
    "Launch",
    "Orchestrator",
    "PendingRun",
    "ReleaseSummary",
    "RunReport",
    "RunTensor",
    "SessionStats",
    "Worker",
    "WorkerStats",
    "compile_cuda",
    "device_code_stats",
    "nvrtc_info",
    "release_sessions",
    "session_stats",
]

ArgDirection = _core.ArgDirection
Buffer = _core.Buffer
Callable = _core.Callable
CudaCode = _core.CudaCode
DeviceArray = _core.DeviceArray
DeviceTensor = _core.DeviceTensor
Kernel = _core.Kernel
KernelWork = _core.KernelWork
Launch = _core.Launch
Orchestrator = _core.Orchestrator
RunReport = _core.RunReport
PendingRun = _core.PendingRun
RunTensor = _core.RunTensor
compile_cuda = _core.compile_cuda
device_code_stats = _core.device_code_stats
nvrtc_info = _core.nvrtc_info
release_sessions = _core.release_sessions
session_stats = _core.session_stats

# The dicts of a worker's observability and of the vendor sessions, with exactly the keys the
# native module returns (the type stubs declare the same).


class WorkerStats(TypedDict):
    """A worker's cumulative driver counters (``Worker.stats()``)."""

    live_allocations: int
    live_bytes: int
    peak_bytes: int
    allocs: int
    frees: int
    h2d_calls: int
    h2d_bytes: int
    d2h_calls: int
    d2h_bytes: int
    maps: int
    map_refusals: int
    unmaps: int
    live_mappings: int
    memset_calls: int
    memset_bytes: int
    pins: int
    unpins: int
    pinned_bytes: int
    launches: int
    module_loads: int
    syncs: int
    modeled_ns: int


class HostViews(TypedDict):
    """Host views of a worker's allocations, by kind."""

    mapped: int
    mirrored: int
    refused: int


class DebugState(TypedDict):
    """What a worker holds now (``Worker.debug_state()``)."""

    arena: tuple[int, int] | None
    scratch_chunks: list[tuple[int, int]]
    views: HostViews
    busy: bool
    closed: bool
    handles: int


class CloseSummary(TypedDict):
    """What ``Worker.close()`` found and freed."""

    user_buffers: int
    resident_sets: int
    leaked_allocations: int
    leaked_mappings: int
    errors: list[str]


class SessionStats(TypedDict):
    """Vendor sessions this process opened so far and holds now (``session_stats()``)."""

    opened: int
    held: int


class ReleaseSummary(TypedDict):
    """What ``release_sessions()`` gave back."""

    sessions: int
    closed_workers: int
    errors: list[str]


class Worker(_core.Worker):
    """A device and everything allocated on it.

    ``Worker(platform="sim", *, staging="arena", svm=None, poison=None, capacity=None,
    device_id=None, malloc_policy=None, reuse_addresses=None, model=None, view_policy=None)``

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
        model: sim only: price every driver operation, every access through a mapping and
            every kernel with a cost model of real hardware, ``"ascend-a3"`` or ``"h200"``, or
            several, comma-separated (``"ascend-a3,h200"``: one run priced under each, the
            first being the primary model; default ``None``): reports then carry modeled time
            per phase beside the measured time (nothing sleeps; see docs/cost-model.md).
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
    warning naming how much). Buffers, device tensors and resident sets hold the device they
    belong to: a worker dropped without ``close`` warns (``ResourceWarning``) and closes, unless
    such handles are still alive; then the device is released with the last of them (so memory
    exported to another library never outlives it).
    """

    def __del__(self) -> None:
        if self.closed:
            return
        warnings.warn(
            f"unclosed {self!r}: close it (or use it as a context manager)",
            ResourceWarning,
            stacklevel=2,
            source=self,
        )
        if self.debug_state()["handles"] == 0:
            self.close()
