//! The CUDA driver end to end against the fake `libcuda` (`crates/fake-cuda`): one primary-context
//! reference per device, the caller's context restored, page-locked mirrors, errors, address
//! reuse; then device execution: modules and entries, launches in stream order on the worker's
//! stream (host kernels registered with the fake stand in for device code), copies that wait for
//! them, a sticky device fault and the cleanup after it, the checks made before a launch, ordering
//! another stream after ours (an event), the compute capability, and NVRTC (the fake library
//! also exports `nvrtc*`) compiling what the device then loads. The same driver on a real GPU:
//! `cuda.rs`.
//!
//! Isolation: every test makes its own copy of the fake library ([`Fake::new`]), so the fake's
//! process-global state (call log, counters, registered kernels, stream latency and hold, retain
//! counts, sticky errors) is private to the test, and tests run in parallel.

mod common;

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::Fake;
use simpler_driver::cuda::{CudaConfig, CudaDevice};
use simpler_driver::nvrtc::{CompileError, Nvrtc, Target};
use simpler_driver::{DevPtr, Device, FuncId, LaunchDims, MapGrant, ModuleId, Op};

type Ctx = *mut c_void;

fn fake() -> Fake {
    Fake::new("fake-cuda", "fake_cuda", &["libcuda.so.1"])
}

fn open_id(fake: &Fake, device_id: u32) -> CudaDevice {
    CudaDevice::open(CudaConfig {
        device_id,
        lib_path: Some(fake.dir.join("libcuda.so.1")),
        ..CudaConfig::default()
    })
    .unwrap()
}

/// Gives back the sessions of this test's private library (what the exit hook does for all).
fn release_sessions(fake: &Fake) -> simpler_driver::ReleaseReport {
    simpler_driver::release_sessions_of(&fake.dir.join("libcuda.so.1").display().to_string())
}

fn retains(fake: &Fake, dev: c_int) -> i64 {
    fake.query::<c_int, i64>("retain_count", dev)
}

/// The calling thread's current context, as the fake driver sees it.
fn current(fake: &Fake) -> Ctx {
    let mut ctx: Ctx = std::ptr::null_mut();
    // SAFETY: `CUresult cuCtxGetCurrent(CUcontext *)`; `&mut ctx` is valid for the write.
    let rc =
        unsafe { fake.sym::<unsafe extern "C" fn(*mut Ctx) -> c_int>("cuCtxGetCurrent")(&mut ctx) };
    assert_eq!(rc, 0);
    ctx
}

#[test]
fn round_trip_is_exact_counted_and_every_view_is_a_mirror() {
    let fake = fake();
    let d = open_id(&fake, 0);
    assert_eq!(d.platform(), "cuda");
    let p = d.alloc(64).unwrap();
    assert!(matches!(
        d.map_host(p, 64).unwrap(),
        MapGrant::Refused { code: 801, .. }
    ));
    d.inject_fault(Op::H2d, 1, None).unwrap();
    let e = d.copy_h2d(p, &[1]).unwrap_err();
    assert_eq!(
        (e.call.as_str(), e.code_name.as_str()),
        ("cuMemcpyHtoDAsync_v2", "CUDA_ERROR_ILLEGAL_ADDRESS")
    );
    fake.inject("cuMemAlloc_v2", 1, 2);
    let e = d.alloc(64).unwrap_err();
    assert_eq!(
        (e.code, e.code_name.as_str()),
        (2, "CUDA_ERROR_OUT_OF_MEMORY")
    );
    assert!(
        e.to_string()
            .starts_with("cuMemAlloc_v2 failed with code 2"),
        "{e}"
    );
    d.free(p).unwrap();
    let s = d.stats();
    assert_eq!(
        (s.allocs, s.frees, s.h2d_calls, s.map_refusals),
        (1, 1, 0, 1),
        "failed calls are not counted"
    );
    let c = common::conformance(&d, "cuda over the fake");
    assert!(
        c.ptr.0 >= 0xc0da_0000_0000_0000,
        "{} looks like a host pointer",
        c.ptr
    );
    let e = &c.refused;
    assert!(
        !e.called
            && e.to_string()
                .starts_with("h2d refused before calling cuMemcpyHtoDAsync_v2"),
        "{e}"
    );
    assert_eq!(fake.count("live_allocations"), 0);
}

#[test]
fn one_primary_context_reference_per_device_across_threads_and_devices() {
    let fake = fake();
    let devs: Vec<CudaDevice> = (0..2).map(|id| open_id(&fake, id)).collect();
    assert_eq!((retains(&fake, 0), retains(&fake, 1)), (1, 1));
    common::round_trips_on_threads(&[&devs[0], &devs[1]], 4, 10, 256);
    assert_eq!(
        fake.count("violations"),
        0,
        "every call ran in its own device's context"
    );
    assert_eq!((retains(&fake, 0), retains(&fake, 1)), (1, 1));
    // Another worker on device 0 joins the process's session: no second retain.
    let again = open_id(&fake, 0);
    assert_eq!((retains(&fake, 0), retains(&fake, 1)), (1, 1));
    drop(again);
    drop(devs);
    assert_eq!(
        (retains(&fake, 0), retains(&fake, 1)),
        (1, 1),
        "the sessions outlive the workers"
    );
    release_sessions(&fake);
    assert_eq!((retains(&fake, 0), retains(&fake, 1)), (0, 0));
    assert_eq!(fake.calls("cuDevicePrimaryCtxRelease_v2").len(), 2);
}

#[test]
fn the_callers_context_is_restored_after_every_call() {
    let fake = fake();
    let d = open_id(&fake, 0);
    // A thread with no context keeps none.
    assert!(current(&fake).is_null());
    let p = d.alloc(4096).unwrap();
    assert!(
        current(&fake).is_null(),
        "the primary context was left current"
    );
    // A thread running its own context (device 1) keeps it.
    let mut theirs: Ctx = std::ptr::null_mut();
    // SAFETY: `cuDevicePrimaryCtxRetain(CUcontext *, CUdevice)` / `cuCtxSetCurrent(CUcontext)`.
    unsafe {
        assert_eq!(
            fake.sym::<unsafe extern "C" fn(*mut Ctx, c_int) -> c_int>("cuDevicePrimaryCtxRetain")(
                &mut theirs,
                1
            ),
            0
        );
        assert_eq!(
            fake.sym::<unsafe extern "C" fn(Ctx) -> c_int>("cuCtxSetCurrent")(theirs),
            0
        );
    }
    let q = d.alloc(4096).unwrap();
    assert_eq!(
        fake.query::<u64, c_int>("alloc_device", q.0),
        0,
        "landed on the worker's device"
    );
    assert_eq!(current(&fake), theirs);
    d.copy_h2d(q, &[1; 64]).unwrap();
    d.free(q).unwrap();
    d.free(p).unwrap();
    assert_eq!(current(&fake), theirs);
    assert_eq!(fake.count("violations"), 0);
    drop(d);
    release_sessions(&fake);
    assert_eq!(
        (retains(&fake, 0), retains(&fake, 1)),
        (0, 1),
        "their reference is theirs"
    );
}

