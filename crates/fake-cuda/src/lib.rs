//! A fake CUDA driver library (`libcuda`) and a fake NVRTC (`libnvrtc`) in one file, for tests
//! only (never shipped): the driver API entry points the CUDA backend uses, with their exact C
//! signatures from `cuda.h` and `nvrtc.h`, backed by host memory, with kernels run by host
//! functions that tests register. Tests point the loader at this file (e.g. as `libcuda.so.1`
//! and `libnvrtc.so`) so the backend, including its device-execution path, can be exercised in
//! CI without a GPU.
//!
//! What it models, and why — a fake is only useful if it is at least as strict as the driver:
//! * **Initialization.** Every driver call except `cuInit` (and `cuGetErrorName`, which the
//!   driver answers at any time) returns `CUDA_ERROR_NOT_INITIALIZED` until `cuInit(0)` succeeds.
//!   NVRTC needs no initialization.
//! * **Per-thread current context.** As in the driver, the current context is thread-local: a
//!   thread starts with none, and `cuCtxSetCurrent` on one thread says nothing about another.
//!   Calls needing a context fail with `CUDA_ERROR_INVALID_CONTEXT` without an (active) current
//!   one, so a backend that forgets to bind its context on a worker thread fails here as it
//!   would on a GPU.
//! * **Primary-context retain/release counts.** `cuDevicePrimaryCtxRetain` and
//!   `cuDevicePrimaryCtxRelease_v2` are reference-counted per device. When the count drops to 0
//!   the context becomes inactive: a thread that still has it current keeps a dangling handle and
//!   every call needing a context fails. Releasing more often than retaining is an error. Tests
//!   read the counts back to prove retains and releases balance. Allocations, streams, events
//!   and modules are *not* destroyed with the context (unlike the driver): they stay live,
//!   counted by the controls, and usable again after the next retain, so a driver that leaks one
//!   shows up in the counts.
//! * **Host registration.** `cuMemHostRegister_v2` records page-locked ranges (without touching
//!   the memory); overlapping registrations and unregistering an address that does not start a
//!   registration fail with the driver's codes, and tests can check nothing is left registered.
//! * **Device addresses and reuse.** Allocations get addresses from a distinct, non-canonical
//!   range (`0xc0da_0000_0000_0000` upward), so a caller that dereferences a device pointer
//!   crashes instead of silently working. Fresh memory is filled with `0xCD` (device memory is
//!   not zeroed). A freed address is handed out again to the next allocation of the same size, as
//!   the driver's allocator does, so a handle kept past `cuMemFree_v2` really aliases newer data.
//! * **Streams run asynchronously** ([`exec`]). Each stream has a FIFO queue run in order by a
//!   background thread, after the enqueuing call returned (and, by default, after a launch
//!   latency), so a caller that forgets to synchronize sees stale data. Queueing costs what a
//!   driver's call does: a stream's thread stays a while after its queue empties, looking for
//!   more work rather than waiting to be woken, and copies move in chunks, so a call made while
//!   the stream copies waits for one chunk at most.
//!   `cuMemcpyHtoDAsync_v2` from a registered (pinned) range reads the host bytes when it runs,
//!   as DMA does; from pageable memory it copies them at call time. `cuMemcpyDtoHAsync_v2`
//!   writes the host buffer when it runs. The built-in streams are queues too, as on a GPU
//!   (never handed out, not counted as live streams): `0` and `CU_STREAM_LEGACY` name the
//!   legacy default stream of the calling thread's current device, `CU_STREAM_PER_THREAD` a
//!   blocking per-thread stream of that thread and device; launches, async copies, memsets,
//!   event records and waits on them return at once. Legacy synchronization as in the CUDA
//!   Driver API's "Stream synchronization behavior": work on the legacy stream first waits for
//!   the work already queued on the device's *blocking* streams (flags 0, the per-thread ones
//!   included), work on a blocking stream for the legacy stream's work queued before it, and a
//!   `CU_STREAM_NON_BLOCKING` stream never synchronizes with it — so a library writing on the
//!   legacy stream is *not* ordered before work on a non-blocking stream that did not wait for
//!   an event recorded after the write. The synchronous `cuMemcpyHtoD_v2`, `cuMemcpyDtoH_v2`
//!   and `cuMemsetD8_v2` are legacy-stream work that returns as the Driver API's "API
//!   synchronization behavior" says: a copy back, or from a pinned range, once it ran; a copy
//!   from pageable memory once its bytes are staged (before it ran); a memset at once.
//!   `cuStreamSynchronize`/`cuStreamQuery` on the legacy stream cover the device's blocking
//!   streams; `cuCtxSynchronize` and `cuMemFree_v2` wait for every stream (of the device; of
//!   every device); `cuStreamDestroy_v2` drains the stream first. Events record a point in a
//!   stream (on the legacy stream, after its implicit waits); `cuStreamWaitEvent` queues a wait
//!   for it (also across devices); a never-recorded event is complete.
//! * **Timing events.** An event made without `CU_EVENT_DISABLE_TIMING` queues, at each
//!   recording, a marker that stamps the host's monotonic clock when the stream reaches it;
//!   `cuEventElapsedTime` (and its `_v2` name) answers the difference in milliseconds,
//!   `CUDA_ERROR_NOT_READY` while either marker has not run, `CUDA_ERROR_INVALID_HANDLE` for an
//!   event without timing or never recorded.
//! * **Modules and launches** ([`api::module`]). `cuModuleLoadData` accepts only images of the
//!   fake NVRTC ([`image`]); one compiled by an NVRTC newer than the driver
//!   (`FAKE_CUDA_DRIVER_VERSION`) fails with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` — PTX newer by
//!   major.minor, a cubin newer by major (a newer minor's cubin loads: minor version
//!   compatibility) — and one the device cannot run with `CUDA_ERROR_NO_BINARY_FOR_GPU`: a
//!   cubin `sm_NN` only on the same major capability and at least `NN` (`sm_80` runs on 8.6,
//!   not on 9.0), PTX `compute_NN` on any capability at least `NN`, an `a` suffix only on
//!   exactly `NN`, an `f` suffix on the same major and at least `NN`. A function has limits of
//!   its own (`cuFuncGetAttribute`, `cuFuncSetAttribute`): its `__launch_bounds__` (else 1024
//!   threads), and 48 KiB of dynamic shared memory until it opts in to more (up to the device's
//!   opt-in limit). `cuLaunchKernel` validates the launch at call time — more threads than the
//!   function's limit is `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES` (not sticky), more shared memory
//!   `CUDA_ERROR_INVALID_VALUE` — and copies the parameter values (each parameter is read as 8
//!   bytes — a limit of the fake), then runs, in stream order, the host function a test
//!   registered for the entry (`fake_cuda_register_kernel`), on the stream's thread, with no
//!   lock of the fake held; it reaches device memory through `fake_cuda_translate`. A host
//!   kernel must not call the driver (device code cannot): such calls fail with
//!   `CUDA_ERROR_NOT_PERMITTED`.
//! * **Stream capture and graphs** ([`api::graph`]). A created stream captures launches
//!   between `cuStreamBeginCapture_v2` and `cuStreamEndCapture` without running them; other work
//!   on it (or synchronizing it) is refused and invalidates the capture. `cuGraphLaunch` queues
//!   exactly the launches captured, with the parameter values captured, on the stream it is
//!   launched on.
//! * **Device facts.** `cuDeviceGetAttribute` answers an H200's limits (1024 threads a block,
//!   48 KiB of shared memory, 227 KiB opt-in, 132 multiprocessors, clocks, a 6144-bit memory
//!   bus) and the compute capability, `cuDeviceGetName` "Fake CUDA device (H200-like)",
//!   `cuDeviceTotalMem_v2` the device's memory, which `cuMemAlloc_v2` never exceeds
//!   (`CUDA_ERROR_OUT_OF_MEMORY`).
//! * **Sticky errors.** A host kernel returning non-zero (or an operation reaching memory freed
//!   meanwhile) is a device fault: `CUDA_ERROR_ILLEGAL_ADDRESS` (700) when it returned 700,
//!   else `CUDA_ERROR_LAUNCH_FAILED` (719); an entry without a host function faults with 719.
//!   The fault poisons the device's primary context: operations still queued on its streams are
//!   discarded, and every later call needing the context returns the code (synchronize calls
//!   included). The releasing calls (`cuMemFree_v2`, `cuMemHostUnregister`,
//!   `cuStreamDestroy_v2`, `cuEventDestroy_v2`, `cuModuleUnload`) return it too but still
//!   release their object, so a driver's cleanup path leaves nothing behind. `cuCtxGetCurrent`,
//!   `cuCtxSetCurrent` and `cuDevicePrimaryCtxRelease_v2` keep working; when the retain count
//!   drops to 0 the poison is cleared (the next retain makes a fresh context): another holder
//!   of the primary context (torch retains it too) keeps it, poisoned, alive after ours were
//!   released, and a new retain gets it back poisoned. `cuDevicePrimaryCtxGetState` says
//!   whether it is retained.
//!   An injected sticky code (700, 702, 710, 714-719) on a call made with an active current
//!   context poisons that context too, as a fault the call reported would.
//! * **Pinning granularity.** The driver page-locks whole host pages: a registration covers
//!   every page its range touches (`FAKE_CUDA_HOST_PAGE`, default 4096), and one that shares a
//!   page with another registration is refused (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`), as
//!   two mirrors within one 64 KiB page are on a 64 KiB-page host.
//! * **Lifecycle costs.** Nothing sleeps, but the expensive lifecycle events are counted and
//!   priced (`fake_cuda_lifecycle`): the first `cuInit`, a primary context's creation (its first
//!   retain) and its destruction (the last release). The prices are assumed orders of magnitude;
//!   what a benchmark compares is how many of each event a workload causes.
//! * **NVRTC** ([`nvrtc`]). "Compiling" finds the `extern "C" __global__` entries of the source,
//!   counts their parameters and reads their `__launch_bounds__` (whose first argument must be
//!   an integer literal, or a name given one by `#define` or a `const`/`constexpr` initializer:
//!   the fake evaluates nothing else, and fails the compile saying so); `#error` fails the compile
//!   with its message in the log; the output is a module image for `cuModuleLoadData` that
//!   records the architecture and the compiler's version. A CUBIN exists only for a real
//!   `sm_NN` target, as in NVRTC. The version is the library's own file name's when it was
//!   loaded as `libnvrtc.so.<major>[.<minor>]` (so two copies under two names are two NVRTCs),
//!   else `FAKE_NVRTC_VERSION`, else 13.0; it decides the architectures NVRTC compiles for
//!   (`nvrtcGetNumSupportedArchs`, `nvrtcGetSupportedArchs`): another `--gpu-architecture`
//!   fails with `NVRTC_ERROR_INVALID_OPTION`.
//! * **Fault injection.** The `nth` next call of a named export (driver or NVRTC) returns a
//!   chosen code without doing anything, so error paths can be tested.
//! * **Stricter-than-real checks.** Freeing, copying to/from or setting an allocation while the
//!   current context belongs to a different device than the one that allocated it is accepted by
//!   the real driver (unified addressing) but is refused here with `CUDA_ERROR_INVALID_VALUE` and
//!   counted as a "wrong context" violation, because it means the backend lost track of which
//!   device owns the memory. Likewise any use of a stream, event, module or function of another
//!   device than the current context's is refused with `CUDA_ERROR_INVALID_HANDLE` and counted
//!   (except the event of `cuStreamWaitEvent`, which may come from any device, as in CUDA).
//!
//! Configuration, read from the environment on first use (so a whole test run can be configured)
//! and again by `fake_cuda_reset`:
//! * `FAKE_CUDA_DEVICES` (default 2): number of devices; ordinals at or past it are invalid.
//! * `FAKE_CUDA_INJECT=name:nth:code[,name:nth:code...]`: the `nth` next call of the named
//!   function (its exact C name, e.g. `cuMemAlloc_v2` or `nvrtcCompileProgram`) returns `code`.
//! * `FAKE_CUDA_DRIVER_VERSION` (default 13000, read at each call): what `cuDriverGetVersion`
//!   answers, and the version `cuModuleLoadData` checks images against.
//! * `FAKE_NVRTC_VERSION` (e.g. `12.4`; read at each call): NVRTC's version when its file name
//!   gives none (default 13.0).
//! * `FAKE_CUDA_REUSE` (default on): `0`/`off` stops freed addresses from being reused.
//! * `FAKE_CUDA_CC` (default `9.0`): the compute capability every device reports.
//! * `FAKE_CUDA_STREAM_LATENCY_US` (default 200): how long a stream that was idle waits before
//!   it runs newly queued work (a launch latency, so a forgotten synchronize shows up); the
//!   built-in streams included.
//! * `FAKE_CUDA_HOST_PAGE` (default 4096): the host page size registrations are counted in.
//! * `FAKE_CUDA_SM_COUNT` (default 132): `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`.
//! * `FAKE_CUDA_SHARED_OPTIN` (default 232448):
//!   `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, the most dynamic shared memory
//!   `cuFuncSetAttribute` lets a function opt in to.
//! * `FAKE_CUDA_TOTAL_MEM` (default 150754820096): each device's memory
//!   (`cuDeviceTotalMem_v2`); allocations beyond it fail.
//!
//! Controls for tests (C ABI, see [`control`]): `fake_cuda_reset` (clears the call log, pending
//! injections, the violation count and the launch/load/compile counters, releases every stream
//! hold, re-reads the environment; keeps live allocations, registrations, retain counts, streams,
//! events, modules, programs, sticky errors and registered host kernels), `fake_cuda_inject`,
//! `fake_cuda_call_log` (one text line per call: `name args -> code`, the device address or
//! handle as the second word where there is one, injected failures marked ` (injected)`, and
//! `fake_cuda fault ...` lines for device faults), `fake_cuda_live_allocations`,
//! `fake_cuda_live_registrations`, `fake_cuda_registered_bytes`, `fake_cuda_retain_count`,
//! `fake_cuda_violations`, `fake_cuda_alloc_device`, `fake_cuda_set_devices`,
//! `fake_cuda_set_reuse`, `fake_cuda_register_kernel`, `fake_cuda_register_noop_kernel`,
//! `fake_cuda_translate`,
//! `fake_cuda_launch_count`, `fake_cuda_module_loads`, `fake_cuda_live_modules`,
//! `fake_cuda_live_streams` (streams made by `cuStreamCreate`), `fake_cuda_live_events`,
//! `fake_cuda_poisoned`, `fake_cuda_hold_streams` (every stream made by `cuStreamCreate`),
//! `int fake_cuda_hold_stream(CUstream h, int on)` (one stream, a built-in handle naming the
//! calling thread's stream of its current device: 0, or `CUDA_ERROR_INVALID_HANDLE` /
//! `CUDA_ERROR_INVALID_CONTEXT`), `fake_cuda_set_stream_latency_us`, `fake_cuda_lifecycle`,
//! `fake_cuda_set_host_page`, `fake_cuda_live_graphs`, `fake_cuda_graph_launches`,
//! `fake_cuda_replayed_launches`, `fake_nvrtc_compile_count` and `fake_nvrtc_live_programs`.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use fake_vendor::{
    current_ctx, parse_flag, set_current_ctx, AddressMode, CallLog, FakeState, Handles, Heap,
    Injections, Shared,
};

