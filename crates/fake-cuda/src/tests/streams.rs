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
    // The built-in streams run before the call returns.
    for builtin in [0usize, 1, 2] {
        let h = builtin as CUstream;
        assert_eq!(cuMemsetD8Async(d, builtin as u8, 4, h), CUDA_SUCCESS);
        assert_eq!(peek(d, 4), [builtin as u8; 4]);
        assert_eq!(cuStreamSynchronize(h), CUDA_SUCCESS);
        assert_eq!(cuStreamQuery(h), CUDA_SUCCESS);
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
    // Recording on a built-in stream: complete at once; a wait on it is no wait.
    assert_eq!(cuEventRecord(e, ptr::null_mut()), CUDA_SUCCESS);
    assert_eq!(cuEventQuery(e), CUDA_SUCCESS);
    assert_eq!(cuStreamWaitEvent(s2, e, 1), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(cuStreamWaitEvent(ptr::null_mut(), e, 0), CUDA_SUCCESS);
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
