"""Shared test configuration: hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE``, and the
``fake_vendor`` fixture (the ascend and cuda platforms over the fake vendor libraries).

* ``ci`` (default): modest example counts so `make test` stays within CI's time budget.
* ``dev``: ten times more, for a local soak (``HYPOTHESIS_PROFILE=dev pytest tests/test_stateful.py
  --hypothesis-show-statistics``).

Both use no example database (nothing is written under the checkout) and no deadline (timing on
a loaded CI machine is not a property of the code).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import simpler as sp
from simpler.testing import fake_kernels

ROOT = Path(__file__).resolve().parents[1]

_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow],
}
settings.register_profile("ci", max_examples=100, stateful_step_count=50, **_COMMON)
settings.register_profile("dev", max_examples=1000, stateful_step_count=100, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class FakeVendor:
    """The fake vendor libraries `make test` builds and links (crates/fake-ascend, crates/fake-cuda)."""

    ascend_libs = ROOT / "target" / "fake-ascend-libs"
    cuda_lib_path = ROOT / "target" / "fake-cuda-libs" / "libcuda.so.1"

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self._env = monkeypatch

    def use(self, platform: str) -> None:
        """Points ``platform`` (``"ascend"`` or ``"cuda"``) at its fake library for this test, as
        `make py-test` does (ascend: small allocations refused and mirrored, large ones mapped);
        skips the test when the library is not linked."""
        if platform == "ascend":
            if not (self.ascend_libs / "libascend_hal.so").exists():
                pytest.skip(f"fake vendor library not linked under {self.ascend_libs} (run `make test`)")
            self._env.setenv("SIMPLER_ASCEND_LIB_DIR", str(self.ascend_libs))
            self._env.setenv("FAKE_ASCEND_MAP", "min:65536")
            self._env.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
        elif platform == "cuda":
            if not self.cuda_lib_path.exists():
                pytest.skip(f"fake libcuda not linked at {self.cuda_lib_path} (run `make test`)")
            self._env.setenv("SIMPLER_CUDA_LIB", str(self.cuda_lib_path))
            self._env.setenv("SIMPLER_NVRTC_LIB", str(self.cuda_lib_path))
        else:
            raise ValueError(f"no fake vendor library for platform {platform!r}")

    def worker(self, platform: str, **opts: Any) -> sp.Worker:
        """A worker on ``platform`` over its fake library (see :meth:`use`); on cuda the fake
        runs device launches through the host implementations of ``simpler.testing.fake_kernels``
        and compiles with its own NVRTC."""
        self.use(platform)
        if platform == "cuda":
            fake_kernels.install_if_fake()
        return sp.Worker(platform, **opts)

    def cuda_lib(self) -> ctypes.CDLL:
        """The fake libcuda, as the runtime loaded it (its controls: ``fake_cuda_*``)."""
        return ctypes.CDLL(str(self.cuda_lib_path))

    def cuda_log(self) -> list[str]:
        """The fake libcuda's call log, one ``name args -> code`` line per call."""
        lib = self.cuda_lib()
        fn = lib.fake_cuda_call_log
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        fn.restype = ctypes.c_size_t
        n = fn(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        fn(buf, n + 1)
        return buf.raw[:n].decode().splitlines()


@pytest.fixture
def fake_vendor(monkeypatch: pytest.MonkeyPatch) -> FakeVendor:
    """The fake vendor libraries, for this test (environment changes are undone after it)."""
    return FakeVendor(monkeypatch)
