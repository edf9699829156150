//! The `cuda` backend: the CUDA driver API (`libcuda.so.1`) opened at run time, through the
//! `_v2` symbols and the device's primary context (`cuda.h`). Rooms: [`sys`] (signatures,
//! codes), [`loading`] (finding the library, the function table), `exec` (the worker's stream,
//! modules, launches); this file is the safe driver.
//!
//! * **One primary-context reference per process**, in the session every worker on the device
//!   shares (`session`, `crate::sessions`), released at exit; `close` frees this device's own
//!   memory, mirrors, stream and modules, and the device is unusable after it.
//! * **Inert in a forked child**: every call is refused before any vendor call (`crate::fork`).
//! * **The caller's context survives.** Every driver call runs with the primary context current
//!   on the calling thread ([`CudaDevice::enter`]): when the thread had another context current
//!   (user code, a framework), it is made current again after the call.
//! * **Mirrors are page-locked.** `cuMemAlloc` memory has no host mapping, so `map_host` always
//!   answers `Refused` (without a vendor call; still counted as a refusal) and every host view is
//!   a mirror; [`Device::alloc_mirror`] registers mirror memory with `cuMemHostRegister_v2`, so
//!   refreshes run at pinned bandwidth (a refused registration leaves an ordinary, pageable
//!   mirror). The driver keeps each registered block alive until it is unregistered, so its
//!   memory is never freed while registered.
//! * **One stream, owned by the device** (`exec`): memsets and launches are enqueued on it
//!   and return at once; copies are enqueued on it too and wait for it, so they are ordered after
//!   every launch before them.
//! * Every call is validated against the ledger first (zero-byte allocations, copies past their
//!   allocation and unknown addresses are refused before any vendor call), counted and logged like
//!   sim; an injected fault fails the call before the vendor function runs.

mod exec;
mod graph;
pub mod loading;
mod pinning;
mod session;
pub mod sys;

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

pub use loading::{DEFAULT_CUDA_LIBS, ENV_CUDA_LIB};
pub use sys::cuda_code_name;

use crate::device::{
    CallRecord, CloseReport, DevPtr, Device, FuncId, LaunchDims, MapGrant, ModuleId, Stats,
};
use crate::ledger::Outcome;
use crate::loader::{LoadError, VendorLib};
use crate::{traced, DeviceError, HostMem, HostMemError, Ledger, Ledgered, Op};
use loading::CudaFns;
use session::Session;
use sys::{status, CuContext, CuDevicePtr, CuResult, CUDA_ERROR_INVALID_VALUE};

/// Mirrors that a closed device could not unregister: kept alive (never freed) for the life of
/// the process, because the driver may still treat their pages as page-locked.
static STILL_REGISTERED: Mutex<Vec<Arc<HostMem>>> = Mutex::new(Vec::new());

/// Options of a CUDA device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudaConfig {
    /// Device ordinal (as `cuDeviceGet` numbers devices, after `CUDA_VISIBLE_DEVICES`).
    pub device_id: u32,
    /// Path of the driver library; overrides `SIMPLER_CUDA_LIB` and the default names.
    pub lib_path: Option<PathBuf>,
    /// Page-lock mirrors; `None` reads `SIMPLER_CUDA_PIN_MIRRORS` (`0`, `false`, `no` or `off`,
    /// in any case, turn it off; default on). Off only to measure what pinning buys.
    pub pin_mirrors: Option<bool>,
    /// The host page size mirrors are laid out in (each mirror covers whole pages of it, so
    /// two registered mirrors never share a page); `None`: the host's (`sysconf`).
    pub host_page: Option<usize>,
}

/// Environment switch for [`CudaConfig::pin_mirrors`].
pub const ENV_PIN_MIRRORS: &str = "SIMPLER_CUDA_PIN_MIRRORS";

/// Whether an environment switch's value turns it off: `0`, `false`, `no`, `off` (any case).
fn is_false_word(v: &str) -> bool {
    ["0", "false", "no", "off"]
        .iter()
        .any(|w| v.trim().eq_ignore_ascii_case(w))
}

#[derive(Debug)]
struct State {
    ledger: Ledger,
    /// `close` ran: every call is refused.
    closed: bool,
    /// Registered (page-locked) mirrors by host address, kept alive until unregistered.
    pinned: BTreeMap<usize, Arc<HostMem>>,
    /// The worker's stream, modules and functions.
    exec: exec::Exec,
    /// Close is releasing what a faulted context held: calls are made despite the fault.
    releasing: bool,
    /// The session the device belongs to (the primary context and its sticky fault).
    session: Arc<Session>,
}

