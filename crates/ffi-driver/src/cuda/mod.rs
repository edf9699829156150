//! The `cuda` backend: the CUDA driver API (`libcuda.so.1`) opened at run time, through the
//! `_v2` symbols and the device's primary context (`cuda.h`). Rooms: [`sys`] (signatures,
//! codes), [`loading`] (finding the library, the function table), `calls` (every call through
//! that table, each a typed method that names the call in its errors, and the ledger's one entry
//! point, `call`), `exec` (the worker's stream, modules, launches), `graph` (captured launches),
//! `pinning` (page-locked mirrors), `session` (the process's primary-context reference),
//! `device` (the [`Device`] trait over them all) and `close`; this file is the device itself:
//! opening it, binding its context, and its memory.
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

mod calls;
mod close;
mod device;
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

use crate::device::{DevPtr, Device};
use crate::loader::{LoadError, VendorLib};
use crate::{DeviceError, HostMem, Ledger, Ledgered, Op};
use loading::CudaFns;
use session::Session;
use sys::{status, CuContext, CUDA_ERROR_INVALID_VALUE};

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
            // The context the thread had before the call (null unbinds, which is what the
            // thread had then).
            if let Err(e) = self.f.ctx_set_current(Op::Device, prev) {
                log::warn!(
                    "cuCtxSetCurrent failed with code {} ({}) restoring the caller's context",
                    e.code,
                    e.code_name
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

    /// Makes the primary context current on the calling thread for one call (see [`Bound`]).
    fn enter(&self, st: &State, op: Op) -> Result<Bound<'_>, DeviceError> {
        self.enter_as(st, op, Self::call_name(op))
    }

    /// `enter`, for a call that is not `op`'s usual one (its refusals name `call`).
    fn enter_as(&self, st: &State, op: Op, call: &'static str) -> Result<Bound<'_>, DeviceError> {
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
        let cur = self.f.ctx_get_current(op)?;
        if cur == ctx {
            return Ok(Bound {
                f: &self.f,
                restore: None,
                _ctx: held,
            });
        }
        // The session's retained primary context, not released while `held` is read-locked.
        self.f.ctx_set_current(op, ctx)?;
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
        let p = self.f.mem_alloc(size).map_err(|e| e.sized(bytes))?;
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
        // `ptr` is a live cuMemAlloc allocation (ledger).
        self.f
            .mem_free(ptr.0)
            .map_err(|e| e.at(ptr.0).sized(size))?;
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
        call: impl FnOnce(sys::CuStream) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        self.check_open(st, op)
            .map_err(|e| e.at(addr).sized(bytes))?;
        Self::containing(st, op, addr, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        let _bound = self.enter(st, op).map_err(|e| e.at(addr).sized(bytes))?;
        call(self.stream_ptr()).map_err(|e| e.at(addr).sized(bytes))?;
        if op == Op::Memset || !wait {
            return Ok(());
        }
        self.wait_stream(op.transfer_what()).map_err(|mut e| {
            e.op = op;
            e.at(addr).sized(bytes)
        })?;
        st.exec.in_flight.clear();
        Ok(())
    }
}

/// Records a sticky fault `e` reported while opening as the session's fault.
fn session_fault(session: &Session, e: &DeviceError) {
    session.note_fault(e.code, &e.call);
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