#[test]
fn mirrors_are_page_locked_until_freed_and_a_refusal_leaves_them_pageable() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let m = d.alloc_mirror(1 << 20).unwrap();
    assert_eq!(
        (
            fake.count("live_registrations"),
            fake.count("registered_bytes")
        ),
        (1, 1 << 20)
    );
    let s = d.stats();
    assert_eq!((s.pins, s.pinned_bytes), (1, 1 << 20));
    d.free_mirror(&m).unwrap();
    assert_eq!(fake.count("live_registrations"), 0);
    // Nothing left to undo.
    d.free_mirror(&m).unwrap();
    // The driver refuses: an ordinary mirror, still usable.
    fake.inject("cuMemHostRegister_v2", 1, 2);
    let m2 = d.alloc_mirror(4096).unwrap();
    m2.write(0, &[1, 2, 3]).unwrap();
    assert_eq!(fake.count("live_registrations"), 0);
    let refused = d
        .call_log()
        .into_iter()
        .filter(|c| c.op == Op::Pin && c.code == 2)
        .count();
    assert_eq!(refused, 1, "the refusal is in the call log");
    // A failed unregister keeps the memory registered (and alive); close retries it.
    let m3 = d.alloc_mirror(8192).unwrap();
    fake.inject("cuMemHostUnregister", 1, 999);
    let e = d.free_mirror(&m3).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.code),
        (Op::Unpin, "cuMemHostUnregister", 999)
    );
    drop(m3);
    assert_eq!(fake.count("live_registrations"), 1);
    let r = d.close();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(fake.count("live_registrations"), 0);
    let s = d.stats();
    assert_eq!((s.pins, s.unpins, s.pinned_bytes), (2, 2, 0));
}

#[test]
fn a_mirror_close_cannot_unregister_is_leaked_never_freed() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let m = d.alloc_mirror(8192).unwrap();
    fake.inject("cuMemHostUnregister", 1, 999);
    let r = d.close();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!((r.errors[0].op, r.errors[0].code), (Op::Unpin, 999));
    let host = format!("host {:#x} (8192 bytes)", m.owned_addr().unwrap());
    assert!(r.errors[0].detail.contains(&host), "{}", r.errors[0]);
    // Still registered with the driver: the memory stays alive (leaked), and is counted.
    let s = d.stats();
    assert_eq!((s.pins, s.unpins, s.pinned_bytes), (1, 0, 8192));
    assert_eq!(
        Arc::strong_count(&m),
        2,
        "the driver's reference was leaked, not dropped"
    );
    d.free_mirror(&m).unwrap();
}

#[test]
fn close_frees_and_the_release_gives_the_context_back_once() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let _p = d.alloc(64).unwrap();
    let r = d.close();
    assert_eq!((r.leaked_allocations, r.leaked_bytes), (1, 64));
    assert_eq!(
        retains(&fake, 0),
        1,
        "the session stays for the next worker"
    );
    let e = d.alloc(8).unwrap_err();
    assert!(e.to_string().contains("the device is closed"), "{e}");
    assert_eq!(d.close(), Default::default());
    drop(d);
    assert!(fake.calls("cuDevicePrimaryCtxRelease_v2").is_empty());
    assert_eq!(release_sessions(&fake).sessions, 1);
    assert_eq!(release_sessions(&fake).sessions, 0, "released once");
    assert_eq!(retains(&fake, 0), 0);
    assert_eq!(fake.calls("cuDevicePrimaryCtxRelease_v2").len(), 1);
}

#[test]
fn ten_workers_in_a_row_create_one_context_and_a_sticky_fault_resets_it() {
    let fake = fake();
    let lifecycle = |fake: &Fake| {
        let mut v = [0u64; 3];
        // SAFETY: `fake_cuda_lifecycle(uint64_t out[3])`; `v` holds three.
        let ns = unsafe {
            fake.sym::<unsafe extern "C" fn(*mut u64) -> u64>("fake_cuda_lifecycle")(v.as_mut_ptr())
        };
        (v, ns)
    };
    for _ in 0..10 {
        let d = open_id(&fake, 0);
        d.free(d.alloc(64).unwrap()).unwrap();
        d.close();
    }
    // [inits, context creations, context destructions]
    assert_eq!(lifecycle(&fake).0, [1, 1, 0]);
    // A sticky fault (here injected into the fake's cuMemAlloc_v2) poisons the context for
    // every worker on the device; every later call names the first fault.
    let (a, b) = (open_id(&fake, 0), open_id(&fake, 0));
    fake.inject("cuMemAlloc_v2", 1, 700);
    let e = a.alloc(64).unwrap_err();
    assert_eq!((e.code, e.called), (700, true), "{e}");
    assert_eq!(fake.query::<c_int, c_int>("poisoned", 0), 700);
    let e = b.alloc(64).unwrap_err();
    assert!(!e.called && e.code == 700, "{e}");
    assert!(e.to_string().contains("cuMemAlloc_v2 reported"), "{e}");
    // A new worker is not handed the poisoned context.
    let e = CudaDevice::open(CudaConfig {
        lib_path: Some(fake.dir.join("libcuda.so.1")),
        ..CudaConfig::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("sticky fault cuMemAlloc_v2 reported (code 700)"),
        "{e}"
    );
    assert!(e.contains("close the 2 worker(s)"), "{e}");
    a.close();
    assert_eq!(retains(&fake, 0), 1, "b still holds the session");
    b.close();
    // The last worker's close gave the faulted session back: the context was reset.
    assert_eq!(retains(&fake, 0), 0);
    assert_eq!(fake.query::<c_int, c_int>("poisoned", 0), 0);
    assert_eq!(lifecycle(&fake).0, [1, 1, 1]);
    let c = open_id(&fake, 0);
    c.free(c.alloc(64).unwrap()).unwrap();
    assert_eq!(lifecycle(&fake).0, [1, 2, 1], "a fresh context");
    drop(c);
    release_sessions(&fake);
}

#[test]
fn mirrors_cover_whole_host_pages_so_two_never_share_a_page_lock() {
    // A 64 KiB-page host: the driver page-locks whole 64 KiB pages.
    let fake = fake();
    // SAFETY: `int fake_cuda_set_host_page(uint64_t)`.
    let set = unsafe { fake.sym::<extern "C" fn(u64) -> c_int>("fake_cuda_set_host_page") };
    assert_eq!(set(64 << 10), 0);
    let open_paged = |page: usize| {
        CudaDevice::open(CudaConfig {
            lib_path: Some(fake.dir.join("libcuda.so.1")),
            host_page: Some(page),
            ..CudaConfig::default()
        })
        .unwrap()
    };
    // Two mirrors laid out in 4 KiB pages (the old assumption) may share a 64 KiB page: the
    // driver refuses to page-lock the second one.
    type Register = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> c_int;
    type Unregister = unsafe extern "C" fn(*mut c_void) -> c_int;
    type Retain = unsafe extern "C" fn(*mut Ctx, c_int) -> c_int;
    let block = simpler_driver::HostMem::with_page(128 << 10, 0, 64 << 10).unwrap();
    let base = block.owned_addr().unwrap();
    // SAFETY: the fake's exports with their `cuda.h` signatures; the registered ranges lie in
    // `block`, which outlives them (the fake records ranges and never touches the memory);
    // the primary context retained here is released below.
    unsafe {
        let mut ctx: Ctx = std::ptr::null_mut();
        assert_eq!(fake.sym::<extern "C" fn(c_uint) -> c_int>("cuInit")(0), 0);
        assert_eq!(
            fake.sym::<Retain>("cuDevicePrimaryCtxRetain")(&mut ctx, 0),
            0
        );
        assert_eq!(
            fake.sym::<unsafe extern "C" fn(Ctx) -> c_int>("cuCtxSetCurrent")(ctx),
            0
        );
        let register = fake.sym::<Register>("cuMemHostRegister_v2");
        let unregister = fake.sym::<Unregister>("cuMemHostUnregister");
        assert_eq!(register(base as *mut c_void, 100, 0), 0);
        assert_eq!(
            register((base + 4096) as *mut c_void, 100, 0),
            712,
            "ALREADY_REGISTERED: the same 64 KiB page"
        );
        assert_eq!(
            register((base + (64 << 10)) as *mut c_void, 100, 0),
            0,
            "the next page"
        );
        assert_eq!(unregister(base as *mut c_void), 0);
        assert_eq!(unregister((base + (64 << 10)) as *mut c_void), 0);
        let set = fake.sym::<unsafe extern "C" fn(Ctx) -> c_int>("cuCtxSetCurrent");
        assert_eq!(set(std::ptr::null_mut()), 0);
        assert_eq!(
            fake.sym::<extern "C" fn(c_int) -> c_int>("cuDevicePrimaryCtxRelease_v2")(0),
            0
        );
    }
    // Laid out in the host's pages, every mirror is registered, each on pages of its own.
    let paged = open_paged(64 << 10);
    let ms: Vec<_> = (0..4).map(|_| paged.alloc_mirror(100).unwrap()).collect();
    let s = paged.stats();
    assert_eq!((s.pins, s.pinned_bytes), (4, 4 * (64 << 10)));
    for m in &ms {
        assert_eq!(m.owned_addr().unwrap() % (64 << 10), 0);
        paged.free_mirror(m).unwrap();
    }
    assert_eq!(paged.stats().pinned_bytes, 0);
    paged.close();
    release_sessions(&fake);
}

#[test]
fn the_fake_reuses_addresses() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let a = d.alloc(4096).unwrap();
    d.free(a).unwrap();
    let b = d.alloc(4096).unwrap();
    assert_eq!(a, b);
    // The ledger tracks the new allocation: the old handle's range is the new one's, so only
    // the runtime's generations can tell them apart (tested from Python).
    d.free(b).unwrap();
    assert!(d.free(b).is_err());
}

