//! Control and observation functions for tests (C ABI, not part of `cuda.h`).

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use fake_vendor::c_text;

use crate::{
    exec, with_state, CUdevice, CUresult, CUstream, HostKernel, CUDA_ERROR_INVALID_HANDLE,
    CUDA_SUCCESS, STATE,
};

/// Clears the call log, pending injections, the violation count and the launch, graph-launch,
/// module-load and compile counters, releases every stream hold, and re-reads the environment
/// (`FAKE_CUDA_DEVICES`, `FAKE_CUDA_INJECT`, `FAKE_CUDA_REUSE`, `FAKE_CUDA_CC`,
/// `FAKE_CUDA_STREAM_LATENCY_US`, `FAKE_CUDA_HOST_PAGE`, `FAKE_CUDA_SM_COUNT`,
/// `FAKE_CUDA_SHARED_OPTIN`, `FAKE_CUDA_TOTAL_MEM`). Initialization, live allocations,
/// registrations, retain counts, streams, events, modules, programs, sticky errors and
/// registered host kernels are kept.
#[no_mangle]
pub extern "C" fn fake_cuda_reset() {
    with_state(|st| {
        st.log.clear();
        st.injections.clear();
        st.violations = 0;
        st.launches = 0;
        st.graph_launches = 0;
        st.replayed_launches = 0;
        st.module_loads = 0;
        st.compiles = 0;
        exec::lock().release_holds();
        st.apply_env();
    });
    exec::notify();
}

/// Makes the `nth` (>= 1) next call of function `name` (its exact C name) return `code` without
/// doing anything. Returns 0, or -1 when `name` is null or `nth` is 0.
///
/// # Safety
/// `name` must be a valid NUL-terminated string (or null, which is rejected).
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_inject(name: *const c_char, nth: u32, code: i32) -> c_int {
    // SAFETY: forwarded caller guarantee.
    unsafe { STATE.inject(name, nth, code) }
}

/// Copies up to `cap` bytes of the call log (UTF-8 text, one line per call, not NUL-terminated)
/// into `buf` and returns the log's full length; call again with a larger buffer when it
/// exceeds `cap`.
///
/// # Safety
/// `buf` must be valid for writes of `cap` bytes (or null with `cap` 0).
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_call_log(buf: *mut c_char, cap: usize) -> usize {
    // SAFETY: forwarded caller guarantee on `buf`.
    unsafe { STATE.copy_log(buf, cap) }
}

/// Number of live (not freed) device allocations.
#[no_mangle]
pub extern "C" fn fake_cuda_live_allocations() -> u64 {
    with_state(|st| st.heap.len() as u64)
}

/// Number of live host registrations.
#[no_mangle]
pub extern "C" fn fake_cuda_live_registrations() -> u64 {
    with_state(|st| st.registrations.len() as u64)
}

/// Total bytes of live host registrations.
#[no_mangle]
pub extern "C" fn fake_cuda_registered_bytes() -> u64 {
    with_state(|st| st.registrations.values().sum())
}

/// The primary-context retain count of `dev`, or -1 for an invalid device.
#[no_mangle]
pub extern "C" fn fake_cuda_retain_count(dev: CUdevice) -> i64 {
    with_state(|st| {
        if st.valid_device(dev) {
            i64::try_from(st.retain_count(dev)).unwrap_or(i64::MAX)
        } else {
            -1
        }
    })
}

/// Number of wrong-context uses (frees, copies or memsets of another device's allocation);
/// must stay 0.
#[no_mangle]
pub extern "C" fn fake_cuda_violations() -> u64 {
    with_state(|st| st.violations)
}

/// The device of the live allocation containing `dptr`, or -1 if none does.
#[no_mangle]
pub extern "C" fn fake_cuda_alloc_device(dptr: u64) -> c_int {
    with_state(|st| st.heap.translate(dptr, 0).map_or(-1, |(_, _, b)| b.meta))
}

/// Sets the number of devices (negative counts as 0).
#[no_mangle]
pub extern "C" fn fake_cuda_set_devices(n: c_int) {
    with_state(|st| st.devices = n.max(0));
}

/// Turns reuse of freed device addresses on (non-zero) or off (0).
#[no_mangle]
pub extern "C" fn fake_cuda_set_reuse(on: c_int) {
    with_state(|st| st.heap.reuse = on != 0);
}

