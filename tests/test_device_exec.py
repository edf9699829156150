"""Device execution on cuda, against the fake libcuda (which runs every launch through a host
implementation registered here, decoding the task rows per the documented ABI, on a thread of
its own, asynchronously): compile cache, module loads, the row layout, launch counts and
levels, stream ordering, device-array kernels, faults, compile errors, and paged attention with
every task on the device."""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import simpler as sp
from simpler.testing import fake_cuda
from simpler.workloads import paged_attention as pa
from simpler.workloads import paged_attention_unroll as pu

F32 = np.dtype(np.float32)

#: y[i] += alpha * x[i] over each task's view of n elements.
SAXPY = r"""
struct saxpy_row { const float* x; float* y; double alpha; long long n; };
extern "C" __global__ void t_saxpy(const saxpy_row* rows) {
    const saxpy_row r = rows[blockIdx.z];
    for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < r.n; i += gridDim.x * blockDim.x)
        r.y[i] += (float)r.alpha * r.x[i];
}
"""

#: Every task's rows as the fake decoded them: (entry, grid, rows array).
SEEN: list[tuple[str, tuple[int, ...], np.ndarray]] = []


@fake_cuda.host_impl("t_saxpy")
def _saxpy(launch: fake_cuda.Launch) -> None:
    rows = launch.rows(4)
    SEEN.append((launch.entry, tuple(launch.grid), rows.copy()))
    for x, y, alpha, n in rows:
        n = launch.i64(n)
        dst = launch.array(int(y), (n,), F32)
        dst += np.float32(launch.f64(alpha)) * launch.array(int(x), (n,), F32)


def _saxpy_fn(x, y, alpha):
    y += np.float32(alpha) * x


def _n_launch(x_shape, y_shape):
    return sp.Launch(grid=1, block=128, consts=(int(np.prod(x_shape)),))


def saxpy_kernel(source: str = SAXPY) -> sp.Kernel:
    code = sp.CudaCode(source, entry="t_saxpy", launch=_n_launch, scalars=("float64",))
    return sp.Kernel(_saxpy_fn, [sp.IN, sp.INOUT], name="saxpy", cuda=code)


SAXPY_K = saxpy_kernel()
SAXPY_HOST = sp.Kernel(_saxpy_fn, [sp.IN, sp.INOUT], name="saxpy_host")


@pytest.fixture
def cuda(fake_vendor):
    SEEN.clear()
    with fake_vendor.worker("cuda", poison=False) as w:
        yield w


def _lib(fake_vendor):
    return fake_vendor.cuda_lib()


def test_a_batch_is_one_launch_over_rows_laid_out_as_documented(cuda):
    """One submit_many of independent tasks is one launch with grid z = tasks; each row holds
    the device address of each view's first element, the scalar in its declared kind and the
    launch consts; nothing runs on the host."""
    res = sp.ResidentTaskArgs(cuda)
    x = res.add("x", np.arange(32, dtype=np.float32).reshape(4, 8))
    y = res.add("y", np.ones((4, 8), np.float32), direction=sp.INOUT)

    def orch(o, x, y, alpha):
        o.submit_many(
            SAXPY_K,
            x.views([1, 8], [[i, 0] for i in range(4)]),
            y.views([1, 8], [[i, 0] for i in range(4)]),
            alpha,
        )

    r = cuda.run(sp.Callable(orch, [sp.IN, sp.INOUT]), [x, y, 0.5])
    c = r.counters
    assert (c["device_launches"], c["device_tasks"], c["host_path_tasks"], c["tasks"]) == (1, 4, 0, 4)
    [(entry, grid, rows)] = SEEN
    assert (entry, grid) == ("t_saxpy", (1, 1, 4))
    xb, yb = x.buffer.ptr, y.buffer.ptr
    assert rows[:, 0].tolist() == [xb + 32 * i for i in range(4)]
    assert rows[:, 1].tolist() == [yb + 32 * i for i in range(4)]
    assert rows[:, 2].view(np.float64).tolist() == [0.5] * 4
    assert rows[:, 3].tolist() == [8] * 4
    out = np.empty((4, 8), np.float32)
    y.buffer.copy_from(out)
    np.testing.assert_array_equal(out, 1 + 0.5 * np.arange(32, dtype=np.float32).reshape(4, 8))
    assert cuda.stats()["launches"] == 1 and cuda.stats()["module_loads"] == 1
    res.release()


