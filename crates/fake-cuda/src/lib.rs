//! A fake CUDA driver library (`libcuda`), for tests only (never shipped): the handful of driver
//! API entry points the CUDA backend uses, with their exact C signatures from `cuda.h`, backed by
//! host memory. Tests point the loader at this file (e.g. as `libcuda.so.1`) so the backend can
//! be exercised in CI without a GPU.
//!
//! What it models, and why — a fake is only useful if it is at least as strict as the driver:
//! * **Initialization.** Every call except `cuInit` (and `cuGetErrorName`, which the driver
//!   answers at any time) returns `CUDA_ERROR_NOT_INITIALIZED` until `cuInit(0)` succeeds.
//! * **Per-thread current context.** As in the driver, the current context is thread-local: a
//!   thread starts with none, and `cuCtxSetCurrent` on one thread says nothing about another.
//!   Memory calls without an (active) current context fail with `CUDA_ERROR_INVALID_CONTEXT`, so
//!   a backend that forgets to bind its context on a worker thread fails here as it would on a
//!   GPU.
//! * **Primary-context retain/release counts.** `cuDevicePrimaryCtxRetain` and
//!   `cuDevicePrimaryCtxRelease_v2` are reference-counted per device. When the count drops to 0
//!   the context becomes inactive: a thread that still has it current keeps a dangling handle and
//!   every call needing a context fails. Releasing more often than retaining is an error. Tests
//!   read the counts back to prove retains and releases balance.
//! * **Host registration.** `cuMemHostRegister_v2` records page-locked ranges (without touching
//!   the memory); overlapping registrations and unregistering an address that does not start a
//!   registration fail with the driver's codes, and tests can check nothing is left registered.
//! * **Device addresses and reuse.** Allocations get addresses from a distinct, non-canonical
//!   range (`0xc0da_0000_0000_0000` upward), so a caller that dereferences a device pointer
//!   crashes instead of silently working. Fresh memory is filled with `0xCD` (device memory is
//!   not zeroed). A freed address is handed out again to the next allocation of the same size, as
//!   the driver's allocator does, so a handle kept past `cuMemFree_v2` really aliases newer data.
//! * **Fault injection.** The `nth` next call of a named export returns a chosen code without
//!   doing anything, so error paths can be tested.
//! * **Stricter-than-real checks.** Freeing, copying to/from or setting an allocation while the
//!   current context belongs to a different device than the one that allocated it is accepted by
//!   the real driver (unified addressing) but is refused here with `CUDA_ERROR_INVALID_VALUE` and
//!   counted as a "wrong context" violation, because it means the backend lost track of which
//!   device owns the memory.
//!
//! Configuration, read from the environment on first use (so a whole test run can be configured)
//! and again by `fake_cuda_reset`:
//! * `FAKE_CUDA_DEVICES` (default 2): number of devices; ordinals at or past it are invalid.
//! * `FAKE_CUDA_INJECT=name:nth:code[,name:nth:code...]`: the `nth` next call of the named
//!   function (its exact C name, e.g. `cuMemAlloc_v2`) returns `code`.
//! * `FAKE_CUDA_REUSE` (default on): `0`/`off` stops freed addresses from being reused.
//!
//! Controls for tests (C ABI, see [`control`]): `fake_cuda_reset` (clears the call log, pending
//! injections and the violation count, re-reads the environment; keeps live allocations,
//! registrations and retain counts), `fake_cuda_inject`, `fake_cuda_call_log` (one text line per
//! call: `name args -> code`, the device address as the second word where there is one, injected
//! failures marked ` (injected)`), `fake_cuda_live_allocations`, `fake_cuda_live_registrations`,
//! `fake_cuda_registered_bytes`, `fake_cuda_retain_count`, `fake_cuda_violations`,
//! `fake_cuda_alloc_device`, `fake_cuda_set_devices` and `fake_cuda_set_reuse`.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard};

use fake_vendor::{env_flag, AddressMode, CallLog, Heap, Injections};

pub mod api;
pub mod control;

#[cfg(test)]
mod tests;

