"""The device check's preflight: what this interpreter and machine offer, before any check runs.

``python -m simpler.tools.device_check --preflight [--platform cuda]`` prints it and exits; every
normal run of the device check prints it first and records the same facts in its ``kind: "run"``
JSON line (key ``preflight``). One line each, ``preflight: <what>: <found>``:

* ``python`` — the interpreter: its path, implementation and version, machine, glibc;
* ``simpler`` — the version and the folder it was imported from;
* ``numpy``, ``pytest``, ``ml_dtypes``, ``torch``, ``cupy``, ``triton`` — found (with the
  version of the distribution that provides it) or missing; found means importable, not
  imported: nothing of theirs is loaded here;
* ``nvidia-cuda-nvrtc``, ``nvidia-cuda-nvrtc-cu12`` — the NVRTC wheels (CUDA 13, CUDA 12): the
  version and where their ``libnvrtc`` files are;
* on cuda, ``driver`` — the CUDA driver library (the one the package opens: ``SIMPLER_CUDA_LIB``,
  else ``libcuda.so.1`` from the loader's path), the file it was loaded from and
  ``cuDriverGetVersion``; ``device N`` — ``cuDeviceGetName``, compute capability, SM count,
  memory (``cuDeviceTotalMem_v2``), clock and memory clock, each ``unreadable`` where the driver
  does not answer; ``nvrtc`` — the NVRTC the runtime would compile with for that driver and
  device, and the target it would compile for (``simpler._core.nvrtc_info``), with one
  ``nvrtc candidate`` line per library it considered.

What is *required* and missing stops the preflight with :class:`PreflightError`, whose message is
one line saying what is missing and how to get it (the device check prints it and exits with
status 2): numpy, pytest (the checks are pytest tests); on cuda the driver library, a ``cuInit``
that fails. A driver that sees no
device raises :class:`NoDevice` (the device check then says so and exits 0, as on a machine
without a driver).
``ml_dtypes`` missing is not fatal: the checks that need bfloat16 are skipped with that reason.

The driver is read with ``ctypes`` from the library itself (``cuInit(0)`` first, then
``cuDeviceGet(&dev, ordinal)`` and the ``cuDevice*`` queries of the public ``cuda.h``). Only the
standard library is imported here, and ``simpler._core`` for the NVRTC choice.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import platform as _platform
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "NVRTC_WHEELS",
    "PACKAGES",
    "NoDevice",
    "PreflightError",
    "cuda_driver",
    "driver_version_tuple",
    "interpreter",
    "nvrtc_choice",
    "nvrtc_wheels",
    "packages",
    "run",
]

#: The packages the preflight reports, by import name: numpy and pytest (which runs the checks)
#: are required, the others optional (``ml_dtypes`` for bfloat16, torch for the export check,
#: CuPy and triton for kernels that use them).
PACKAGES = ("numpy", "pytest", "ml_dtypes", "torch", "cupy", "triton")

#: The NVRTC wheels (CUDA 13, CUDA 12) the runtime searches ``sys.path`` for.
NVRTC_WHEELS = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12")

#: How to get each package on a machine that has a registry (and how to carry it to one that
#: does not), for the lines that say it is missing.
_HOW_TO_GET = {
    "numpy": "pip install 'numpy>=1.26'",
    "pytest": "pip install pytest, or carry the wheels: make device-wheels",
    "ml_dtypes": "pip install ml-dtypes, or carry the wheel: make device-wheels",
}

# ``CUdevice_attribute`` values of the public ``cuda.h``.
#: ``CU_DEVICE_ATTRIBUTE_CLOCK_RATE``: the peak clock, kHz.
ATTR_CLOCK_RATE = 13
#: ``CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT``: the SM count.
ATTR_MULTIPROCESSOR_COUNT = 16
#: ``CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE``: the peak memory clock, kHz.
ATTR_MEMORY_CLOCK_RATE = 36
#: ``CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR``.
ATTR_COMPUTE_CAPABILITY_MAJOR = 75
#: ``CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR``.
ATTR_COMPUTE_CAPABILITY_MINOR = 76

# ``CUresult`` codes the preflight explains (``cuda.h``).
#: ``cuInit`` of the CUDA toolkit's stub library, not the driver.
CUDA_ERROR_STUB_LIBRARY = 34
#: ``cuInit`` found no CUDA device.
CUDA_ERROR_NO_DEVICE = 100


class PreflightError(Exception):
    """Something the device check requires is missing; the message is one line that says what
    and how to get it."""


class NoDevice(PreflightError):
    """The driver is there but sees no device (``CUDA_ERROR_NO_DEVICE``, or a device count of 0):
    a machine without a GPU for this process, which the device check skips (exit status 0)."""


#: Where the preflight's lines go: ``emit(what, found)`` (default: ``preflight: what: found`` on
#: stdout).
Emit = Callable[[str, str], None]


def _print(what: str, found: str) -> None:
    print(f"preflight: {what}: {found}", flush=True)


# -- the interpreter and the packages ---------------------------------------------------------------


def interpreter() -> dict[str, Any]:
    """This interpreter: path, implementation, version, machine and C library."""
    libc, libc_version = _platform.libc_ver()
    return {
        "executable": sys.executable,
        "implementation": _platform.python_implementation(),
        "version": _platform.python_version(),
        "machine": _platform.machine(),
        "libc": f"{libc} {libc_version}".strip() or None,
    }


def _importable(name: str) -> bool:
    """Whether ``name`` would import (its spec is found; nothing is imported)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _dists_of(name: str) -> list[str]:
    """The distributions that provide the top-level module ``name`` (e.g. ``cupy-cuda12x``)."""
    try:
        return sorted(set(importlib.metadata.packages_distributions().get(name, [])))
    except Exception:  # a broken metadata folder elsewhere on sys.path: report no version
        return []


