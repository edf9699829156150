"""What the vendor platforms share with real drivers, tested through the fake vendor libraries.

Real drivers hand a freed device address out again, so a handle kept past ``free`` must not
reach the newer allocation that starts there: every operation on it is a clear "was freed"
error, on sim (``reuse_addresses=True``) and on the ascend and cuda platforms (whose fakes reuse
addresses as the runtimes do). On cuda every host view is a mirror, page-locked while it lives.
A vendor runtime the process already loaded is reused, never loaded a second time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import simpler as sp

ROOT = Path(__file__).resolve().parents[1]
IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT


def _worker(kind, fake_vendor):
    if kind in ("ascend", "cuda"):
        return fake_vendor.worker(kind)
    return sp.Worker("sim", reuse_addresses=True)


COPY = sp.Kernel(lambda x, y: y.__setitem__(..., x), [IN, OUT], name="copy")
CALL = sp.Callable(lambda o, x, y: o.submit(COPY, x, y), [IN, OUT])


@pytest.mark.parametrize("kind", ["sim", "ascend", "cuda"])
def test_a_handle_kept_past_free_is_refused_everywhere_after_its_address_is_reused(kind, fake_vendor):
    with _worker(kind, fake_vendor) as w:
        old = w.malloc(4096)
        stale = old.tensor((1024,), "float32")
        w.free(old)
        new = w.malloc(4096)
        assert new.ptr == old.ptr, "the driver handed the freed address out again"
        w.copy_to(new, np.arange(1024, dtype=np.float32))
        host = np.zeros(1024, np.float32)
        freed = r"was freed; the allocation now at that address is a newer one"
        attempts = {
            "write": lambda: w.copy_to(old, host),
            "read": lambda: w.copy_from(host, old),
            "copy (a tensor)": lambda: w.copy_from(host, stale),
            "view": lambda: w.host_view_info(old),
            "bind": lambda: w.run(CALL, [stale, np.zeros(1024, np.float32)]),
            "free": lambda: w.free(old),
        }
        for what, attempt in attempts.items():
            with pytest.raises(sp.StateError, match=freed):
                attempt()
            got = np.zeros(1024, np.float32)
            w.copy_from(got, new)
            np.testing.assert_array_equal(got, np.arange(1024), err_msg=f"after {what}")
        # The new handle works, bound and all.
        out = np.zeros(1024, np.float32)
        w.run(CALL, [new.tensor((1024,), "float32"), out])
        np.testing.assert_array_equal(out, np.arange(1024))
        w.free(new)
        w.trim_staging()  # the retained staging arena
        assert w.stats()["live_allocations"] == 0


def test_reuse_addresses_is_a_sim_option():
    with pytest.raises(sp.ArgumentError, match="reuse_addresses / model are sim options"):
        sp.Worker("cuda", reuse_addresses=True)


def test_cuda_mirrors_are_page_locked_while_they_live(fake_vendor):
    read = sp.Callable(lambda o, t: o.get_tensor_data(t, 3), [IN])
    with _worker("cuda", fake_vendor) as w:
        buf = w.malloc(1 << 16)
        w.copy_to(buf, np.arange(1 << 14, dtype=np.int32))
        t = buf.tensor((1 << 14,), "int32")
        r = w.run(read, [t])
        assert r.counters["views_mirrored"] == 1 and r.counters["views_mapped"] == 0
        s = w.stats()
        assert (s["pins"], s["pinned_bytes"], s["unpins"]) == (1, 1 << 16, 0)
        w.free(buf)
        s = w.stats()
        assert (s["pins"], s["unpins"], s["pinned_bytes"]) == (1, 1, 0)
        # One left for close: still unlocked exactly once.
        buf = w.malloc(4096)
        w.run(read, [buf.tensor((1024,), "int32")])
    s = w.stats()
    assert (s["pins"], s["unpins"], s["pinned_bytes"]) == (2, 2, 0)


def test_an_already_loaded_vendor_runtime_is_reused_not_loaded_twice(tmp_path, fake_vendor):
    """A framework (torch_npu) loaded the runtime first, from its own directory; our worker,
    pointed elsewhere, must use that copy rather than load a second one."""
    fake = ROOT / "target" / "debug" / "libfake_ascend.so"
    if not fake.exists():
        pytest.skip(f"fake vendor library not built at {fake} (run `make test`)")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    shutil.copy(fake, theirs / "libfake_ascend.so")
    shutil.copy(fake_vendor.ascend_libs / "libc_sec.so", theirs / "libc_sec.so")
    for name in ("libascendcl.so", "libruntime.so", "libascend_hal.so"):
        (theirs / name).symlink_to("libfake_ascend.so")
    script = textwrap.dedent(
        """
        import ctypes, sys
        # The framework's load: by name, found on LD_LIBRARY_PATH (the runtime pulls in the HAL).
        hal = ctypes.CDLL("libascend_hal.so", mode=ctypes.RTLD_GLOBAL)
        acl = ctypes.CDLL("libascendcl.so", mode=ctypes.RTLD_GLOBAL)
        acl.fake_ascend_init_count.restype = ctypes.c_uint64
        import simpler as sp
        w = sp.Worker("ascend")
        w.free(w.malloc(64))
        refs_while_open = acl.fake_ascend_init_count()
        w.close()
        refs_after_close = acl.fake_ascend_init_count()  # the session stays until exit
        sp.release_sessions()
        maps = open("/proc/self/maps").read()
        print(refs_while_open, refs_after_close, acl.fake_ascend_init_count(), sys.argv[1] in maps)
        """
    )
    env = dict(os.environ)
    env.update(
        LD_LIBRARY_PATH=str(theirs),
        SIMPLER_ASCEND_LIB_DIR=str(fake_vendor.ascend_libs),  # ours: the build's copy
        FAKE_ASCEND_MAP="always",
    )
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    ours = str(fake.resolve())
    out = subprocess.run([sys.executable, "-c", script, ours], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    refs_open, refs_closed, refs_released, ours_loaded = out.stdout.split()
    assert (refs_open, refs_closed, refs_released) == ("1", "1", "0"), (
        "the worker initialized the framework's copy"
    )
    assert ours_loaded == "False", "a second copy of the runtime was loaded"


_LOAD_SCRIPT = """
import simpler as sp
try:
    with sp.Worker("ascend") as w:
        w.free(w.malloc(64))
    print("loaded")