def test_dependent_tasks_run_in_levels_in_submission_order(cuda):
    """Tasks that update the same bytes cannot share a launch: each dependence level is its own
    launch (the fake's host implementation would see both tasks in one launch otherwise), and
    the result is the sequential one."""
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, np.float32)

    def orch(o, x, y):
        # Five tasks on the same y (a chain), with different alphas.
        o.submit_many(SAXPY_K, x, y, np.arange(1, 6, dtype=np.float64))

    r = cuda.run(sp.Callable(orch, [sp.IN, sp.INOUT]), [x, y])
    assert (r.counters["device_launches"], r.counters["device_tasks"]) == (5, 5)
    assert [grid for _, grid, _ in SEEN] == [(1, 1, 1)] * 5
    assert [rows[0, 2].view(np.float64) for _, _, rows in SEEN] == [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(y, 15 * x)


def test_single_submits_launch_one_task_each_and_host_kernels_are_counted(cuda):
    x = np.arange(16, dtype=np.float32)
    y = np.zeros(16, np.float32)

    def orch(o, x, y):
        o.submit(SAXPY_K, x, y, 1.0)
        o.submit(SAXPY_HOST, x, y, 10.0)  # no device code: the host path, over copies
        o.submit(SAXPY_K, x, y, 100.0)

    r = cuda.run(sp.Callable(orch, [sp.IN, sp.INOUT]), [x, y])
    c = r.counters
    assert (c["device_launches"], c["device_tasks"], c["host_path_tasks"]) == (2, 2, 1)
    # The host task ran between the two launches: the order of submission.
    np.testing.assert_array_equal(y, 111 * x)


def test_compiled_once_per_process_and_loaded_once_per_worker(fake_vendor):
    src = SAXPY + "\n// a source of its own: compiled once\n"
    k = saxpy_kernel(src)
    before = sp.device_code_stats()
    for _ in range(2):
        with fake_vendor.worker("cuda") as w:
            x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
            for _ in range(3):
                w.run(sp.Callable(lambda o, x, y: o.submit(k, x, y, 2.0), [sp.IN, sp.INOUT]), [x, y])
            assert w.stats()["module_loads"] == 1
    after = sp.device_code_stats()
    assert after["compiles"] - before["compiles"] == 1
    assert after["cache_hits"] - before["cache_hits"] == 1  # the second worker's load
    np.testing.assert_array_equal(y, [6] * 4)


def test_a_ptx_image_loads_without_the_compiler(cuda):
    image = "FAKECUDA-MODULE 1\narch sm_90\nentry t_saxpy 1\n"
    code = sp.CudaCode(ptx=image, entry="t_saxpy", launch=_n_launch, scalars=("float64",))
    k = sp.Kernel(_saxpy_fn, [sp.IN, sp.INOUT], cuda=code)
    before = sp.device_code_stats()
    x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
    cuda.run(sp.Callable(lambda o, x, y: o.submit(k, x, y, 3.0), [sp.IN, sp.INOUT]), [x, y])
    np.testing.assert_array_equal(y, [3] * 4)
    assert sp.device_code_stats() == before


def test_outputs_are_read_after_the_stream_has_run(cuda, fake_vendor):
    """The fake runs stream work late (a long wake-up latency here): a copy back or a kernel
    over device arrays that did not wait for the stream would see the old bytes."""
    lib = _lib(fake_vendor)
    lib.fake_cuda_set_stream_latency_us(30_000)
    seen = []

    def peek(x, y):
        # A device-array kernel reads y right after the launch that wrote it.
        a = np.ctypeslib.as_array(
            ctypes.cast(
                lib_translate(lib, y.__cuda_array_interface__["data"][0], 16), ctypes.POINTER(ctypes.c_float)
            ),
            (4,),
        )
        seen.append(a.copy())

    k_peek = sp.Kernel(peek, [sp.IN, sp.IN], name="peek", device_arrays=True)
    try:
        x, y = np.ones(4, np.float32), np.zeros(4, np.float32)

        def orch(o, x, y):
            o.submit(SAXPY_K, x, y, 7.0)
            o.submit(k_peek, x, y)

        cuda.run(sp.Callable(orch, [sp.IN, sp.INOUT]), [x, y])
    finally:
        lib.fake_cuda_set_stream_latency_us(0)
    np.testing.assert_array_equal(y, [7] * 4)
    np.testing.assert_array_equal(seen[0], [7] * 4)


def lib_translate(lib, addr, nbytes):
    fn = lib.fake_cuda_translate
    fn.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong]
    fn.restype = ctypes.c_void_p
    p = fn(addr, nbytes)
    assert p, f"{addr:#x} is not device memory"
    return p