pub mod api;
pub mod control;
pub mod exec;
pub mod image;
pub mod nvrtc;

#[cfg(test)]
mod tests;

/// `CUresult` (`cuda.h`: an enum, passed as `int`).
pub type CUresult = c_int;
/// `CUdevice` (`cuda.h`: `typedef int CUdevice`).
pub type CUdevice = c_int;
/// `CUcontext` (`cuda.h`: an opaque `struct CUctx_st *`).
pub type CUcontext = *mut c_void;
/// `CUdeviceptr` (`cuda.h`: `unsigned long long` on 64-bit hosts).
pub type CUdeviceptr = std::ffi::c_ulonglong;
/// `CUstream` (`cuda.h`: an opaque `struct CUstream_st *`).
pub type CUstream = *mut c_void;
/// `CUevent` (`cuda.h`: an opaque `struct CUevent_st *`).
pub type CUevent = *mut c_void;
/// `CUmodule` (`cuda.h`: an opaque `struct CUmod_st *`).
pub type CUmodule = *mut c_void;
/// `CUfunction` (`cuda.h`: an opaque `struct CUfunc_st *`).
pub type CUfunction = *mut c_void;
/// `CUdevice_attribute` (`cuda.h`: an enum, passed as `int`).
#[allow(non_camel_case_types)] // the header's name
pub type CUdevice_attribute = c_int;