#[test]
fn a_failed_context_bind_names_the_address_and_size() {
    let fake = fake();
    let d = open_id(&fake, 0);
    let p = d.alloc(4096).unwrap();
    fake.inject("cuCtxGetCurrent", 1, 201);
    let e = d.copy_h2d(DevPtr(p.0 + 16), &[1; 32]).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.addr, e.bytes),
        (Op::H2d, "cuCtxGetCurrent", Some(p.0 + 16), Some(32))
    );
    fake.inject("cuCtxGetCurrent", 1, 201);
    let e = d.free(p).unwrap_err();
    assert_eq!((e.addr, e.bytes), (Some(p.0), Some(4096)), "{e}");
    fake.inject("cuCtxGetCurrent", 1, 201);
    let e = d.alloc(64).unwrap_err();
    assert_eq!((e.addr, e.bytes), (None, Some(64)), "{e}");
    d.free(p).unwrap();
}

// Device execution. Host kernels stand in for device code: the fake runs the one registered for
// an entry on the stream's thread, in stream order, with the launch's parameter values.

/// `fake_cuda_host_kernel`: `int (*)(void *user, const char *entry, const unsigned long long
/// *params, unsigned n_params, const unsigned *grid, const unsigned *block, unsigned shared)`,
/// `extern "C-unwind"` as the fake declares it.
type HostKernel = unsafe extern "C-unwind" fn(
    *mut c_void,
    *const c_char,
    *const u64,
    c_uint,
    *const c_uint,
    *const c_uint,
    c_uint,
) -> c_int;

/// `void *fake_cuda_translate(unsigned long long dev_addr, unsigned long long len)`.
type Translate = extern "C" fn(u64, u64) -> *mut c_void;

/// `CUDA_ERROR_ILLEGAL_ADDRESS`: what a host kernel returns to fault.
const ILLEGAL_ADDRESS: c_int = 700;

/// One block of one thread, no shared memory.
const ONE: LaunchDims = LaunchDims {
    grid: [1, 1, 1],
    block: [1, 1, 1],
    shared_bytes: 0,
};

fn dims(grid: [u32; 3], block: [u32; 3]) -> LaunchDims {
    LaunchDims {
        grid,
        block,
        shared_bytes: 0,
    }
}

/// What the host kernels of one test reach through their `user` pointer: that test's copy of
/// `fake_cuda_translate` (each test has its own fake), and how many kernels ran.
struct Kernels {
    translate: Translate,
    runs: AtomicU32,
}

impl Kernels {
    fn new(fake: &Fake) -> Kernels {
        Kernels {
            // SAFETY: the fake exports `void *fake_cuda_translate(unsigned long long, unsigned
            // long long)`, which is `Translate`.
            translate: unsafe { fake.sym::<Translate>("fake_cuda_translate") },
            runs: AtomicU32::new(0),
        }
    }

    /// Makes `f` the host implementation of `entry`, called with `self` as its `user` pointer.
    /// `self` must outlive every launch of it: tests declare it before the device, which drains
    /// its stream when it closes (or drops).
    fn register(&self, fake: &Fake, entry: &str, f: HostKernel) {
        type Register =
            unsafe extern "C" fn(*const c_char, Option<HostKernel>, *mut c_void) -> c_int;
        let entry = CString::new(entry).unwrap();
        let user = std::ptr::from_ref(self).cast_mut().cast::<c_void>();
        // SAFETY: `int fake_cuda_register_kernel(const char *, fake_cuda_host_kernel, void *)`
        // is `Register`; `entry` is NUL-terminated; `f` has the host kernel's type and `user`
        // points at `self`, which outlives the launches (see above) and is only read through a
        // shared reference (its counter is atomic).
        let rc = unsafe {
            fake.sym::<Register>("fake_cuda_register_kernel")(entry.as_ptr(), Some(f), user)
        };
        assert_eq!(rc, 0);
    }

    /// The host address of device range `[addr, addr + len)`; null when it is not inside one
    /// live allocation.
    fn host(&self, addr: u64, len: u64) -> *mut u8 {
        (self.translate)(addr, len).cast()
    }

