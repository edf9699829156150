"""Cached host views: a mapping read through a host cache of the allocation. Filled by one bulk
copy out of the mapping (no driver call), refreshed once per stale run by the mirror's rule,
written through to the device; chosen by declaration or, under ``auto``, once reads dominate;
released (cache and mapping) before the allocation is freed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import simpler as sp

IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT
BUMP = sp.Kernel(lambda t: t.__iadd__(1), [INOUT], name="bump")


def _reads(n):
    def orch(o, t):
        total = 0
        for i in range(n):
            total += int(o.get_tensor_data(t, i % 64))
        o.submit(BUMP, t)
        return total

    return sp.Callable(orch, [INOUT])


def test_a_cache_refreshes_exactly_once_per_stale_run():
    with sp.Worker("sim", view_policy="cached") as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", np.zeros(64, np.int32), INOUT)
        d2h = w.stats()["d2h_calls"]
        fills = []
        for _ in range(4):
            r = w.run(_reads(500), [t])  # the kernel writes t every run: stale each time
            fills.append((r.counters["views_cached"], r.counters["cache_fills"]))
            assert r.counters["cache_fill_bytes"] == 256 * r.counters["cache_fills"]
            assert r.counters["mapped_reads"] == 0  # every read hit the cache
        assert fills == [(1, 1), (0, 1), (0, 1), (0, 1)]
        assert w.stats()["d2h_calls"] == d2h, "a cache is filled from the mapping, not by a copy call"
        assert w.host_view_info(t) == "cached"


def test_writes_go_through_to_the_device_and_to_later_reads():
    seen = []

    def orch(o, t):
        o.set_tensor_data(t, 5, 42)
        seen.append(int(o.get_tensor_data(t, 5)))
        seen.append(int(o.read_tensor(t)[5]))
        o.submit(BUMP, t)

    with sp.Worker("sim", view_policy="cached") as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", np.zeros(64, np.int32), INOUT)
        r = w.run(sp.Callable(orch, [INOUT]), [t])
        assert seen == [42, 42] and r.counters["mapped_writes"] == 1
        out = np.zeros(64, np.int32)
        w.copy_from(out, t.buffer)
        assert out[5] == 43 and out[4] == 1  # the device saw the write before the kernel ran


def test_auto_turns_a_read_heavy_mapping_into_a_cache_and_counts_every_read():
    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        # 256 KiB: a bulk copy out of the mapping (0.3 GB/s: 873.8 us) costs 515 reads of 1.7 us
        # (docs/cost-model.md); reads are noted 16 at a time, so the switch comes at the 528th.
        t = res.add("t", np.zeros(64 * 1024, np.int32), IN)
        call = sp.Callable(lambda o, t: [o.get_tensor_data(t, i) for i in range(600)], [IN])
        r = w.run(call, [t])
        assert r.counters["views_mapped"] == 1 and r.counters["views_cached"] == 1
        assert r.counters["mapped_reads"] == 528  # the reads before the switch crossed the bus
        assert w.host_view_info(t) == "cached"
        r = w.run(call, [t])  # IN: never stale, never refilled
        assert (r.counters["mapped_reads"], r.counters["cache_fills"]) == (0, 0)


def test_reads_not_yet_noted_survive_another_allocations_switch():
    """Reads through a mapping are noted in batches; when another allocation's switch makes every
    argument resolve again, the reads of the batch in progress still count."""

    def orch(o, a, b):
        for i in range(10):
            o.get_tensor_data(b, i)
        for i in range(16):  # `a` (64 bytes) switches to a cache here
            o.get_tensor_data(a, i)
        for i in range(518):  # 528 reads of `b` (256 KiB) in all: it switches at the last one
            o.get_tensor_data(b, i)

    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        a = res.add("a", np.zeros(16, np.int32), IN)
        b = res.add("b", np.zeros(64 * 1024, np.int32), IN)
        r = w.run(sp.Callable(orch, [IN, IN]), [a, b])
        assert (r.counters["views_cached"], r.counters["mapped_reads"]) == (2, 16 + 528)
        assert w.host_view_info(a) == w.host_view_info(b) == "cached"


def test_auto_keeps_a_lightly_read_mapping():
    with sp.Worker("sim") as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", np.zeros(64 * 1024, np.int32), IN)
        r = w.run(sp.Callable(lambda o, t: [o.get_tensor_data(t, i) for i in range(100)], [IN]), [t])
        assert r.counters["mapped_reads"] == 100 and r.counters["views_cached"] == 0
        assert w.host_view_info(t) == "mapping"


@pytest.mark.parametrize(
    ("hint", "kind"), [("mapping", "mapping"), ("mirror", "mirror"), ("cached", "cached")]
)
def test_a_declared_policy_wins_over_the_workers(hint, kind):
    with sp.Worker("sim", view_policy="auto") as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", np.zeros(64 * 1024, np.int32), IN, host_view=hint, eager=True)
        assert w.host_view_info(t) == kind
        w.run(sp.Callable(lambda o, t: [o.get_tensor_data(t, i) for i in range(2000)], [IN]), [t])
        assert w.host_view_info(t) == kind


def test_a_cached_view_is_released_before_its_allocation_is_freed():
    with sp.Worker("sim", view_policy="cached") as w:
        buf = w.malloc(4096)
        w.run(sp.Callable(lambda o, t: o.get_tensor_data(t, 0), [IN]), [buf.tensor((1024,), "int32")])
        assert w.host_view_info(buf) == "cached" and tuple(w.debug_state()["views"].values()) == (1, 0, 0)
        w.free(buf)
        assert tuple(w.debug_state()["views"].values()) == (0, 0, 0)
        log = [(op, addr) for op, addr, _n, code, _p in w.call_log() if code == 0 and addr == buf.ptr]
        assert [op for op, _ in log][-2:] == ["unmap", "free"]
        assert w.stats()["live_mappings"] == 0


def test_a_mirror_policy_never_maps():
    with sp.Worker("sim", view_policy="mirror") as w:
        buf = w.malloc(4096)
        w.run(sp.Callable(lambda o, t: o.get_tensor_data(t, 0), [IN]), [buf.tensor((1024,), "int32")])
        assert w.host_view_info(buf) == "mirror" and w.stats()["maps"] == 0


def test_a_bad_policy_is_an_argument_error():
    with pytest.raises(sp.ArgumentError, match="view_policy must be 'auto', 'mapping', 'cached' or 'mirror'"):
        sp.Worker("sim", view_policy="sometimes")


def test_a_large_bulk_read_under_auto_is_served_from_the_cache_it_triggers():
    seen = []
    with sp.Worker("sim", model="ascend-a3") as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("t", np.arange(64 * 1024, dtype=np.int32), IN, eager=True)  # mapped at add
        call = sp.Callable(lambda o, t: seen.append(int(o.read_tensor(t)[1000])), [IN])
        r = w.run(call, [t])
        # 65,536 element reads through the mapping would cost ~111 ms; the cache costs one fill.
        assert (r.counters["views_cached"], r.counters["mapped_reads"]) == (1, 0)
        assert r.counters["cache_fill_bytes"] == 256 << 10
        assert r.modeled["orchestrate"] == round((256 << 10) / 0.3)
        assert seen == [1000]


# Staged tensors: the orchestrator reads them through a mapping of the staging arena they share.
# Read often, they are read from a per-run host copy of their own span instead (the arena holds
# other bytes next run, so the copy lives one run).

STAGED_N = 16 * 1024  # a 64 KiB int32 tensor: under auto its span copy pays after 129 reads


def _staged_reads(n, seen):
    def orch(o, t):
        seen.append([int(o.get_tensor_data(t, i % STAGED_N)) for i in range(n)])

    return sp.Callable(orch, [IN])


@pytest.mark.parametrize("policy", ["auto", "cached", "mapping", "mirror"])
def test_a_staged_tensor_is_read_from_the_bytes_the_run_uploaded(policy):
    """Whatever the view policy, the orchestrator reads a staged tensor from a copy of the bytes
    the run uploaded: no mapping of the staging allocation, no read back from the device, one
    copy of its span per run (a copy lives one run)."""
    host = np.arange(STAGED_N, dtype=np.int32)
    with sp.Worker("sim", view_policy=policy) as w:
        for _ in range(2):
            seen = []
            before = w.stats()
            r = w.run(_staged_reads(600, seen), [host])
            assert seen == [[i % STAGED_N for i in range(600)]]
            c = r.counters
            assert (c["views_mapped"], c["mapped_reads"], c["staged_view_copies"]) == (0, 0, 1)
            assert (c["cache_fills"], c["views_cached"]) == (0, 0)
            after = w.stats()
            assert (after["d2h_calls"], after["maps"]) == (before["d2h_calls"], before["maps"])


def test_writes_to_a_staged_tensor_reach_the_device_and_later_reads():
    seen = []

    def orch(o, t):
        for i in range(200):
            o.get_tensor_data(t, i)
        o.set_tensor_data(t, 7, -5)
        seen.append((int(o.get_tensor_data(t, 7)), int(o.read_tensor(t)[7])))
        o.submit(BUMP, t)

    host = np.zeros(STAGED_N, np.int32)
    with sp.Worker("sim", model="ascend-a3") as w:
        h2d = w.stats()["h2d_calls"]
        r = w.run(sp.Callable(orch, [INOUT]), [host])
        assert seen == [(-5, -5)]
        assert host[7] == -4 and host[6] == 1  # the kernel saw the write; copied back
        c = r.counters
        assert (c["staged_view_copies"], c["mapped_reads"], c["mapped_writes"]) == (1, 0, 0)
        assert w.stats()["h2d_calls"] == h2d + 2  # the upload, then the element written


def test_a_staged_output_is_read_from_the_device_once_never_mapped():
    """A staged OUT tensor was not uploaded (its device bytes are the poison): a read of it
    copies its span from the device once, and maps nothing."""
    seen = []

    def orch(o, t):
        seen.append([int(o.get_tensor_data(t, i)) for i in range(4)])

    with sp.Worker("sim") as w:
        d2h = w.stats()["d2h_calls"]
        out = np.zeros(1024, np.uint8)
        r = w.run(sp.Callable(orch, [OUT]), [out])
        assert seen == [[0xA5] * 4]
        assert (r.counters["staged_view_copies"], r.counters["views_mapped"]) == (1, 0)
        assert w.stats()["d2h_calls"] == d2h + 2 and w.stats()["maps"] == 0  # the span; copy back


_NO_ROOM_FOR_A_CACHE = """
import resource, sys
import numpy as np
import simpler as sp