impl State {
    /// Records `e` as the context's fault when the vendor answered a sticky code: the context
    /// is unusable from then on, for every worker of the process on this device, so every
    /// later call is refused with it, and close abandons what the context held instead of
    /// freeing it one call at a time.
    fn note_fault(&mut self, e: &DeviceError) {
        if e.called && sys::is_sticky(e.code) && self.session.note_fault(e.code, &e.call) {
            log::error!(
                "the CUDA context is unusable after {} ({}) from {}: close every worker on \
                 device {}",
                e.code,
                e.code_name,
                e.call,
                self.session.ordinal
            );
        }
    }
}

/// One driver call (see `traced`); a sticky fault the vendor call reports poisons the device.
fn call<T: Outcome>(
    st: &mut State,
    op: Op,
    addr: u64,
    bytes: u64,
    body: impl FnOnce(&mut State) -> Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    call_named(st, op, CudaDevice::call_name(op), addr, bytes, body)
}

/// `call`, for an op whose vendor call is not the op's usual one (`call_name`).
fn call_named<T: Outcome>(
    st: &mut State,
    op: Op,
    name: &'static str,
    addr: u64,
    bytes: u64,
    body: impl FnOnce(&mut State) -> Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    traced(
        st,
        op,
        addr,
        bytes,
        CudaDevice::injected_at(op, name),
        |st| {
            let r = body(st);
            if let Err(e) = &r {
                st.note_fault(e);
            }
            r
        },
    )
}

impl Ledgered for State {
    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

/// An NVIDIA GPU through the CUDA driver API. See the module docs.
pub struct CudaDevice {
    config: CudaConfig,
    pin_mirrors: bool,
    /// Mirrors cover whole pages of this size.
    host_page: usize,
    lib: VendorLib,
    f: CudaFns,
    session: Arc<Session>,
    state: Mutex<State>,
    /// The worker's stream handle (0 before open creates it and after close), its one home:
    /// readable without the state lock, which a thread waiting for the device holds.
    stream: std::sync::atomic::AtomicU64,
}

// SAFETY: the only non-thread-safe fields are the raw `CUcontext` handles inside `state`, opaque
// handles the CUDA driver allows to be made current on any thread; they are only read under the
// mutex, and the registered mirrors are `HostMem`s, which are `Send + Sync`.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; every access to the context, the mirrors and the ledger goes through the
// mutex.
unsafe impl Sync for CudaDevice {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("device_id", &self.config.device_id)
            .field("library", &self.lib.path)
            .finish_non_exhaustive()
    }
}

/// The primary context bound to the calling thread for one call; the caller's own context is
/// current again when this drops, and the session cannot be released meanwhile.
struct Bound<'a> {
    f: &'a CudaFns,
    restore: Option<CuContext>,
    _ctx: std::sync::RwLockReadGuard<'a, Option<CuContext>>,
}

impl Drop for Bound<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            // SAFETY: `CUresult cuCtxSetCurrent(CUcontext)` with the context the thread had
            // before the call (null unbinds, which is what the thread had then).
            let r = CuResult(unsafe { (self.f.ctx_set_current)(prev) }).result();
            if let Err(s) = r {
                log::warn!(
                    "cuCtxSetCurrent failed with code {} ({}) restoring the caller's context",
                    s.code,
                    s.name
                );
            }
        }
    }
}

impl CudaDevice {
    /// Opens device `config.device_id`: loads the driver library (config path, else
    /// `SIMPLER_CUDA_LIB`, else `libcuda.so.1` / `libcuda.so` on the loader's search path) and
    /// joins the process's session on the device (`cuInit(0)` and one primary-context retain,
    /// taken by the first open, released at exit by `crate::release_sessions`).
    pub fn open(config: CudaConfig) -> Result<CudaDevice, LoadError> {
        let ordinal = c_int::try_from(config.device_id).map_err(|_| LoadError::Config {
            what: "device_id".to_string(),
            detail: format!("{} does not fit int", config.device_id),
        })?;
        let (lib, f) = loading::load(config.lib_path.as_ref())?;
        let key = Self::key(lib, ordinal);
        let session = crate::sessions::join(key, || Session::open(lib, f, ordinal))?;
        let pin_mirrors = config
            .pin_mirrors
            .unwrap_or_else(|| std::env::var(ENV_PIN_MIRRORS).map_or(true, |v| !is_false_word(&v)));
        let host_page = config.host_page.unwrap_or_else(crate::host_page_size);
        let device = CudaDevice {
            config,
            pin_mirrors,
            host_page,
            lib,
            f,
            session: Arc::clone(&session),
            state: Mutex::new(State {
                ledger: Ledger::new(),
                closed: false,
                pinned: BTreeMap::new(),
                exec: exec::Exec::default(),
                releasing: false,
                session,
            }),
            stream: std::sync::atomic::AtomicU64::new(0),
        };
        // On failure `device` drops, which closes it (leaving the session).
        let created = device.create_stream(&mut device.lock());
        if let Err(e) = &created {
            // A context already faulted: the session is given back when this device drops, so
            // that the context is reset once nothing else holds it.
            if sys::is_sticky(e.code) {
                session_fault(&device.session, e);
            }
        }
        created.map_err(|e| LoadError::Init {
            library: device.lib.name.to_string(),
            call: e.call.clone(),
            code: e.code,
            code_name: e.code_name.clone(),
            detail: if sys::is_sticky(e.code) {
                format!(
                    "{}; device {}'s primary context is unusable after an earlier fault in this \
                     process, and something else in the process (torch, CuPy) still holds it, \
                     so it is not reset when simpler's workers let go: restart the process",
                    e.detail, device.config.device_id
                )
            } else {
                e.detail.clone()
            },
        })?;
        Ok(device)
    }