/// A host implementation of a kernel entry (`fake_cuda_host_kernel`): returns 0 on success, 700
/// for an illegal address, anything else for another device fault. `C-unwind`: a foreign
/// forced unwind (`pthread_exit` from Python's finalization) may pass through it.
pub type HostKernel = unsafe extern "C-unwind" fn(
    user: *mut c_void,
    entry: *const std::ffi::c_char,
    params: *const std::ffi::c_ulonglong,
    n_params: std::ffi::c_uint,
    grid: *const std::ffi::c_uint,
    block: *const std::ffi::c_uint,
    shared_bytes: std::ffi::c_uint,
) -> c_int;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: CUresult = 209;
pub const CUDA_ERROR_UNSUPPORTED_PTX_VERSION: CUresult = 222;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_LAUNCH_FAILED: CUresult = 719;
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// First device address handed out: non-canonical on x86-64 and outside aarch64 user space.
const DEV_BASE: u64 = 0xc0da_0000_0000_0000;
/// Device allocation alignment.
const ALIGN: u64 = 4096;
/// Byte written into fresh allocations (device memory is not zeroed).
const FILL: u8 = 0xCD;
/// Primary context handles: device `d`'s is number `d`. Opaque values, never dereferenced.
const CONTEXTS: Handles = Handles::new(0xC7C0_0000, 16);
/// Device count when `FAKE_CUDA_DEVICES` is unset.
const DEFAULT_DEVICES: c_int = 2;
/// Compute capability when `FAKE_CUDA_CC` is unset.
const DEFAULT_CC: (c_int, c_int) = (9, 0);
/// Launch latency when `FAKE_CUDA_STREAM_LATENCY_US` is unset.
const DEFAULT_LATENCY_US: u64 = 200;
/// Host page size when `FAKE_CUDA_HOST_PAGE` is unset.
const DEFAULT_HOST_PAGE: u64 = 4096;
/// Multiprocessors a device has when `FAKE_CUDA_SM_COUNT` is unset (an H200's).
const DEFAULT_SM_COUNT: c_int = 132;
/// Shared memory a block may opt in to when `FAKE_CUDA_SHARED_OPTIN` is unset (227 KiB, an
/// H200's `MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`).
const DEFAULT_SHARED_OPTIN: u32 = 232_448;
/// Device memory when `FAKE_CUDA_TOTAL_MEM` is unset (an H200's).
const DEFAULT_TOTAL_MEM: u64 = 150_754_820_096;
/// The driver version when `FAKE_CUDA_DRIVER_VERSION` is unset (CUDA 13.0).
const DEFAULT_DRIVER_VERSION: c_int = 13000;

