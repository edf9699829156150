//! Modules, launches of registered host kernels, launch checks, sticky errors.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use super::*;
use crate::exec::CU_STREAM_NON_BLOCKING;

/// What the last `record()` launch saw: params, grid, block, shared bytes, entry.
type Seen = (Vec<u64>, [u32; 3], [u32; 3], u32, String);
static SEEN: Mutex<Option<Seen>> = Mutex::new(None);

unsafe extern "C-unwind" fn record_kernel(
    user: *mut c_void,
    entry: *const c_char,
    params: *const u64,
    n: c_uint,
    grid: *const c_uint,
    block: *const c_uint,
    shared: c_uint,
) -> c_int {
    assert_eq!(user as usize, 0x5eed);
    // SAFETY: the fake passes `n` params, 3 grid and 3 block dimensions, a NUL-terminated entry.
    let seen = unsafe {
        (
            std::slice::from_raw_parts(params, n as usize).to_vec(),
            *grid.cast::<[u32; 3]>(),
            *block.cast::<[u32; 3]>(),
            shared,
            CStr::from_ptr(entry).to_string_lossy().into_owned(),
        )
    };
    *SEEN.lock().unwrap() = Some(seen);
    0
}

#[test]
fn modules_load_and_launches_run_host_kernels() {
    let dev = Dev::new();
    let ptx = compile(KERNELS, &["-arch=sm_90"]).unwrap();
    assert_eq!(
        load(b"\x7fELF\x02\x01\x01\0"),
        Err(CUDA_ERROR_INVALID_IMAGE)
    );
    assert_eq!(
        load(b"FAKECUDA-MODULE 1\narch none\nbogus\n\0"),
        Err(CUDA_ERROR_INVALID_IMAGE)
    );
    let m = load(&ptx).unwrap();
    assert_eq!((fake_cuda_module_loads(), fake_cuda_live_modules()), (1, 1));
    let fill = function(m, c"fill").unwrap();
    assert_eq!(function(m, c"fill"), Ok(fill), "the same handle again");
    assert_eq!(function(m, c"nope"), Err(CUDA_ERROR_NOT_FOUND));
    assert_eq!(
        function(0xbad as CUmodule, c"fill"),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
    register(c"fill", fill_kernel);

    let d = alloc(256).unwrap();
    let s = stream(CU_STREAM_NON_BLOCKING);
    // Parameter values are copied at call time.
    let mut vals: [u64; 3] = [d, 16, 0x5A];
    let mut ptrs: Vec<*mut c_void> = vals.iter_mut().map(|v| ptr::from_mut(v).cast()).collect();
    fake_cuda_hold_streams(1);
    // SAFETY: `ptrs` holds three pointers to 8 readable bytes each.
    let rc = unsafe {
        cuLaunchKernel(
            fill,
            4,
            1,
            1,
            128,
            1,
            1,
            0,
            s,
            ptrs.as_mut_ptr(),
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, CUDA_SUCCESS);
    // SAFETY: `ptrs[2]` points at `vals[2]`, alive.
    unsafe { *ptrs[2].cast::<u64>() = 0x77 };
    assert_eq!(peek(d, 16), [0xCD; 16], "not run yet");
    fake_cuda_hold_streams(0);
    assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_eq!(peek(d, 17), [[0x5A; 16].as_slice(), &[0xCD]].concat());
    // On the legacy stream it runs before the call returns.
    assert_eq!(
        launch(fill, [1; 3], [1; 3], ptr::null_mut(), &[d + 100, 4, 9]),
        CUDA_SUCCESS
    );
    assert_eq!(peek(d + 100, 4), [9; 4]);
    assert_eq!(fake_cuda_launch_count(), 2);

    // The host kernel sees what the launch said.
    let rec = function(m, c"slow_write").unwrap();
    // SAFETY: `record_kernel` is a host kernel; its user pointer is only compared.
    let rc = unsafe {
        fake_cuda_register_kernel(
            c"slow_write".as_ptr(),
            Some(record_kernel),
            0x5eed as *mut c_void,
        )
    };
    assert_eq!(rc, 0);
    let mut a = [3u64, 4];
    let mut ptrs: Vec<*mut c_void> = a.iter_mut().map(|v| ptr::from_mut(v).cast()).collect();
    // SAFETY: as above, two parameters.
    let rc = unsafe {
        cuLaunchKernel(
            rec,
            5,
            6,
            7,
            8,
            4,
            2,
            1024,
            s,
            ptrs.as_mut_ptr(),
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(cuCtxSynchronize(), CUDA_SUCCESS);
    let seen = SEEN.lock().unwrap().take().unwrap();
    assert_eq!(
        seen,
        (
            vec![3, 4],
            [5, 6, 7],
            [8, 4, 2],
            1024,
            "slow_write".to_string()
        )
    );
    // SAFETY: a null function removes the registration.
    let rc = unsafe { fake_cuda_register_kernel(c"slow_write".as_ptr(), None, ptr::null_mut()) };
    assert_eq!(rc, 0);

    let log = call_log();
    let line = format!(
        "cuLaunchKernel fill {:#x} grid=(4,1,1) block=(128,1,1) shared=0 stream={:#x} \
         params=[{d:#x},0x10,0x5a] -> 0\n",
        fill as usize, s as usize
    );
    assert!(log.contains(&line), "{log}");
    assert!(
        log.contains(&format!("cuModuleLoadData {:#x} image=", m as usize)),
        "{log}"
    );

    // Unloading invalidates the module and its functions.
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    assert_eq!(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
    assert_eq!(
        launch(fill, [1; 3], [1; 3], s, &[d, 1, 1]),
        CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(fake_cuda_live_modules(), 0);
    // An image for a newer architecture than the device's does not load.
    let newer = compile(KERNELS, &["-arch=sm_100"]).unwrap();
    assert_eq!(load(&newer), Err(CUDA_ERROR_NO_BINARY_FOR_GPU));
    assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}

#[test]
fn launches_are_checked_at_call_time() {
    let dev = Dev::new();
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let (fill, orphan) = (
        function(m, c"fill").unwrap(),
        function(m, c"orphan").unwrap(),
    );
    let s = stream(0);
    let p = [0u64, 0, 0];
    for (grid, block) in [
        ([0, 1, 1], [1, 1, 1]),
        ([1, 0, 1], [1, 1, 1]),
        ([1, 1, 1], [1, 1, 0]),
        ([1 << 31, 1, 1], [1, 1, 1]),
        ([1, 65536, 1], [1, 1, 1]),
        ([1, 1, 65536], [1, 1, 1]),
        ([1, 1, 1], [32, 32, 2]),
        ([1, 1, 1], [1, 1, 65]),
        ([1, 1, 1], [1025, 1, 1]),
    ] {
        assert_eq!(
            launch(fill, grid, block, s, &p),
            CUDA_ERROR_INVALID_VALUE,
            "{grid:?} {block:?}"
        );
    }
    let mut vals = p;
    let mut ptrs: Vec<*mut c_void> = vals.iter_mut().map(|v| ptr::from_mut(v).cast()).collect();
    let mut extra = [ptr::null_mut::<c_void>()];
    // SAFETY: `ptrs` holds three valid parameter pointers; the others are checked as invalid.
    unsafe {
        let shared = (48 << 10) + 1;
        let rc = cuLaunchKernel(
            fill,
            1,
            1,
            1,
            1,
            1,
            1,
            shared,
            s,
            ptrs.as_mut_ptr(),
            ptr::null_mut(),
        );
        assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
        let rc = cuLaunchKernel(
            fill,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            ptrs.as_mut_ptr(),
            extra.as_mut_ptr(),
        );
        assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
        let rc = cuLaunchKernel(
            fill,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            ptr::null_mut(),
            ptr::null_mut(),
        );
        assert_eq!(rc, CUDA_ERROR_INVALID_VALUE, "fill has parameters");
        let rc = cuLaunchKernel(
            ptr::null_mut(),
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            ptr::null_mut(),
            ptr::null_mut(),
        );
        assert_eq!(rc, CUDA_ERROR_INVALID_HANDLE);
        let rc = cuLaunchKernel(
            0x1234 as CUfunction,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            ptr::null_mut(),
            ptr::null_mut(),
        );
        assert_eq!(rc, CUDA_ERROR_INVALID_HANDLE);
    }
    assert_eq!(fake_cuda_launch_count(), 0);
    assert_eq!(fake_cuda_poisoned(0), 0, "a refused launch is no fault");
    // The limits themselves are fine (orphan has no parameters: no kernelParams needed).
    fake_cuda_hold_streams(1);
    // SAFETY: `orphan` has no parameters.
    let rc = unsafe {
        cuLaunchKernel(
            orphan,
            (1 << 31) - 1,
            65535,
            65535,
            16,
            16,
            4,
            48 << 10,
            s,
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(launch(orphan, [1; 3], [1, 1, 64], s, &[]), CUDA_SUCCESS);
    assert_eq!(fake_cuda_launch_count(), 2);
    // Nothing registered for `orphan`: the launch faults when it runs. Drop the queue first.
    fake_cuda_hold_streams(0);
    assert_eq!(cuStreamSynchronize(s), CUDA_ERROR_LAUNCH_FAILED);
    let log = call_log();
    assert!(
        log.contains("fake_cuda exec orphan: no host implementation registered\n"),
        "{log}"
    );
    assert!(
        log.contains(
            "fake_cuda fault dev=0 cuLaunchKernel orphan -> 719; 1 queued ops discarded\n"
        ),
        "{log}"
    );
    assert_eq!(cuStreamDestroy_v2(s), CUDA_ERROR_LAUNCH_FAILED);
    assert_eq!(cuModuleUnload(m), CUDA_ERROR_LAUNCH_FAILED);
    dev.finish();
}

static BOOM_SEEN: AtomicI32 = AtomicI32::new(0);

/// The host kernel of `boom(code)`: returns `code`; first tries a driver call, refused.
unsafe extern "C-unwind" fn boom_kernel(
    _: *mut c_void,
    _: *const c_char,
    params: *const u64,
    _: c_uint,
    _: *const c_uint,
    _: *const c_uint,
    _: c_uint,
) -> c_int {
    let mut d: CUdeviceptr = 0;
    // SAFETY: `d` is a valid out pointer.
    BOOM_SEEN.store(unsafe { cuMemAlloc_v2(&mut d, 64) }, Ordering::SeqCst);
    // SAFETY: `boom` has one parameter.
    unsafe { *params as c_int }
}

#[test]
fn a_device_fault_poisons_the_context_until_its_last_release() {
    let dev = Dev::new();
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let (boom, fill) = (function(m, c"boom").unwrap(), function(m, c"fill").unwrap());
    register(c"boom", boom_kernel);
    register(c"fill", fill_kernel);
    let d = alloc(64).unwrap();
    let s = stream(CU_STREAM_NON_BLOCKING);
    let e = event();
    let mut out = [0u8; 8];
    let mut host = [0u8; 64];
    let hp = host.as_mut_ptr().cast::<c_void>();
    assert_eq!(cuMemHostRegister_v2(hp, 64, 0), CUDA_SUCCESS);
    fake_cuda_hold_streams(1);
    assert_eq!(launch(boom, [1; 3], [1; 3], s, &[5]), CUDA_SUCCESS);
    assert_eq!(launch(fill, [1; 3], [1; 3], s, &[d, 64, 1]), CUDA_SUCCESS);
    // SAFETY: `out` holds 8 bytes.
    let rc = unsafe { cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), d, 8, s) };
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(cuEventRecord(e, s), CUDA_SUCCESS);
    fake_cuda_hold_streams(0);
    assert_eq!(cuEventSynchronize(e), CUDA_ERROR_LAUNCH_FAILED);
    assert_eq!(cuStreamSynchronize(s), CUDA_ERROR_LAUNCH_FAILED);
    assert_eq!(
        BOOM_SEEN.load(Ordering::SeqCst),
        CUDA_ERROR_NOT_PERMITTED,
        "a host kernel may not call the driver"
    );
    assert_eq!(fake_cuda_poisoned(0), CUDA_ERROR_LAUNCH_FAILED);
    assert_eq!(
        peek(d, 8),
        [0xCD; 8],
        "work queued after the fault was discarded"
    );
    assert_eq!(out, [0; 8]);

    // Every call needing the context fails with the sticky code.
    let sticky = CUDA_ERROR_LAUNCH_FAILED;
    assert_eq!(alloc(64), Err(sticky));
    assert_eq!(read(d, 8), Err(sticky));
    assert_eq!(cuMemsetD8_v2(d, 0, 8), sticky);
    assert_eq!(cuMemsetD8Async(d, 0, 8, s), sticky);
    assert_eq!(launch(fill, [1; 3], [1; 3], s, &[d, 64, 1]), sticky);
    assert_eq!(cuCtxSynchronize(), sticky);
    assert_eq!(cuStreamQuery(s), sticky);
    assert_eq!(cuEventQuery(e), sticky);
    assert_eq!(function(m, c"fill"), Err(sticky));
    assert_eq!(load(&compile(KERNELS, &[]).unwrap()), Err(sticky));
    let mut s2: CUstream = ptr::null_mut();
    // SAFETY: valid out pointer.
    assert_eq!(unsafe { cuStreamCreate(&mut s2, 0) }, sticky);
    // The context calls still work; the destroying calls release their object anyway.
    assert_eq!(current(), dev.ctx as usize);
    assert_eq!(cuCtxSetCurrent(dev.ctx), CUDA_SUCCESS);
    assert_eq!(cuMemHostRegister_v2(hp, 64, 0), sticky);
    assert_eq!(cuMemHostUnregister(hp), sticky);
    assert_eq!(fake_cuda_live_registrations(), 0);
    assert_eq!(cuEventDestroy_v2(e), sticky);
    assert_eq!(cuStreamDestroy_v2(s), sticky);
    assert_eq!(cuModuleUnload(m), sticky);
    assert_eq!(cuMemFree_v2(d), sticky);
    assert_eq!((fake_cuda_live_streams(), fake_cuda_live_events()), (0, 0));
    assert_eq!(
        (fake_cuda_live_modules(), fake_cuda_live_allocations()),
        (0, 0)
    );
    // Another device is unaffected.
    let ctx1 = retain(1);
    assert_eq!(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    let d1 = alloc(8).unwrap();
    assert_eq!(cuMemFree_v2(d1), CUDA_SUCCESS);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
    assert_eq!(cuCtxSetCurrent(ptr::null_mut()), CUDA_SUCCESS);

    // The last release destroys the context; the next retain makes a healthy one.
    let extra = retain(0);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    assert_eq!(fake_cuda_poisoned(0), sticky, "still retained once");
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    assert_eq!(fake_cuda_poisoned(0), 0);
    assert_eq!(retain(0), extra);
    assert_eq!(cuCtxSetCurrent(dev.ctx), CUDA_SUCCESS);

    // An illegal address (700) on the legacy stream: the launch itself reports it.
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let fill = function(m, c"fill").unwrap();
    let gone = 0xc0da_7777_0000_0000;
    assert_eq!(
        launch(fill, [1; 3], [1; 3], ptr::null_mut(), &[gone, 8, 0]),
        CUDA_ERROR_ILLEGAL_ADDRESS
    );
    assert_eq!(fake_cuda_poisoned(0), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(alloc(8), Err(CUDA_ERROR_ILLEGAL_ADDRESS));
    let mut name: *const c_char = ptr::null();
    for code in [200, 209, 400, 500, 600, 700, 719, 800] {
        // SAFETY: `name` is a valid out pointer.
        let rc = unsafe { cuGetErrorName(code, &mut name) };
        assert_eq!(rc, CUDA_SUCCESS, "{code}");
    }
    assert_eq!(error_name(719).as_deref(), Some("CUDA_ERROR_LAUNCH_FAILED"));
    assert_eq!(cuModuleUnload(m), CUDA_ERROR_ILLEGAL_ADDRESS);
    let log = call_log();
    assert!(
        log.contains("cuMemAlloc_v2 - 64 (from a host kernel) -> 800\n"),
        "{log}"
    );
    assert!(
        log.contains("cuDevicePrimaryCtxRelease_v2 0 count=0 (sticky error 719 cleared) -> 0\n"),
        "{log}"
    );
    // Only the last release clears the fault.
    let again = retain(0);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    assert_eq!(
        fake_cuda_poisoned(0),
        CUDA_ERROR_ILLEGAL_ADDRESS,
        "still retained"
    );
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    assert_eq!(fake_cuda_poisoned(0), 0);
    assert_eq!(retain(0), again);
    dev.finish();
}
