//! The fake's state is global: every test takes [`serial`] first, so they run one at a time
//! (in any order), and leaves no stream, event, module or allocation behind. The driver model is
//! checked in one test, in order; streams, kernels and NVRTC have rooms of their own.

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Mutex, MutexGuard};
use std::time::SystemTime;

use crate::api::*;
use crate::control::*;
use crate::*;

mod graphs;
mod kernels;
mod nvrtc_api;
mod streams;

static SERIAL: Mutex<()> = Mutex::new(());

/// The newest modification time of the files under `dir`.
fn newest(dir: &Path) -> SystemTime {
    let mut t = SystemTime::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let m = if p.is_dir() {
            newest(&p)
        } else {
            e.metadata().and_then(|m| m.modified()).unwrap_or(t)
        };
        t = t.max(m);
    }
    t
}

/// This crate's library (`libfake_cuda.so`), for tests that load copies of it: the one beside
/// the test executable when it is newer than the sources, else built with `cargo build -p
/// fake-cuda` into a target directory of its own (so the build never waits for the lock of the
/// `cargo test` running us).
fn library() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.as_ref() {
        return p.clone();
    }
    let file = "libfake_cuda.so";
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crates = manifest.parent().unwrap();
    let sources = newest(manifest).max(newest(&crates.join("fake-vendor")));
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test-exe> -> target/<profile>
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let beside = profile.join(file);
    let fresh = std::fs::metadata(&beside)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= sources);
    let so = if fresh {
        beside
    } else {
        let target = profile.parent().unwrap().join("fake-cuda-selftest");
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let status = std::process::Command::new(cargo)
            .args(["build", "-q", "-p", "fake-cuda", "--target-dir"])
            .arg(&target)
            .current_dir(manifest)
            .status()
            .unwrap_or_else(|e| panic!("running `{cargo} build -p fake-cuda`: {e}"));
        assert!(status.success(), "`cargo build -p fake-cuda` failed");
        target.join("debug").join(file)
    };
    assert!(so.is_file(), "{} missing", so.display());
    *built = Some(so.clone());
    so
}

/// The test lock (a failed test does not poison it for the others).
fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops whatever an earlier, failed test left behind (so only that test reports it).
fn scrub() {
    fake_cuda_hold_streams(0);
    {
        let mut ex = exec::lock();
        ex.streams.clear();
        ex.events.clear();
    }
    exec::notify();
    with_state(|st| {
        st.modules.clear();
        st.functions.clear();
        st.registrations.clear();
        st.poison.clear();
        let live: Vec<u64> = st.heap.blocks().map(|(a, _)| a).collect();
        for a in live {
            st.heap.remove(a, ALIGN, false);
        }
    });
}

/// A test's device: device 0's primary context, fresh (retained once, so healthy), current on
/// the calling thread; the log, injections and counters reset; the test lock held.
struct Dev {
    ctx: CUcontext,
    _serial: MutexGuard<'static, ()>,
}

impl Dev {
    fn new() -> Dev {
        let serial = serial();
        scrub();
        fake_cuda_reset();
        fake_cuda_set_devices(2);
        fake_cuda_set_reuse(1);
        fake_cuda_set_stream_latency_us(100);
        assert_eq!(cuInit(0), CUDA_SUCCESS);
        for dev in 0..2 {
            while fake_cuda_retain_count(dev) > 0 {
                assert_eq!(cuDevicePrimaryCtxRelease_v2(dev), CUDA_SUCCESS);
            }
        }
        let ctx = retain(0);
        assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        Dev {
            ctx,
            _serial: serial,
        }
    }

    /// Checks that the test left nothing behind, and releases the context.
    fn finish(self) {
        assert_eq!(fake_cuda_live_streams(), 0, "streams left");
        assert_eq!(fake_cuda_live_events(), 0, "events left");
        assert_eq!(fake_cuda_live_modules(), 0, "modules left");
        assert_eq!(fake_cuda_live_allocations(), 0, "allocations left");
        assert_eq!(fake_cuda_violations(), 0, "{}", call_log());
        assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ptr::null_mut()), CUDA_SUCCESS);
    }
}

/// What device memory holds now, read behind the streams' backs.
fn peek(src: CUdeviceptr, n: usize) -> Vec<u8> {
    let p = fake_cuda_translate(src, n as u64);
    assert!(!p.is_null());
    // SAFETY: `p` has `n` bytes of a live allocation behind it.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec()
}