/// The driver's version (`1000 * major + 10 * minor`): `FAKE_CUDA_DRIVER_VERSION`, read at each
/// call (so a test may change it while the library is loaded), else 13000.
fn driver_version() -> c_int {
    std::env::var("FAKE_CUDA_DRIVER_VERSION")
        .ok()
        .and_then(|v| v.trim().parse::<c_int>().ok())
        .filter(|&v| v > 0)
        .unwrap_or(DEFAULT_DRIVER_VERSION)
}

/// Modeled lifecycle costs in nanoseconds (assumed, see the module docs): the first `cuInit`,
/// a primary context's creation and its destruction.
const INIT_NS: u64 = 100_000_000;
const CTX_CREATE_NS: u64 = 200_000_000;
const CTX_DESTROY_NS: u64 = 50_000_000;

/// Lifecycle events (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
struct Lifecycle {
    inits: u64,
    ctx_creates: u64,
    ctx_destroys: u64,
}

impl Lifecycle {
    fn ns(&self) -> u64 {
        self.inits * INIT_NS + self.ctx_creates * CTX_CREATE_NS + self.ctx_destroys * CTX_DESTROY_NS
    }
}

/// Whether `code` is a sticky device fault (the context is unusable after it).
fn is_sticky(code: CUresult) -> bool {
    matches!(code, 700 | 702 | 710 | 714..=719)
}

