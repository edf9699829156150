"""Vendor sessions as a real machine needs them, on the fake vendor libraries: one session per
process and device shared by every worker (released at exit, or by ``release_sessions``), a
forked child that cannot touch its parent's device, and the HAL's resource refusals served by
a mirror."""

from __future__ import annotations

import ctypes
import gc
import os

import numpy as np
import pytest

import simpler as sp

IN = sp.IN
VENDORS = ["ascend", "cuda"]
N = 1 << 15  # 128 KiB of int32: mapped under the fake ascend's min:65536


def _ascend_fake(fake_vendor) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(fake_vendor.ascend_libs / "libascend_hal.so"))
    lib.fake_ascend_call_log.restype = ctypes.c_size_t
    lib.fake_ascend_live_allocations.restype = ctypes.c_uint64
    lib.fake_ascend_live_mappings.restype = ctypes.c_uint64
    lib.fake_ascend_lifecycle.restype = ctypes.c_uint64
    lib.fake_ascend_set_bar.argtypes = [ctypes.c_uint64]
    lib.fake_ascend_inject.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int32]
    return lib


def _log_len(platform: str, fake_vendor) -> int:
    """How long the fake's call log is now (every vendor call adds a line)."""
    if platform == "cuda":
        return len(fake_vendor.cuda_log())
    return _ascend_fake(fake_vendor).fake_ascend_call_log(None, 0)


def _live(platform: str, fake_vendor) -> tuple[int, int]:
    """(live allocations, live mappings or registrations) as the fake counts them."""
    if platform == "cuda":
        lib = fake_vendor.cuda_lib()
        lib.fake_cuda_live_allocations.restype = ctypes.c_uint64
        lib.fake_cuda_live_registrations.restype = ctypes.c_uint64
        return lib.fake_cuda_live_allocations(), lib.fake_cuda_live_registrations()
    lib = _ascend_fake(fake_vendor)
    return lib.fake_ascend_live_allocations(), lib.fake_ascend_live_mappings()


@pytest.mark.parametrize("platform", VENDORS)
def test_ten_workers_opened_and_closed_in_a_row_open_the_device_once(platform, fake_vendor):
    sp.release_sessions()
    before = sp.session_stats()["opened"]
    for _ in range(10):
        with fake_vendor.worker(platform) as w:
            w.free(w.malloc(64))
    stats = sp.session_stats()
    assert (stats["opened"] - before, stats["held"]) == (1, 1)
    released = sp.release_sessions()
    assert (released["sessions"], released["closed_workers"], released["errors"]) == (1, 0, [])
    assert sp.session_stats()["held"] == 0


@pytest.mark.parametrize("platform", VENDORS)
def test_release_closes_open_workers_first_and_their_close_is_then_quiet(platform, fake_vendor):
    w = fake_vendor.worker(platform)
    buf = w.malloc(4096)
    released = sp.release_sessions()
    assert (released["sessions"], released["closed_workers"], released["errors"]) == (1, 1, [])
    assert _live(platform, fake_vendor)[0] == 0, "the worker's memory went before the session"
    with pytest.raises(sp.DeviceError, match="closed"):
        w.copy_to(buf, np.zeros(16, np.uint8))
    summary = w.close()
    assert summary is not None and summary["errors"] == []


def test_release_keeps_a_worker_whose_memory_another_library_holds(fake_vendor):
    """An export's memory is never freed under its consumer, by release_sessions either: the
    worker with a live DLPack export stays open (and usable), with its session, and the result
    names the allocation; another worker on the device is closed as usual. Once the consumer
    lets go, the next release closes the worker and gives the session back."""
    sp.release_sessions()
    kept, other = fake_vendor.worker("cuda"), fake_vendor.worker("cuda")
    data = np.arange(1024, dtype=np.float32)
    buf = kept.malloc(data.nbytes)
    kept.copy_to(buf, data)
    other.malloc(256)
    capsule = buf.tensor((1024,), "float32").__dlpack__()
    live = _live("cuda", fake_vendor)[0]

    released = sp.release_sessions()
    assert (released["sessions"], released["closed_workers"]) == (0, 1), released
    (error,) = released["errors"]
    assert "cuda device 0: a worker was kept open, with its session" in error, error
    assert f"allocation {buf.ptr:#x} has 1 live export(s)" in error, error
    assert _live("cuda", fake_vendor)[0] == live - 1, "only the other worker's memory went"
    assert sp.session_stats()["held"] == 1 and not kept.closed
    back = np.empty_like(data)
    kept.copy_from(back, buf)  # the kept worker works on
    np.testing.assert_array_equal(back, data)

    del capsule
    gc.collect()
    released = sp.release_sessions()
    assert (released["sessions"], released["closed_workers"], released["errors"]) == (1, 1, [])
    assert _live("cuda", fake_vendor)[0] == 0 and sp.session_stats()["held"] == 0
    assert kept.close()["errors"] == [] and other.close()["errors"] == []


