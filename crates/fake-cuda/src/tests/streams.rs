//! Streams and events: order, asynchrony, pinned and pageable copies, waits, draining.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use super::*;
use crate::exec::CU_STREAM_NON_BLOCKING;

/// Releases the stream hold after `ms` milliseconds, from another thread.
fn release_hold_after(ms: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        fake_cuda_hold_streams(0);
    })
}

#[test]
fn streams_run_in_order_after_the_call_returned() {
    let dev = Dev::new();
    let d = alloc(64).unwrap();
    let s = stream(CU_STREAM_NON_BLOCKING);
    let data: Vec<u8> = (0..64).collect();
    let mut out = vec![0u8; 64];
    fake_cuda_hold_streams(1);
    // SAFETY: `data` and `out` hold 64 bytes and outlive the synchronize below.
    unsafe {
        let rc = cuMemcpyHtoDAsync_v2(d, data.as_ptr().cast(), 64, s);
        assert_eq!(rc, CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(d + 8, 0xEE, 8, s), CUDA_SUCCESS);
        let rc = cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), d, 64, s);
        assert_eq!(rc, CUDA_SUCCESS);
    }
    // Nothing ran: a caller that forgets to synchronize sees stale data.
    assert_eq!(out, [0; 64]);
    assert_eq!(peek(d, 64), [0xCD; 64]);
    assert_eq!(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    // The synchronous calls do not wait for a non-blocking stream (the hold would hang them).
    assert_eq!(read(d, 4).unwrap(), [0xCD; 4]);
    fake_cuda_hold_streams(0);
    assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_eq!(cuStreamQuery(s), CUDA_SUCCESS);
    let mut want = data.clone();
    want[8..16].fill(0xEE);
    assert_eq!(
        out, want,
        "in order: the copy back saw both earlier operations"
    );

    // They do wait for a blocking stream, as the legacy stream does.
    let b = stream(0);
    fake_cuda_hold_streams(1);
    assert_eq!(cuMemsetD8Async(d, 0x11, 64, b), CUDA_SUCCESS);
    let releaser = release_hold_after(30);
    assert_eq!(read(d, 64).unwrap(), [0x11; 64]);
    releaser.join().unwrap();
    // The built-in streams are queues too: the call returns before the work ran.
    for builtin in [0usize, 1, 2] {
        let h = builtin as CUstream;
        assert_eq!(fake_cuda_hold_stream(h, 1), CUDA_SUCCESS);
        assert_eq!(cuMemsetD8Async(d, builtin as u8, 4, h), CUDA_SUCCESS);
        assert_eq!(peek(d, 4), [0x11; 4], "stream {builtin:#x}: not run yet");
        assert_eq!(cuStreamQuery(h), CUDA_ERROR_NOT_READY);
        assert_eq!(fake_cuda_hold_stream(h, 0), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(h), CUDA_SUCCESS);
        assert_eq!(cuStreamQuery(h), CUDA_SUCCESS);
        assert_eq!(peek(d, 4), [builtin as u8; 4]);
        assert_eq!(cuMemsetD8_v2(d, 0x11, 4), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(ptr::null_mut()), CUDA_SUCCESS);
    }

    // Destroy drains the stream; the handle is dead afterwards.
    fake_cuda_hold_streams(1);
    assert_eq!(cuMemsetD8Async(d, 0x22, 64, s), CUDA_SUCCESS);
    let releaser = release_hold_after(30);
    assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    assert_eq!(peek(d, 64), [0x22; 64]);
    releaser.join().unwrap();
    assert_eq!(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(cuMemsetD8Async(d, 0, 1, s), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(cuStreamDestroy_v2(s), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(
        cuStreamDestroy_v2(ptr::null_mut()),
        CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(cuStreamDestroy_v2(b), CUDA_SUCCESS);

    // Call-time checks.
    let mut bad: CUstream = ptr::null_mut();
    // SAFETY: `bad` is a valid out pointer; `out` holds 64 bytes.
    unsafe {
        assert_eq!(cuStreamCreate(&mut bad, 2), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuStreamCreate(ptr::null_mut(), 0), CUDA_ERROR_INVALID_VALUE);
        let rc = cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), d + 32, 64, ptr::null_mut());
        assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
    }
    assert_eq!(
        cuMemsetD8Async(d + 64, 0, 1, ptr::null_mut()),
        CUDA_ERROR_INVALID_VALUE
    );
    std::thread::spawn(move || {
        assert_eq!(
            cuMemsetD8Async(d, 0, 1, ptr::null_mut()),
            CUDA_ERROR_INVALID_CONTEXT
        );
        assert_eq!(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    })
    .join()
    .unwrap();
    let log = call_log();
    let line = format!(
        "cuMemcpyHtoDAsync_v2 {d:#x} 64 src={:#x} stream={:#x} pageable -> 0\n",
        data.as_ptr() as usize,
        s as usize
    );
    assert!(log.contains(&line), "{log}");
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}

#[test]
fn pinned_copies_read_the_host_when_they_run_pageable_ones_at_call_time() {
    let dev = Dev::new();
    let d = alloc(8192).unwrap();
    let s = stream(CU_STREAM_NON_BLOCKING);
    let mut pinned = vec![1u8; 8192];
    let mut pageable = vec![1u8; 4096];
    let p = pinned.as_mut_ptr().cast::<c_void>();
    assert_eq!(cuMemHostRegister_v2(p, 4096, 0), CUDA_SUCCESS);
    fake_cuda_hold_streams(1);
    // SAFETY: the buffers hold 8192 and 4096 bytes and outlive the synchronize below.
    unsafe {
        assert_eq!(cuMemcpyHtoDAsync_v2(d, p, 4096, s), CUDA_SUCCESS);
        let rc = cuMemcpyHtoDAsync_v2(d + 4096, pageable.as_ptr().cast(), 4096, s);
        assert_eq!(rc, CUDA_SUCCESS);
        // Partly outside the registration: pageable.
        let rc = cuMemcpyHtoDAsync_v2(d + 8000, p.byte_add(4000).cast_const(), 192, s);
        assert_eq!(rc, CUDA_SUCCESS);
    }
    pinned.fill(2);
    pageable.fill(2);
    fake_cuda_hold_streams(0);
    assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_eq!(peek(d, 4096), [2; 4096], "pinned: read when the copy ran");
    assert_eq!(
        peek(d + 4096, 3904),
        [1; 3904],
        "pageable: copied at call time"
    );
    assert_eq!(peek(d + 8000, 96), [1; 96]);
    assert_eq!(peek(d + 8096, 96), [1; 96]);
    let log = call_log();
    assert!(
        log.contains(&format!(
            "cuMemcpyHtoDAsync_v2 {d:#x} 4096 src={:#x} stream={:#x} pinned -> 0",
            p as usize, s as usize
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("cuMemcpyHtoDAsync_v2 {:#x} 192", d + 8000)),
        "{log}"
    );
    assert_eq!(cuMemHostUnregister(p), CUDA_SUCCESS);
    assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}

static OPEN: AtomicBool = AtomicBool::new(false);

/// The host kernel of `gate()`: returns once [`OPEN`] is set.
unsafe extern "C-unwind" fn gate_kernel(
    _: *mut c_void,
    _: *const c_char,
    _: *const u64,
    _: c_uint,
    _: *const c_uint,
    _: *const c_uint,
    _: c_uint,
) -> c_int {
    while !OPEN.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    0
}

#[test]
fn events_order_work_across_streams() {
    let dev = Dev::new();
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let gate = function(m, c"gate").unwrap();
    register(c"gate", gate_kernel);
    OPEN.store(false, Ordering::SeqCst);
    let d = alloc(64).unwrap();
    let (s1, s2) = (
        stream(CU_STREAM_NON_BLOCKING),
        stream(CU_STREAM_NON_BLOCKING),
    );
    let (e, never) = (event(), event());
    let mut out = vec![0u8; 64];
    assert_eq!(launch(gate, [1; 3], [1; 3], s1, &[]), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d, 7, 64, s1), CUDA_SUCCESS);
    assert_eq!(cuEventRecord(e, s1), CUDA_SUCCESS);
    assert_eq!(
        cuStreamWaitEvent(s2, never, 0),
        CUDA_SUCCESS,
        "never recorded: no wait"
    );
    assert_eq!(cuStreamWaitEvent(s2, e, 0), CUDA_SUCCESS);
    // SAFETY: `out` holds 64 bytes and outlives the synchronize below.
    let rc = unsafe { cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), d, 64, s2) };
    assert_eq!(rc, CUDA_SUCCESS);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(out, [0; 64], "s2 waits for the event");
    assert_eq!(cuEventQuery(e), CUDA_ERROR_NOT_READY);
    assert_eq!(cuEventQuery(never), CUDA_SUCCESS);
    assert_eq!(cuStreamQuery(s2), CUDA_ERROR_NOT_READY);
    OPEN.store(true, Ordering::SeqCst);
    assert_eq!(cuEventSynchronize(e), CUDA_SUCCESS);
    assert_eq!(cuEventQuery(e), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS);
    assert_eq!(out, [7; 64]);
    // Recording on a built-in stream marks a point of its queue, complete once it ran.
    assert_eq!(fake_cuda_hold_stream(ptr::null_mut(), 1), CUDA_SUCCESS);
    assert_eq!(cuEventRecord(e, ptr::null_mut()), CUDA_SUCCESS);
    assert_eq!(
        cuEventQuery(e),
        CUDA_ERROR_NOT_READY,
        "a timing event's marker is queued"
    );
    assert_eq!(fake_cuda_hold_stream(ptr::null_mut(), 0), CUDA_SUCCESS);
    assert_eq!(cuEventSynchronize(e), CUDA_SUCCESS);
    assert_eq!(cuEventQuery(e), CUDA_SUCCESS);
    assert_eq!(cuStreamWaitEvent(s2, e, 1), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(cuStreamWaitEvent(ptr::null_mut(), e, 0), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(ptr::null_mut()), CUDA_SUCCESS);
    let mut bad: CUevent = ptr::null_mut();
    // SAFETY: `bad` is a valid out pointer.
    let rc = unsafe { cuEventCreate(&mut bad, 4) };
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
    assert_eq!(fake_cuda_live_events(), 2);
    for ev in [e, never] {
        assert_eq!(cuEventDestroy_v2(ev), CUDA_SUCCESS);
        assert_eq!(cuEventQuery(ev), CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuEventRecord(ev, s1), CUDA_ERROR_INVALID_HANDLE);
    }
    // Another device's stream is refused (and counted).
    let ctx1 = retain(1);
    assert_eq!(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(s1), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(fake_cuda_violations(), 1);
    with_state(|st| st.violations = 0);
    assert_eq!(cuCtxSetCurrent(dev.ctx), CUDA_SUCCESS);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
    for s in [s1, s2] {
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    }
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}

static SLOW_WRITE: AtomicI32 = AtomicI32::new(-1);

/// The host kernel of `slow_write(p, v)`: after 50 ms, stores `v` at `p` (700 if `p` is gone).
unsafe extern "C-unwind" fn slow_write_kernel(
    _: *mut c_void,
    _: *const c_char,
    params: *const u64,
    _: c_uint,
    _: *const c_uint,
    _: *const c_uint,
    _: c_uint,
) -> c_int {
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: `slow_write` has two parameters.
    let (p, v) = unsafe { (*params, *params.add(1)) };
    let host = fake_cuda_translate(p, 8);
    let rc = if host.is_null() {
        CUDA_ERROR_ILLEGAL_ADDRESS
    } else {
        // SAFETY: `host` has 8 bytes of device memory behind it.
        unsafe { host.cast::<u64>().write_unaligned(v) };
        0
    };
    SLOW_WRITE.store(rc, Ordering::SeqCst);
    rc
}

#[test]
fn mem_free_waits_for_every_stream() {
    let dev = Dev::new();
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let f = function(m, c"slow_write").unwrap();
    register(c"slow_write", slow_write_kernel);
    SLOW_WRITE.store(-1, Ordering::SeqCst);
    let d = alloc(8).unwrap();
    let s = stream(CU_STREAM_NON_BLOCKING);
    let t = Instant::now();
    assert_eq!(launch(f, [1; 3], [1; 3], s, &[d, 42]), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert_eq!(
        SLOW_WRITE.load(Ordering::SeqCst),
        0,
        "the kernel ran before the free"
    );
    assert_eq!(fake_cuda_poisoned(0), 0);
    assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    dev.finish();
}

/// Releases the hold of stream `h` (resolved on the spawned thread: a created stream only)
/// after `ms` milliseconds.
fn release_stream_after(h: CUstream, ms: u64) -> std::thread::JoinHandle<()> {
    let h = h as usize;
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        assert_eq!(fake_cuda_hold_stream(h as CUstream, 0), CUDA_SUCCESS);
    })
}

/// Releases the calling thread's hold of the legacy stream after `ms` milliseconds: the
/// spawned thread binds `ctx` to name the same device's legacy stream.
fn release_legacy_after(ctx: CUcontext, ms: u64) -> std::thread::JoinHandle<()> {
    let ctx = ctx as usize;
    std::thread::spawn(move || {
        assert_eq!(cuCtxSetCurrent(ctx as CUcontext), CUDA_SUCCESS);
        std::thread::sleep(Duration::from_millis(ms));
        assert_eq!(
            fake_cuda_hold_stream(CU_STREAM_LEGACY as CUstream, 0),
            CUDA_SUCCESS
        );
        assert_eq!(cuCtxSetCurrent(ptr::null_mut()), CUDA_SUCCESS);
    })
}

use crate::exec::{CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};

#[test]
fn a_non_blocking_stream_does_not_see_legacy_work_it_did_not_wait_for() {
    let dev = Dev::new();
    let legacy = CU_STREAM_LEGACY as CUstream;
    let d = alloc(64).unwrap();
    let nb = stream(CU_STREAM_NON_BLOCKING);
    let e = event();
    let data = [0x42u8; 64];
    let mut stale = [0u8; 64];
    let mut fresh = [0u8; 64];
    // A consumer library writes on the legacy stream; its copy is still queued.
    assert_eq!(fake_cuda_hold_stream(legacy, 1), CUDA_SUCCESS);
    // SAFETY: `data` holds 64 bytes (pageable: copied at call time).
    let rc = unsafe { cuMemcpyHtoDAsync_v2(d, data.as_ptr().cast(), 64, legacy) };
    assert_eq!(rc, CUDA_SUCCESS);
    // A read on a non-blocking stream that did not wait for it runs anyway: stale bytes.
    // SAFETY: `stale` holds 64 bytes and outlives the synchronize below.
    let rc = unsafe { cuMemcpyDtoHAsync_v2(stale.as_mut_ptr().cast(), d, 64, nb) };
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(nb), CUDA_SUCCESS);
    assert_eq!(stale, [0xCD; 64], "not ordered after the legacy stream");
    // Recording an event on the legacy stream and waiting for it orders the read.
    assert_eq!(cuEventRecord(e, legacy), CUDA_SUCCESS);
    assert_eq!(cuStreamWaitEvent(nb, e, 0), CUDA_SUCCESS);
    // SAFETY: `fresh` holds 64 bytes and outlives the synchronize below.
    let rc = unsafe { cuMemcpyDtoHAsync_v2(fresh.as_mut_ptr().cast(), d, 64, nb) };
    assert_eq!(rc, CUDA_SUCCESS);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        cuStreamQuery(nb),
        CUDA_ERROR_NOT_READY,
        "waits for the legacy stream"
    );
    assert_eq!(cuEventQuery(e), CUDA_ERROR_NOT_READY);
    assert_eq!(fake_cuda_hold_stream(legacy, 0), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(nb), CUDA_SUCCESS);
    assert_eq!(fresh, data, "ordered after the legacy stream's write");

    // The same with a launch writing on the legacy stream (behind a gate kernel).
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let (gate, fill) = (function(m, c"gate").unwrap(), function(m, c"fill").unwrap());
    register(c"gate", gate_kernel);
    register(c"fill", fill_kernel);
    OPEN.store(false, Ordering::SeqCst);
    assert_eq!(launch(gate, [1; 3], [1; 3], legacy, &[]), CUDA_SUCCESS);
    assert_eq!(
        launch(fill, [1; 3], [1; 3], legacy, &[d, 64, 7]),
        CUDA_SUCCESS
    );
    // SAFETY: `stale` holds 64 bytes and outlives the synchronize below.
    let rc = unsafe { cuMemcpyDtoHAsync_v2(stale.as_mut_ptr().cast(), d, 64, nb) };
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(nb), CUDA_SUCCESS);
    assert_eq!(stale, data, "the fill behind the gate has not run");
    assert_eq!(cuEventRecord(e, ptr::null_mut()), CUDA_SUCCESS);
    assert_eq!(cuStreamWaitEvent(nb, e, 0), CUDA_SUCCESS);
    // SAFETY: `fresh` holds 64 bytes and outlives the synchronize below.
    let rc = unsafe { cuMemcpyDtoHAsync_v2(fresh.as_mut_ptr().cast(), d, 64, nb) };
    assert_eq!(rc, CUDA_SUCCESS);
    OPEN.store(true, Ordering::SeqCst);
    assert_eq!(cuStreamSynchronize(nb), CUDA_SUCCESS);
    assert_eq!(fresh, [7; 64]);

    // The synchronous calls are legacy-stream work too: a memset returns before it ran, a
    // pageable copy once its bytes are staged, a pinned copy and a copy back once they ran.
    assert_eq!(fake_cuda_hold_stream(legacy, 1), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8_v2(d, 1, 64), CUDA_SUCCESS);
    let mut staged = [2u8; 32];
    // SAFETY: `staged` holds 32 bytes.
    let rc = unsafe { cuMemcpyHtoD_v2(d, staged.as_ptr().cast(), 32) };
    assert_eq!(rc, CUDA_SUCCESS);
    staged.fill(3);
    assert_eq!(peek(d, 64), [7; 64], "both still queued");
    let mut pinned = vec![4u8; 8192];
    let p = pinned.as_mut_ptr().cast::<c_void>();
    assert_eq!(cuMemHostRegister_v2(p, 8192, 0), CUDA_SUCCESS);
    let t = Instant::now();
    let releaser = release_legacy_after(dev.ctx, 30);
    // SAFETY: `pinned` holds 8192 bytes.
    let rc = unsafe { cuMemcpyHtoD_v2(d + 32, p.cast_const(), 16) };
    assert_eq!(rc, CUDA_SUCCESS);
    assert!(
        t.elapsed() >= Duration::from_millis(30),
        "a pinned copy waits"
    );
    releaser.join().unwrap();
    assert_eq!(
        read(d, 64).unwrap(),
        [[2u8; 32].as_slice(), &[4; 16], &[1; 16]].concat(),
        "in legacy-stream order, the staged bytes as they were at the call"
    );
    assert_eq!(cuMemHostUnregister(p), CUDA_SUCCESS);
    // ... and they never wait for a non-blocking stream.
    assert_eq!(fake_cuda_hold_stream(nb, 1), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d, 9, 64, nb), CUDA_SUCCESS);
    assert_eq!(read(d, 4).unwrap(), [2; 4]);
    assert_eq!(fake_cuda_hold_stream(nb, 0), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(nb), CUDA_SUCCESS);

    assert_eq!(
        fake_cuda_live_streams(),
        1,
        "the built-in streams are not counted"
    );
    assert_eq!(cuEventDestroy_v2(e), CUDA_SUCCESS);
    assert_eq!(cuStreamDestroy_v2(nb), CUDA_SUCCESS);
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}