/// Bases of the opaque handles of each kind (never dereferenced, never reused).
const STREAM_BASE: usize = 0x5700_0000_0000;
const EVENT_BASE: usize = 0xE700_0000_0000;
const MODULE_BASE: usize = 0x30D0_0000_0000;
const FUNCTION_BASE: usize = 0xF700_0000_0000;
const PROGRAM_BASE: usize = 0x9C00_0000_0000;

static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

/// A fresh opaque handle of the kind starting at `base`.
fn new_handle(base: usize) -> usize {
    base + NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) * 16
}

/// The primary context handle of `dev`.
fn ctx_of(dev: CUdevice) -> usize {
    CONTEXTS.handle(dev as usize)
}

/// The device whose primary-context handle `ctx` is (whether or not it is valid or active).
fn device_of_ctx(ctx: usize) -> Option<CUdevice> {
    CUdevice::try_from(CONTEXTS.number(ctx)?).ok()
}

struct State {
    initialized: bool,
    devices: c_int,
    /// Compute capability (major, minor) of every device.
    cc: (c_int, c_int),
    /// Primary-context retain counts by device (absent: 0).
    retains: BTreeMap<CUdevice, u64>,
    /// Sticky fault codes by device (absent: the context is healthy).
    poison: BTreeMap<CUdevice, CUresult>,
    /// Device memory; each block records the device that allocated it.
    heap: Heap<CUdevice>,
    /// Host registrations: start -> length.
    registrations: BTreeMap<u64, u64>,
    /// Loaded modules and the functions got from them, by handle.
    modules: BTreeMap<usize, api::module::Module>,
    functions: BTreeMap<usize, api::module::Function>,
    /// Host implementations of kernel entries: entry -> (function, user pointer).
    kernels: BTreeMap<String, (HostKernel, usize)>,
    /// NVRTC programs by handle.
    programs: BTreeMap<usize, nvrtc::Program>,
    launches: u64,
    /// Stream captures in progress, by stream handle; graphs and executable graphs by handle.
    captures: BTreeMap<usize, api::graph::Capture>,
    graphs: BTreeMap<usize, api::graph::Graph>,
    graph_execs: BTreeMap<usize, api::graph::Graph>,
    /// `cuGraphLaunch` calls and the kernel launches they queued.
    graph_launches: u64,
    replayed_launches: u64,
    module_loads: u64,
    compiles: u64,
    injections: Injections,
    log: CallLog,
    violations: u64,
    /// The host page size registrations are counted in.
    host_page: u64,
    /// Multiprocessors of every device.
    sm_count: c_int,
    /// The most dynamic shared memory a function may opt in to.
    shared_optin: u32,
    /// Memory of every device, in bytes.
    total_mem: u64,
    lifecycle: Lifecycle,
}