    /// The process this device was opened in.
    pub fn process_id(&self) -> u32 {
        self.session.process().pid
    }

    fn key(lib: VendorLib, ordinal: c_int) -> crate::sessions::Key {
        crate::sessions::Key {
            platform: "cuda",
            library: lib.path,
            device: i64::from(ordinal),
        }
    }

    /// The key of the process's session this device belongs to.
    pub(crate) fn session_key(&self) -> crate::sessions::Key {
        Self::key(self.lib, self.session.ordinal)
    }

    /// The options this device was opened with.
    pub fn config(&self) -> &CudaConfig {
        &self.config
    }

    /// Where the driver library came from (a path, or "already loaded in this process").
    pub fn library(&self) -> &str {
        self.lib.path
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state, for one call of `op`; refused in a forked child before the lock is taken (a
    /// parent thread may have held it when it forked).
    fn lock_for(&self, op: Op) -> Result<MutexGuard<'_, State>, DeviceError> {
        self.session.check_process(op, Self::call_name(op))?;
        Ok(self.lock())
    }

    fn call_name(op: Op) -> &'static str {
        let n = CudaFns::NAMES;
        match op {
            Op::Alloc => n.mem_alloc,
            Op::Free => n.mem_free,
            Op::H2d => n.memcpy_htod_async,
            Op::D2h => n.memcpy_dtoh_async,
            Op::Memset => n.memset_d8_async,
            Op::Map | Op::Unmap => "(no host mapping of device memory on cuda)",
            Op::Pin => n.host_register,
            Op::Unpin => n.host_unregister,
            Op::Module => n.module_load_data,
            Op::Launch => n.launch_kernel,
            Op::Sync => n.stream_synchronize,
            Op::Device => n.ctx_set_current,
        }
    }

    /// An error from the driver's own checks, made before any vendor call.
    fn refused(op: Op, code: i64, detail: impl Into<String>) -> DeviceError {
        Self::refused_at(op, Self::call_name(op), code, detail)
    }

    /// `refused`, naming `call` (for an op whose calls differ: module loads and lookups).
    fn refused_at(op: Op, call: &str, code: i64, detail: impl Into<String>) -> DeviceError {
        status(code).error(op, call, detail).before_call()
    }

    /// The error of an injected fault: it fails the call before the vendor function.
    /// `injected`, naming `call`.
    fn injected_at(op: Op, call: &'static str) -> impl FnOnce(i64) -> DeviceError {
        move |code| status(code).error(op, call, "injected fault")
    }