    /// The `len` bytes at device address `addr`, read from the fake's memory behind the
    /// driver's back. Only while no stream can run work on them (held, or synchronized).
    fn peek(&self, addr: DevPtr, len: usize) -> Vec<u8> {
        let p = self.host(addr.0, len as u64);
        assert!(!p.is_null(), "{addr} is not {len} live bytes");
        // SAFETY: `p` is the host address of `len` bytes of a live allocation (non-null above),
        // which nothing writes while we read (the callers' condition).
        unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
    }

    fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}

/// The `Kernels` behind a host kernel's `user` pointer.
///
/// # Safety
/// `user` must be the pointer [`Kernels::register`] registered, whose `Kernels` is alive.
unsafe fn kernels<'a>(user: *mut c_void) -> &'a Kernels {
    // SAFETY: per this function's contract.
    unsafe { &*user.cast::<Kernels>() }
}

/// A host kernel's parameter values.
///
/// # Safety
/// `params` must hold `n` values when `n > 0` (as the fake passes them).
unsafe fn params<'a>(params: *const u64, n: c_uint) -> &'a [u64] {
    if n == 0 {
        return &[];
    }
    // SAFETY: per this function's contract.
    unsafe { std::slice::from_raw_parts(params, n as usize) }
}

/// Host kernel `add_one(row)`: `row` is the device address of a row `[ptr: u64, n: u64]`; adds
/// 1 to each of the `n` bytes at device address `ptr`. Faults (700) on an address that is not
/// live device memory.
unsafe extern "C-unwind" fn add_one(
    user: *mut c_void,
    _entry: *const c_char,
    p: *const u64,
    n_params: c_uint,
    _grid: *const c_uint,
    _block: *const c_uint,
    _shared: c_uint,
) -> c_int {
    // SAFETY: the fake calls host kernels with the registered `user` and its copy of the
    // launch's `n_params` parameter values.
    let (k, p) = unsafe { (kernels(user), params(p, n_params)) };
    let Some(&row_addr) = p.first() else {
        return ILLEGAL_ADDRESS;
    };
    let row = k.host(row_addr, 16).cast::<u64>();
    if row.is_null() {
        return ILLEGAL_ADDRESS;
    }
    // SAFETY: `row` is the host address of 16 live bytes (checked above); unaligned reads.
    let (ptr, n) = unsafe { (row.read_unaligned(), row.add(1).read_unaligned()) };
    let data = k.host(ptr, n);
    if data.is_null() {
        return ILLEGAL_ADDRESS;
    }
    for i in 0..n as usize {
        // SAFETY: `data` is the host address of `n` live bytes (checked above), which only this
        // stream's thread touches while the kernel runs.
        unsafe {
            let b = data.add(i);
            *b = (*b).wrapping_add(1);
        }
    }
    k.runs.fetch_add(1, Ordering::SeqCst);
    0
}

/// Host kernel `fill(ptr, n, value)`: sets the `n` bytes at device address `ptr` to `value`.
unsafe extern "C-unwind" fn fill(
    user: *mut c_void,
    _entry: *const c_char,
    p: *const u64,
    n_params: c_uint,
    _grid: *const c_uint,
    _block: *const c_uint,
    _shared: c_uint,
) -> c_int {
    // SAFETY: as in `add_one`.
    let (k, p) = unsafe { (kernels(user), params(p, n_params)) };
    let &[ptr, n, value] = p else {
        return ILLEGAL_ADDRESS;
    };
    let data = k.host(ptr, n);
    if data.is_null() {
        return ILLEGAL_ADDRESS;
    }
    // SAFETY: `data` is the host address of `n` live bytes (checked above), which only this
    // stream's thread touches while the kernel runs.
    unsafe { std::ptr::write_bytes(data, value as u8, n as usize) };
    k.runs.fetch_add(1, Ordering::SeqCst);
    0
}

/// Host kernel that only counts its run.
unsafe extern "C-unwind" fn noop(
    user: *mut c_void,
    _entry: *const c_char,
    _p: *const u64,
    _n_params: c_uint,
    _grid: *const c_uint,
    _block: *const c_uint,
    _shared: c_uint,
) -> c_int {
    // SAFETY: the fake calls host kernels with the registered `user`.
    unsafe { kernels(user) }.runs.fetch_add(1, Ordering::SeqCst);
    0
}

/// Host kernel that takes 30 ms, then counts its run.
unsafe extern "C-unwind" fn slow(
    user: *mut c_void,
    _entry: *const c_char,
    _p: *const u64,
    _n_params: c_uint,
    _grid: *const c_uint,
    _block: *const c_uint,
    _shared: c_uint,
) -> c_int {
    std::thread::sleep(Duration::from_millis(30));
    // SAFETY: the fake calls host kernels with the registered `user`.
    unsafe { kernels(user) }.runs.fetch_add(1, Ordering::SeqCst);
    0
}

/// Host kernel that faults with `CUDA_ERROR_ILLEGAL_ADDRESS`.
unsafe extern "C-unwind" fn boom(
    _user: *mut c_void,
    _entry: *const c_char,
    _p: *const u64,
    _n_params: c_uint,
    _grid: *const c_uint,
    _block: *const c_uint,
    _shared: c_uint,
) -> c_int {
    ILLEGAL_ADDRESS
}

/// A module image of the fake NVRTC for `sm_90` with these entries (name, parameter count),
/// NUL-terminated.
fn image(entries: &[(&str, u32)]) -> Vec<u8> {
    let mut s = String::from("FAKECUDA-MODULE 1\narch sm_90\n");
    for (name, n) in entries {
        s.push_str(&format!("entry {name} {n}\n"));
    }
    let mut v = s.into_bytes();
    v.push(0);
    v
}

/// Indexes of the lines of `log` that are calls of `name`.
fn positions(log: &[String], name: &str) -> Vec<usize> {
    let prefix = format!("{name} ");
    (0..log.len())
        .filter(|&i| log[i].starts_with(&prefix))
        .collect()
}

/// Holds every stream of the fake (queued work waits) until released or dropped; declared after
/// the device, so a failing assertion releases it before the device drains its stream. A
/// watchdog releases it after [`Hold::LIMIT`] so that a call that blocks on held work (a driver
/// bug) fails the test at [`Hold::release`] instead of hanging it.
struct Hold {
    set: extern "C" fn(c_int),
    done: Option<mpsc::Sender<()>>,
    watchdog: Option<std::thread::JoinHandle<bool>>,
}

impl Hold {
    const LIMIT: Duration = Duration::from_secs(10);