/// `CUresult` (`cuda.h`: an enum, passed as `int`).
pub type CUresult = c_int;
/// `CUdevice` (`cuda.h`: `typedef int CUdevice`).
pub type CUdevice = c_int;
/// `CUcontext` (`cuda.h`: an opaque `struct CUctx_st *`).
pub type CUcontext = *mut std::ffi::c_void;
/// `CUdeviceptr` (`cuda.h`: `unsigned long long` on 64-bit hosts).
pub type CUdeviceptr = std::ffi::c_ulonglong;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// First device address handed out: non-canonical on x86-64 and outside aarch64 user space.
const DEV_BASE: u64 = 0xc0da_0000_0000_0000;
/// Device allocation alignment.
const ALIGN: u64 = 4096;
/// Byte written into fresh allocations (device memory is not zeroed).
const FILL: u8 = 0xCD;
/// Primary context handle of device 0; device `d` gets `CTX_BASE + d * CTX_STRIDE`. Opaque
/// values, never dereferenced.
const CTX_BASE: usize = 0xC7C0_0000;
const CTX_STRIDE: usize = 16;
/// Device count when `FAKE_CUDA_DEVICES` is unset.
const DEFAULT_DEVICES: c_int = 2;

thread_local! {
    /// The calling thread's current context handle (0: none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn current_ctx() -> usize {
    CURRENT.with(Cell::get)
}

fn set_current_ctx(ctx: usize) {
    CURRENT.with(|c| c.set(ctx));
}

/// The primary context handle of `dev`.
fn ctx_of(dev: CUdevice) -> usize {
    CTX_BASE + dev as usize * CTX_STRIDE
}

struct State {
    initialized: bool,
    devices: c_int,
    /// Primary-context retain counts by device (absent: 0).
    retains: BTreeMap<CUdevice, u64>,
    /// Device memory; each block records the device that allocated it.
    heap: Heap<CUdevice>,
    /// Host registrations: start -> length.
    registrations: BTreeMap<u64, u64>,
    injections: Injections,
    log: CallLog,
    violations: u64,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

impl State {
    fn from_env() -> State {
        let mut st = State {
            initialized: false,
            devices: DEFAULT_DEVICES,
            retains: BTreeMap::new(),
            heap: Heap::new(AddressMode::Distinct(DEV_BASE)),
            registrations: BTreeMap::new(),
            injections: Injections::default(),
            log: CallLog::default(),
            violations: 0,
        };
        st.apply_env();
        st
    }

    fn apply_env(&mut self) {
        self.devices = DEFAULT_DEVICES;
        if let Ok(v) = std::env::var("FAKE_CUDA_DEVICES") {
            match v.trim().parse::<c_int>() {
                Ok(n) if n >= 0 => self.devices = n,
                _ => self.config_error(&format!("FAKE_CUDA_DEVICES={v:?}")),
            }
        }
        self.heap.reuse = true;
        if let Ok(v) = std::env::var("FAKE_CUDA_REUSE") {
            match env_flag("FAKE_CUDA_REUSE") {
                Some(on) => self.heap.reuse = on,
                None => self.config_error(&format!("FAKE_CUDA_REUSE={v:?}")),
            }
        }
        if let Ok(v) = std::env::var("FAKE_CUDA_INJECT") {
            for item in self.injections.parse(&v) {
                self.config_error(&format!("FAKE_CUDA_INJECT item {item:?}"));
            }
        }
    }

    fn config_error(&mut self, what: &str) {
        eprintln!("fake-cuda: ignoring invalid {what}");
        self.log.line(&format!("fake_cuda config error: {what}"));
    }

    /// Logs a call and returns its code.
    fn ret(&mut self, name: &str, args: &str, code: CUresult) -> CUresult {
        self.log.ret(name, args, code)
    }

    /// The failure this call of `name` must return, if any: an injected one (logged with
    /// ` (injected)`), else `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` (logged).
    fn gate(&mut self, name: &str, args: &str) -> Option<CUresult> {
        if let Some(code) = self.injections.take_logged(&mut self.log, name, args) {
            return Some(code);
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

    /// The device whose primary context `ctx` is, when that context is active (retained).
    fn active_device(&self, ctx: usize) -> Option<CUdevice> {
        let off = ctx.checked_sub(CTX_BASE)?;
        if off % CTX_STRIDE != 0 {
            return None;
        }
        let dev = CUdevice::try_from(off / CTX_STRIDE).ok()?;
        (self.valid_device(dev) && self.retain_count(dev) > 0).then_some(dev)
    }

    /// The device of the calling thread's current context, or `CUDA_ERROR_INVALID_CONTEXT` when
    /// there is none or it is no longer active.
    fn current_device(&self) -> Result<CUdevice, CUresult> {
        self.active_device(current_ctx())
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
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
            self.violations += 1;
            return Err(format!(
                " WRONG-CONTEXT(alloc dev={owner}, current dev={dev})"
            ));
        }
        Ok(host)
    }
}

fn lock() -> MutexGuard<'static, Option<State>> {
    // A panic while holding the lock cannot cross the C boundary (it would abort); treat a
    // poisoned lock as usable anyway.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut guard = lock();
    f(guard.get_or_insert_with(State::from_env))
}