fn stream(flags: u32) -> CUstream {
    let mut s: CUstream = ptr::null_mut();
    // SAFETY: `s` is a valid out pointer.
    assert_eq!(unsafe { cuStreamCreate(&mut s, flags) }, CUDA_SUCCESS);
    assert!(!s.is_null());
    s
}

fn event() -> CUevent {
    let mut e: CUevent = ptr::null_mut();
    // SAFETY: `e` is a valid out pointer.
    assert_eq!(unsafe { cuEventCreate(&mut e, 0) }, CUDA_SUCCESS);
    e
}

fn call_log() -> String {
    // SAFETY: a null buffer with capacity 0 is allowed.
    let len = unsafe { fake_cuda_call_log(ptr::null_mut(), 0) };
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` holds `len` bytes.
    let n = unsafe { fake_cuda_call_log(buf.as_mut_ptr().cast::<c_char>(), len) };
    assert_eq!(n, len);
    String::from_utf8(buf).unwrap()
}

fn current() -> usize {
    let mut ctx: CUcontext = ptr::null_mut();
    // SAFETY: `ctx` is a valid out pointer.
    assert_eq!(unsafe { cuCtxGetCurrent(&mut ctx) }, CUDA_SUCCESS);
    ctx as usize
}

fn retain(dev: CUdevice) -> CUcontext {
    let mut ctx: CUcontext = ptr::null_mut();
    // SAFETY: `ctx` is a valid out pointer.
    let rc = unsafe { cuDevicePrimaryCtxRetain(&mut ctx, dev) };
    assert_eq!(rc, CUDA_SUCCESS);
    ctx
}

fn alloc(bytes: usize) -> Result<CUdeviceptr, CUresult> {
    let mut d: CUdeviceptr = 0;
    // SAFETY: `d` is a valid out pointer.
    match unsafe { cuMemAlloc_v2(&mut d, bytes) } {
        CUDA_SUCCESS => Ok(d),
        code => Err(code),
    }
}

fn read(src: CUdeviceptr, n: usize) -> Result<Vec<u8>, CUresult> {
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds `n` bytes.
    match unsafe { cuMemcpyDtoH_v2(buf.as_mut_ptr().cast::<c_void>(), src, n) } {
        CUDA_SUCCESS => Ok(buf),
        code => Err(code),
    }
}

fn error_name(code: CUresult) -> Option<String> {
    let mut s: *const c_char = ptr::null();
    // SAFETY: `s` is a valid out pointer.
    let rc = unsafe { cuGetErrorName(code, &mut s) };
    // SAFETY: on success `s` points at a static NUL-terminated string.
    (rc == CUDA_SUCCESS).then(|| unsafe { CStr::from_ptr(s) }.to_str().unwrap().to_string())
}

#[test]
fn driver_model() {
    let _serial = serial();
    scrub();
    set_current_ctx(0);
    // Start from a fresh process's model (other tests ran cuInit and retained).
    with_state(|st| {
        st.initialized = false;
        st.retains.clear();
        st.poison.clear();
    });
    fake_cuda_reset();
    fake_cuda_set_devices(2);
    fake_cuda_set_reuse(1);

    // Before cuInit only cuInit and cuGetErrorName work.
    let mut dev: CUdevice = -1;
    // SAFETY: `dev` is a valid out pointer.
    let rc = unsafe { cuDeviceGet(&mut dev, 0) };
    assert_eq!(rc, CUDA_ERROR_NOT_INITIALIZED);
    assert_eq!(
        error_name(201).as_deref(),
        Some("CUDA_ERROR_INVALID_CONTEXT")
    );
    assert_eq!(error_name(12345), None);
    assert_eq!(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(cuInit(0), CUDA_SUCCESS);

    // Devices.
    // SAFETY: `dev` is a valid out pointer; a null one is rejected.
    unsafe {
        assert_eq!(cuDeviceGet(&mut dev, 2), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(cuDeviceGet(ptr::null_mut(), 0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuDeviceGet(&mut dev, 1), CUDA_SUCCESS);
    }
    assert_eq!(dev, 1);

    // No current context: memory calls fail with 201.
    assert_eq!(current(), 0);
    assert_eq!(alloc(4096), Err(CUDA_ERROR_INVALID_CONTEXT));
    assert_eq!(
        cuMemFree_v2(0xc0da_0000_0000_0000),
        CUDA_ERROR_INVALID_CONTEXT
    );

    // Retain counts and the per-thread current context.
    let ctx0 = retain(0);
    assert_eq!(ctx0 as usize, 0xC7C0_0000);
    assert_eq!(retain(0), ctx0);
    assert_eq!(fake_cuda_retain_count(0), 2);
    assert_eq!(fake_cuda_retain_count(1), 0);
    assert_eq!(fake_cuda_retain_count(2), -1);
    assert_eq!(
        cuCtxSetCurrent(0xdead_0000 as CUcontext),
        CUDA_ERROR_INVALID_CONTEXT
    );
    assert_eq!(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    assert_eq!(current(), ctx0 as usize);
    std::thread::spawn(|| {
        assert_eq!(current(), 0, "a new thread has no current context");
        assert_eq!(alloc(64), Err(CUDA_ERROR_INVALID_CONTEXT));
    })
    .join()
    .unwrap();

    // Allocation, fill, copies, memset, bounds.
    let a = alloc(4096).unwrap();
    assert!(
        a >= 0xc0da_0000_0000_0000 && a.is_multiple_of(4096),
        "{a:#x}"
    );
    assert_eq!(fake_cuda_alloc_device(a + 100), 0);
    assert_eq!(read(a, 8).unwrap(), [0xCD; 8]);
    let data: Vec<u8> = (0..16).collect();
    // SAFETY: `data` holds 16 bytes.
    let rc = unsafe { cuMemcpyHtoD_v2(a + 8, data.as_ptr().cast::<c_void>(), 16) };
    assert_eq!(rc, CUDA_SUCCESS);
    assert_eq!(read(a + 8, 16).unwrap(), data);
    assert_eq!(cuMemsetD8_v2(a, 7, 4), CUDA_SUCCESS);
    assert_eq!(read(a, 4).unwrap(), [7; 4]);
    assert_eq!(read(a + 4090, 8), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(cuMemsetD8_v2(a + 8192, 0, 1), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(alloc(0), Err(CUDA_ERROR_INVALID_VALUE));

    // Address reuse after free (and none when turned off).
    assert_eq!(cuMemFree_v2(a + 1), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(cuMemFree_v2(a), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(fake_cuda_alloc_device(a), -1);
    let b = alloc(100).unwrap();
    assert_eq!(b, a, "same size class: the freed address comes back");
    assert_eq!(read(b, 2).unwrap(), [0xCD; 2], "fresh fill on reuse");
    fake_cuda_set_reuse(0);
    assert_eq!(cuMemFree_v2(b), CUDA_SUCCESS);
    let c = alloc(100).unwrap();
    assert_ne!(c, b);
    fake_cuda_set_reuse(1);
    assert_eq!(fake_cuda_live_allocations(), 1);

    // Wrong context: another device's current context may not touch the allocation.
    let ctx1 = retain(1);
    assert_ne!(ctx1, ctx0);
    assert_eq!(cuCtxSetCurrent(ctx1), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(c), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(read(c, 1), Err(CUDA_ERROR_INVALID_VALUE));
    assert_eq!(fake_cuda_violations(), 2);
    let d = alloc(10).unwrap();
    assert_eq!(fake_cuda_alloc_device(d), 1);
    assert_eq!(cuMemFree_v2(d), CUDA_SUCCESS);
    assert_eq!(cuCtxSetCurrent(ctx0), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(c), CUDA_SUCCESS);
    assert_eq!(fake_cuda_live_allocations(), 0);

    // Host registration: overlap 712, unregister of a non-start 713.
    let mut host = vec![0u8; 256];
    let p = host.as_mut_ptr().cast::<c_void>();
    assert_eq!(cuMemHostRegister_v2(p, 100, 0), CUDA_SUCCESS);
    // SAFETY: offsets stay inside `host` (the pointers are only recorded, never dereferenced).
    let (p50, p1) = unsafe { (p.byte_add(50), p.byte_add(1)) };
    assert_eq!(
        cuMemHostRegister_v2(p50, 10, 0),
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    );
    assert_eq!(
        cuMemHostRegister_v2(ptr::null_mut(), 10, 0),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(cuMemHostRegister_v2(p, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_eq!(
        cuMemHostUnregister(p1),
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    );
    assert_eq!(fake_cuda_live_registrations(), 1);
    assert_eq!(fake_cuda_registered_bytes(), 100);
    assert_eq!(cuMemHostUnregister(p), CUDA_SUCCESS);
    assert_eq!(
        cuMemHostUnregister(p),
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    );
    assert_eq!(fake_cuda_live_registrations(), 0);
    assert_eq!(host[0], 0, "registration never touches the memory");

    // Injection fires once, on the nth call, without doing anything.
    // SAFETY: valid NUL-terminated names; a null one is rejected.
    unsafe {
        assert_eq!(fake_cuda_inject(c"cuMemAlloc_v2".as_ptr(), 2, 2), 0);
        assert_eq!(fake_cuda_inject(ptr::null(), 1, 2), -1);
        assert_eq!(fake_cuda_inject(c"cuMemAlloc_v2".as_ptr(), 0, 2), -1);
    }
    let e = alloc(4096).unwrap();
    assert_eq!(alloc(4096), Err(CUDA_ERROR_OUT_OF_MEMORY));
    let f = alloc(4096).unwrap();
    assert_eq!(fake_cuda_live_allocations(), 2);
    assert_eq!(cuMemFree_v2(e), CUDA_SUCCESS);
    assert_eq!(cuMemFree_v2(f), CUDA_SUCCESS);
    let log = call_log();
    assert!(
        log.contains("cuMemAlloc_v2 - 4096 -> 2 (injected)\n"),
        "{log}"
    );
    assert!(
        log.contains(&format!("cuMemAlloc_v2 {e:#x} 4096 -> 0\n")),
        "{log}"
    );
    assert!(
        log.contains(&format!("cuMemFree_v2 {e:#x} -> 0\n")),
        "{log}"
    );
    assert!(
        log.contains(&format!("cuMemAlloc_v2 {a:#x} 4096 -> 0\n")),
        "{log}"
    );
    assert!(log.contains("WRONG-CONTEXT"), "{log}");

    // Release: counts go down; at 0 the context is inactive and the handle dangles.
    assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(1), CUDA_ERROR_INVALID_CONTEXT);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(7), CUDA_ERROR_INVALID_DEVICE);
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    assert_eq!(fake_cuda_retain_count(0), 1);
    assert_eq!(alloc(64).map(|d| cuMemFree_v2(d)), Ok(CUDA_SUCCESS));
    assert_eq!(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);
    assert_eq!(fake_cuda_retain_count(0), 0);
    assert_eq!(
        current(),
        ctx0 as usize,
        "the released context stays current"
    );
    assert_eq!(alloc(64), Err(CUDA_ERROR_INVALID_CONTEXT));
    assert_eq!(cuCtxSetCurrent(ctx0), CUDA_ERROR_INVALID_CONTEXT);
    assert_eq!(cuCtxSetCurrent(ptr::null_mut()), CUDA_SUCCESS);
    assert_eq!(current(), 0);

    // Reset clears the log, injections and violations but keeps the model's state.
    // SAFETY: a valid NUL-terminated name.
    unsafe { fake_cuda_inject(c"cuInit".as_ptr(), 1, 999) };
    fake_cuda_reset();
    assert_eq!(fake_cuda_violations(), 0);
    assert_eq!(call_log(), "");
    assert_eq!(cuInit(0), CUDA_SUCCESS);
    assert_eq!(call_log(), "cuInit 0 -> 0\n");
}

/// The source the kernel tests compile: one entry per host kernel they register.
const KERNELS: &str = r#"
// Every entry's parameters are 8 bytes wide, as the fake reads them.
extern "C" __global__ void fill(unsigned char *p, unsigned long long n, unsigned long long v) {}
extern "C" __global__ void gate(void) {}
extern "C" __global__ void slow_write(unsigned long long *p, unsigned long long v) {}
extern "C" __global__ void boom(unsigned long long code) {}
extern "C" __global__ void orphan() {}
extern "C" __global__ void __launch_bounds__(128, 2)
bounded(unsigned char *p, unsigned long long n, unsigned long long v) {}
"#;

/// Compiles `src` with `opts` through the fake NVRTC: its PTX, or the code and log.
fn compile(src: &str, opts: &[&str]) -> Result<Vec<u8>, (nvrtc::nvrtcResult, String)> {
    use crate::nvrtc::*;
    let src = std::ffi::CString::new(src).unwrap();
    let opts: Vec<std::ffi::CString> = opts
        .iter()
        .map(|o| std::ffi::CString::new(*o).unwrap())
        .collect();
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: nvrtcProgram = ptr::null_mut();
    // SAFETY: valid out pointer, NUL-terminated strings, `ptrs` holds `ptrs.len()` options;
    // the output buffers are sized by the matching size calls.
    unsafe {
        let rc = nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            c"k.cu".as_ptr(),
            0,
            ptr::null(),
            ptr::null(),
        );
        assert_eq!(rc, NVRTC_SUCCESS);
        let rc = nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        let result = if rc == NVRTC_SUCCESS {
            let mut n = 0usize;
            assert_eq!(nvrtcGetPTXSize(prog, &mut n), NVRTC_SUCCESS);
            let mut ptx = vec![0u8; n];
            assert_eq!(nvrtcGetPTX(prog, ptx.as_mut_ptr().cast()), NVRTC_SUCCESS);
            Ok(ptx)
        } else {
            let mut n = 0usize;
            assert_eq!(nvrtcGetProgramLogSize(prog, &mut n), NVRTC_SUCCESS);
            let mut log = vec![0u8; n];
            assert_eq!(
                nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()),
                NVRTC_SUCCESS
            );
            assert_eq!(log.pop(), Some(0));
            Err((rc, String::from_utf8(log).unwrap()))
        };
        assert_eq!(nvrtcDestroyProgram(&mut prog), NVRTC_SUCCESS);
        assert!(prog.is_null());
        result
    }
}

fn load(image: &[u8]) -> Result<CUmodule, CUresult> {
    let mut m: CUmodule = ptr::null_mut();
    // SAFETY: `m` is a valid out pointer; `image` is NUL-terminated or no fake image.
    match unsafe { cuModuleLoadData(&mut m, image.as_ptr().cast()) } {
        CUDA_SUCCESS => Ok(m),
        code => Err(code),
    }
}

fn function(m: CUmodule, name: &CStr) -> Result<CUfunction, CUresult> {
    let mut f: CUfunction = ptr::null_mut();
    // SAFETY: `f` is a valid out pointer; `name` is NUL-terminated.
    match unsafe { cuModuleGetFunction(&mut f, m, name.as_ptr()) } {
        CUDA_SUCCESS => Ok(f),
        code => Err(code),
    }
}

/// Launches `f` on `s` with 8-byte parameters `params` (and no shared memory).
fn launch(f: CUfunction, grid: [u32; 3], block: [u32; 3], s: CUstream, params: &[u64]) -> CUresult {
    let mut values = params.to_vec();
    let mut ptrs: Vec<*mut c_void> = values
        .iter_mut()
        .map(|v| ptr::from_mut(v).cast::<c_void>())
        .collect();
    // SAFETY: `ptrs` holds one pointer per parameter, each to 8 readable bytes.
    unsafe {
        cuLaunchKernel(
            f,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            0,
            s,
            ptrs.as_mut_ptr(),
            ptr::null_mut(),
        )
    }
}

/// Makes `f` the host implementation of `entry`.
fn register(entry: &CStr, f: HostKernel) {
    // SAFETY: `entry` is NUL-terminated; `f` is a `fake_cuda_host_kernel` needing no user data.
    let rc = unsafe { fake_cuda_register_kernel(entry.as_ptr(), Some(f), ptr::null_mut()) };
    assert_eq!(rc, 0);
}

/// The host kernel of `fill(p, n, v)`: sets `n` bytes at `p` to `v`; 700 when `p` is no
/// device memory.
unsafe extern "C-unwind" fn fill_kernel(
    _user: *mut c_void,
    _entry: *const c_char,
    params: *const u64,
    n_params: std::ffi::c_uint,
    _grid: *const std::ffi::c_uint,
    _block: *const std::ffi::c_uint,
    _shared: std::ffi::c_uint,
) -> std::ffi::c_int {
    assert_eq!(n_params, 3);
    // SAFETY: the fake passes `n_params` values.
    let (p, n, v) = unsafe { (*params, *params.add(1), *params.add(2)) };
    let host = fake_cuda_translate(p, n);
    if host.is_null() {
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    // SAFETY: `host` has `n` bytes of device memory behind it.
    unsafe { ptr::write_bytes(host.cast::<u8>(), v as u8, n as usize) };
    0
}
