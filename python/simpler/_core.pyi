"""Type stubs for the native module ``simpler._core`` (glue over the Rust runtime).

Users should use the ``simpler`` package, which re-exports these classes; the module imports
nothing from the package (its numpy helpers are handed over once, by ``install_helpers``).
"""

from collections.abc import Callable as _Fn
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final, Literal, NoReturn, Protocol, Self, final, overload

import numpy as np

# The dicts the worker's observability methods return: declared once, in the Python module.
from simpler.worker import CloseSummary as _CloseSummary
from simpler.worker import DebugState as _DebugState
from simpler.worker import ReleaseSummary as _ReleaseSummary
from simpler.worker import SessionStats as _SessionStats
from simpler.worker import WorkerStats as _WorkerStats

__all__ = [
    "DRIVER_OPS",
    "DTYPES",
    "MODELS",
    "NVRTC_WHEEL_SUBDIRS",
    "PHASES",
    "PLATFORMS",
    "STAGING_MODES",
    "VIEW_POLICIES",
    "ArgDirection",
    "ArgumentError",
    "ArgumentTypeError",
    "Buffer",
    "BuiltArgs",
    "Callable",
    "CompileError",
    "CudaCode",
    "DeviceArray",
    "DeviceError",
    "DeviceTensor",
    "GeometryError",
    "HazardError",
    "HostWindow",
    "Kernel",
    "KernelWork",
    "Launch",
    "NoHostViewError",
    "Orchestrator",
    "PendingRun",
    "PlatformUnavailableError",
    "ResidentSet",
    "RunReport",
    "RunTensor",
    "RunViews",
    "SimplerError",
    "StateError",
    "Worker",
    "check_name",
    "check_scalar",
    "check_worker_options",
    "compile_cuda",
    "device_code_stats",
    "install_helpers",
    "nvrtc_info",
    "parse_svm",
    "release_sessions",
    "session_stats",
]

DTYPES: list[str]
PLATFORMS: list[str]
MODELS: list[str]
VIEW_POLICIES: list[str]
STAGING_MODES: list[str]
DRIVER_OPS: list[str]
NVRTC_WHEEL_SUBDIRS: list[str]
PHASES: list[str]

_Platform = Literal["sim", "ascend", "cuda"]
_StagingMode = Literal["arena", "fresh"]
_ViewPolicy = Literal["auto", "mapping", "cached", "mirror"]
_Replay = Literal["off", "plans", "graphs"]
_HostView = Literal["lazy", "eager", "auto", "mapping", "cached", "mirror"]
_ViewKind = Literal["mapping", "cached", "mirror"]
# One model, or several comma-separated (``"ascend-a3,h200"``), the first being the primary one.
_Model = Literal["ascend-a3", "h200"]
_DriverOp = Literal["alloc", "free", "h2d", "d2h", "map", "unmap", "memset", "pin", "unpin"]
_Phase = Literal["bind", "orchestrate", "execute", "copy_back", "cleanup"]

_Scalar = int | float | bool
_Index = int | tuple[int, ...] | list[int]

class _NamedArgs(Protocol):
    """Named run arguments: ``(name, value)`` pairs from ``__simpler_args__()``."""

    def __simpler_args__(self) -> Iterable[tuple[str, Any]]: ...

# -- exceptions (re-exported by simpler.errors) --

class SimplerError(Exception):
    """Base class of every simpler error."""

class ArgumentError(SimplerError, ValueError):
    """A bad argument value: wrong count, bad index, a tensor larger than its buffer..."""

class ArgumentTypeError(SimplerError, TypeError):
    """An argument of the wrong kind: unsupported dtype, a float where an int is needed..."""

class GeometryError(ArgumentError):
    """A shape, stride, offset or size computation overflowed or is invalid for the tensor."""

class StateError(SimplerError, RuntimeError):
    """An operation invalid in the current state: use after free, release or close; a busy worker."""