def test_device_array_kernels_get_the_views_not_copies(cuda, fake_vendor):
    lib = _lib(fake_vendor)
    got = {}

    def k(x, y, alpha):
        got["x"], got["y"] = x.__cuda_array_interface__, y.__cuda_array_interface__
        got["obj"] = x
        dst = np.ctypeslib.as_array(
            ctypes.cast(
                lib_translate(lib, y.__cuda_array_interface__["data"][0], 32), ctypes.POINTER(ctypes.c_float)
            ),
            (8,),
        )
        src = np.ctypeslib.as_array(
            ctypes.cast(
                lib_translate(lib, x.__cuda_array_interface__["data"][0], 32), ctypes.POINTER(ctypes.c_float)
            ),
            (8,),
        )
        dst += np.float32(alpha) * src

    kernel = sp.Kernel(k, [sp.IN, sp.INOUT], name="arrays", device_arrays=True)
    assert kernel.device_arrays is True
    x, y = np.arange(16, dtype=np.float32).reshape(2, 8), np.zeros((2, 8), np.float32)

    def orch(o, x, y):
        o.submit(kernel, x.view([1, 8], [1, 0]), y.view([1, 8], [1, 0]), 2.0)

    r = cuda.run(sp.Callable(orch, [sp.IN, sp.INOUT]), [x, y])
    assert r.counters["host_path_tasks"] == 0
    np.testing.assert_array_equal(y[1], 2 * x[1])
    np.testing.assert_array_equal(y[0], 0)
    cx, cy = got["x"], got["y"]
    assert cx["shape"] == (1, 8) and cx["typestr"] == "<f4" and cx["version"] == 3
    assert cx["data"][1] is True and cy["data"][1] is False  # IN arrays are read-only
    assert cx["stream"] == cy["stream"] and cx["stream"] > 2
    with pytest.raises(sp.StateError, match="valid only during the kernel's call"):
        _ = got["obj"].__cuda_array_interface__


def test_on_sim_a_device_array_kernel_gets_numpy_arrays():
    def k(x, y):
        assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
        y[...] = x * 3

    kernel = sp.Kernel(k, [sp.IN, sp.OUT], device_arrays="cupy")
    with sp.Worker("sim") as w:
        x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
        w.run(sp.Callable(lambda o, x, y: o.submit(kernel, x, y), [sp.IN, sp.OUT]), [x, y])
    np.testing.assert_array_equal(y, 3 * x)


def test_a_faulting_kernel_is_a_sticky_device_error(fake_vendor):
    @fake_cuda.host_impl("t_fault")
    def _fault(launch):
        return 700

    code = sp.CudaCode(
        'extern "C" __global__ void t_fault(const void* rows) {}', entry="t_fault", launch=sp.Launch(1, 1)
    )
    k = sp.Kernel(lambda y: None, [sp.OUT], name="fault", cuda=code)
    w = fake_vendor.worker("cuda")
    lib = _lib(fake_vendor)
    lib.fake_cuda_live_allocations.restype = ctypes.c_uint64
    live_before = lib.fake_cuda_live_allocations()
    y = np.zeros(4, np.float32)
    call = sp.Callable(lambda o, y: o.submit(k, y), [sp.OUT])
    with pytest.raises(sp.DeviceError) as e:
        w.run(call, [y])
    assert (e.value.code, e.value.code_name, e.value.phase) == (700, "CUDA_ERROR_ILLEGAL_ADDRESS", "execute")
    assert "cuStreamSynchronize" in str(e.value)
    # The context is poisoned: the next call fails with the same code.
    with pytest.raises(sp.DeviceError) as e2:
        w.run(sp.Callable(lambda o, y: None, [sp.OUT]), [y])
    assert e2.value.code == 700
    # Close completes: what the context held goes with it, said once; a new worker on the same
    # device works (the fault went with the last reference to the context).
    report = w.close()
    assert report["leaked_allocations"] == 2  # the staging arena and the task-row buffer
    assert any(re.search(r"after a sticky fault: .* 2 allocation\(s\) go with", e) for e in report["errors"])
    # The releasing calls were still made: the driver released what the context held.
    assert lib.fake_cuda_live_allocations() <= live_before
    with fake_vendor.worker("cuda") as fresh:
        fresh.malloc(64).copy_to(np.ones(16, np.float32))