    fn new(fake: &Fake) -> Hold {
        // SAFETY: `void fake_cuda_hold_streams(int)`.
        let set = unsafe { fake.sym::<extern "C" fn(c_int)>("fake_cuda_hold_streams") };
        set(1);
        let (done, rx) = mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            let expired = matches!(
                rx.recv_timeout(Hold::LIMIT),
                Err(mpsc::RecvTimeoutError::Timeout)
            );
            if expired {
                set(0);
            }
            expired
        });
        Hold {
            set,
            done: Some(done),
            watchdog: Some(watchdog),
        }
    }

    /// Lets the streams run; fails when the watchdog had to (a call blocked while held).
    fn release(mut self) {
        assert!(!self.stop(), "a call blocked on held stream work");
    }

    /// Releases the hold and stops the watchdog; whether it had expired.
    fn stop(&mut self) -> bool {
        (self.set)(0);
        drop(self.done.take());
        self.watchdog
            .take()
            .is_some_and(|w| w.join().unwrap_or(true))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A module loads and its entry resolves; launches are enqueued on the worker's stream in call
/// order, after the memset before them (which returns at once too), and the copy back waits for
/// all of them: it sees every byte +3 (+3 over the memset's value where it ran). The counters
/// (`launches`, `module_loads`) and both call logs (three `cuLaunchKernel` on the worker's
/// stream, then the `cuMemcpyDtoHAsync_v2`, then the wait) say the same.
#[test]
fn launches_run_in_stream_order_and_the_copy_back_waits_for_them() {
    let fake = fake();
    let k = Kernels::new(&fake);
    k.register(&fake, "add_one", add_one);
    let d = open_id(&fake, 0);
    let n = 1000u64;
    let data = d.alloc(n).unwrap();
    let row = d.alloc(16).unwrap();
    d.copy_h2d(row, &[data.0.to_ne_bytes(), n.to_ne_bytes()].concat())
        .unwrap();
    let bytes: Vec<u8> = (0..n).map(|i| (i * 3) as u8).collect();
    d.copy_h2d(data, &bytes).unwrap();
    d.fill(data, 10, 0xF0).unwrap();
    let m = d.load_module(&image(&[("add_one", 1)])).unwrap();
    let f = d.function(m, "add_one").unwrap();
    assert_eq!(
        d.function(m, "add_one").unwrap(),
        f,
        "one function per entry"
    );
    for _ in 0..3 {
        d.launch(f, ONE, &[row.0]).unwrap();
    }
    let mut out = vec![0u8; n as usize];
    d.copy_d2h(&mut out, data).unwrap();
    let mut want: Vec<u8> = bytes.iter().map(|b| b.wrapping_add(3)).collect();
    want[..10].fill(0xF3);
    assert_eq!(out, want);
    assert_eq!(k.runs(), 3);
    let s = d.stats();
    assert_eq!((s.launches, s.module_loads), (3, 1));
    assert_eq!(
        (fake.count("launch_count"), fake.count("module_loads")),
        (3, 1)
    );
    let log = fake.log();
    let stream = format!("stream={:#x}", d.stream_handle().unwrap());
    let launches = positions(&log, "cuLaunchKernel");
    assert_eq!(launches.len(), 3, "{log:#?}");
    for &i in &launches {
        assert!(
            log[i].starts_with("cuLaunchKernel add_one ")
                && log[i].contains(&stream)
                && log[i].contains(&format!("params=[{:#x}]", row.0))
                && log[i].ends_with("-> 0"),
            "{}",
            log[i]
        );
    }
    let dtoh = positions(&log, "cuMemcpyDtoHAsync_v2");
    assert_eq!(dtoh.len(), 1, "{log:#?}");
    assert!(log[dtoh[0]].contains(&stream), "{}", log[dtoh[0]]);
    assert!(launches.iter().all(|&i| i < dtoh[0]), "{log:#?}");
    let waits = positions(&log, "cuStreamSynchronize");
    assert!(waits.iter().any(|&i| i > dtoh[0]), "{log:#?}");
    let ops: Vec<Op> = d
        .call_log()
        .iter()
        .map(|c| c.op)
        .filter(|op| matches!(op, Op::Launch | Op::D2h))
        .collect();
    assert_eq!(ops, [Op::Launch, Op::Launch, Op::Launch, Op::D2h]);
    let r = d.close();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        (fake.count("live_modules"), fake.count("live_streams")),
        (0, 0)
    );
}

/// The synchronization a caller relies on is there, and needed. With a 20 ms launch latency and
/// the streams held until another thread lets them run 20 ms later, a copy back right after a
/// launch sees what the kernel wrote and returns no sooner than the stream ran it: a copy that
/// did not wait would return at once, with stale bytes. And the fake really is asynchronous:
/// right after a launch (streams held, so deterministically) the device memory, read through
/// `fake_cuda_translate`, still holds the old bytes and the kernel has not run; after
/// `synchronize()` it holds the new ones.
#[test]
fn a_launch_is_asynchronous_and_the_copy_back_and_synchronize_wait_for_it() {
    let fake = fake();
    let k = Kernels::new(&fake);
    k.register(&fake, "fill", fill);
    let d = open_id(&fake, 0);
    let n = 4096u64;
    let p = d.alloc(n).unwrap();
    d.copy_h2d(p, &vec![0; n as usize]).unwrap();
    let m = d.load_module(&image(&[("fill", 3)])).unwrap();
    let f = d.function(m, "fill").unwrap();
    fake.query::<c_uint, ()>("set_stream_latency_us", 20_000);

    // The stream runs nothing until another thread lets it, 20 ms from now: a copy back that
    // did not wait would return at once, with the zeros still in `out`.
    let hold = Hold::new(&fake);
    d.launch(f, ONE, &[p.0, n, 0x5A]).unwrap();
    let t = std::time::Instant::now();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        hold.release();
    });
    let mut out = vec![0u8; n as usize];
    d.copy_d2h(&mut out, p).unwrap();
    assert!(out.iter().all(|&b| b == 0x5A), "the copy did not wait");
    assert!(
        t.elapsed() >= Duration::from_millis(20),
        "returned before the stream ran"
    );
    releaser.join().unwrap();
    assert_eq!(k.runs(), 1);

    let hold = Hold::new(&fake);
    d.launch(f, ONE, &[p.0, n, 0x77]).unwrap();
    assert!(
        k.peek(p, n as usize).iter().all(|&b| b == 0x5A),
        "the launch ran before it returned"
    );
    assert_eq!(k.runs(), 1);
    hold.release();
    d.synchronize().unwrap();
    assert_eq!(k.runs(), 2);
    assert!(k.peek(p, n as usize).iter().all(|&b| b == 0x77));
    let s = d.stats();
    assert_eq!((s.launches, s.syncs), (2, 1));
    assert_eq!(fake.calls("cuCtxSynchronize").len(), 0);
    d.synchronize_device().unwrap();
    assert_eq!(fake.calls("cuCtxSynchronize").len(), 1);
}