static STATE: Shared<State> = Shared::new();

impl FakeState for State {
    const NAME: &'static str = "fake-cuda";

    fn from_env() -> State {
        let mut st = State {
            initialized: false,
            devices: DEFAULT_DEVICES,
            cc: DEFAULT_CC,
            retains: BTreeMap::new(),
            poison: BTreeMap::new(),
            heap: Heap::new(AddressMode::Distinct(DEV_BASE)),
            registrations: BTreeMap::new(),
            modules: BTreeMap::new(),
            functions: BTreeMap::new(),
            kernels: BTreeMap::new(),
            programs: BTreeMap::new(),
            launches: 0,
            captures: BTreeMap::new(),
            graphs: BTreeMap::new(),
            graph_execs: BTreeMap::new(),
            graph_launches: 0,
            replayed_launches: 0,
            module_loads: 0,
            compiles: 0,
            injections: Injections::default(),
            log: CallLog::default(),
            violations: 0,
            host_page: DEFAULT_HOST_PAGE,
            sm_count: DEFAULT_SM_COUNT,
            shared_optin: DEFAULT_SHARED_OPTIN,
            total_mem: DEFAULT_TOTAL_MEM,
            lifecycle: Lifecycle::default(),
        };
        st.apply_env();
        st
    }

    fn injections(&mut self) -> &mut Injections {
        &mut self.injections
    }

    fn log(&mut self) -> &mut CallLog {
        &mut self.log
    }
}