except sp.PlatformUnavailableError as e:
    print(e)
"""


def test_a_missing_vendor_dependency_is_preloaded_from_beside_the_library_or_named_with_the_fix(
    tmp_path, fake_vendor
):
    """CANN's libraries carry no RPATH: a dependency (libc_sec.so) not on LD_LIBRARY_PATH is
    found beside the library and preloaded; where it is nowhere, the error names it and the
    fix (set_env.sh, or the LD_LIBRARY_PATH entries)."""
    fake = ROOT / "target" / "debug" / "libfake_ascend.so"
    if not (fake_vendor.ascend_libs / "libc_sec.so").exists():
        pytest.skip("fake vendor libraries not linked (run `make test`)")
    libs = tmp_path / "cann" / "lib64"
    libs.mkdir(parents=True)
    shutil.copy(fake, libs / "libfake_ascend.so")
    for name in ("libascendcl.so", "libascend_hal.so"):
        (libs / name).symlink_to("libfake_ascend.so")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "ASCEND_RT_VISIBLE_DEVICES")}
    env.update(SIMPLER_ASCEND_LIB_DIR=str(libs), FAKE_ASCEND_MAP="always")

    def load() -> str:
        out = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    missing = load()
    for needle in ("libc_sec.so", "set_env.sh", f"LD_LIBRARY_PATH={libs}", str(libs / "libascend_hal.so")):
        assert needle in missing, f"{needle!r} missing from: {missing}"
    shutil.copy(fake_vendor.ascend_libs / "libc_sec.so", libs / "libc_sec.so")
    assert load() == "loaded"


def test_device_check_skips_cleanly_without_a_device_and_finds_a_driver_library(fake_vendor):
    script = ROOT / ".ci" / "device-check"
    env = dict(os.environ, SIMPLER_CUDA_LIB="/nonexistent/libcuda.so.1")
    env["SIMPLER_ASCEND_LIB_DIR"] = "/nonexistent"
    out = subprocess.run([str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "device-check: skipped: no device driver" in out.stdout, out
    if fake_vendor.cuda_lib_path.exists():
        env["SIMPLER_CUDA_LIB"] = str(fake_vendor.cuda_lib_path)
        out = subprocess.run([str(script), "--probe"], env=env, capture_output=True, text=True)
        assert out.returncode == 0 and "platforms with a driver: cuda" in out.stdout, out
