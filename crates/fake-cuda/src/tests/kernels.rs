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
    // On the legacy stream too it runs after the call returned, in stream order.
    assert_eq!(fake_cuda_hold_stream(ptr::null_mut(), 1), CUDA_SUCCESS);
    assert_eq!(
        launch(fill, [1; 3], [1; 3], ptr::null_mut(), &[d + 100, 4, 9]),
        CUDA_SUCCESS
    );
    assert_eq!(peek(d + 100, 4), [0xCD; 4], "queued");
    assert_eq!(fake_cuda_hold_stream(ptr::null_mut(), 0), CUDA_SUCCESS);
    assert_eq!(
        read(d + 100, 4).unwrap(),
        [9; 4],
        "the read is ordered after it"
    );
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

    // An illegal address (700) on the legacy stream: the launch returns at once; the fault
    // comes when it runs, and the next call needing the context reports it.
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let fill = function(m, c"fill").unwrap();
    let gone = 0xc0da_7777_0000_0000;
    assert_eq!(
        launch(fill, [1; 3], [1; 3], ptr::null_mut(), &[gone, 8, 0]),
        CUDA_SUCCESS
    );
    assert_eq!(
        cuStreamSynchronize(ptr::null_mut()),
        CUDA_ERROR_ILLEGAL_ADDRESS
    );
    assert_eq!(fake_cuda_poisoned(0), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_eq!(alloc(8), Err(CUDA_ERROR_ILLEGAL_ADDRESS));
    let mut name: *const c_char = ptr::null();
    for code in [200, 209, 222, 400, 500, 600, 700, 701, 719, 800] {
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

/// `cuFuncGetAttribute(attrib, f)`: the value, or the code.
fn func_attr(f: CUfunction, attrib: c_int) -> Result<c_int, CUresult> {
    let mut v = -1;
    // SAFETY: `v` is a valid out pointer.
    match unsafe { cuFuncGetAttribute(&mut v, attrib, f) } {
        CUDA_SUCCESS => Ok(v),
        code => Err(code),
    }
}

/// Launches `f` (three 8-byte parameters) with `block` threads and `shared` dynamic bytes.
fn launch_shared(
    f: CUfunction,
    block: [u32; 3],
    shared: u32,
    s: CUstream,
    p: [u64; 3],
) -> CUresult {
    let mut vals = p;
    let mut ptrs: Vec<*mut c_void> = vals.iter_mut().map(|v| ptr::from_mut(v).cast()).collect();
    // SAFETY: `ptrs` holds three pointers to 8 readable bytes each.
    unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            block[0],
            block[1],
            block[2],
            shared,
            s,
            ptrs.as_mut_ptr(),
            ptr::null_mut(),
        )
    }
}