policy, size = sys.argv[1], int(sys.argv[2])
w = sp.Worker("sim", view_policy=policy)
buf = w.malloc(size)
t = buf.tensor((size // 4,), "int32")
w.copy_to(buf, np.array([7], np.int32), offset=12)
# From here the process cannot take another `size // 2` bytes: the host cache cannot be had.
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + size // 2, resource.RLIM_INFINITY))
n = 1 if policy == "cached" else size // 510 + 32  # under auto: past the switch (a read per ~510 B)
seen = []
r = w.run(sp.Callable(lambda o, t: seen.extend(int(o.get_tensor_data(t, 3)) for _ in range(n)), [sp.IN]), [t])
c = r.counters
print(w.host_view_info(buf), set(seen), c["views_cached"], c["cache_fills"], c["mapped_reads"] == n)
w.free(buf)
print(w.stats()["live_mappings"], w.stats()["live_allocations"])
w.close()
"""


def _capped(cwd, script, policy, size):
    """Runs one of the address-space-capping scripts above in a fresh interpreter (the cap is
    process-wide); returns the finished process, which must have succeeded."""
    p = subprocess.run(
        [sys.executable, "-c", script, policy, str(size)], capture_output=True, text=True, cwd=cwd
    )
    assert p.returncode == 0, p.stderr
    return p


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.parametrize(("policy", "size"), [("cached", 256 << 20), ("auto", 48 << 20)])
def test_without_host_memory_for_a_cache_the_mapping_keeps_serving(tmp_path, policy, size):
    """A cache is an optimization: where its host memory cannot be allocated (here the address
    space is capped), the read is served through the mapping, a warning names the allocation
    and its size, and the mapping is still released before the free."""
    p = _capped(tmp_path, _NO_ROOM_FOR_A_CACHE, policy, size)
    assert p.stdout.split("\n")[:2] == ["mapping {7} 0 0 True", "0 0"]
    assert "cannot allocate a host cache of allocation 0x" in p.stderr
    assert (
        f"({size} bytes): cannot allocate {size} bytes of host memory; reading through the mapping instead"
        in p.stderr
    )


_NO_ROOM_FOR_A_SPAN_COPY = """
import resource, sys
import numpy as np
import simpler as sp

size = int(sys.argv[2])
host = np.zeros(size // 4, np.int32)
host[3] = 7

def orch(o, t):
    # The arena holds the staged bytes now; from here the process cannot take `size // 2` more.
    vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + size // 2, resource.RLIM_INFINITY))
    try:
        o.get_tensor_data(t, 3)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

with sp.Worker("sim") as w:
    try:
        w.run(sp.Callable(orch, [sp.IN]), [host])
    except sp.SimplerError as e:
        print(type(e).__name__, e)
    ok = w.run(sp.Callable(lambda o, t: print(o.get_tensor_data(t, 3)), [sp.IN]), [host])
    print(ok.counters["views_mapped"], w.stats()["maps"])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_without_host_memory_for_a_staged_tensors_copy_the_read_fails_clearly(tmp_path):
    """A staged tensor is read from a copy of its span; where that copy cannot be allocated the
    read fails with an error naming the tensor, its span and its size (nothing is mapped), and
    the worker's next run reads it normally."""
    size = 256 << 20
    p = _capped(tmp_path, _NO_ROOM_FOR_A_SPAN_COPY, "auto", size)
    first, value, counts = p.stdout.strip().split("\n")
    assert first.startswith(
        f"ArgumentError tensor arg0: cannot allocate a host copy of its span ({size} bytes at 0x"
    )
    assert (value, counts) == ("7", "0 0")


@pytest.mark.parametrize("policy", ["mirror", "cached"])
def test_a_task_that_writes_a_tensor_the_callable_declares_in_makes_its_copy_stale(policy):
    """The callable declares the resident tensor IN, but a task writes it through an INOUT slot:
    at the end of the run its mirror (or cache) is stale all the same, so the next run's
    orchestrator reads the new bytes, not the copy of the old ones."""
    bump = sp.Kernel(lambda x: x.__iadd__(1), [INOUT], name="bump")
    seen = []

    def orch(o, t):
        seen.append(int(o.get_tensor_data(t, 0)))
        o.submit(bump, t)

    call = sp.Callable(orch, [IN])
    with sp.Worker("sim", svm="always") as w, sp.ResidentTaskArgs(w) as res:
        t = res.add("x", np.zeros(4, np.int32), host_view=policy)
        for _ in range(3):
            w.run(call, [t])
        assert w.host_view_info(t) == policy
    assert seen == [0, 1, 2]