/// `int fake_cuda_register_kernel(const char *entry, fake_cuda_host_kernel fn, void *user)`:
/// makes `fn` the host implementation of kernel entry `entry` (replacing an earlier one; a
/// null `fn` removes it). Launches of `entry` call `fn(user, entry, params, n_params, grid,
/// block, shared_bytes)` on the stream's thread with no lock of the fake held. Returns 0, or
/// -1 for a null `entry`.
///
/// # Safety
/// `entry` must be null or NUL-terminated; `fn` must stay callable, and `user` valid for it,
/// until removed (launches already queued may still call it).
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_register_kernel(
    entry: *const c_char,
    f: Option<HostKernel>,
    user: *mut c_void,
) -> c_int {
    // SAFETY: null or NUL-terminated per the caller.
    let Some(entry) = (unsafe { c_text(entry) }) else {
        return -1;
    };
    with_state(|st| {
        match f {
            Some(f) => st.kernels.insert(entry, (f, user as usize)),
            None => st.kernels.remove(&entry),
        };
    });
    0
}

/// A host kernel that does nothing (see [`fake_cuda_register_noop_kernel`]).
unsafe extern "C-unwind" fn noop_kernel(
    _user: *mut c_void,
    _entry: *const c_char,
    _params: *const c_ulonglong,
    _n_params: c_uint,
    _grid: *const c_uint,
    _block: *const c_uint,
    _shared: c_uint,
) -> c_int {
    0
}

/// `int fake_cuda_register_noop_kernel(const char *entry)`: makes launches of `entry` do nothing,
/// natively (no callback into a caller's runtime, so a benchmark of the host's side measures
/// the host alone). Returns 0, or -1 for a null `entry`.
///
/// # Safety
/// `entry` must be null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_register_noop_kernel(entry: *const c_char) -> c_int {
    // SAFETY: forwarded caller guarantee; `noop_kernel` needs no user data and lives forever.
    unsafe { fake_cuda_register_kernel(entry, Some(noop_kernel), std::ptr::null_mut()) }
}

/// `void *fake_cuda_translate(unsigned long long dev_addr, unsigned long long len)`: the host
/// address of device range `[dev_addr, dev_addr + len)` if it lies in one live allocation (of
/// any device), else null. For host kernels, which may call it from the stream's thread.
#[no_mangle]
pub extern "C" fn fake_cuda_translate(dev_addr: c_ulonglong, len: c_ulonglong) -> *mut c_void {
    with_state(|st| {
        st.heap
            .translate(dev_addr, len)
            .map_or(std::ptr::null_mut(), |(_, host, _)| host.cast())
    })
}

/// Number of launches `cuLaunchKernel` accepted (since the last reset).
#[no_mangle]
pub extern "C" fn fake_cuda_launch_count() -> u64 {
    with_state(|st| st.launches)
}

/// Graphs and executable graphs alive (`cuStreamEndCapture`, `cuGraphInstantiateWithFlags`,
/// not yet destroyed).
#[no_mangle]
pub extern "C" fn fake_cuda_live_graphs() -> u64 {
    with_state(|st| (st.graphs.len() + st.graph_execs.len()) as u64)
}

/// Number of `cuGraphLaunch` calls accepted (since the last reset).
#[no_mangle]
pub extern "C" fn fake_cuda_graph_launches() -> u64 {
    with_state(|st| st.graph_launches)
}

/// Number of kernel launches graph launches queued (since the last reset); not counted in
/// `fake_cuda_launch_count`, which counts `cuLaunchKernel` calls that queued a launch.
#[no_mangle]
pub extern "C" fn fake_cuda_replayed_launches() -> u64 {
    with_state(|st| st.replayed_launches)
}

/// Number of successful `cuModuleLoadData` calls (since the last reset).
#[no_mangle]
pub extern "C" fn fake_cuda_module_loads() -> u64 {
    with_state(|st| st.module_loads)
}

/// Number of loaded (not unloaded) modules.
#[no_mangle]
pub extern "C" fn fake_cuda_live_modules() -> u64 {
    with_state(|st| st.modules.len() as u64)
}