class HazardError(SimplerError, RuntimeError):
    """An orchestrator access to bytes that a task submitted earlier in the run reads or writes."""

class NoHostViewError(SimplerError, LookupError):
    """An access to a device address that no host view of the run covers."""

    addr: int | None
    nbytes: int | None

class PlatformUnavailableError(SimplerError, RuntimeError):
    """The platform's vendor library is missing or failed to initialize."""

class CompileError(SimplerError, RuntimeError):
    """A kernel's device code did not compile, or the compiler (NVRTC) could not be found."""

class DeviceError(SimplerError, RuntimeError):
    """A driver call failed."""

    op: str | None
    code: int | None
    code_name: str | None
    call: str | None
    phase: str | None
    tensor: str | None
    addr: int | None
    nbytes: int | None

# -- functions --

def parse_svm(value: str | int) -> str | int:
    """Parses a sim ``svm`` option: ``"always"``, ``"never"`` or a minimum byte count."""

def check_scalar(value: object, what: str) -> None:
    """Raises ``ArgumentTypeError`` unless ``value`` is an int, float or bool."""

def check_name(name: object, what: str) -> str:
    """Raises ``ArgumentTypeError`` unless ``name`` is a non-empty string; returns it."""

def check_worker_options(platform: _Platform | None = None, **options: Any) -> None:
    """Raises what ``Worker(platform, **options)`` would for these options, without opening a
    device."""

def install_helpers(
    *,
    dtype_name: _Fn[..., Any],
    np_dtype: _Fn[..., Any],
    nvrtc_dirs: _Fn[..., Any],
    device_array: _Fn[..., Any],
    host_array: _Fn[..., Any],
    host_scalar: _Fn[..., Any],
) -> None:
    """Hands the native module its Python helpers (``simpler._arrays`` does, at import)."""

# -- handles --

@final
class ArgDirection:
    """Direction of a tensor argument in a signature."""

    IN: Final[ArgDirection]
    OUT: Final[ArgDirection]
    INOUT: Final[ArgDirection]
    def __new__(cls, value: Literal["IN", "OUT", "INOUT"]) -> ArgDirection: ...
    @property
    def name(self) -> Literal["IN", "OUT", "INOUT"]: ...
    @property
    def value(self) -> Literal["IN", "OUT", "INOUT"]: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

_Direction = ArgDirection | Literal["IN", "OUT", "INOUT"]

@final
class Buffer:
    """A device allocation made by ``Worker.malloc`` (or owned by a resident set)."""

    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def tensor(
        self,
        shape: Sequence[int],
        dtype: object,
        strides: Sequence[int] | None = None,
        offset: int | None = None,
    ) -> DeviceTensor: ...
    def free(self) -> None: ...
    def copy_to(self, arr: np.ndarray, offset: int | None = None) -> None: ...
    def copy_from(self, arr: np.ndarray, offset: int | None = None) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc_info: object) -> None: ...
    def __reduce__(self) -> NoReturn: ...

@final
class DeviceTensor:
    """A tensor over a device buffer; passed to ``Worker.run`` it is resident."""

    def __new__(
        cls,
        buffer: Buffer,
        shape: Sequence[int],
        dtype: object,
        strides: Sequence[int] | None = None,
        offset: int | None = None,
    ) -> DeviceTensor: ...
    @property
    def buffer(self) -> Buffer: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def contiguous(self) -> bool: ...
    @property
    def np_dtype(self) -> np.dtype[Any]: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __array__(self, dtype: object = None, copy: object = None) -> None: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: object = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object: ...
    def __reduce__(self) -> NoReturn: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class HostWindow:
    """Bytes of host memory exposed to numpy through ``__array_interface__``."""

    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    @property
    def layout(self) -> tuple[str, list[int], list[int]]:
        """(dtype name, shape, byte strides)."""
    @property
    def zero_copy(self) -> bool: ...