    /// Makes the primary context current on the calling thread for one call (see [`Bound`]).
    fn enter(&self, st: &State, op: Op) -> Result<Bound<'_>, DeviceError> {
        self.enter_as(st, op, Self::call_name(op))
    }

    /// `enter`, for a call that is not `op`'s usual one (its refusals name `call`).
    fn enter_as(&self, st: &State, op: Op, call: &'static str) -> Result<Bound<'_>, DeviceError> {
        let names = CudaFns::NAMES;
        if st.closed {
            return Err(Self::refused_at(
                op,
                call,
                sys::CUDA_ERROR_INVALID_CONTEXT,
                "the device is closed",
            ));
        }
        self.session.check_process(op, call)?;
        let held = self.session.context();
        let Some(ctx) = *held else {
            return Err(Self::refused_at(
                op,
                call,
                sys::CUDA_ERROR_INVALID_CONTEXT,
                "the process's session on this device was released (at exit, or by \
                 release_sessions): its primary context is gone",
            ));
        };
        if let Some((code, first)) =
            crate::sessions::VendorSession::fault(&*self.session).filter(|_| !st.releasing)
        {
            return Err(Self::refused_at(
                op,
                call,
                code,
                format!(
                    "the device's context is unusable after a fault {first} reported (a \
                     kernel's, usually); close every worker on this device: it works again once \
                     the last one has closed and the context was reset"
                ),
            ));
        }
        let mut cur: CuContext = std::ptr::null_mut();
        // SAFETY: `&mut cur` is valid for the pointer the call writes.
        CuResult(unsafe { (self.f.ctx_get_current)(&mut cur) })
            .result()
            .map_err(|s| s.error(op, names.ctx_get_current, "reading the thread's context"))?;
        if cur == ctx {
            return Ok(Bound {
                f: &self.f,
                restore: None,
                _ctx: held,
            });
        }
        // SAFETY: `CUresult cuCtxSetCurrent(CUcontext)` with the session's retained primary
        // context, not released while `held` is read-locked.
        CuResult(unsafe { (self.f.ctx_set_current)(ctx) })
            .result()
            .map_err(|s| {
                s.error(
                    op,
                    names.ctx_set_current,
                    "making the primary context current",
                )
            })?;
        Ok(Bound {
            f: &self.f,
            restore: Some(cur),
            _ctx: held,
        })
    }

    /// Refuses any call on a closed device, or in a forked child, before the ledger's checks.
    fn check_open(&self, st: &State, op: Op) -> Result<(), DeviceError> {
        if st.closed {
            return Err(Self::refused(
                op,
                sys::CUDA_ERROR_INVALID_CONTEXT,
                "the device is closed",
            ));
        }
        self.session.check_process(op, Self::call_name(op))
    }

    fn containing(st: &State, op: Op, addr: u64, bytes: u64) -> Result<(u64, u64), DeviceError> {
        st.ledger.require(addr, bytes, |why| {
            Self::refused(op, CUDA_ERROR_INVALID_VALUE, why)
        })
    }

    fn do_alloc(&self, st: &mut State, bytes: u64) -> Result<DevPtr, DeviceError> {
        let op = Op::Alloc;
        self.check_open(st, op).map_err(|e| e.sized(bytes))?;
        if bytes == 0 {
            return Err(
                Self::refused(op, CUDA_ERROR_INVALID_VALUE, "zero-byte allocation").sized(0),
            );
        }
        let size = usize::try_from(bytes).map_err(|_| {
            Self::refused(op, CUDA_ERROR_INVALID_VALUE, "size exceeds size_t").sized(bytes)
        })?;
        let _bound = self.enter(st, op).map_err(|e| e.sized(bytes))?;
        let mut p: CuDevicePtr = 0;
        // SAFETY: `&mut p` is valid for the CUdeviceptr the call writes.
        CuResult(unsafe { (self.f.mem_alloc)(&mut p, size) })
            .result()
            .map_err(|s| {
                s.error(op, Self::call_name(op), "device allocation")
                    .sized(bytes)
            })?;
        if p == 0 {
            return Err(status(0)
                .error(op, Self::call_name(op), "a null pointer")
                .sized(bytes));
        }
        st.ledger.on_alloc(DevPtr(p), bytes);
        Ok(DevPtr(p))
    }

    fn do_free(&self, st: &mut State, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Free;
        self.check_open(st, op).map_err(|e| e.at(ptr.0))?;
        let size = st
            .ledger
            .require_live(ptr, |why| Self::refused(op, CUDA_ERROR_INVALID_VALUE, why))?;
        let _bound = self.enter(st, op).map_err(|e| e.at(ptr.0).sized(size))?;
        // SAFETY: `ptr` is a live cuMemAlloc allocation (ledger); the host never dereferences it.
        CuResult(unsafe { (self.f.mem_free)(ptr.0) })
            .result()
            .map_err(|s| {
                s.error(op, Self::call_name(op), "allocation left live")
                    .at(ptr.0)
                    .sized(size)
            })?;
        st.ledger.on_free(ptr);
        Ok(())
    }

    /// A copy or memset enqueued on the worker's stream: range checked, context bound, status
    /// checked. A copy (the host owns its bytes) then waits for the stream, unless `wait` is
    /// false (its host source is kept in flight instead).
    fn transfer(
        &self,
        st: &mut State,
        op: Op,
        (addr, bytes): (u64, u64),
        wait: bool,
        call: impl FnOnce(sys::CuStream) -> CuResult,
    ) -> Result<(), DeviceError> {
        self.check_open(st, op)
            .map_err(|e| e.at(addr).sized(bytes))?;
        Self::containing(st, op, addr, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        let _bound = self.enter(st, op).map_err(|e| e.at(addr).sized(bytes))?;
        let what = op.transfer_what();
        call(self.stream_ptr())
            .result()
            .map_err(|s| s.error(op, Self::call_name(op), what).at(addr).sized(bytes))?;
        if op == Op::Memset || !wait {
            return Ok(());
        }
        self.wait_stream(what).map_err(|mut e| {
            e.op = op;
            e.at(addr).sized(bytes)
        })?;
        st.exec.in_flight.clear();
        Ok(())
    }
}

impl Device for CudaDevice {
    fn platform(&self) -> &'static str {
        "cuda"
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr, DeviceError> {
        let op = Op::Alloc;
        call(&mut *self.lock_for(op)?, op, 0, bytes, |st| {
            self.do_alloc(st, bytes)
        })
    }

    fn free(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Free;
        let mut st = self.lock_for(op)?;
        let size = st.ledger.live_size(ptr).unwrap_or(0);
        call(&mut st, op, ptr.0, size, |st| self.do_free(st, ptr))
    }

    fn copy_h2d(&self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::H2d, src.len() as u64);
        call(&mut *self.lock_for(op)?, op, dst.0, bytes, |st| {
            self.transfer(st, op, (dst.0, bytes), true, |stream| {
                // SAFETY: `src` is valid for `src.len()` reads until `transfer` has waited for
                // the stream; `[dst, dst + len)` lies inside a live allocation (checked by
                // `transfer`); the stream is the device's own.
                CuResult(unsafe {
                    (self.f.memcpy_htod_async)(dst.0, src.as_ptr().cast(), src.len(), stream)
                })
            })
        })
    }

    fn copy_h2d_async(
        &self,
        dst: DevPtr,
        src: &Arc<HostMem>,
        offset: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        // Only memory this process owns outlives the call for certain (a foreign mapping can be
        // revoked): the rest is copied at once.
        if src.owned_addr().is_none() {
            return crate::device::copy_at_once(self, dst, src, offset, len);
        }
        // The range is checked (and the block's address taken) under the block's lock.
        let from = src
            .with_slice(offset, len, |s| s.as_ptr() as usize)
            .map_err(|e| crate::device::host_source_error(dst, len, e))?;
        let (op, bytes) = (Op::H2d, len as u64);
        call(&mut *self.lock_for(op)?, op, dst.0, bytes, |st| {
            self.transfer(st, op, (dst.0, bytes), false, |stream| {
                // SAFETY: `[from, from + len)` lies inside `src` (checked above), a block this
                // process owns, which `in_flight` keeps alive until the stream is next waited
                // for, so it stays valid for the copy's reads; `[dst, dst + len)` lies inside a
                // live allocation (checked by `transfer`); the stream is the device's own.
                CuResult(unsafe {
                    (self.f.memcpy_htod_async)(dst.0, from as *const std::ffi::c_void, len, stream)
                })
            })?;
            st.exec.in_flight.push(src.clone());
            Ok(())
        })
    }

    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::D2h, dst.len() as u64);
        let (out, len) = (dst.as_mut_ptr(), dst.len());
        call(&mut *self.lock_for(op)?, op, src.0, bytes, |st| {
            self.transfer(st, op, (src.0, bytes), true, |stream| {
                // SAFETY: `out` is valid for `len` writes (the whole of `dst`) until
                // `transfer` has waited for the stream; `[src, src + len)` lies inside a live
                // allocation (checked by `transfer`); the stream is the device's own.
                CuResult(unsafe { (self.f.memcpy_dtoh_async)(out.cast(), src.0, len, stream) })
            })
        })
    }

    fn fill(&self, dst: DevPtr, bytes: u64, value: u8) -> Result<(), DeviceError> {
        let op = Op::Memset;
        call(&mut *self.lock_for(op)?, op, dst.0, bytes, |st| {
            self.transfer(st, op, (dst.0, bytes), true, |stream| {
                // SAFETY: `[dst, dst + bytes)` lies inside a live allocation (checked by
                // `transfer`), so `bytes` is at most that allocation's size, which fit `size_t`
                // when `do_alloc` passed it to `cuMemAlloc_v2`: the cast is lossless.
                // `cuMemsetD8Async` touches only those bytes; no host memory is involved.
                CuResult(unsafe { (self.f.memset_d8_async)(dst.0, value, bytes as usize, stream) })
            })
        })
    }

    fn map_host(&self, ptr: DevPtr, bytes: u64) -> Result<MapGrant, DeviceError> {
        let op = Op::Map;
        call(&mut *self.lock_for(op)?, op, ptr.0, bytes, |st| {
            Self::containing(st, op, ptr.0, bytes.max(1))?;
            st.ledger.on_map(false);
            Ok(MapGrant::Refused {
                code: sys::CUDA_ERROR_NOT_SUPPORTED,
                reason:
                    "cuMemAlloc memory has no host mapping on CUDA; every host view is a mirror"
                        .to_string(),
            })
        })
    }

    fn unmap_host(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Unmap;
        call(&mut *self.lock_for(op)?, op, ptr.0, 0, |_| {
            Err(Self::refused(
                op,
                CUDA_ERROR_INVALID_VALUE,
                "no host mapping starts at this address (CUDA never maps device memory)",
            )
            .at(ptr.0))
        })
    }

    fn alloc_mirror(&self, len: usize) -> Result<Arc<HostMem>, HostMemError> {
        let mem = Arc::new(HostMem::with_page(len, 0, self.host_page)?);
        if !self.pin_mirrors {
            return Ok(mem);
        }
        let op = Op::Pin;
        let Ok(mut st) = self.lock_for(op) else {
            return Ok(mem);
        };
        let bytes = mem.allocated() as u64;
        let r = call(&mut st, op, 0, bytes, |st| self.do_pin(st, &mem));
        if let Err(e) = r {
            let addr = mem.owned_addr().unwrap_or_default();
            log::debug!("mirror at host {addr:#x} ({len} bytes) stays pageable: {e}");
        }
        Ok(mem)
    }

    fn free_mirror(&self, mem: &Arc<HostMem>) -> Result<(), DeviceError> {
        let Some(addr) = mem.owned_addr() else {
            return Ok(());
        };
        let mut st = self.lock_for(Op::Unpin)?;
        if !st.pinned.contains_key(&addr) {
            return Ok(());
        }
        let (op, bytes) = (Op::Unpin, mem.allocated() as u64);
        call(&mut st, op, 0, bytes, |st| self.do_unpin(st, addr, bytes))
    }

    fn runs_device_code(&self) -> bool {
        true
    }

    fn compute_capability(&self) -> Result<(u32, u32), DeviceError> {
        self.do_compute_capability(&self.lock())
    }

    fn load_module(&self, image: &[u8]) -> Result<ModuleId, DeviceError> {
        let op = Op::Module;
        let bytes = image.len() as u64;
        call(&mut *self.lock_for(op)?, op, 0, bytes, |st| {
            self.do_load_module(st, image)
        })
    }

    fn function(&self, module: ModuleId, entry: &str) -> Result<FuncId, DeviceError> {
        let op = Op::Module;
        let name = CudaFns::NAMES.module_get_function;
        call_named(&mut *self.lock_for(op)?, op, name, 0, 0, |st| {
            self.do_function(st, module, entry)
        })
    }

    fn launch(&self, func: FuncId, dims: LaunchDims, params: &[u64]) -> Result<(), DeviceError> {
        let op = Op::Launch;
        call(&mut *self.lock_for(op)?, op, 0, 0, |st| {
            self.do_launch(st, func, dims, params)
        })
    }

    #[allow(clippy::result_large_err)] // the failing launch's index beside the driver's error
    fn launch_all(
        &self,
        launches: &[crate::LaunchCall<'_>],
        timed: bool,
    ) -> Result<(), (usize, DeviceError)> {
        let op = Op::Launch;
        let mut st = self.lock_for(op).map_err(|e| (0, e))?;
        // One context bind for the whole group.
        let _bound = match self.enter(&st, op) {
            Ok(b) => b,
            Err(e) => {
                st.note_fault(&e);
                return Err((0, e));
            }
        };
        // Timing is diagnostics: an event that cannot be recorded costs the group its time, not
        // the run (a sticky fault is still noted, and shows at the next call).
        let timing = |st: &mut State| match self.record_timing(st) {
            Ok(e) => Some(e),
            Err(e) => {
                st.note_fault(&e);
                log::warn!("timing a batch of launches: {e}");
                None
            }
        };
        let start = if timed { timing(&mut st) } else { None };
        let mut r = Ok(());
        for (i, l) in launches.iter().enumerate() {
            let done = call(&mut st, op, 0, 0, |st| {
                self.launch_bound(st, l.func, l.dims, l.params)
            });
            if let Err(e) = done {
                r = Err((i, e));
                break;
            }
        }
        if let Some(start) = start {
            match (&r, timing(&mut st)) {
                (Ok(()), Some(end)) => st.exec.timed.push((start, end)),
                (_, end) => st.exec.spare.extend(std::iter::once(start).chain(end)),
            }
        }
        r
    }

    fn captures_graphs(&self) -> bool {
        self.has_graphs()
    }

    fn capture(&self, launches: &[crate::LaunchCall<'_>]) -> Result<crate::GraphId, DeviceError> {
        let op = Op::Launch;
        let mut st = self.lock_for(op)?;
        self.do_capture(&mut st, launches)
    }

    fn launch_graph(&self, graph: crate::GraphId, timed: bool) -> Result<(), DeviceError> {
        let op = Op::Launch;
        let mut st = self.lock_for(op)?;
        let _bound = match self.enter_as(&st, op, CudaFns::NAMES.graph_launch) {
            Ok(b) => b,
            Err(e) => {
                st.note_fault(&e);
                return Err(e);
            }
        };
        let timing = |st: &mut State| match self.record_timing(st) {
            Ok(e) => Some(e),
            Err(e) => {
                st.note_fault(&e);
                log::warn!("timing a graph launch: {e}");
                None
            }
        };
        let start = if timed { timing(&mut st) } else { None };
        let name = CudaFns::NAMES.graph_launch;
        let r = call_named(&mut st, op, name, 0, 0, |st| {
            self.launch_graph_bound(st, graph)
        });
        if let Some(start) = start {
            match (&r, timing(&mut st)) {
                (Ok(()), Some(end)) => st.exec.timed.push((start, end)),
                (_, end) => st.exec.spare.extend(std::iter::once(start).chain(end)),
            }
        }
        r
    }

    fn destroy_graph(&self, graph: crate::GraphId) -> Result<(), DeviceError> {
        let op = Op::Launch;
        let mut st = self.lock_for(op)?;
        let r = self.do_destroy_graph(&mut st, graph);
        if let Err(e) = &r {
            st.note_fault(e);
        }
        r
    }

    fn take_device_time(&self) -> Result<Option<u64>, DeviceError> {
        let op = Op::Sync;
        let mut st = self.lock_for(op)?;
        let r = self.do_take_device_time(&mut st);
        if let Err(e) = &r {
            st.note_fault(e);
        }
        r
    }

    fn function_limits(&self, func: FuncId) -> Result<crate::FuncLimits, DeviceError> {
        let op = Op::Module;
        call_named(
            &mut *self.lock_for(op)?,
            op,
            "cuFuncGetAttribute",
            0,
            0,
            |st| self.do_function_limits(st, func),
        )
    }

    fn allow_dynamic_shared(&self, func: FuncId, bytes: u32) -> Result<(), DeviceError> {
        let op = Op::Module;
        let name = "cuFuncSetAttribute";
        call_named(
            &mut *self.lock_for(op)?,
            op,
            name,
            0,
            u64::from(bytes),
            |st| self.do_allow_dynamic_shared(st, func, bytes),
        )
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        let op = Op::Sync;
        call(&mut *self.lock_for(op)?, op, 0, 0, |st| {
            self.do_synchronize(st)
        })
    }

    fn synchronize_device(&self) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let name = CudaFns::NAMES.ctx_synchronize;
        call_named(&mut *self.lock_for(op)?, op, name, 0, 0, |st| {
            self.do_synchronize_device(st)
        })
    }

    fn stream_handle(&self) -> Option<u64> {
        match self.stream.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            s => Some(s),
        }
    }

    fn fault(&self) -> Option<i64> {
        crate::sessions::VendorSession::fault(&*self.session).map(|(code, _)| code)
    }

    fn driver_version(&self) -> Option<(u32, u32)> {
        let get = self.f.driver_get_version?;
        let mut v: c_int = 0;
        // SAFETY: `CUresult cuDriverGetVersion(int*)`; `&mut v` is valid for the write. It needs
        // no context.
        CuResult(unsafe { get(&mut v) }).result().ok()?;
        let v = u32::try_from(v).ok()?;
        Some((v / 1000, v % 1000 / 10))
    }

    fn wait_for_stream(&self, producer: u64) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let name = CudaFns::NAMES.stream_wait_event;
        call_named(&mut *self.lock_for(op)?, op, name, 0, 0, |st| {
            self.do_wait_for_stream(st, producer)
        })
    }

    fn order_stream(&self, consumer: u64) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let name = CudaFns::NAMES.stream_wait_event;
        call_named(&mut *self.lock_for(op)?, op, name, 0, 0, |st| {
            self.do_order_stream(st, consumer)
        })
    }

    fn stats(&self) -> Stats {
        self.lock().ledger.stats()
    }

    fn call_log(&self) -> Vec<CallRecord> {
        self.lock().ledger.log()
    }

    fn set_phase(&self, phase: &'static str) {
        self.lock().ledger.set_phase(phase);
    }

    fn inject_fault(&self, op: Op, nth: u64, code: Option<i64>) -> Result<(), DeviceError> {
        // Default: CUDA_ERROR_ILLEGAL_ADDRESS, a sticky error on real hardware.
        let code = code.unwrap_or(sys::CUDA_ERROR_ILLEGAL_ADDRESS);
        self.lock().ledger.inject(op, nth, code)
    }

    fn clear_faults(&self) {
        self.lock().ledger.clear_faults();
    }

    /// Drains the stream, unregisters every mirror and frees every allocation of this device;
    /// the process's session (the primary-context retain) stays for the next worker, until exit
    /// (or, after a sticky fault, until the last worker on the device closes). The device is
    /// unusable afterwards. In a forked child nothing is done, not even a lock taken (a parent
    /// thread may have held it when it forked).
    fn close(&self) -> CloseReport {
        let mut report = CloseReport::default();
        if self.session.process().forked() {
            return report;
        }
        let mut st = self.lock();
        st.ledger.clear_faults();
        if st.closed {
            return report;
        }
        // After a sticky fault every call fails, but the releasing calls are still made (they
        // release what they can: a driver frees with the context); their errors are expected,
        // so one summary says what happened.
        let fault = crate::sessions::VendorSession::fault(&*self.session);
        st.releasing = fault.is_some();
        let mut errors = Vec::new();
        match self.enter(&st, Op::Device) {
            Ok(_bound) => self.close_exec(&mut st, &mut errors),
            Err(e) => errors.push(e),
        }
        let pinned: Vec<(usize, u64)> = st
            .pinned
            .iter()
            .map(|(&a, m)| (a, m.allocated() as u64))
            .collect();
        for (addr, len) in pinned {
            let r = self.do_unpin(&mut st, addr, len);
            if let Err(e) = st.ledger.logged(Op::Unpin, 0, len, r) {
                errors.push(e);
            }
        }
        for (ptr, size) in st.ledger.live_allocations() {
            report.leaked_allocations += 1;
            report.leaked_bytes += size;
            let r = self.do_free(&mut st, ptr);
            if let Err(e) = st.ledger.logged(Op::Free, ptr.0, size, r) {
                errors.push(e);
            }
        }
        match fault {
            Some((code, _)) => self.abandon(&mut st, code, errors.len(), &mut report),
            None => report.errors.extend(errors),
        }
        st.releasing = false;
        st.closed = true;
        // Mirrors whose unregister failed are still registered with the driver (the primary
        // context keeps the registration alive): their memory must never be freed or reused, so
        // it is kept for the life of the process, and `pinned_bytes` keeps counting it.
        let kept = std::mem::take(&mut st.pinned);
        if !kept.is_empty() {
            let mut q = STILL_REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
            q.extend(kept.into_values());
        }
        drop(st);
        report.errors.extend(crate::sessions::leave(&*self.session));
        if report.leaked_allocations > 0 {
            log::warn!(
                "cuda device {} closed with {} live allocation(s) ({} bytes); freed them",
                self.config.device_id,
                report.leaked_allocations,
                report.leaked_bytes
            );
        }
        report
    }

    fn closed(&self) -> bool {
        self.lock().closed
    }
}