impl State {
    fn apply_env(&mut self) {
        self.devices = DEFAULT_DEVICES;
        let count = |v: &str| v.trim().parse::<c_int>().ok().filter(|&n| n >= 0);
        if let Some(n) = self.env("FAKE_CUDA_DEVICES", count) {
            self.devices = n;
        }
        self.heap.reuse = true;
        if let Some(on) = self.env("FAKE_CUDA_REUSE", parse_flag) {
            self.heap.reuse = on;
        }
        self.cc = DEFAULT_CC;
        let cc = |v: &str| {
            let (a, b) = v.trim().split_once('.')?;
            let (a, b) = (a.parse::<c_int>().ok()?, b.parse::<c_int>().ok()?);
            (a > 0 && (0..10).contains(&b)).then_some((a, b))
        };
        if let Some(cc) = self.env("FAKE_CUDA_CC", cc) {
            self.cc = cc;
        }
        let mut latency = DEFAULT_LATENCY_US;
        if let Some(us) = self.env("FAKE_CUDA_STREAM_LATENCY_US", |v| v.trim().parse().ok()) {
            latency = us;
        }
        exec::set_latency_us(latency);
        self.host_page = DEFAULT_HOST_PAGE;
        let page = |v: &str| v.trim().parse::<u64>().ok().filter(|p| p.is_power_of_two());
        if let Some(p) = self.env("FAKE_CUDA_HOST_PAGE", page) {
            self.host_page = p;
        }
        self.sm_count = DEFAULT_SM_COUNT;
        let positive = |v: &str| v.trim().parse::<c_int>().ok().filter(|&n| n > 0);
        if let Some(n) = self.env("FAKE_CUDA_SM_COUNT", positive) {
            self.sm_count = n;
        }
        self.shared_optin = DEFAULT_SHARED_OPTIN;
        let optin = |v: &str| {
            let n = v.trim().parse::<u32>().ok()?;
            c_int::try_from(n).is_ok().then_some(n)
        };
        if let Some(n) = self.env("FAKE_CUDA_SHARED_OPTIN", optin) {
            self.shared_optin = n;
        }
        self.total_mem = DEFAULT_TOTAL_MEM;
        let bytes = |v: &str| v.trim().parse::<u64>().ok().filter(|&n| n > 0);
        if let Some(n) = self.env("FAKE_CUDA_TOTAL_MEM", bytes) {
            self.total_mem = n;
        }
        self.inject_from_env("FAKE_CUDA_INJECT");
    }

    /// Logs a call and returns its code.
    fn ret(&mut self, name: &str, args: &str, code: CUresult) -> CUresult {
        self.log.ret(name, args, code)
    }

    /// The failure this call of `name` must return, if any: an injected one (logged with
    /// ` (injected)`), else `CUDA_ERROR_NOT_PERMITTED` for a call from a host kernel (device code
    /// cannot call the driver), else `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` (logged).
    fn gate(&mut self, name: &str, args: &str) -> Option<CUresult> {
        if let Some(code) = self.injections.take_logged(&mut self.log, name, args) {
            if is_sticky(code) {
                if let Some(dev) = self.active_device(current_ctx()) {
                    self.poison.entry(dev).or_insert(code);
                    self.log
                        .line(&format!("fake_cuda fault {code} poisons device {dev}"));
                }
            }
            return Some(code);
        }
        if name != "cuGetErrorName" && exec::on_executor() {
            let args = format!("{args} (from a host kernel)");
            return Some(self.ret(name, &args, CUDA_ERROR_NOT_PERMITTED));
        }
        if !self.initialized && name != "cuInit" && name != "cuGetErrorName" {
            return Some(self.ret(name, args, CUDA_ERROR_NOT_INITIALIZED));
        }
        None
    }

    fn valid_device(&self, dev: CUdevice) -> bool {
        (0..self.devices).contains(&dev)
    }

    fn retain_count(&self, dev: CUdevice) -> u64 {
        self.retains.get(&dev).copied().unwrap_or(0)
    }

    /// The sticky error of `dev`'s primary context, or `CUDA_SUCCESS`.
    fn poisoned(&self, dev: CUdevice) -> CUresult {
        self.poison.get(&dev).copied().unwrap_or(CUDA_SUCCESS)
    }

    /// The device whose primary context `ctx` is, when that context is active (retained).
    fn active_device(&self, ctx: usize) -> Option<CUdevice> {
        let dev = device_of_ctx(ctx)?;
        (self.valid_device(dev) && self.retain_count(dev) > 0).then_some(dev)
    }

    /// The device of the calling thread's current context, or `CUDA_ERROR_INVALID_CONTEXT` when
    /// there is none or it is no longer active, or the context's sticky error.
    fn current_device(&self) -> Result<CUdevice, CUresult> {
        let dev = self.current_device_any()?;
        match self.poisoned(dev) {
            CUDA_SUCCESS => Ok(dev),
            code => Err(code),
        }
    }