/// A kernel fault is sticky: the launch itself succeeds (asynchronous), `synchronize()` reports
/// 700 `CUDA_ERROR_ILLEGAL_ADDRESS` from `cuStreamSynchronize`, and every later call (alloc,
/// copy, launch) fails with 700 too. `close()` reports errors (each with 700) but still
/// releases everything: the fake's live modules, streams, events and allocations are back to
/// what they were (its releasing calls release on a poisoned context too), and the primary
/// context is released; that clears the poison, so a new device on the same ordinal opens and
/// works.
#[test]
fn a_kernel_fault_is_sticky_and_close_still_releases_everything() {
    let fake = fake();
    let k = Kernels::new(&fake);
    k.register(&fake, "boom", boom);
    let live = || {
        [
            "live_modules",
            "live_streams",
            "live_events",
            "live_allocations",
        ]
        .map(|c| (c, fake.count(c)))
    };
    let before = live();
    let d = open_id(&fake, 0);
    let p = d.alloc(64).unwrap();
    let m = d.load_module(&image(&[("boom", 0)])).unwrap();
    let f = d.function(m, "boom").unwrap();
    d.order_stream(1).unwrap(); // makes the event, for close to destroy
    d.launch(f, ONE, &[]).unwrap();
    let e = d.synchronize().unwrap_err();
    assert_eq!(
        (
            e.op,
            e.call.as_str(),
            e.code,
            e.code_name.as_str(),
            e.called
        ),
        (
            Op::Sync,
            "cuStreamSynchronize",
            700,
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            true
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("cuStreamSynchronize failed with code 700"),
        "{e}"
    );
    assert_eq!(fake.query::<c_int, c_int>("poisoned", 0), 700);
    let e = d.alloc(64).unwrap_err();
    assert_eq!((e.call.as_str(), e.code), ("cuMemAlloc_v2", 700), "{e}");
    let e = d.copy_h2d(p, &[1; 8]).unwrap_err();
    assert_eq!(
        (e.call.as_str(), e.code, e.addr, e.bytes),
        ("cuMemcpyHtoDAsync_v2", 700, Some(p.0), Some(8)),
        "{e}"
    );
    let mut b = [0u8; 8];
    let e = d.copy_d2h(&mut b, p).unwrap_err();
    assert_eq!(
        (e.call.as_str(), e.code),
        ("cuMemcpyDtoHAsync_v2", 700),
        "{e}"
    );
    let e = d.launch(f, ONE, &[]).unwrap_err();
    assert_eq!((e.call.as_str(), e.code), ("cuLaunchKernel", 700), "{e}");
    let e = d.synchronize().unwrap_err();
    assert_eq!(e.code, 700, "{e}");

    let r = d.close();
    assert!(!r.errors.is_empty());
    assert!(r.errors.iter().all(|e| e.code == 700), "{:#?}", r.errors);
    assert_eq!((r.leaked_allocations, r.leaked_bytes), (1, 64));
    assert_eq!(live(), before, "close left something live");
    assert_eq!(retains(&fake, 0), 0);
    assert_eq!(
        fake.query::<c_int, c_int>("poisoned", 0),
        0,
        "the last release clears the poison"
    );

    let d2 = open_id(&fake, 0);
    let q = d2.alloc(64).unwrap();
    d2.copy_h2d(q, &[7; 64]).unwrap();
    let mut out = [0u8; 64];
    d2.copy_d2h(&mut out, q).unwrap();
    assert_eq!(out, [7; 64]);
    d2.synchronize().unwrap();
    let r = d2.close();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(live(), before);
}

/// Launch geometry, handles, images and entry names are checked: zero dimensions, a grid z
/// past 65535, more than 1024 threads a block and an unknown function are refused before
/// `cuLaunchKernel` (no call reaches the fake); the limits themselves are accepted; an image
/// that is not one is `cuModuleLoadData`'s 200 `CUDA_ERROR_INVALID_IMAGE`, a missing entry
/// `cuModuleGetFunction`'s 500 `CUDA_ERROR_NOT_FOUND`, an entry name with a NUL is refused
/// before the call; and injected faults for `Op::Launch`, `Op::Module` and `Op::Sync` fail the
/// call before the vendor function runs.
#[test]
fn launches_modules_and_entries_are_validated_and_faults_fire_before_the_call() {
    let fake = fake();
    let k = Kernels::new(&fake);
    k.register(&fake, "k", noop);
    let d = open_id(&fake, 0);
    let m = d.load_module(&image(&[("k", 1)])).unwrap();
    let f = d.function(m, "k").unwrap();
    for (grid, block, code) in [
        ([0, 1, 1], [1, 1, 1], 1),
        ([1, 1, 1], [1, 0, 1], 1),
        ([1, 1, 65_536], [1, 1, 1], 1),
        ([1, 65_536, 1], [1, 1, 1], 1),
        ([1, 1, 1], [1024, 2, 1], 1),
        ([1, 1, 1], [33, 32, 1], 1),
    ] {
        let e = d.launch(f, dims(grid, block), &[0]).unwrap_err();
        assert_eq!(
            (e.op, e.call.as_str(), e.code, e.called),
            (Op::Launch, "cuLaunchKernel", code, false),
            "{grid:?} {block:?}: {e}"
        );
        assert!(
            e.to_string()
                .starts_with("launch refused before calling cuLaunchKernel"),
            "{e}"
        );
    }
    let e = d.launch(FuncId(0xdead_beef), ONE, &[0]).unwrap_err();
    assert_eq!(
        (e.call.as_str(), e.code, e.code_name.as_str(), e.called),
        ("cuLaunchKernel", 400, "CUDA_ERROR_INVALID_HANDLE", false),
        "{e}"
    );
    assert!(e.detail.contains("0xdeadbeef"), "{e}");
    assert!(
        fake.calls("cuLaunchKernel").is_empty(),
        "a refused launch reached the fake"
    );
    // The limits themselves are fine.
    d.launch(f, dims([1, 65_535, 65_535], [1024, 1, 1]), &[0])
        .unwrap();
    d.launch(f, dims([i32::MAX as u32, 1, 1], [8, 8, 16]), &[0])
        .unwrap();
    d.synchronize().unwrap();
    assert_eq!((k.runs(), fake.count("launch_count")), (2, 2));
    // A limit of the device's the driver leaves to it (block z <= 64): the vendor's answer.
    let e = d.launch(f, dims([1, 1, 1], [1, 1, 128]), &[0]).unwrap_err();
    assert_eq!(
        (e.call.as_str(), e.code, e.called),
        ("cuLaunchKernel", 1, true),
        "{e}"
    );

    let e = d.load_module(b"not an image").unwrap_err();
    assert_eq!(
        (
            e.op,
            e.call.as_str(),
            e.code,
            e.code_name.as_str(),
            e.called
        ),
        (
            Op::Module,
            "cuModuleLoadData",
            200,
            "CUDA_ERROR_INVALID_IMAGE",
            true
        ),
        "{e}"
    );
    let e = d.load_module(b"").unwrap_err();
    assert_eq!(
        (e.call.as_str(), e.called),
        ("cuModuleLoadData", false),
        "{e}"
    );
    let e = d.function(m, "missing").unwrap_err();
    assert_eq!(
        (
            e.op,
            e.call.as_str(),
            e.code,
            e.code_name.as_str(),
            e.called
        ),
        (
            Op::Module,
            "cuModuleGetFunction",
            500,
            "CUDA_ERROR_NOT_FOUND",
            true
        ),
        "{e}"
    );
    assert!(e.detail.contains("\"missing\""), "{e}");
    let gets = fake.calls("cuModuleGetFunction").len();
    let e = d.function(m, "k\0x").unwrap_err();
    assert_eq!((e.op, e.code, e.called), (Op::Module, 1, false), "{e}");
    assert!(e.detail.contains("contains a NUL byte"), "{e}");
    let e = d.function(ModuleId(0x1234), "k").unwrap_err();
    assert_eq!((e.op, e.code, e.called), (Op::Module, 400, false), "{e}");
    assert!(e.detail.contains("0x1234 is not loaded"), "{e}");
    assert_eq!(fake.calls("cuModuleGetFunction").len(), gets);

    // Injected faults fail the call before the vendor function: the fake sees nothing.
    let log_len = fake.log().len();
    d.inject_fault(Op::Launch, 1, None).unwrap();
    let e = d.launch(f, ONE, &[0]).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.code, e.detail.as_str()),
        (Op::Launch, "cuLaunchKernel", 700, "injected fault"),
        "{e}"
    );
    d.inject_fault(Op::Module, 1, Some(200)).unwrap();
    let e = d.load_module(&image(&[("k", 1)])).unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.code, e.detail.as_str()),
        (Op::Module, "cuModuleLoadData", 200, "injected fault"),
        "{e}"
    );
    d.inject_fault(Op::Sync, 1, None).unwrap();
    let e = d.synchronize().unwrap_err();
    assert_eq!(
        (e.op, e.call.as_str(), e.code, e.detail.as_str()),
        (Op::Sync, "cuStreamSynchronize", 700, "injected fault"),
        "{e}"
    );
    let after = fake.log();
    assert_eq!(after.len(), log_len, "{:#?}", &after[log_len..]);
    assert_eq!(
        (fake.count("launch_count"), fake.count("module_loads")),
        (2, 1)
    );
    // Each fired once; the device works on.
    assert_eq!(fake.query::<c_int, c_int>("poisoned", 0), 0);
    d.launch(f, ONE, &[0]).unwrap();
    d.synchronize().unwrap();
    assert_eq!(k.runs(), 3);
    let failed = d.call_log().iter().filter(|c| c.code != 0).count();
    assert!(failed >= 3, "refusals and injected faults are logged");
}