/// Records a sticky fault `e` reported while opening as the session's fault.
fn session_fault(session: &Session, e: &DeviceError) {
    session.note_fault(e.code, &e.call);
}

impl CudaDevice {
    /// The end of a close after a sticky fault: what the releasing calls could not release goes
    /// with the context (it is forgotten, never retried); one error says what happened.
    fn abandon(&self, st: &mut State, code: i64, failed: usize, report: &mut CloseReport) {
        let left = st.ledger.live_allocations();
        for (ptr, _) in &left {
            st.ledger.on_free(*ptr);
        }
        report.errors.push(status(code).error(
            Op::Device,
            "(the device's context, after a sticky fault)",
            format!(
                "closed device {} after a sticky fault: {failed} releasing call(s) failed with it; \
                 {} allocation(s) go with the context",
                self.config.device_id,
                left.len()
            ),
        ));
    }
}

impl Drop for CudaDevice {
    /// Frees what is still live; the session's primary-context reference stays with the process.
    /// Never panics.
    fn drop(&mut self) {
        let report = self.close();
        for e in &report.errors {
            log::warn!("cuda device {} drop: {e}", self.config.device_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_naming_the_path_and_the_setting() {
        let e = CudaDevice::open(CudaConfig {
            device_id: 0,
            lib_path: Some(PathBuf::from("/nonexistent/libcuda.so.1")),
            ..CudaConfig::default()
        })
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("/nonexistent/libcuda.so.1"), "{msg}");
        assert!(msg.contains("SIMPLER_CUDA_LIB"), "{msg}");
        assert!(matches!(e, LoadError::Library { .. }), "{e:?}");
    }

    #[test]
    fn the_pin_switch_takes_the_usual_false_words() {
        for off in ["0", "false", "FALSE", " no ", "Off"] {
            assert!(is_false_word(off), "{off}");
        }
        for on in ["1", "true", "yes", "on", ""] {
            assert!(!is_false_word(on), "{on}");
        }
    }
}