def packages() -> dict[str, dict[str, Any]]:
    """Each of :data:`PACKAGES`: ``found`` (importable), ``version`` and ``dist`` (the
    distribution that provides it, from its metadata; ``None`` when it has none)."""
    out: dict[str, dict[str, Any]] = {}
    for name in PACKAGES:
        rec: dict[str, Any] = {"found": _importable(name), "version": None, "dist": None}
        if rec["found"]:
            for dist in _dists_of(name):
                try:
                    rec["version"], rec["dist"] = importlib.metadata.version(dist), dist
                    break
                except importlib.metadata.PackageNotFoundError:
                    continue
        out[name] = rec
    return out


def nvrtc_wheels() -> dict[str, dict[str, Any] | None]:
    """Each of :data:`NVRTC_WHEELS`: ``None`` when not installed, else its ``version`` and
    ``libs``, the paths of its ``libnvrtc`` files."""
    out: dict[str, dict[str, Any] | None] = {}
    for name in NVRTC_WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
            continue
        libs = sorted(
            str(Path(str(dist.locate_file(f))).resolve())
            for f in dist.files or ()
            if f.name.startswith("libnvrtc")
        )
        out[name] = {"version": dist.version, "libs": libs}
    return out


def _simpler() -> dict[str, Any]:
    """The simpler being run: its version and folder (it is imported already: this module is
    part of it)."""
    try:
        version = importlib.metadata.version("simpler-residency")
    except importlib.metadata.PackageNotFoundError:
        version = "0+unknown"
    spec = importlib.util.find_spec("simpler")
    origin = spec.origin if spec is not None else None
    return {"version": version, "path": str(Path(origin).parent) if origin else None}


# -- the CUDA driver -------------------------------------------------------------------------------


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    """``cuGetErrorName(code)``, or the bare number where the driver has no name for it."""
    try:
        fn = lib.cuGetErrorName
    except AttributeError:
        return str(code)
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    fn.restype = ctypes.c_int
    name = ctypes.c_char_p()
    if fn(code, ctypes.byref(name)) == 0 and name.value:
        return f"{code} {name.value.decode(errors='replace')}"
    return str(code)


def _loaded_from(lib: ctypes.CDLL, symbol: str) -> str | None:
    """The file ``lib`` was loaded from (``dladdr`` of one of its symbols), resolved."""

    class DlInfo(ctypes.Structure):
        _fields_ = [
            ("dli_fname", ctypes.c_char_p),
            ("dli_fbase", ctypes.c_void_p),
            ("dli_sname", ctypes.c_char_p),
            ("dli_saddr", ctypes.c_void_p),
        ]

    for libc in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(libc).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        dladdr.restype = ctypes.c_int
        info = DlInfo()
        addr = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p)
        if dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode(errors="replace"))
    return None


