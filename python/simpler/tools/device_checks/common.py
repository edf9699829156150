"""What the device checks share: the :class:`Context` every check gets, the skips that say why a
check does not apply, small helpers, the device check's own CUDA entry, the model comparison of
the bench checks, and what the run line and the figure lines record about the machine.

Nothing here imports pytest, the workloads, the bench, the benchmarks or the reports at import
time (the entry point, :mod:`simpler.tools.device_check`, imports this module before its
preflight); the skips import pytest when they run, inside a check.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from collections.abc import Callable as Fn
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ..._arrays import np_dtype
from ...testing import fake_cuda
from ...worker import Worker

if TYPE_CHECKING:
    from ..._core import _Platform

__all__ = [
    "MODEL_ROUNDS",
    "NOTHING_ENTRY",
    "NOTHING_SOURCE",
    "PLATFORM_MODEL",
    "Context",
    "Figures",
    "device_timing",
    "driver_info",
    "fake_first",
    "figure_context",
    "gb_per_s",
    "install_if_fake",
    "model_error",
    "need_bfloat16",
    "need_cuda",
    "pattern",
    "register_fake_impls",
    "run_threads",
    "skip",
]

#: What a check records: figure name -> value (JSON; anything else is recorded as its ``str``).
Figures = dict[str, Any]


class Context:
    """What every check gets (the ``ctx`` fixture): the platform, ``--quick``, whether the driver
    is the fake, the output folder, and the preflight's facts (:func:`simpler.tools.preflight.run`)."""

    def __init__(
        self, platform: _Platform, quick: bool, fake: bool, out: Path, facts: dict[str, Any] | None = None
    ) -> None:
        self.platform = platform
        self.quick = quick
        self.fake = fake
        self.out = out
        self.facts = facts or {}

    @property
    def cuda(self) -> bool:
        """Whether the platform is cuda."""
        return self.platform == "cuda"

    def worker(self, **options: Any) -> Worker:
        """A new worker on the platform."""
        return Worker(self.platform, **options)


def skip(reason: str) -> NoReturn:
    """Ends the check as skipped, with ``reason`` (``pytest.skip``)."""
    import pytest

    pytest.skip(reason)


def need_cuda(ctx: Context) -> None:
    """Skips a check that only means something on cuda."""
    if not ctx.cuda:
        skip(f"a cuda check (platform {ctx.platform})")


def need_bfloat16() -> None:
    """Skips a check whose tensors are bfloat16 when ``ml_dtypes`` is missing, with the error
    that names the fix."""
    try:
        np_dtype("bfloat16")
    except ImportError as e:
        skip(
            f"ml_dtypes is missing and bfloat16 needs it: pip install ml-dtypes, or carry its wheel "
            f"here with make device-wheels ({e})"
        )


def gb_per_s(nbytes: float, ns: float) -> float:
    """``nbytes`` moved in ``ns`` nanoseconds, in GB/s (3 decimals; NaN for no time)."""
    return round(nbytes / ns, 3) if ns > 0 else float("nan")  # bytes per ns == GB/s