    /// [`State::current_device`], poisoned or not.
    fn current_device_any(&self) -> Result<CUdevice, CUresult> {
        self.active_device(current_ctx())
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// Starts an export that needs a healthy current context: [`State::gate`], then
    /// [`State::current_device`]. Returns the device, or the code to return (already logged).
    fn enter(&mut self, name: &str, args: &str) -> Result<CUdevice, CUresult> {
        if let Some(code) = self.gate(name, args) {
            return Err(code);
        }
        self.current_device()
            .map_err(|code| self.ret(name, args, code))
    }

    /// [`State::enter`] for the exports that also work on a poisoned context (the releasing
    /// calls and synchronizes): [`State::current_device_any`].
    fn enter_any(&mut self, name: &str, args: &str) -> Result<CUdevice, CUresult> {
        if let Some(code) = self.gate(name, args) {
            return Err(code);
        }
        self.current_device_any()
            .map_err(|code| self.ret(name, args, code))
    }

    /// Starts an export about device `dev` that needs no context: [`State::gate`], then
    /// `CUDA_ERROR_INVALID_DEVICE` (logged) for an ordinal that names no device.
    fn enter_device(&mut self, name: &str, args: &str, dev: CUdevice) -> Result<(), CUresult> {
        if let Some(code) = self.gate(name, args) {
            return Err(code);
        }
        if !self.valid_device(dev) {
            return Err(self.ret(name, args, CUDA_ERROR_INVALID_DEVICE));
        }
        Ok(())
    }

    /// Counts a use of `owner`'s object while `dev`'s context is current; returns the log note.
    fn wrong_context(&mut self, what: &str, owner: CUdevice, dev: CUdevice) -> String {
        self.violations += 1;
        format!(" WRONG-CONTEXT({what} dev={owner}, current dev={dev})")
    }

    /// Checks that `[addr, addr + len)` lies in one live allocation of device `dev` and returns
    /// the host address of `addr`. On failure returns the code and, for a wrong-device
    /// allocation, the log suffix (the violation is counted).
    fn device_range(&mut self, addr: u64, len: u64, dev: CUdevice) -> Result<*mut u8, String> {
        let Some((_, host, block)) = self.heap.translate(addr, len) else {
            return Err(String::new());
        };
        if block.meta != dev {
            let owner = block.meta;
            return Err(self.wrong_context("alloc", owner, dev));
        }
        Ok(host)
    }

    /// [`State::device_range`] for the call `name args`: a failure is logged with its note and
    /// returned as `CUDA_ERROR_INVALID_VALUE`.
    fn live_range(
        &mut self,
        (name, args): (&str, &str),
        addr: u64,
        len: u64,
        dev: CUdevice,
    ) -> Result<*mut u8, CUresult> {
        self.device_range(addr, len, dev).map_err(|note| {
            let args = format!("{args}{note}");
            self.ret(name, &args, CUDA_ERROR_INVALID_VALUE)
        })
    }

    /// [`State::live_range`] for a copy of `len` bytes between `host` and device memory: a null
    /// `host` with bytes to copy is refused first (`CUDA_ERROR_INVALID_VALUE`, logged).
    fn host_copy_range(
        &mut self,
        call: (&str, &str),
        host: *const c_void,
        addr: u64,
        len: usize,
        dev: CUdevice,
    ) -> Result<*mut u8, CUresult> {
        if host.is_null() && len > 0 {
            return Err(self.ret(call.0, call.1, CUDA_ERROR_INVALID_VALUE));
        }
        self.live_range(call, addr, len as u64, dev)
    }

    /// Whether `[start, start + len)` lies inside one host registration.
    fn pinned(&self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len) else {
            return false;
        };
        self.registrations
            .range(..=start)
            .next_back()
            .is_some_and(|(&s, &l)| s + l >= end)
    }
}

/// Runs `f` on the fake's state (made from the environment on first use), under its lock.
fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(f)
}

/// [`with_state`] for an export that stops at its first failure: `Err` and `Ok` both carry the
/// code to return, already logged.
fn export(f: impl FnOnce(&mut State) -> Result<CUresult, CUresult>) -> CUresult {
    with_state(f).unwrap_or_else(|code| code)
}