def test_compile_errors_name_the_kernel_and_carry_the_log(cuda):
    code = sp.CudaCode(
        '#error no such intrinsic\nextern "C" __global__ void t_bad(const void* r) {}',
        entry="t_bad",
        launch=sp.Launch(1, 1),
    )
    k = sp.Kernel(lambda y: None, [sp.OUT], name="bad", cuda=code)
    y = np.zeros(4, np.float32)
    with pytest.raises(sp.CompileError, match=r"(?s)device code t_bad: .*no such intrinsic"):
        cuda.run(sp.Callable(lambda o, y: o.submit(k, y), [sp.OUT]), [y])
    # The worker is usable after the failed run.
    x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
    cuda.run(sp.Callable(lambda o, x, y: o.submit(SAXPY_K, x, y, 1.0), [sp.IN, sp.INOUT]), [x, y])
    np.testing.assert_array_equal(y, x)


def test_a_missing_compiler_says_where_it_looked(fake_vendor, tmp_path):
    fake_vendor.use("cuda")
    script = (
        "import numpy as np, simpler as sp\n"
        "src = 'extern \"C\" __global__ void t_x(const void* r) {}'\n"
        "code = sp.CudaCode(src, entry='t_x', launch=sp.Launch(1))\n"
        "k = sp.Kernel(lambda y: None, [sp.OUT], cuda=code)\n"
        "with sp.Worker('cuda') as w:\n"
        "    try:\n"
        "        w.run(sp.Callable(lambda o, y: o.submit(k, y), [sp.OUT]), [np.zeros(4, np.float32)])\n"
        "    except sp.CompileError as e:\n"
        "        print('CompileError:', e)\n"
    )
    env = dict(os.environ, SIMPLER_NVRTC_LIB=str(tmp_path / "libnvrtc.so.13"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "CompileError:" in out.stdout and str(tmp_path / "libnvrtc.so.13") in out.stdout, out.stdout
    assert "SIMPLER_NVRTC_LIB" in out.stdout


def test_bad_launches_and_scalars_are_refused_at_submit(cuda):
    x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
    bad = sp.Kernel(
        _saxpy_fn,
        [sp.IN, sp.INOUT],
        cuda=sp.CudaCode(SAXPY, entry="t_saxpy", launch=lambda *s: (1, 1), scalars=("float64",)),
    )
    with pytest.raises(sp.ArgumentTypeError, match="launch function returned tuple, not a Launch"):
        cuda.run(sp.Callable(lambda o, x, y: o.submit(bad, x, y, 1.0), [sp.IN, sp.INOUT]), [x, y])
    ints = sp.Kernel(
        _saxpy_fn,
        [sp.IN, sp.INOUT],
        cuda=sp.CudaCode(SAXPY, entry="t_saxpy", launch=_n_launch, scalars=("int64",)),
    )
    with pytest.raises(sp.ArgumentError, match=r"scalar 0 travels as int64 .* 2.5 is not an integer"):
        cuda.run(sp.Callable(lambda o, x, y: o.submit(ints, x, y, 2.5), [sp.IN, sp.INOUT]), [x, y])
    with pytest.raises(sp.ArgumentError, match="declares 1 scalar"):
        cuda.run(sp.Callable(lambda o, x, y: o.submit(SAXPY_K, x, y), [sp.IN, sp.INOUT]), [x, y])
    with pytest.raises(sp.ArgumentError, match="grid\\[0\\] = 0"):
        sp.Launch(grid=0)
    with pytest.raises(sp.ArgumentError, match="exactly one of source, ptx and cubin"):
        sp.CudaCode(SAXPY, ptx="x", entry="t_saxpy", launch=sp.Launch(1))


def test_an_external_write_through_an_export_is_seen_by_the_next_run(cuda, fake_vendor):
    """A consumer may write through an export: the exported allocation's host view is stale at
    the next run, so the orchestrator reads what the consumer wrote."""
    lib = _lib(fake_vendor)
    res = sp.ResidentTaskArgs(cuda)
    t = res.add("lens", np.array([1, 2, 3, 4], np.int32))
    seen = []

    def orch(o, lens):
        seen.append(o.read_tensor(lens).tolist())

    call = sp.Callable(orch, [sp.IN])
    cuda.run(call, [t])
    data = t.__cuda_array_interface__["data"][0]
    p = lib_translate(lib, data, 16)
    ctypes.memmove(p, np.array([9, 9, 9, 9], np.int32).ctypes.data, 16)  # the consumer writes
    cuda.run(call, [t])
    assert seen == [[1, 2, 3, 4], [9, 9, 9, 9]]
    del t
    gc.collect()
    res.release()


@pytest.mark.parametrize("arm", pa.ARMS)
def test_paged_attention_runs_every_task_on_the_device(cuda, arm):
    params = dict(pa._BASES[1][1], arm=arm)
    x = pa.make_inputs(params)
    names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
    golden = pa.golden_paged_attention(*(x[n] for n in names), x["scale"])
    with sp.ResidentTaskArgs(cuda) as res:
        args = [res.add(n, x[n]) if n in pa.RESIDENT[arm] else x[n] for n in names]
        for _ in range(2):
            out = np.zeros_like(x["out"])
            r = cuda.run(pa.CALLABLE, [*args, out, x["scale"]])
            np.testing.assert_allclose(out, golden, rtol=1e-3, atol=1e-3)
            c = r.counters
            assert c["host_path_tasks"] == 0 and c["device_tasks"] == c["tasks"] > 0
            assert c["device_launches"] < c["tasks"]
        del args
    # The six entries come from one source: one module, loaded once.
    assert cuda.stats()["module_loads"] == 1


@pytest.mark.parametrize("arm", pu.ARMS)
@pytest.mark.parametrize("case", ["CaseVarSeq4", "CaseTwoGroups", "CaseEmpty"])
def test_unrolled_paged_attention_runs_every_task_on_the_device(cuda, arm, case):
    """Every task of the unrolled graph is a device launch (no host path), golden holds over
    rounds, and a batch of groups is one launch (the updates of one sequence: one per level)."""
    params = dict(pu._BASES)[case]
    x = pu.make_inputs(params)
    names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
    golden = pu.golden_paged_attention(*(x[n] for n in names), x["scale"])
    with sp.ResidentTaskArgs(cuda) as res:
        args = [res.add(n, x[n]) if n in pu.RESIDENT[arm] else x[n] for n in names]
        for _ in range(2):
            out = np.zeros_like(x["out"])
            r = cuda.run(pu.CALLABLE, [*args, out, x["scale"]])
            np.testing.assert_allclose(out, golden, rtol=1e-3, atol=1e-3)
            c = r.counters
            assert c["host_path_tasks"] == 0 and c["device_tasks"] == c["tasks"] > 0
            assert c["tasks"] == pu.tasks_per_round(
                x["context_lens"], params["block_size"], params["num_heads"]
            )
            assert c["device_launches"] <= c["submits"] + 1  # two groups of one sequence: 2 levels
        del args


def test_the_shipped_cuda_sources_compile_with_the_real_nvrtc(fake_vendor):
    """The CUDA C++ the package ships (paged attention's six entries, the unrolled one's five, the
    launches benchmark's kernel) compiles with the real NVRTC, found through the runtime's own
    search (the wheel's folder on ``sys.path``; the fake NVRTC is not used here). The fake libcuda
    then refuses the real cubin, which is how this test knows it got that far: a compile error
    would be a ``CompileError``."""
    from simpler import _cuda

    if not _cuda.nvrtc_dirs():
        pytest.skip("the nvidia-cuda-nvrtc wheel is not installed (requirements/dev.txt)")
    fake_vendor.use("cuda")
    script = (
        "import numpy as np, simpler as sp\n"
        "from simpler.tools import benchmarks\n"
        "from simpler.workloads import paged_attention as pa, paged_attention_cuda as pac\n"
        "from simpler.workloads import paged_attention_unroll as pu, paged_attention_unroll_cuda as puc\n"
        "bench = benchmarks.LAUNCH_SOURCE, benchmarks.LAUNCH_ENTRY\n"
        "shipped = [(pac.SOURCE, e) for e in pac.KERNELS] + [(puc.SOURCE, e) for e in puc.KERNELS]\n"
        "shipped += [bench]\n"
        "unrolled = pu.kernels_for(16, 128, 128, 64)['qk']\n"
        "used = {k.cuda.source for k in (pa.QK, pa.ZERO, unrolled, benchmarks.LAUNCH_KERNEL)}\n"
        "assert used == {s for s, _ in shipped}\n"
        "with sp.Worker('cuda') as w:\n"
        "    for src, entry in shipped:\n"
        "        code = sp.CudaCode(src, entry=entry, launch=sp.Launch(1))\n"
        "        k = sp.Kernel(lambda x: None, [sp.INOUT], cuda=code)\n"
        "        try:\n"
        "            call = sp.Callable(lambda o, x: o.submit(k, x), [sp.INOUT])\n"
        "            w.run(call, [np.zeros(4, np.float32)])\n"
        "        except sp.DeviceError as e:\n"
        "            print(entry, e.call, e.code_name)\n"
        "print(sp.device_code_stats()['compiles'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SIMPLER_NVRTC_LIB"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    loads = [line for line in lines if line.endswith("cuModuleLoadData CUDA_ERROR_INVALID_IMAGE")]
    assert len(loads) == 12, out.stdout  # every kernel compiled, then its real cubin was refused
    # three sources: paged attention's and the unrolled one's (once each) and the benchmark's
    assert lines[-2] == "3", out.stdout


def test_reading_an_export_while_another_thread_waits_for_the_device_does_not_hang(cuda, fake_vendor):
    """A thread in a run waits for the device (its stream held by the fake) while the fake's
    stream thread will need the GIL to run the host kernel; meanwhile another thread reads an
    export's stream and orders a stream after the worker's: neither may wait for the device with
    the GIL held (that would deadlock here, and stall every Python thread on a GPU)."""
    lib = _lib(fake_vendor)
    t = cuda.malloc(64).tensor((16,), "float32")
    x, y = np.ones(16, np.float32), np.zeros(16, np.float32)
    call = sp.Callable(lambda o, x, y: o.submit(SAXPY_K, x, y, 2.0), [sp.IN, sp.INOUT])
    th = threading.Thread(target=lambda: cuda.run(call, [x, y]))
    # A hang is a failure with tracebacks, not a stuck test run.
    faulthandler.dump_traceback_later(60, exit=True)
    lib.fake_cuda_hold_streams(1)
    release = threading.Timer(0.5, lambda: lib.fake_cuda_hold_streams(0))
    try:
        th.start()
        release.start()  # meanwhile the run waits for the held stream, holding the device's lock
        while th.is_alive():
            assert t.__cuda_array_interface__["stream"] > 2
            t.__dlpack__(stream=2)  # the capsule is dropped at once
            time.sleep(0.001)
        th.join()
    finally:
        release.cancel()
        release.join()
        lib.fake_cuda_hold_streams(0)
        faulthandler.cancel_dump_traceback_later()
    np.testing.assert_array_equal(y, 2 * x)
    del t
    gc.collect()


def test_an_nvrtc_newer_than_the_driver_is_refused_with_the_fix(cuda, monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_DRIVER_VERSION", "12040")
    k = saxpy_kernel(SAXPY + "\n// compiled for the CUDA 12.4 driver\n")
    x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
    expected = r"makes code for CUDA 13 drivers, and this driver is CUDA 12\.4"
    with pytest.raises(sp.CompileError, match=expected):
        cuda.run(sp.Callable(lambda o, x, y: o.submit(k, x, y, 1.0), [sp.IN, sp.INOUT]), [x, y])


def test_a_failing_device_array_kernel_still_waits_for_the_device(cuda, fake_vendor):
    def boom(x):
        raise RuntimeError("kernel failed")

    k = sp.Kernel(boom, [sp.INOUT], device_arrays=True)
    before = len(fake_vendor.cuda_log())
    with pytest.raises(RuntimeError, match="kernel failed"):
        cuda.run(sp.Callable(lambda o, x: o.submit(k, x), [sp.INOUT]), [np.zeros(4, np.float32)])
    assert any(line.startswith("cuCtxSynchronize") for line in fake_vendor.cuda_log()[before:])


def test_a_refused_close_does_not_hide_the_blocks_exception(fake_vendor):
    with pytest.warns(RuntimeWarning, match="leaving the worker's block: close: .* live export"):
        with pytest.raises(KeyError, match="the block's own error"):
            with fake_vendor.worker("cuda") as w:
                t = w.malloc(64).tensor((16,), "float32")
                _ = t.__cuda_array_interface__
                raise KeyError("the block's own error")
    del t
    gc.collect()
    w.close()


def test_code_that_reads_contiguous_views_refuses_other_layouts_at_submit(cuda):
    code = sp.CudaCode(SAXPY, entry="t_saxpy", launch=_n_launch, scalars=("float64",), contiguous=True)
    k = sp.Kernel(_saxpy_fn, [sp.IN, sp.INOUT], cuda=code)
    assert code.contiguous
    x, y = np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32)

    def column(o, x, y):  # a strided view: one column of each
        o.submit(k, x.view([4, 1], [0, 0]), y.view([4, 1], [0, 3]), 1.0)

    with pytest.raises(sp.ArgumentError, match="tensor 0 is not a row-major contiguous view"):
        cuda.run(sp.Callable(column, [sp.IN, sp.INOUT]), [x, y])

    def rows(o, x, y):  # whole rows are contiguous: accepted, batched or not
        o.submit_many(
            k, x.views([1, 8], [[i, 0] for i in range(4)]), y.views([1, 8], [[i, 0] for i in range(4)]), 2.0
        )

    cuda.run(sp.Callable(rows, [sp.IN, sp.INOUT]), [x, y])
    np.testing.assert_array_equal(y, 2 * x)


#: y[t] = 2 * x[t], one element per task; the per-task grid z is the launch's (a kernel of this
#: shape would split each task's work over gz blocks).
DOUBLE = r"""
struct double_row {{ const float* x; float* y; }};
extern "C" __global__ void t_double_gz{gz}(const double_row* rows) {{
    const double_row r = rows[blockIdx.z / {gz}];
    if (blockIdx.z % {gz} == 0 && threadIdx.x == 0) *r.y = 2.0f * *r.x;
}}
"""

#: Per launch of a t_double entry: (per-task gz, launch grid z, first task, tasks).
DOUBLE_LAUNCHES: list[tuple[int, int, int, int]] = []


def _double_impl(gz: int):
    def run(launch: fake_cuda.Launch) -> None:
        rows = launch.rows(2, gz)
        n = len(rows)
        x0, y0 = int(rows[0, 0]), int(rows[0, 1])
        # The tasks of one launch are consecutive elements here: one vectorized step for them all.
        assert (rows[:, 0] == x0 + 4 * np.arange(n, dtype=np.uint64)).all()
        assert (rows[:, 1] == y0 + 4 * np.arange(n, dtype=np.uint64)).all()
        launch.array(y0, (n,), F32)[...] = 2 * launch.array(x0, (n,), F32)
        DOUBLE_LAUNCHES.append((gz, launch.grid[2], x0, n))

    return run


for _gz in (1, 3, 7):
    fake_cuda.host_impl(f"t_double_gz{_gz}")(_double_impl(_gz))


@pytest.mark.parametrize(("gz", "n"), [(1, 65_536), (1, 2 * 65_535 + 1), (3, 2 * 21_845 + 2), (7, 9_363)])
def test_a_batch_past_the_grid_z_limit_is_split_into_full_launches(cuda, gz, n):
    """A batch of more tasks than one launch covers (65,535 // gz, the grid's z limit over the
    per-task z) runs as ceil(n / (65,535 // gz)) launches, each but the last full, none with a
    grid z past 65,535, covering every task once, in order."""
    code = sp.CudaCode(DOUBLE.format(gz=gz), entry=f"t_double_gz{gz}", launch=sp.Launch(grid=(1, 1, gz)))
    k = sp.Kernel(lambda x, y: np.multiply(x, 2, out=y), [sp.IN, sp.OUT], name="double", cuda=code)
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    rows = np.arange(n, dtype=np.int64)[:, None]
    DOUBLE_LAUNCHES.clear()

    def orch(o, x, y):
        o.submit_many(k, x.views([1], rows), y.views([1], rows))

    r = cuda.run(sp.Callable(orch, [sp.IN, sp.OUT]), [x, y])
    per = 65_535 // gz
    launches = -(-n // per)
    sizes = [min(per, n - i * per) for i in range(launches)]
    assert (r.counters["device_launches"], r.counters["device_tasks"]) == (launches, n)
    assert [(g, z, t) for g, z, _, t in DOUBLE_LAUNCHES] == [(gz, gz * s, s) for s in sizes]
    assert all(z <= 65_535 for _, z, _, _ in DOUBLE_LAUNCHES)
    starts = [x0 for _, _, x0, _ in DOUBLE_LAUNCHES]
    assert [s - starts[0] for s in starts] == [4 * per * i for i in range(launches)]
    np.testing.assert_array_equal(y, 2 * x)