/// Number of live streams made by `cuStreamCreate` (not destroyed; the internal streams behind
/// the built-in handles are not counted).
#[no_mangle]
pub extern "C" fn fake_cuda_live_streams() -> u64 {
    exec::lock().created() as u64
}

/// Number of live (created, not destroyed) events.
#[no_mangle]
pub extern "C" fn fake_cuda_live_events() -> u64 {
    exec::lock().events.len() as u64
}

/// Lifecycle events so far and their modeled cost: writes `[inits, context creations, context
/// destructions]` into `out` (when not null) and returns the modeled nanoseconds.
///
/// # Safety
/// `out` must be null or valid for writes of three `u64`.
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_lifecycle(out: *mut u64) -> u64 {
    with_state(|st| {
        let l = st.lifecycle;
        if !out.is_null() {
            let v = [l.inits, l.ctx_creates, l.ctx_destroys];
            // SAFETY: non-null and, per the caller, valid for three `u64` writes.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, 3) };
        }
        l.ns()
    })
}

/// Sets the host page size registrations are counted in (a power of two); returns 0, or -1 for
/// an invalid size.
#[no_mangle]
pub extern "C" fn fake_cuda_set_host_page(bytes: u64) -> c_int {
    if !bytes.is_power_of_two() {
        return -1;
    }
    with_state(|st| st.host_page = bytes);
    0
}

/// The sticky error of `dev`'s primary context, or 0 when it is healthy (or `dev` is invalid).
#[no_mangle]
pub extern "C" fn fake_cuda_poisoned(dev: c_int) -> c_int {
    with_state(|st| st.poisoned(dev))
}

/// Holds (non-zero) or releases (0) every stream made by `cuStreamCreate` (not the built-in
/// ones: hold those with `fake_cuda_hold_stream`): while held, queued work waits (so a test can
/// observe what was, or was not, done at call time). Anything that waits for a held stream
/// (synchronize, `cuMemFree_v2`, legacy-stream work after work on a blocking stream) blocks
/// until the hold is released from another thread. A stream held by `fake_cuda_hold_stream`
/// stays held when this releases.
#[no_mangle]
pub extern "C" fn fake_cuda_hold_streams(on: c_int) {
    exec::lock().held = on != 0;
    exec::notify();
}

/// `int fake_cuda_hold_stream(CUstream h, int on)`: holds (non-zero `on`) or releases (0) one
/// stream, as `fake_cuda_hold_streams` does for all: while held it runs nothing and its work
/// stays queued. A built-in handle (`0`, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`) names the
/// calling thread's stream of its current context's device. Returns 0;
/// `CUDA_ERROR_INVALID_HANDLE` for a handle that names no live stream;
/// `CUDA_ERROR_INVALID_CONTEXT` for a built-in handle on a thread without an active current
/// context. Like the global hold, it is not logged.
#[no_mangle]
pub extern "C" fn fake_cuda_hold_stream(h: CUstream, on: c_int) -> CUresult {
    let h = h as usize;
    let dev = if exec::builtin(h) {
        match with_state(|st| st.current_device_any()) {
            Ok(dev) => Some(dev),
            Err(code) => return code,
        }
    } else {
        None
    };
    let mut ex = exec::lock();
    let s = match dev {
        Some(dev) => ex.resolve(h, dev),
        None if ex.stream(h).is_some() => h,
        None => return CUDA_ERROR_INVALID_HANDLE,
    };
    if let Some(s) = ex.streams.get_mut(&s) {
        s.held = on != 0;
    }
    drop(ex);
    exec::notify();
    CUDA_SUCCESS
}

/// Sets the launch latency: how long an idle stream waits before running newly queued work.
#[no_mangle]
pub extern "C" fn fake_cuda_set_stream_latency_us(us: c_uint) {
    exec::set_latency_us(u64::from(us));
}

/// Number of successful `nvrtcCompileProgram` calls (since the last reset).
#[no_mangle]
pub extern "C" fn fake_nvrtc_compile_count() -> u64 {
    with_state(|st| st.compiles)
}

/// Number of live (created, not destroyed) NVRTC programs.
#[no_mangle]
pub extern "C" fn fake_nvrtc_live_programs() -> u64 {
    with_state(|st| st.programs.len() as u64)
}