/// `order_stream` makes another stream of the device wait for the work enqueued on the
/// worker's stream so far, without blocking the host: it records an event on the worker's
/// stream (`cuEventRecord`) and makes the consumer wait for it (`cuStreamWaitEvent` with the
/// consumer's handle), so the consumer does not finish before a slow kernel enqueued before
/// the call. Stream 0 is refused before any call; 1 and 2 (the default streams) are accepted;
/// one event serves every call, and close destroys it.
#[test]
fn order_stream_makes_another_stream_wait_for_the_workers_stream() {
    type Retain = unsafe extern "C" fn(*mut Ctx, c_int) -> c_int;
    type SetCurrent = unsafe extern "C" fn(Ctx) -> c_int;
    type StreamCreate = unsafe extern "C" fn(*mut Ctx, c_uint) -> c_int;
    type StreamCall = unsafe extern "C" fn(Ctx) -> c_int;
    type Release = unsafe extern "C" fn(c_int) -> c_int;
    let fake = fake();
    let k = Kernels::new(&fake);
    k.register(&fake, "slow", slow);
    // SAFETY: each type is the `cuda.h` signature of its symbol.
    let (retain, set_current, stream_create, stream_sync, stream_destroy, release) = unsafe {
        (
            fake.sym::<Retain>("cuDevicePrimaryCtxRetain"),
            fake.sym::<SetCurrent>("cuCtxSetCurrent"),
            fake.sym::<StreamCreate>("cuStreamCreate"),
            fake.sym::<StreamCall>("cuStreamSynchronize"),
            fake.sym::<StreamCall>("cuStreamDestroy_v2"),
            fake.sym::<Release>("cuDevicePrimaryCtxRelease_v2"),
        )
    };
    let (streams0, events0) = (fake.count("live_streams"), fake.count("live_events"));
    let d = open_id(&fake, 0);
    let worker = d.stream_handle().unwrap();
    assert_eq!(
        fake.count("live_streams"),
        streams0 + 1,
        "the worker's stream"
    );
    let m = d.load_module(&image(&[("slow", 0)])).unwrap();
    let f = d.function(m, "slow").unwrap();

    // The consumer: a stream of device 0 that someone else (a library) made in the primary
    // context, on this thread.
    let mut ctx: Ctx = std::ptr::null_mut();
    let mut consumer: Ctx = std::ptr::null_mut();
    // SAFETY: the out-pointers are valid for the writes; `ctx` is the retained primary context.
    unsafe {
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        assert_eq!(stream_create(&mut consumer, 1), 0);
        assert_eq!(set_current(std::ptr::null_mut()), 0);
    }
    let c = consumer as u64;

    let from = fake.log().len();
    let hold = Hold::new(&fake);
    d.launch(f, ONE, &[]).unwrap();
    d.order_stream(c).unwrap();
    assert_eq!(k.runs(), 0, "the host waited");
    hold.release();
    // SAFETY: the primary context (retained above) and the consumer stream made in it.
    unsafe {
        assert_eq!(set_current(ctx), 0);
        assert_eq!(stream_sync(consumer), 0);
        assert_eq!(set_current(std::ptr::null_mut()), 0);
    }
    assert_eq!(
        k.runs(),
        1,
        "the consumer finished before the worker's kernel"
    );
    let log = fake.log()[from..].to_vec();
    let created = positions(&log, "cuEventCreate");
    let recorded = positions(&log, "cuEventRecord");
    let waited = positions(&log, "cuStreamWaitEvent");
    assert_eq!(
        (created.len(), recorded.len(), waited.len()),
        (1, 1, 1),
        "{log:#?}"
    );
    assert!(
        created[0] < recorded[0] && recorded[0] < waited[0],
        "{log:#?}"
    );
    let event = log[created[0]].split_whitespace().nth(1).unwrap();
    assert_eq!(
        log[recorded[0]],
        format!("cuEventRecord {event} stream={worker:#x} -> 0")
    );
    assert_eq!(
        log[waited[0]],
        format!("cuStreamWaitEvent {c:#x} event={event} flags=0 -> 0")
    );
    assert_eq!(fake.count("live_events"), events0 + 1);

    let from = fake.log().len();
    let e = d.order_stream(0).unwrap_err();
    assert_eq!((e.op, e.code, e.called), (Op::Sync, 1, false), "{e}");
    assert!(e.detail.contains("stream 0 is ambiguous"), "{e}");
    assert_eq!(fake.log().len(), from, "a refused call reached the fake");
    d.order_stream(1).unwrap();
    d.order_stream(2).unwrap();
    let log = fake.log()[from..].to_vec();
    assert!(
        positions(&log, "cuEventCreate").is_empty(),
        "one event serves every call"
    );
    let waited: Vec<&str> = positions(&log, "cuStreamWaitEvent")
        .into_iter()
        .map(|i| log[i].split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(waited, ["0x1", "0x2"]);

    let r = d.close();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(
        fake.count("live_events"),
        events0,
        "close destroys the event"
    );
    assert_eq!(fake.calls("cuEventDestroy_v2").len(), 1);
    assert_eq!(
        fake.count("live_streams"),
        streams0 + 1,
        "the consumer is theirs"
    );
    // SAFETY: the consumer stream and the primary context retained above, released once.
    unsafe {
        assert_eq!(set_current(ctx), 0);
        assert_eq!(stream_destroy(consumer), 0);
        assert_eq!(set_current(std::ptr::null_mut()), 0);
        assert_eq!(release(0), 0);
    }
    assert_eq!(fake.count("live_streams"), streams0);
    release_sessions(&fake);
    assert_eq!(retains(&fake, 0), 0);
}

/// The compute capability comes from the device's attributes (75, 76): 9.0, the fake's
/// default (`FAKE_CUDA_CC`).
#[test]
fn compute_capability_is_the_devices() {
    let fake = fake();
    let d = open_id(&fake, 0);
    assert!(d.runs_device_code());
    assert_eq!(d.compute_capability().unwrap(), (9, 0));
    let asked: Vec<String> = fake
        .calls("cuDeviceGetAttribute")
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    assert_eq!(asked, ["75", "76"]);
}

/// NVRTC through the fake (the same library exports `nvrtc*`, linked as `libnvrtc.so.13` in a
/// folder passed to `Nvrtc::open`): a source with two `extern "C" __global__` entries compiles
/// to a CUBIN for `sm_90`, which the device loads, both entries resolve and one runs; a source
/// with `#error boom` is a `CompileError` from `nvrtcCompileProgram` whose message carries the
/// compiler's log line. Every program is destroyed, whatever the outcome.
#[test]
fn nvrtc_compiles_what_the_device_loads_and_reports_the_log() {
    let fake = Fake::new(
        "fake-cuda",
        "fake_cuda",
        &["libcuda.so.1", "libnvrtc.so.13"],
    );
    // SAFETY: both controls are `uint64_t name(void)`.
    let (live_programs, compiles) = unsafe {
        (
            fake.sym::<extern "C" fn() -> u64>("fake_nvrtc_live_programs"),
            fake.sym::<extern "C" fn() -> u64>("fake_nvrtc_compile_count"),
        )
    };
    let dirs: [PathBuf; 1] = [fake.dir.clone()];
    let nv = Nvrtc::open(&dirs).unwrap();
    assert_eq!(nv.version(), (13, 0));
    assert_eq!(
        nv.library(),
        fake.dir.join("libnvrtc.so.13").display().to_string()
    );
    let sm90 = Target::Cubin { major: 9, minor: 0 };
    let src = r#"
        extern "C" __global__ void scale(float* x, float a, unsigned long long n) {}
        extern "C" __global__ void add_one(unsigned long long* row) {}
    "#;
    let img = nv.compile(src, "two.cu", &[], sm90).unwrap();
    assert_eq!(img.kind, simpler_driver::nvrtc::ImageKind::Cubin);
    assert!(
        img.bytes.starts_with(
            b"FAKECUDA-MODULE 1\narch sm_90\ncuda 13.0\nentry scale 3\nentry add_one 1\n"
        ),
        "{}",
        String::from_utf8_lossy(&img.bytes)
    );
    assert_eq!((live_programs(), compiles()), (0, 1));

    let k = Kernels::new(&fake);
    k.register(&fake, "add_one", add_one);
    let d = open_id(&fake, 0);
    let m = d.load_module(&img.bytes).unwrap();
    let scale = d.function(m, "scale").unwrap();
    let add = d.function(m, "add_one").unwrap();
    assert_ne!(scale, add);
    let data = d.alloc(8).unwrap();
    let row = d.alloc(16).unwrap();
    d.copy_h2d(data, &[1; 8]).unwrap();
    d.copy_h2d(row, &[data.0.to_ne_bytes(), 8u64.to_ne_bytes()].concat())
        .unwrap();
    d.launch(add, ONE, &[row.0]).unwrap();
    let mut out = [0u8; 8];
    d.copy_d2h(&mut out, data).unwrap();
    assert_eq!(out, [2; 8]);

    let bad = "#error boom\nextern \"C\" __global__ void k() {}\n";
    let e = nv.compile(bad, "bad.cu", &[], sm90).unwrap_err();
    let line = "bad.cu(1): catastrophic error: #error directive: boom";
    match &e {
        CompileError::Nvrtc { call, log, .. } => {
            assert_eq!(*call, "nvrtcCompileProgram");
            assert!(log.contains(line), "{log}");
        }
        other => panic!("{other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.starts_with("nvrtcCompileProgram failed with code 6 (NVRTC_ERROR_COMPILATION)"),
        "{msg}"
    );
    assert!(msg.contains(line), "{msg}");
    assert_eq!((live_programs(), compiles()), (0, 1));
}

/// `copy_h2d_async` from a page-locked mirror queues the copy and returns before it runs: the
/// device reads the bytes when the copy runs (so a write the caller makes before then is what
/// arrives, which is why a caller must not write them), the device keeps the mirror alive
/// meanwhile (the caller's handle is dropped at once), and pageable memory falls back to a copy
/// that waits.
#[test]
fn an_async_upload_from_a_page_locked_mirror_runs_in_stream_order() {
    let fake = fake();
    let k = Kernels::new(&fake);
    let d = open_id(&fake, 0);
    let n = 4096usize;
    let p = d.alloc(n as u64).unwrap();
    d.copy_h2d(p, &vec![0; n]).unwrap();
    let rows = d.alloc_mirror(n).unwrap();
    rows.fill(0, n, 0x11).unwrap();
    let hold = Hold::new(&fake);
    d.copy_h2d_async(p, &rows, 0, n).unwrap();
    assert!(
        k.peek(p, n).iter().all(|&b| b == 0),
        "the copy ran before it returned"
    );
    rows.fill(0, n, 0x22).unwrap();
    drop(rows);
    hold.release();
    d.synchronize().unwrap();
    assert!(
        k.peek(p, n).iter().all(|&b| b == 0x22),
        "a page-locked source is read when the copy runs"
    );
    let log = fake.calls("cuMemcpyHtoDAsync_v2");
    assert!(log.last().is_some_and(|c| c.contains(" pinned")), "{log:?}");
    assert_eq!(d.stats().h2d_calls, 2);
    // A range past a mirror is refused: the conformance checks (the round trip test above).

    // Pageable memory: copied before the call returns (the fake reads it at call time).
    let pageable = Arc::new(simpler_driver::HostMem::new(n, 0x33).unwrap());
    d.copy_h2d_async(p, &pageable, 0, n).unwrap();
    d.synchronize().unwrap();
    assert!(k.peek(p, n).iter().all(|&b| b == 0x33));
    d.free(p).unwrap();
    assert!(d.close().errors.is_empty());
}