def _kernel_module() -> str | None:
    """The NVIDIA kernel module's version (``/proc/driver/nvidia/version``), where readable."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d[\w.]*)", text)
    return m.group(1) if m else None


def _open_driver() -> tuple[ctypes.CDLL, str]:
    """The CUDA driver library the package opens: ``SIMPLER_CUDA_LIB``, else ``libcuda.so.1``
    (then ``libcuda.so``) from the loader's path."""
    env = os.environ.get("SIMPLER_CUDA_LIB")
    names = [env] if env else ["libcuda.so.1", "libcuda.so"]
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            errors.append(str(e))
    if env:
        raise PreflightError(
            f"no CUDA driver library: SIMPLER_CUDA_LIB={env} does not load ({errors[0]}); point "
            "SIMPLER_CUDA_LIB at the NVIDIA driver's libcuda.so.1, or unset it to use the loader's"
        )
    raise PreflightError(
        f"no CUDA driver library: libcuda.so.1 is not on the loader's search path ({errors[0]}); "
        "install the NVIDIA driver, or set SIMPLER_CUDA_LIB to the path of its libcuda.so.1"
    )


def _int_query(lib: ctypes.CDLL, symbol: str, *args: Any) -> tuple[int | None, str | None]:
    """``symbol(&int, *args)``: (the value, None), or (None, why it is unreadable)."""
    try:
        fn = getattr(lib, symbol)
    except AttributeError:
        return None, f"the library has no {symbol}"
    value = ctypes.c_int(0)
    rc = fn(ctypes.byref(value), *args)
    return (value.value, None) if rc == 0 else (None, f"{symbol}: {_error_name(lib, rc)}")