#[test]
fn functions_have_limits_of_their_own() {
    let dev = Dev::new();
    let m = load(&compile(KERNELS, &["-arch=sm_90"]).unwrap()).unwrap();
    let (fill, bounded) = (
        function(m, c"fill").unwrap(),
        function(m, c"bounded").unwrap(),
    );
    register(c"fill", fill_kernel);
    register(c"bounded", fill_kernel);
    // The attributes: the launch bounds, no static or local memory, 32 registers, 48 KiB.
    assert_eq!(func_attr(bounded, 0), Ok(128));
    assert_eq!(func_attr(fill, 0), Ok(1024));
    assert_eq!(func_attr(fill, 1), Ok(0));
    assert_eq!(func_attr(fill, 3), Ok(0));
    assert_eq!(func_attr(fill, 4), Ok(32));
    assert_eq!(func_attr(fill, 8), Ok(49152));
    assert_eq!(func_attr(fill, 2), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(
        func_attr(0x1234 as CUfunction, 0),
        Err(CUDA_ERROR_INVALID_HANDLE)
    );
    // SAFETY: a null out pointer is refused.
    let rc = unsafe { cuFuncGetAttribute(ptr::null_mut(), 0, fill) };
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);

    let d = alloc(64).unwrap();
    let s = stream(CU_STREAM_NON_BLOCKING);
    // More threads than the launch bounds: out of resources, refused at the call, not sticky.
    assert_eq!(
        launch_shared(bounded, [129, 1, 1], 0, s, [d, 8, 1]),
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    );
    assert_eq!(
        launch_shared(bounded, [64, 2, 2], 0, s, [d, 8, 1]),
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    );
    assert_eq!(fake_cuda_launch_count(), 0, "nothing queued");
    assert_eq!(fake_cuda_poisoned(0), 0);
    assert_eq!(
        launch_shared(bounded, [128, 1, 1], 0, s, [d, 8, 1]),
        CUDA_SUCCESS
    );
    // The device's limit still comes first (invalid value).
    assert_eq!(
        launch_shared(fill, [1025, 1, 1], 0, s, [d, 8, 1]),
        CUDA_ERROR_INVALID_VALUE
    );
    // Dynamic shared memory: 48 KiB until the function opts in, up to the device's opt-in.
    assert_eq!(
        launch_shared(fill, [1, 1, 1], 49153, s, [d, 8, 2]),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(cuFuncSetAttribute(fill, 8, 100 << 10), CUDA_SUCCESS);
    assert_eq!(func_attr(fill, 8), Ok(100 << 10));
    assert_eq!(func_attr(bounded, 8), Ok(49152), "per function");
    assert_eq!(
        launch_shared(fill, [1, 1, 1], 100 << 10, s, [d, 8, 2]),
        CUDA_SUCCESS
    );
    assert_eq!(
        launch_shared(fill, [1, 1, 1], (100 << 10) + 1, s, [d, 8, 2]),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(cuFuncSetAttribute(fill, 8, 232448), CUDA_SUCCESS);
    assert_eq!(
        cuFuncSetAttribute(fill, 8, 232449),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(cuFuncSetAttribute(fill, 8, -1), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(cuFuncSetAttribute(fill, 0, 64), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(
        cuFuncSetAttribute(0x1234 as CUfunction, 8, 0),
        CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(cuFuncSetAttribute(fill, 8, 0), CUDA_SUCCESS);
    assert_eq!(
        launch_shared(fill, [1, 1, 1], 1, s, [d, 8, 2]),
        CUDA_ERROR_INVALID_VALUE
    );
    // The opt-in limit is the device's (`FAKE_CUDA_SHARED_OPTIN`).
    with_state(|st| st.shared_optin = 64 << 10);
    assert_eq!(
        cuFuncSetAttribute(fill, 8, 70_000),
        CUDA_ERROR_INVALID_VALUE
    );
    fake_cuda_reset();
    assert_eq!(cuStreamSynchronize(s), CUDA_SUCCESS);
    assert_eq!(peek(d, 8), [2; 8]);
    assert_eq!(fake_cuda_launch_count(), 0, "reset");
    assert_eq!(cuStreamDestroy_v2(s), CUDA_SUCCESS);
    assert_eq!(cuModuleUnload(m), CUDA_SUCCESS);
    assert_eq!(func_attr(fill, 0), Err(CUDA_ERROR_INVALID_HANDLE));
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}

/// Sets `FAKE_CUDA_DRIVER_VERSION` (`None`: unsets it). Tests hold the test lock.
fn driver_version_env(v: Option<&str>) {
    match v {
        Some(v) => std::env::set_var("FAKE_CUDA_DRIVER_VERSION", v),
        None => std::env::remove_var("FAKE_CUDA_DRIVER_VERSION"),
    }
}

/// A hand-made image for `arch` (made by NVRTC `cuda`, when given) with one entry.
fn image(arch: &str, cuda: Option<&str>) -> Vec<u8> {
    let cuda = cuda.map_or(String::new(), |v| format!("cuda {v}\n"));
    format!("FAKECUDA-MODULE 1\narch {arch}\n{cuda}entry k 0\n\0").into_bytes()
}

/// Loads `img` and unloads it again: the load's code.
fn loads(img: &[u8]) -> CUresult {
    match load(img) {
        Ok(m) => cuModuleUnload(m),
        Err(code) => code,
    }
}

#[test]
fn images_load_only_where_the_driver_and_device_run_them() {
    let dev = Dev::new();
    // The driver's version against the compiler's: PTX by major.minor, a cubin by major.
    driver_version_env(Some("12040"));
    let ptx_version = CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    assert_eq!(loads(&image("compute_90", Some("12.8"))), ptx_version);
    assert_eq!(loads(&image("none", Some("12.5"))), ptx_version);
    assert_eq!(loads(&image("compute_90", Some("12.4"))), CUDA_SUCCESS);
    assert_eq!(
        loads(&image("sm_90", Some("12.8"))),
        CUDA_SUCCESS,
        "minor version compatibility"
    );
    assert_eq!(loads(&image("sm_90", Some("13.0"))), ptx_version);
    assert_eq!(
        loads(&image("compute_90", None)),
        CUDA_SUCCESS,
        "version unknown"
    );
    // What an NVRTC newer than the driver makes does not load (its PTX carries its version).
    let newer = compile(KERNELS, &["-arch=compute_90"]).unwrap();
    assert_eq!(load(&newer), Err(ptx_version));
    assert!(call_log().contains("arch=compute_90 cuda=13.0 entries=6 (driver is 12.4) -> 222\n"));
    driver_version_env(None);
    assert_eq!(loads(&newer), CUDA_SUCCESS, "on the default 13.0 driver");

    // Architectures on a 9.0 device: a cubin of the same major, PTX of any older one.
    for (arch, code) in [
        ("sm_90", CUDA_SUCCESS),
        ("sm_90a", CUDA_SUCCESS),
        ("sm_80", CUDA_ERROR_NO_BINARY_FOR_GPU),
        ("sm_86", CUDA_ERROR_NO_BINARY_FOR_GPU),
        ("sm_100", CUDA_ERROR_NO_BINARY_FOR_GPU),
        ("compute_80", CUDA_SUCCESS),
        ("compute_52", CUDA_SUCCESS),
        ("compute_90a", CUDA_SUCCESS),
        ("compute_80a", CUDA_ERROR_NO_BINARY_FOR_GPU),
        ("compute_100", CUDA_ERROR_NO_BINARY_FOR_GPU),
        ("none", CUDA_SUCCESS),
    ] {
        assert_eq!(loads(&image(arch, Some("13.0"))), code, "{arch} on 9.0");
    }
    // On 8.6: sm_80 runs (same major, older), sm_87 and sm_90a do not.
    with_state(|st| st.cc = (8, 6));
    for (arch, code) in [
        ("sm_80", CUDA_SUCCESS),
        ("sm_86", CUDA_SUCCESS),
        ("sm_86a", CUDA_SUCCESS),
        ("sm_87", CUDA_ERROR_NO_BINARY_FOR_GPU),
        ("sm_90a", CUDA_ERROR_NO_BINARY_FOR_GPU),
        ("compute_80", CUDA_SUCCESS),
        ("compute_90", CUDA_ERROR_NO_BINARY_FOR_GPU),
    ] {
        assert_eq!(loads(&image(arch, None)), code, "{arch} on 8.6");
    }
    // On 10.3: family code of 10.0 runs, 10.0-specific code does not.
    with_state(|st| st.cc = (10, 3));
    for (arch, code) in [
        ("sm_100f", CUDA_SUCCESS),
        ("compute_100f", CUDA_SUCCESS),
        ("sm_100", CUDA_SUCCESS),
        ("sm_100a", CUDA_ERROR_NO_BINARY_FOR_GPU),
        ("sm_103a", CUDA_SUCCESS),
    ] {
        assert_eq!(loads(&image(arch, None)), code, "{arch} on 10.3");
    }
    fake_cuda_reset();
    assert_eq!(fake_cuda_live_modules(), 0);
    dev.finish();
}

#[test]
fn a_second_holder_keeps_a_poisoned_primary_context_alive() {
    let dev = Dev::new();
    // Torch retains the primary context itself and makes it current on its own thread.
    let torch = retain(0);
    assert_eq!(torch, dev.ctx);
    assert_eq!(fake_cuda_retain_count(0), 2);
    let m = load(&compile(KERNELS, &[]).unwrap()).unwrap();
    let boom = function(m, c"boom").unwrap();
    register(c"boom", boom_kernel);
    let s = stream(CU_STREAM_NON_BLOCKING);
    let d = alloc(64).unwrap();
    assert_eq!(launch(boom, [1; 3], [1; 3], s, &[700]), CUDA_SUCCESS);
    let sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    assert_eq!(cuStreamSynchronize(s), sticky);
    // Our side cleans up and gives its reference back: the context lives on, poisoned.
    assert_eq!(cuStreamDestroy_v2(s), sticky);
    assert_eq!(cuModuleUnload(m), sticky);
    assert_eq!(cuMemFree_v2(d), sticky);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    assert_eq!(fake_cuda_retain_count(0), 1);
    assert_eq!(fake_cuda_poisoned(0), sticky, "torch still holds it");
    let torch_thread = {
        let ctx = torch as usize;
        move || {
            assert_eq!(cuCtxSetCurrent(ctx as CUcontext), CUDA_SUCCESS);
            assert_eq!(alloc(8), Err(sticky));
            assert_eq!(cuCtxSynchronize(), sticky);
            assert_eq!(
                cuMemsetD8Async(0xc0da_0000_0000_0000, 0, 1, ptr::null_mut()),
                sticky
            );
            let mut active = -1;
            let mut flags = 9;
            // SAFETY: valid out pointers.
            let rc = unsafe { cuDevicePrimaryCtxGetState(0, &mut flags, &mut active) };
            assert_eq!((rc, flags, active), (CUDA_SUCCESS, 0, 1));
            assert_eq!(cuCtxSetCurrent(ptr::null_mut()), CUDA_SUCCESS);
        }
    };
    std::thread::spawn(torch_thread).join().unwrap();
    // A new worker retains again: it gets the same, poisoned context.
    let again = retain(0);
    assert_eq!(again, torch);
    assert_eq!(cuCtxSetCurrent(again), CUDA_SUCCESS);
    assert_eq!(alloc(8), Err(sticky));
    let mut s2: CUstream = ptr::null_mut();
    let mut e: CUevent = ptr::null_mut();
    // SAFETY: valid out pointers.
    unsafe {
        assert_eq!(cuStreamCreate(&mut s2, 0), sticky);
        assert_eq!(cuEventCreate(&mut e, 0), sticky);
    }
    assert_eq!(load(&compile(KERNELS, &[]).unwrap()), Err(sticky));
    assert_eq!(cuStreamSynchronize(ptr::null_mut()), sticky);
    assert_eq!(cuMemsetD8_v2(0xc0da_0000_0000_0000, 0, 1), sticky);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    assert_eq!(fake_cuda_poisoned(0), sticky);
    // Only the last holder's release destroys it; the next retain is a healthy context.
    let mut destroyed = [0u64; 3];
    // SAFETY: `destroyed` holds three `u64`.
    unsafe { fake_cuda_lifecycle(destroyed.as_mut_ptr()) };
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    let mut after = [0u64; 3];
    // SAFETY: `after` holds three `u64`.
    unsafe { fake_cuda_lifecycle(after.as_mut_ptr()) };
    assert_eq!(
        after[2],
        destroyed[2] + 1,
        "destroyed once, at the last release"
    );
    assert_eq!(fake_cuda_poisoned(0), 0);
    let mut active = -1;
    let mut flags = 9;
    // SAFETY: valid out pointers.
    let rc = unsafe { cuDevicePrimaryCtxGetState(0, &mut flags, &mut active) };
    assert_eq!((rc, flags, active), (CUDA_SUCCESS, 0, 0));
    // SAFETY: null out pointers are refused.
    let rc = unsafe { cuDevicePrimaryCtxGetState(0, ptr::null_mut(), &mut active) };
    assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
    // SAFETY: valid out pointers.
    let rc = unsafe { cuDevicePrimaryCtxGetState(7, &mut flags, &mut active) };
    assert_eq!(rc, CUDA_ERROR_INVALID_DEVICE);
    assert_eq!(retain(0), torch);
    assert_eq!(cuCtxSetCurrent(dev.ctx), CUDA_SUCCESS);
    let d = alloc(8).unwrap();
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    dev.finish();
}