def pattern(nbytes: int, seed: int) -> np.ndarray:
    """``nbytes`` (a multiple of 8) of distinct-looking bytes, made fast."""
    words = np.arange(nbytes // 8, dtype=np.uint64)
    words *= np.uint64(0x9E3779B97F4A7C15)
    words ^= np.uint64((seed * 0x5851F42D4C957F2D + 1) & 0xFFFF_FFFF_FFFF_FFFF)
    return words.view(np.uint8)


def run_threads(n: int, body: Fn[[int], None], barrier: threading.Barrier | None = None) -> None:
    """Runs ``body(k)`` on ``n`` threads; raises what they raised, one line each."""
    errors: list[str] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        try:
            body(k)
        except BaseException as e:
            with lock:
                errors.append(f"thread {k}: {type(e).__name__}: {e}")
            if barrier is not None:
                barrier.abort()

    ts = [threading.Thread(target=run, args=(k,), name=f"device-check-{k}") for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise AssertionError("; ".join(sorted(errors)))


@contextmanager
def device_timing() -> Iterator[None]:
    """``SIMPLER_DEVICE_TIMING=1`` inside (the device's part of execute, timed with events around
    each batch of launches), as it was after."""
    before = os.environ.get("SIMPLER_DEVICE_TIMING")
    os.environ["SIMPLER_DEVICE_TIMING"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SIMPLER_DEVICE_TIMING", None)
        else:
            os.environ["SIMPLER_DEVICE_TIMING"] = before


#: A device entry that writes nothing (the poison check's device kernel).
NOTHING_ENTRY = "simpler_check_nothing"
NOTHING_SOURCE = """
/* simpler device-check: writes nothing (simpler.tools.device_check) */
extern "C" __global__ void simpler_check_nothing(const unsigned long long* rows) {}
"""


def register_fake_impls() -> None:
    """The fake libcuda's host implementation of :data:`NOTHING_ENTRY` (it writes nothing)."""
    if NOTHING_ENTRY not in fake_cuda.IMPLS:
        fake_cuda.host_impl(NOTHING_ENTRY)(lambda launch: None)


def install_if_fake() -> bool:
    """On the fake libcuda: the shipped workloads' host kernels, registered (they import the
    workloads, which load after the preflight). Returns whether the driver is the fake."""
    from ...testing import fake_kernels

    return fake_kernels.install_if_fake()


def fake_first(platform: str) -> Fn[[], object] | None:
    """What runs before the preflight's NVRTC choice: on cuda, the fake libcuda's set-up (its
    host kernels, and NVRTC pointed at the fake's own), so the choice printed is the one the
    checks get; nothing on a real driver."""
    return install_if_fake if platform == "cuda" else None


# The cost model that stands for each platform's device (the driver's `CostModel::for_platform`):
# the device's measured phases are compared with this model only.
PLATFORM_MODEL = {"cuda": "h200", "ascend": "ascend-a3"}

# Rounds of the priced sim run: its modeled phases do not vary from one warm round to the next,
# so one cold and one warm round say all (they run while the device is held).
MODEL_ROUNDS = 2


def model_error(
    ctx: Context, case: str, measured: list[dict[str, Any]], workload: str = "paged_attention"
) -> Figures:
    """The model's error: the same case priced on sim (golden skipped: the device run checked
    it) under the model of the device's platform (:data:`PLATFORM_MODEL`), printed beside the
    device's measured phases with the ratio measured / modeled; the ratios become figures
    ``model.<arm>.<row>.<model>``. Nothing on a platform without a model (sim)."""
    from ..bench import BenchOptions, bench_records
    from ..report import format_model_comparison, model_comparison

    model = PLATFORM_MODEL.get(ctx.platform)
    if model is None:
        return {}
    opts = BenchOptions(
        workload=workload,
        rounds=MODEL_ROUNDS,
        platform="sim",
        cases=[case],
        skip_golden=True,
        worker_options={"model": model},
    )
    modeled, failures = bench_records(opts, progress=False)
    if failures:
        raise AssertionError("; ".join(failures))
    print(format_model_comparison(measured, modeled, measured_on=ctx.platform))
    return {
        f"model.{r['arm']}.{r['row']}.{m}": round(ratio, 4)
        for r in model_comparison(measured, modeled)
        for m, ratio in r["ratio"].items()
        if ratio is not None
    }


def driver_info(platform: str) -> dict[str, Any]:
    """What the run line records about the driver (best effort)."""
    info: dict[str, Any] = {}
    for mod in ("torch", "cupy", "triton", "pytest"):
        info[f"has_{mod}"] = importlib.util.find_spec(mod) is not None
    if platform == "cuda":
        from ..._cuda import nvrtc_dirs

        info["SIMPLER_CUDA_LIB"] = os.environ.get("SIMPLER_CUDA_LIB")
        info["SIMPLER_NVRTC_LIB"] = os.environ.get("SIMPLER_NVRTC_LIB")
        info["CUDA_HOME"] = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        info["nvrtc_wheel_dirs"] = nvrtc_dirs()
        try:
            lib = ctypes.CDLL(os.environ.get("SIMPLER_CUDA_LIB") or "libcuda.so.1")
            v = ctypes.c_int(0)
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
                info["cuda_driver_version"] = v.value
        except (OSError, AttributeError):
            pass
    return info


def figure_context(facts: dict[str, Any]) -> dict[str, Any]:
    """What every figure line records of where it was measured: the device (name, compute
    capability, clocks where readable), the driver and the NVRTC, from the preflight's facts."""
    device = facts.get("device") or {}
    driver = facts.get("driver") or {}
    nvrtc = facts.get("nvrtc") or {}
    return {
        "device": device.get("name"),
        "capability": device.get("capability"),
        "clock_khz": device.get("clock_khz"),
        "memory_clock_khz": device.get("memory_clock_khz"),
        "driver_version": driver.get("version"),
        "nvrtc": (
            f"{nvrtc['version'][0]}.{nvrtc['version'][1]} {nvrtc.get('path')}"
            if nvrtc.get("version")
            else None
        ),
    }