#[test]
fn blocking_streams_and_the_legacy_stream_wait_for_each_other() {
    let dev = Dev::new();
    let legacy = CU_STREAM_LEGACY as CUstream;
    let per_thread = CU_STREAM_PER_THREAD as CUstream;
    let d = alloc(64).unwrap();
    let b = stream(0);

    // Work on a blocking stream waits for the legacy stream's work queued before it.
    assert_eq!(fake_cuda_hold_stream(legacy, 1), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d, 1, 64, legacy), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d, 2, 8, b), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d + 8, 3, 8, per_thread), CUDA_SUCCESS);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(cuStreamQuery(b), CUDA_ERROR_NOT_READY);
    assert_eq!(cuStreamQuery(per_thread), CUDA_ERROR_NOT_READY);
    assert_eq!(peek(d, 64), [0xCD; 64]);
    assert_eq!(fake_cuda_hold_stream(legacy, 0), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(b), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(per_thread), CUDA_SUCCESS);
    assert_eq!(peek(d, 8), [2; 8]);
    assert_eq!(peek(d + 8, 8), [3; 8]);

    // Legacy-stream work waits for the blocking streams' work (per-thread ones included).
    assert_eq!(fake_cuda_hold_stream(b, 1), CUDA_SUCCESS);
    assert_eq!(fake_cuda_hold_stream(per_thread, 1), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d, 4, 8, b), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d + 8, 5, 8, per_thread), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d, 6, 4, legacy), CUDA_SUCCESS);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(cuStreamQuery(legacy), CUDA_ERROR_NOT_READY);
    assert_eq!(peek(d, 4), [2; 4], "the legacy memset waits");
    assert_eq!(fake_cuda_hold_stream(b, 0), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(b), CUDA_SUCCESS);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(
        peek(d, 4),
        [4; 4],
        "still waiting for the per-thread stream"
    );
    assert_eq!(fake_cuda_hold_stream(per_thread, 0), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(legacy), CUDA_SUCCESS);
    assert_eq!(
        peek(d, 16),
        [[6u8; 4].as_slice(), &[4; 4], &[5; 8]].concat()
    );

    // Per-thread streams are per thread: another thread's is its own, and not held.
    assert_eq!(fake_cuda_hold_stream(per_thread, 1), CUDA_SUCCESS);
    let ctx = dev.ctx as usize;
    std::thread::spawn(move || {
        assert_eq!(cuCtxSetCurrent(ctx as CUcontext), CUDA_SUCCESS);
        let pt = CU_STREAM_PER_THREAD as CUstream;
        assert_eq!(cuMemsetD8Async(d + 32, 8, 8, pt), CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(pt), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ptr::null_mut()), CUDA_SUCCESS);
    })
    .join()
    .unwrap();
    assert_eq!(peek(d + 32, 8), [8; 8]);
    assert_eq!(fake_cuda_hold_stream(per_thread, 0), CUDA_SUCCESS);
    // The other thread's stream is dropped once its executor finished.
    let t = Instant::now();
    while exec::lock().streams.len() > 3 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        exec::lock().streams.len(),
        3,
        "b, the legacy stream and this thread's per-thread stream"
    );
    assert_eq!(fake_cuda_live_streams(), 1);

    // The global hold holds created streams only.
    fake_cuda_hold_streams(1);
    assert_eq!(cuMemsetD8Async(d, 9, 4, legacy), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(legacy), CUDA_SUCCESS);
    assert_eq!(peek(d, 4), [9; 4]);
    fake_cuda_hold_streams(0);
    assert_eq!(cuStreamDestroy_v2(b), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}