class Kernel:
    """A task body: ``fn(*arrays, *scalars)`` runs once per submitted task; ``cuda`` is its
    program for CUDA devices, launched natively there."""

    def __new__(
        cls,
        fn_: _Fn[..., Any],
        signature: Sequence[Any],
        name: str | None = None,
        *,
        cuda: CudaCode | None = None,
        device_arrays: bool | Literal["cupy", "torch"] | None = None,
        work: KernelWork | None = None,
    ) -> Self: ...
    @property
    def fn(self) -> _Fn[..., Any]: ...
    @property
    def name(self) -> str: ...
    @property
    def signature(self) -> tuple[tuple[ArgDirection, str | None], ...]: ...
    @property
    def cuda(self) -> CudaCode | None: ...
    @property
    def device_arrays(self) -> bool | str: ...
    @property
    def work(self) -> KernelWork | None: ...

_Precision = Literal["bf16", "fp16", "fp8", "int8", "fp32"]

@final
class KernelWork:
    """The work one task of a kernel does, for the sim cost models: bytes read and written
    (``None``: derived from the task's views), operations by precision, and the share of each
    model's device rates the kernel reaches (``efficiency``)."""

    def __new__(
        cls,
        *,
        bytes_read: int | None = None,
        bytes_written: int | None = None,
        flops: Mapping[_Precision, int] | None = None,
        efficiency: float | Mapping[str, float] | None = None,
    ) -> Self: ...
    @property
    def bytes_read(self) -> int | None: ...
    @property
    def bytes_written(self) -> int | None: ...
    @property
    def flops(self) -> dict[_Precision, int]: ...
    @property
    def efficiency(self) -> dict[str, float]: ...

@final
class Launch:
    """How one submit call of a device kernel launches: per-task grid and block, dynamic
    shared memory, and int64 constants appended to every task row."""

    def __new__(
        cls,
        grid: int | Sequence[int],
        block: int | Sequence[int] | None = None,
        shared_bytes: int = 0,
        consts: Sequence[int] | None = None,
    ) -> Launch: ...
    @property
    def grid(self) -> tuple[int, int, int]: ...
    @property
    def block(self) -> tuple[int, int, int]: ...
    @property
    def shared_bytes(self) -> int: ...
    @property
    def consts(self) -> tuple[int, ...]: ...
    def __eq__(self, value: object, /) -> bool: ...

@final
class CudaCode:
    """A kernel's program for CUDA devices: CUDA C++ source (compiled with NVRTC), or a PTX or
    cubin image; ``entry`` names its ``extern "C" __global__`` function."""

    def __new__(
        cls,
        source: str | None = None,
        *,
        entry: str,
        launch: Launch | _Fn[..., Launch],
        ptx: str | bytes | None = None,
        cubin: bytes | None = None,
        options: Sequence[str] | None = None,
        scalars: Sequence[Literal["int64", "uint64", "float64"]] | None = None,
        contiguous: bool = False,
        arch_specific: bool = False,
    ) -> CudaCode: ...
    @property
    def entry(self) -> str: ...
    @property
    def source(self) -> str | None: ...
    @property
    def image(self) -> bytes | None: ...
    @property
    def options(self) -> list[str]: ...
    @property
    def contiguous(self) -> bool: ...
    @property
    def arch_specific(self) -> bool: ...
    @property
    def scalars(self) -> list[str] | None: ...
    @property
    def launch(self) -> Launch | _Fn[..., Launch]: ...
    def launch_for(self, shapes: Sequence[Sequence[int]]) -> Launch: ...

@final
class DeviceArray:
    """One tensor of a task as device memory (CUDA Array Interface and DLPack), for kernels
    declared with ``device_arrays``; valid only during the kernel's call."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def stream(self) -> int | None: ...
    @property
    def writable(self) -> bool: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...

# -- the dicts of a worker's observability and of the vendor sessions --

def nvrtc_info(
    driver: tuple[int, int] | None = None, capability: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The NVRTC the runtime compiles with for that driver and device, its target, and every
    NVRTC found (``path``, ``version``, ``usable``, ``why``, ``target``)."""

