"""simpler: how the tensor arguments of a repeatedly dispatched device program reach the device.

Three capabilities in one library:

1. declared residency per argument (``TensorArg(name, value, child_memory=True)``,
   :class:`ResidentTaskArgs`): a case-owned device buffer, no per-round malloc/copy/free;
2. a cheap, observable staging path for host-staged arguments (a retained staging arena);
3. host views of device-resident tensors for host-side orchestration (mapping or mirror,
   established lazily and cached for the allocation's life).

The package's parts: the library surface (this module: workers, buffers, tensors, resident
sets, callables; :mod:`simpler.errors`), the testing harness (:mod:`simpler.testing`: scene
tests, the standalone runner, the pytest plugin; its main names are re-exported here and
loaded when first read, as are the device groups of :mod:`simpler.group`), the tools
(:mod:`simpler.tools`: the ``simpler`` command, bench and report) and the workloads shipped with
it (:mod:`simpler.workloads`). See ``docs/`` and the README for a tour.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import TYPE_CHECKING, Any

try:
    #: The installed version (of the ``simpler-residency`` distribution).
    __version__ = _dist_version("simpler-residency")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

try:  # everything below needs numpy: say so in one line, not from deep inside a traceback
    import numpy as _numpy  # noqa: F401
except ImportError as _e:
    import sys as _sys

    _msg = (
        f"simpler needs numpy (>= 1.26), which {_sys.executable} cannot import ({_e}): install it "
        "with pip install 'numpy>=1.26'"
    )
    _argv = list(getattr(_sys, "orig_argv", ()))
    _main = _argv[_argv.index("-m") + 1] if "-m" in _argv[:-1] else None  # python -m <_main>
    if _main == "simpler.tools.device_check":
        # The device check's preflight (simpler.tools.preflight): one line, exit status 2.
        print(f"device-check: preflight: {_msg}", file=_sys.stderr)
        raise SystemExit(2) from None
    raise ImportError(_msg) from _e

from . import _arrays  # noqa: F401  (hands the native module its numpy helpers, once)
from ._arrays import SUPPORTED_DTYPES, as_numpy, np_dtype
from .args import BuiltArgs, ResidentTaskArgs, Scalar, TaskArgsBuilder, TensorArg
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CompileError,
    DeviceError,
    GeometryError,
    HazardError,
    NoHostViewError,
    PlatformUnavailableError,
    SimplerError,
    StateError,
)
from .worker import (
    ArgDirection,
    Buffer,
    Callable,
    CudaCode,
    DeviceArray,
    DeviceTensor,
    Kernel,
    KernelWork,
    Launch,
    Orchestrator,
    PendingRun,
    RunReport,
    RunTensor,
    Worker,
    compile_cuda,
    device_code_stats,
    nvrtc_info,
    release_sessions,
    session_stats,
)

IN = ArgDirection.IN
OUT = ArgDirection.OUT
INOUT = ArgDirection.INOUT

#: Names of the testing harness and of device groups, re-exported here but loaded when first
#: read: ``import simpler`` loads the library, not the harness nor the process groups.
_LAZY = {
    "CaseRun": "testing",
    "SceneTestCase": "testing",
    "main": "testing",
    "run_case": "testing",
    "scene_test": "testing",
    "DeviceGroup": "group",
    "DeviceGroupError": "group",
    "GroupResidentSet": "group",
}

if TYPE_CHECKING:
    from .group import DeviceGroup, DeviceGroupError, GroupResidentSet
    from .testing import CaseRun, SceneTestCase, main, run_case, scene_test


def __getattr__(name: str) -> Any:
    """The harness's and the groups' names (:data:`_LAZY`), imported when first read."""
    sub = _LAZY.get(name)
    if sub is None:
        raise AttributeError(f"module 'simpler' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{sub}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "IN",
    "INOUT",
    "OUT",
    "SUPPORTED_DTYPES",
    "ArgDirection",
    "ArgumentError",
    "ArgumentTypeError",
    "Buffer",
    "BuiltArgs",
    "Callable",
    "CaseRun",
    "CompileError",
    "CudaCode",
    "DeviceArray",
    "DeviceError",
    "DeviceGroup",
    "DeviceGroupError",
    "DeviceTensor",
    "GeometryError",
    "GroupResidentSet",
    "HazardError",
    "Kernel",
    "KernelWork",
    "Launch",
    "NoHostViewError",
    "Orchestrator",
    "PendingRun",
    "PlatformUnavailableError",
    "ResidentTaskArgs",
    "RunReport",
    "RunTensor",
    "Scalar",
    "SceneTestCase",
    "SimplerError",
    "StateError",
    "TaskArgsBuilder",
    "TensorArg",
    "Worker",
    "__version__",
    "as_numpy",
    "compile_cuda",
    "device_code_stats",
    "main",
    "np_dtype",
    "nvrtc_info",
    "release_sessions",
    "run_case",
    "scene_test",
    "session_stats",
]