#[test]
fn one_stream_can_be_held() {
    let dev = Dev::new();
    let d = alloc(64).unwrap();
    let (s1, s2) = (
        stream(CU_STREAM_NON_BLOCKING),
        stream(CU_STREAM_NON_BLOCKING),
    );
    assert_eq!(fake_cuda_hold_stream(s1, 1), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d, 1, 32, s1), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d + 32, 2, 32, s2), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS);
    assert_eq!(peek(d, 64), [[0xCDu8; 32].as_slice(), &[2; 32]].concat());
    assert_eq!(cuStreamQuery(s1), CUDA_ERROR_NOT_READY);
    // The global release leaves a stream held on its own held.
    fake_cuda_hold_streams(1);
    fake_cuda_hold_streams(0);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(cuStreamQuery(s1), CUDA_ERROR_NOT_READY);
    let releaser = release_stream_after(s1, 20);
    assert_eq!(cuStreamSynchronize(s1), CUDA_SUCCESS);
    releaser.join().unwrap();
    assert_eq!(peek(d, 32), [1; 32]);
    // Unknown handles; built-in handles need a current context; reset releases every hold.
    assert_eq!(
        fake_cuda_hold_stream(0x1234 as CUstream, 1),
        CUDA_ERROR_INVALID_HANDLE
    );
    std::thread::spawn(|| {
        assert_eq!(
            fake_cuda_hold_stream(ptr::null_mut(), 1),
            CUDA_ERROR_INVALID_CONTEXT
        );
    })
    .join()
    .unwrap();
    assert_eq!(fake_cuda_hold_stream(s2, 1), CUDA_SUCCESS);
    assert_eq!(fake_cuda_hold_stream(ptr::null_mut(), 1), CUDA_SUCCESS);
    fake_cuda_reset();
    assert_eq!(cuMemsetD8Async(d, 3, 8, s2), CUDA_SUCCESS);
    assert_eq!(cuMemsetD8Async(d + 8, 4, 8, ptr::null_mut()), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(s2), CUDA_SUCCESS);
    assert_eq!(cuStreamSynchronize(ptr::null_mut()), CUDA_SUCCESS);
    assert_eq!(peek(d, 16), [[3u8; 8].as_slice(), &[4; 8]].concat());
    for s in [s1, s2] {
        assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
        assert_eq!(fake_cuda_hold_stream(s, 1), CUDA_ERROR_INVALID_HANDLE);
    }
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}