def compile_cuda(
    source: str,
    capability: tuple[int, int],
    *,
    options: Sequence[str] | None = None,
    name: str = "source.cu",
    driver: tuple[int, int] | None = None,
    arch_specific: bool = False,
) -> dict[str, Any]:
    """Compiles CUDA C++ for a device of that compute capability with the NVRTC a worker would
    use, without a device; the log, and ptxas' registers, stack and spills per entry."""

def device_code_stats() -> dict[str, int]:
    """``compiles`` and ``cache_hits`` of device-code source in this process."""

def release_sessions() -> _ReleaseSummary:
    """Gives back this process's vendor sessions now (closing the ascend / cuda workers still
    open first): ``{"sessions": n, "closed_workers": k, "errors": [...]}``. A worker with a live
    export (another library may use its memory) stays open, with its session, and ``errors``
    names it."""

def session_stats() -> _SessionStats:
    """``opened`` (vendor sessions this process opened so far) and ``held`` (held now)."""

class Callable:
    """A device program: an orchestration function over tensor arguments."""

    def __new__(
        cls, orchestration: _Fn[..., Any], signature: Sequence[Any], name: str | None = None
    ) -> Self: ...
    @property
    def orchestration(self) -> _Fn[..., Any]: ...
    @property
    def name(self) -> str: ...
    @property
    def signature(self) -> tuple[tuple[ArgDirection, str | None], ...]: ...
    def check_tensor_count(self, n: int, who: str) -> None: ...

@final
class BuiltArgs:
    """Arguments ready for ``Worker.run``: values in order, with names."""

    def __new__(cls, pairs: Iterable[tuple[str, Any]]) -> BuiltArgs: ...
    @property
    def names(self) -> list[str]: ...
    def __simpler_args__(self) -> list[tuple[str, Any]]: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: int | slice, /) -> Any: ...

@final
class PendingRun:
    """A run left pending by ``Worker.run(..., wait=False)``; ``wait()`` returns its report."""

    def wait(self) -> RunReport: ...
    @property
    def pending(self) -> bool: ...

@final
class RunReport:
    """What one run did: ``phases`` (nanoseconds per phase) and ``counters``."""

    @property
    def phases(self) -> dict[_Phase, int]: ...
    @property
    def counters(self) -> dict[str, int]: ...
    @property
    def ok(self) -> bool: ...
    @property
    def callable(self) -> str: ...
    @property
    def modeled(self) -> dict[_Phase, int] | None: ...
    @property
    def dispatch_ns(self) -> int: ...
    @property
    def modeled_dispatch_ns(self) -> int | None: ...
    @property
    def modeled_round_ns(self) -> int | None: ...
    @property
    def modeled_by(self) -> dict[str, dict[_Phase, int]]: ...
    @property
    def kernels(self) -> list[dict[str, Any]]: ...
    def to_dict(self) -> dict[str, Any]: ...
    def __reduce__(self) -> tuple[_Fn[[str, bytes], RunReport], tuple[str, bytes]]: ...
    @staticmethod
    def _restore(callable: str, state: bytes) -> RunReport: ...

# -- a run --

@final
class RunTensor:
    """A tensor argument (or a view of one) of the run in progress."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def direction(self) -> ArgDirection: ...
    @property
    def arg_index(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def view(self, shape: Sequence[int], offsets: Sequence[int]) -> RunTensor: ...
    def views(self, shape: Sequence[int], offsets: Any) -> RunViews: ...

@final
class RunViews:
    """Many views of one run tensor: one per task of a ``submit_many``."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    def __len__(self) -> int: ...

@final
class Orchestrator:
    """The handle an orchestration function receives."""

    def get_tensor_data(self, t: RunTensor, idx: _Index) -> _Scalar: ...
    def set_tensor_data(self, t: RunTensor, idx: _Index, value: _Scalar) -> None: ...
    def read_tensor(self, t: RunTensor) -> np.ndarray: ...
    def scratch(self, shape: Sequence[int], dtype: object, name: str | None = None) -> RunTensor: ...
    def submit(self, kernel: Kernel, *args: Any) -> int: ...
    def submit_many(self, kernel: Kernel, *args: Any, count: int | None = None) -> int: ...

