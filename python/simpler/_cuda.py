"""CUDA plumbing written in Python, handed to the native module at import (``_arrays.py``).

* Where the NVRTC library of the ``nvidia-cuda-nvrtc`` wheels is: nothing puts site-packages on
  the dynamic loader's path, so the runtime is told the folders explicitly (it also reads
  ``SIMPLER_NVRTC_LIB``, ``CUDA_HOME`` / ``CUDA_PATH`` and the loader's own path).
* The CuPy array or torch tensor over a :class:`simpler.DeviceArray`, for kernels declared with
  ``device_arrays="cupy"`` / ``"torch"`` (imported only then: neither is a dependency)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from . import _core


@functools.cache
def nvrtc_dirs() -> list[str]:
    """The folders of ``sys.path`` entries that hold an NVRTC wheel's library, CUDA 13 first."""
    found: list[str] = []
    for sub in _core.NVRTC_WHEEL_SUBDIRS:  # the runtime's list: CUDA 13, then CUDA 12 wheels
        for entry in sys.path:
            d = Path(entry or ".") / sub
            if d.is_dir() and any(d.glob("libnvrtc.so*")) and str(d) not in found:
                found.append(str(d))
    return found


def device_array(kind: str, arr: Any) -> Any:
    """``arr`` (a :class:`simpler.DeviceArray`) as a CuPy array (``kind == "cupy"``) or a torch
    tensor (``"torch"``), without a copy, ordered after the worker's stream."""
    if kind == "cupy":
        import cupy

        return cupy.asarray(arr)
    import torch

    return torch.from_dlpack(arr)