def cuda_driver(ordinal: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """The CUDA driver and device ``ordinal``, read through the library with ``ctypes``: a
    ``driver`` dict (``requested``, ``library``, ``version``, ``fake``, ``kernel_module``) and a
    ``device`` dict (``ordinal``, ``count``, ``name``, ``capability``, ``sm_count``,
    ``memory_bytes``, ``clock_khz``, ``memory_clock_khz``; ``None`` where unreadable, the reason
    in ``unreadable``). :class:`PreflightError` when the library does not load, ``cuInit``
    fails or there is no such device."""
    lib, requested = _open_driver()
    driver: dict[str, Any] = {
        "requested": requested,
        "library": _loaded_from(lib, "cuInit") if hasattr(lib, "cuInit") else None,
        "version": None,
        "fake": hasattr(lib, "fake_cuda_register_kernel"),
        "kernel_module": _kernel_module(),
    }
    where = driver["library"] or requested
    lacks = [f for f in ("cuInit", "cuDeviceGet") if not hasattr(lib, f)]
    if lacks:
        raise PreflightError(
            f"{where} is not a CUDA driver library (it has no {', '.join(lacks)}); point "
            "SIMPLER_CUDA_LIB at the NVIDIA driver's libcuda.so.1"
        )
    driver["version"], _ = _int_query(lib, "cuDriverGetVersion")
    lib.cuInit.argtypes = [ctypes.c_uint]
    lib.cuInit.restype = ctypes.c_int
    rc = lib.cuInit(0)
    if rc != 0:
        fix = {
            CUDA_ERROR_NO_DEVICE: "no GPU is visible to this process: check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES",
            CUDA_ERROR_STUB_LIBRARY: "this is the CUDA toolkit's stub library, not the driver: point "
            "SIMPLER_CUDA_LIB at the NVIDIA driver's libcuda.so.1",
        }.get(rc, "the driver did not initialize: check nvidia-smi (a missing or mismatched kernel module?)")
        error = NoDevice if rc == CUDA_ERROR_NO_DEVICE else PreflightError
        raise error(f"cuInit(0) failed with {_error_name(lib, rc)} on {where}: {fix}")
    device: dict[str, Any] = {"ordinal": ordinal, "unreadable": {}}
    device["count"], _ = _int_query(lib, "cuDeviceGetCount")
    dev = ctypes.c_int(0)
    lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    lib.cuDeviceGet.restype = ctypes.c_int
    rc = lib.cuDeviceGet(ctypes.byref(dev), ordinal)
    if rc != 0 or device["count"] == 0:
        seen = "" if device["count"] is None else f" ({device['count']} visible)"
        why = f"cuDeviceGet({ordinal}) failed with {_error_name(lib, rc)}" if rc else "cuDeviceGetCount is 0"
        error = NoDevice if device["count"] == 0 or rc == CUDA_ERROR_NO_DEVICE else PreflightError
        raise error(
            f"no CUDA device {ordinal}{seen}: {why} on {where}; check nvidia-smi and CUDA_VISIBLE_DEVICES"
        )

    def unreadable(key: str, why: str | None) -> None:
        if why is not None:
            device["unreadable"][key] = why

    name = ctypes.create_string_buffer(256)
    try:
        rc = lib.cuDeviceGetName(name, ctypes.c_int(len(name)), dev)
        device["name"] = name.value.decode(errors="replace") if rc == 0 else None
        unreadable("name", None if rc == 0 else f"cuDeviceGetName: {_error_name(lib, rc)}")
    except AttributeError:
        device["name"] = None
        unreadable("name", "the library has no cuDeviceGetName")
    major, why_major = _int_query(lib, "cuDeviceGetAttribute", ATTR_COMPUTE_CAPABILITY_MAJOR, dev)
    minor, why_minor = _int_query(lib, "cuDeviceGetAttribute", ATTR_COMPUTE_CAPABILITY_MINOR, dev)
    device["capability"] = [major, minor] if major is not None and minor is not None else None
    unreadable("capability", why_major or why_minor)
    for key, attr in (
        ("sm_count", ATTR_MULTIPROCESSOR_COUNT),
        ("clock_khz", ATTR_CLOCK_RATE),
        ("memory_clock_khz", ATTR_MEMORY_CLOCK_RATE),
    ):
        device[key], why_not = _int_query(lib, "cuDeviceGetAttribute", attr, dev)
        unreadable(key, why_not)
    try:
        total = lib.cuDeviceTotalMem_v2
        total.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
        total.restype = ctypes.c_int
        nbytes = ctypes.c_size_t(0)
        rc = total(ctypes.byref(nbytes), dev)
        device["memory_bytes"] = nbytes.value if rc == 0 else None
        unreadable("memory_bytes", None if rc == 0 else f"cuDeviceTotalMem_v2: {_error_name(lib, rc)}")
    except AttributeError:
        device["memory_bytes"] = None
        unreadable("memory_bytes", "the library has no cuDeviceTotalMem_v2")
    return driver, device


def driver_version_tuple(version: int | None) -> tuple[int, int] | None:
    """``cuDriverGetVersion``'s number as ``(major, minor)``: 12080 is ``(12, 8)``."""
    return None if version is None else (version // 1000, (version % 1000) // 10)


def nvrtc_choice(driver: tuple[int, int] | None, capability: tuple[int, int] | None) -> dict[str, Any]:
    """The NVRTC the runtime would compile with for this driver and device
    (``simpler._core.nvrtc_info``, where the native module has it): its dict, with
    ``available`` True; ``available`` False with ``why`` where the native module has no
    ``nvrtc_info``; ``error`` where it found no NVRTC that fits."""
    try:
        from simpler import _core
    except ImportError as e:
        return {"available": False, "why": f"simpler._core does not import: {e}"}
    info = getattr(_core, "nvrtc_info", None)
    if info is None:
        return {"available": False, "why": "this build of simpler._core has no nvrtc_info"}
    try:
        choice = dict(info(driver=driver, capability=capability))
    except Exception as e:  # CompileError: no NVRTC fits; the message lists what was tried
        return {"available": True, "error": f"{type(e).__name__}: {e}"}
    choice["candidates"] = [dict(c) for c in choice.get("candidates") or ()]
    return {"available": True, **choice}


# -- the lines -----------------------------------------------------------------------------------------


def _version_text(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return ".".join(str(x) for x in v)
    return str(v)


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def _device_line(device: dict[str, Any]) -> str:
    why = device["unreadable"]

    def val(key: str, text: Callable[[Any], str]) -> str:
        return text(device[key]) if device.get(key) is not None else f"unreadable ({why.get(key)})"

    return ", ".join(
        [
            f"name {val('name', str)}",
            f"compute capability {val('capability', lambda c: f'{c[0]}.{c[1]}')}",
            f"SMs {val('sm_count', str)}",
            f"memory {val('memory_bytes', lambda b: f'{b / 2**30:.1f} GiB ({b} bytes)')}",
            f"clock {val('clock_khz', lambda k: f'{k / 1000:.0f} MHz')}",
            f"memory clock {val('memory_clock_khz', lambda k: f'{k / 1000:.0f} MHz')}",
        ]
    )


def _nvrtc_lines(choice: dict[str, Any], emit: Emit) -> None:
    if not choice.get("available"):
        emit("nvrtc", f"not available ({choice.get('why')})")
        return
    if "error" in choice:
        emit("nvrtc", f"none usable: {_first_line(choice['error'])}")
        return
    target = choice.get("target")
    kind = choice.get("target_kind")
    emit(
        "nvrtc",
        f"{choice.get('path')} (version {_version_text(choice.get('version'))}), target "
        f"{target or 'none (no device capability)'}{f' ({kind})' if kind else ''}",
    )
    for c in choice["candidates"]:
        state = "usable" if c.get("usable") else "not usable"
        why = f": {_first_line(str(c['why']))}" if c.get("why") else ""
        emit("nvrtc candidate", f"{c.get('path')} (version {_version_text(c.get('version'))}), {state}{why}")


def run(
    platform: str,
    ordinal: int = 0,
    emit: Emit = _print,
    before_nvrtc: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """The preflight for ``platform``: prints each line as it is found (``emit(what, found)``)
    and returns the facts (keys ``python``, ``simpler``, ``packages``, ``nvrtc_wheels``,
    ``missing`` — optional packages that are missing, with the reason —, and on cuda
    ``driver``, ``device``, ``nvrtc``). Raises :class:`PreflightError` when something required
    is missing. ``before_nvrtc`` runs before the NVRTC choice is made (the device check points
    NVRTC at the fake's there, on the fake libcuda)."""
    facts: dict[str, Any] = {"platform": platform, "missing": {}}
    py = facts["python"] = interpreter()
    emit(
        "python",
        f"{py['executable']} ({py['implementation']} {py['version']}, {py['machine']}"
        f"{', ' + py['libc'] if py['libc'] else ''})",
    )
    s = facts["simpler"] = _simpler()
    emit("simpler", f"{s['version']} from {s['path']}")
    pkgs = facts["packages"] = packages()
    if not pkgs["ml_dtypes"]["found"]:
        facts["missing"]["ml_dtypes"] = (
            "ml_dtypes is not installed: the bfloat16 checks (paged attention, bench) are skipped; "
            + _HOW_TO_GET["ml_dtypes"]
        )
    for name, rec in pkgs.items():
        if rec["found"]:
            dist = f" ({rec['dist']})" if rec["dist"] and rec["dist"].replace("-", "_") != name else ""
            emit(name, f"{rec['version'] or 'found (no version metadata)'}{dist}")
        elif name == "ml_dtypes":
            emit(
                name,
                "missing (not fatal: the bfloat16 checks, paged attention and bench, will be "
                f"skipped); {_HOW_TO_GET[name]}",
            )
        else:
            how = _HOW_TO_GET.get(name)
            emit(name, f"missing{'; ' + how if how else ''}")
    if not pkgs["numpy"]["found"]:
        raise PreflightError(f"numpy is missing for {sys.executable}: {_HOW_TO_GET['numpy']}")
    if not pkgs["pytest"]["found"]:
        raise PreflightError(
            f"pytest is missing for {sys.executable} (the device checks are pytest tests): "
            + _HOW_TO_GET["pytest"]
        )
    wheels = facts["nvrtc_wheels"] = nvrtc_wheels()
    for name, wheel in wheels.items():
        if wheel is None:
            emit(name, "not installed")
        else:
            emit(name, f"{wheel['version']}: {', '.join(wheel['libs']) or 'no libnvrtc files listed'}")
    if platform != "cuda":
        return facts
    driver, device = cuda_driver(ordinal)
    facts["driver"], facts["device"] = driver, device
    v = driver_version_tuple(driver["version"])
    opened_as = driver["requested"] if driver["library"] not in (None, driver["requested"]) else None
    emit(
        "driver",
        f"{driver['library'] or driver['requested']}"
        f"{f' (opened as {opened_as})' if opened_as else ''}"
        f"{' (the fake libcuda)' if driver['fake'] else ''}, cuDriverGetVersion "
        + (f"{driver['version']} (CUDA {v[0]}.{v[1]})" if v else "unreadable")
        + (f", kernel module {driver['kernel_module']}" if driver["kernel_module"] else ""),
    )
    count = f" of {device['count']}" if device.get("count") is not None else ""
    emit(f"device {ordinal}{count}", _device_line(device))
    if before_nvrtc is not None:
        before_nvrtc()
    cc = device["capability"]
    facts["nvrtc"] = nvrtc_choice(v, (cc[0], cc[1]) if cc else None)
    _nvrtc_lines(facts["nvrtc"], emit)
    return facts