# -- the worker and its resident sets --

class Worker:
    """The native worker (device, allocations, view cache, run in progress)."""

    def __new__(
        cls,
        platform: _Platform | None = None,
        *,
        staging: _StagingMode | None = None,
        svm: Literal["always", "never"] | str | int | None = None,
        poison: bool | None = None,
        capacity: int | None = None,
        device_id: int | None = None,
        malloc_policy: Literal["huge_first", "huge_only", "normal_only"] | None = None,
        reuse_addresses: bool | None = None,
        model: _Model | str | None = None,
        view_policy: _ViewPolicy | None = None,
    ) -> Self: ...
    @property
    def platform(self) -> _Platform: ...
    @property
    def device_id(self) -> int: ...
    @property
    def staging(self) -> _StagingMode: ...
    @property
    def view_policy(self) -> _ViewPolicy: ...
    @property
    def model(self) -> _Model | None: ...
    @property
    def device_timing(self) -> bool: ...
    @device_timing.setter
    def device_timing(self, on: bool) -> None: ...
    @property
    def replay(self) -> _Replay: ...
    @replay.setter
    def replay(self, mode: _Replay) -> None: ...
    @property
    def plans_kept(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> _CloseSummary | None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc_info: object) -> None: ...
    def __reduce__(self) -> NoReturn: ...
    def malloc(self, nbytes: int) -> Buffer: ...
    def free(self, buf: Buffer | DeviceTensor) -> None: ...
    def copy_to(self, buf: Buffer | DeviceTensor, arr: np.ndarray, offset: int | None = None) -> None: ...
    def copy_from(self, arr: np.ndarray, buf: Buffer | DeviceTensor, offset: int | None = None) -> None: ...
    def host_view_info(self, buf: Buffer | DeviceTensor) -> _ViewKind | None: ...
    def wait_stream(self, stream: object) -> None: ...
    def trim_staging(self) -> None: ...
    def stats(self) -> _WorkerStats: ...
    def debug_state(self) -> _DebugState: ...
    def call_log(self) -> list[tuple[_DriverOp, int, int, int, str]]: ...
    def inject_fault(self, op: _DriverOp, nth: int | None = None, code: int | None = None) -> None: ...
    def clear_faults(self) -> None: ...
    @overload
    def run(
        self, callable: Callable, args: Sequence[Any] | _NamedArgs, wait: Literal[True] = True
    ) -> RunReport: ...
    @overload
    def run(
        self, callable: Callable, args: Sequence[Any] | _NamedArgs, wait: Literal[False]
    ) -> PendingRun: ...
    @overload
    def run(
        self, callable: Callable, args: Sequence[Any] | _NamedArgs, wait: bool
    ) -> RunReport | PendingRun: ...

class ResidentSet:
    """Case-owned device buffers for resident tensor arguments."""

    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __new__(cls, worker: Worker) -> Self: ...
    @property
    def released(self) -> bool: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def resident_names(self) -> list[str]: ...
    def direction(self, name: str) -> ArgDirection: ...
    def __getitem__(self, name: str, /) -> Any: ...
    def __contains__(self, name: object, /) -> bool: ...
    def __len__(self) -> int: ...
    def add(
        self,
        name: str,
        host: np.ndarray,
        direction: _Direction | None = None,
        host_view: _HostView | None = None,
        eager: bool | None = None,
    ) -> Any: ...
    def build_args(
        self, expected_count: int | None = None, scalars: Iterable[Any] | None = None
    ) -> BuiltArgs: ...
    def bind(self, builder: _NamedArgs) -> BuiltArgs: ...
    def copy_back(self, builder: Any, names: str | Iterable[str] | None = None) -> None: ...
    def release(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc_info: object) -> None: ...