/// Creates an event with `flags`.
fn event_with(flags: c_uint) -> CUevent {
    let mut e: CUevent = ptr::null_mut();
    // SAFETY: `e` is a valid out pointer.
    assert_eq!(unsafe { cuEventCreate(&mut e, flags) }, CUDA_SUCCESS);
    e
}

/// `cuEventElapsedTime` (or its `_v2` name with `v2`): the milliseconds, or the code.
fn elapsed_ms(a: CUevent, b: CUevent, v2: bool) -> Result<f32, CUresult> {
    let mut ms = -1.0f32;
    // SAFETY: `ms` is a valid out pointer.
    let rc = unsafe {
        if v2 {
            cuEventElapsedTime_v2(&mut ms, a, b)
        } else {
            cuEventElapsedTime(&mut ms, a, b)
        }
    };
    if rc == CUDA_SUCCESS {
        Ok(ms)
    } else {
        Err(rc)
    }
}

#[test]
fn timing_events_stamp_when_the_stream_reaches_them() {
    let dev = Dev::new();
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let f = function(m, c"slow_write").unwrap();
    register(c"slow_write", slow_write_kernel);
    let d = alloc(8).unwrap();
    let s = stream(CU_STREAM_NON_BLOCKING);
    let (start, end) = (event(), event());
    let (untimed, never) = (event_with(2), event());
    assert_eq!(fake_cuda_hold_stream(s, 1), CUDA_SUCCESS);
    assert_eq!(cuEventRecord(start, s), CUDA_SUCCESS);
    assert_eq!(launch(f, [1; 3], [1; 3], s, &[d, 1]), CUDA_SUCCESS);
    assert_eq!(cuEventRecord(end, s), CUDA_SUCCESS);
    assert_eq!(cuEventRecord(untimed, s), CUDA_SUCCESS);
    std::thread::sleep(Duration::from_millis(20));
    // Held: neither recording completed.
    assert_eq!(elapsed_ms(start, end, false), Err(CUDA_ERROR_NOT_READY));
    assert_eq!(elapsed_ms(start, end, true), Err(CUDA_ERROR_NOT_READY));
    assert_eq!(cuEventQuery(start), CUDA_ERROR_NOT_READY);
    assert_eq!(fake_cuda_hold_stream(s, 0), CUDA_SUCCESS);
    assert_eq!(cuEventSynchronize(end), CUDA_SUCCESS);
    // The kernel between them slept 50 ms; the time held before it does not count.
    for v2 in [false, true] {
        let ms = elapsed_ms(start, end, v2).unwrap();
        assert!((50.0..1000.0).contains(&ms), "{ms} ms");
        let back = elapsed_ms(end, start, v2).unwrap();
        assert!((back + ms).abs() < 0.01, "{back} ms");
    }
    assert_eq!(elapsed_ms(start, start, false), Ok(0.0));
    // Events without timing, or never recorded, are invalid here.
    assert_eq!(
        elapsed_ms(start, untimed, false),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
    assert_eq!(elapsed_ms(never, end, true), Err(CUDA_ERROR_INVALID_HANDLE));
    // SAFETY: a null out pointer is refused.
    let rc = unsafe { cuEventElapsedTime(ptr::null_mut(), start, end) };
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
    // Recording again forgets the old stamp until the stream reaches the new marker.
    assert_eq!(fake_cuda_hold_stream(ptr::null_mut(), 1), CUDA_SUCCESS);
    assert_eq!(cuEventRecord(end, ptr::null_mut()), CUDA_SUCCESS);
    assert_eq!(elapsed_ms(start, end, false), Err(CUDA_ERROR_NOT_READY));
    assert_eq!(fake_cuda_hold_stream(ptr::null_mut(), 0), CUDA_SUCCESS);
    assert_eq!(cuEventSynchronize(end), CUDA_SUCCESS);
    assert!(elapsed_ms(start, end, false).unwrap() >= 50.0);
    for e in [start, end, untimed, never] {
        assert_eq!(cuEventDestroy_v2(e), CUDA_SUCCESS);
    }
    assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}