def _in_child(w, buf, t, read, platform, fake_vendor):
    """In a forked child: each use of the parent's worker, whether it was refused naming the
    parent, and whether the fake saw no vendor call meanwhile."""
    calls = _log_len(platform, fake_vendor)
    refused = []
    for attempt in (
        lambda: w.malloc(64),
        lambda: w.copy_from(np.empty(N, np.int32), buf),
        lambda: w.copy_to(buf, np.zeros(N, np.int32)),
        lambda: w.run(read, [t]),
    ):
        try:
            attempt()
            refused.append("no error")
        except sp.SimplerError as e:
            ok = "forked child" in str(e) and f"process {os.getppid()}" in str(e)
            refused.append(ok or str(e))
    w.close()  # inert: nothing of the parent's is given back from here
    sp.release_sessions()
    return refused, _log_len(platform, fake_vendor) == calls


@pytest.mark.parametrize("platform", VENDORS)
def test_a_forked_child_cannot_use_the_parents_worker_and_leaves_its_device_untouched(platform, fake_vendor):
    w = fake_vendor.worker(platform)
    table = np.arange(N, dtype=np.int32)
    buf = w.malloc(table.nbytes)
    w.copy_to(buf, table)
    t = buf.tensor((N,), "int32")
    got: list[int] = []
    read = sp.Callable(lambda o, t: got.append(int(o.get_tensor_data(t, N - 1))), [IN])
    w.run(read, [t])
    view = w.host_view_info(buf)
    assert view == ("mapping" if platform == "ascend" else "mirror")
    live = _live(platform, fake_vendor)
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every use is refused, without a vendor call
        try:
            os.close(r)
            os.write(wfd, repr(_in_child(w, buf, t, read, platform, fake_vendor)).encode())
        except BaseException as e:  # report anything to the parent; never return into pytest
            os.write(wfd, f"child failed: {e!r}".encode())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(r) as f:
        answer = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, answer
    assert answer == repr(([True] * 4, True))
    # The parent's device memory, mappings and views are as they were.
    assert _live(platform, fake_vendor) == live
    assert w.host_view_info(buf) == view
    back = np.empty(N, np.int32)
    w.copy_from(back, buf)
    np.testing.assert_array_equal(back, table)
    w.run(read, [t])
    assert got == [N - 1, N - 1]
    w.close()
    sp.release_sessions()


def test_a_hal_resource_refusal_is_mirrored_with_one_warning(fake_vendor, caplog):
    with fake_vendor.worker("ascend") as w:
        fake = _ascend_fake(fake_vendor)
        fake.fake_ascend_set_bar(N * 4)  # room for one 128 KiB mapping
        table = np.arange(N, dtype=np.int32)
        bufs = [w.malloc(table.nbytes) for _ in range(2)]
        read = sp.Callable(lambda o, a, b: (o.get_tensor_data(a, 1), o.get_tensor_data(b, 1)), [IN, IN])
        for b in bufs:
            w.copy_to(b, table)
        with caplog.at_level("WARNING"):
            w.run(read, [b.tensor((N,), "int32") for b in bufs])
        assert [w.host_view_info(b) for b in bufs] == ["mapping", "mirror"]
        warned = [r.getMessage() for r in caplog.records if "mapping resources" in r.getMessage()]
        assert len(warned) == 1, warned
        assert all(s in warned[0] for s in ("DRV_ERROR_OUT_OF_MEMORY", "code 6", f"{N * 4} bytes"))
        # An invalid-argument answer stays an error.
        fake.fake_ascend_set_bar(0)
        third = w.malloc(table.nbytes)
        assert fake.fake_ascend_inject(b"halHostRegister", 1, 3) == 0
        with pytest.raises(sp.DeviceError, match="halHostRegister failed with code 3"):
            w.run(read, [third.tensor((N,), "int32"), bufs[0].tensor((N,), "int32")])


def test_the_ascend_hardware_check_reports_the_vendors_answers_as_json(fake_vendor):
    """`python -m simpler.tools.ascend_check` against the fake runtime, whose answers are known:
    every size maps, a 256 MiB BAR budget refuses the fifth 64 MiB mapping with OUT_OF_MEMORY,
    an unregister under the user id (0) of logical device 1 finds nothing, the context object is
    reused after a reset."""
    import json
    import subprocess
    import sys

    fake_vendor.use("ascend")
    env = dict(os.environ, FAKE_ASCEND_BAR=str(256 << 20), FAKE_ASCEND_MAP="always")
    out = subprocess.run(
        [sys.executable, "-m", "simpler.tools.ascend_check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [(r["bytes"], r["register"], r["unregister"]) for r in got["map_sizes"]] == [
        (1, 0, 0),
        (33, 0, 0),
        (4097, 0, 0),
        ((1 << 20) + 1, 0, 0),
    ]
    assert got["map_until_refusal"]["mapped"] == 4
    assert got["map_until_refusal"]["refusal"] == {"call": "halHostRegister", "code": 6}
    u = got["unregister_devid"]
    assert (u["logical"], u["unregister_user"], u["unregister_logical"]) == (1, 11, 0)
    assert got["context_after_reopen"]["same_object"] is True
    assert got["open_close_cycles"]["cycles"] == 10
