//! The `ascend` backend: the CANN runtime (`libascendcl.so`, or `libruntime.so` where the `acl*`
//! symbols are absent) for memory and copies, and the driver's HAL (`libascend_hal.so`) for host
//! mappings, all opened at run time. Rooms: [`sys`] (raw signatures, constants, status codes),
//! [`loading`] (finding the libraries, load order, function tables), `calls` (every call through
//! those tables, each a typed method that names the call in its errors, and the ledger's one
//! entry point, `traced`), `visible` (device ids under `ASCEND_RT_VISIBLE_DEVICES`), `session`
//! (the runtime references the process holds and how threads are bound), `mapping` (host
//! mappings through the HAL) and `close`; this file is the safe driver. `docs/platforms.md`
//! describes it for users.
//!
//! Invariants this file keeps:
//! * **Unregister before free.** `free` refuses an allocation that still has a host mapping
//!   (BUSY, like sim; the runtime unmaps first), and `close` unmaps every mapping before it frees
//!   anything. A mapping whose unregister fails stays recorded, so its allocation is never freed.
//! * **Revoke after a successful unregister.** Each granted mapping is a foreign [`HostMem`]
//!   shared with the caller; `unmap_host` blocks accesses while `halHostUnregister` runs and
//!   revokes the host side only when it succeeded, so a failed unregister leaves a usable view.
//! * **Only a capability answer is a refusal.** `halHostRegister` answering NOT_SUPPORT (the
//!   driver's per-page-type check), or a "success" that leaves the out-pointer null (the
//!   toolkit's stub HAL), is `MapGrant::Refused`: the caller mirrors that allocation. Any other
//!   code (an unaligned pointer, a bad range, a bad device) is a bug and a [`DeviceError`].
//! * **The HAL gets the logical device id** (the runtime's translation of the user id, see
//!   [`visible::logical_device_id`]).
//! * **Resource answers are refusals too.** `halHostRegister` answering OUT_OF_MEMORY,
//!   NO_RESOURCES, OVER_LIMIT or MALLOC_FAIL (the host's mapping resources, the BAR window, are
//!   exhausted) is a `MapGrant::Refused` as well, with one warning naming the allocation, its size
//!   and the code: the caller mirrors that allocation instead of failing the run.
//! * **One device reference, one ACL reference per process**, in the session every worker on
//!   the device shares (`session`, `crate::sessions`), given back at exit; `close` frees this
//!   device's own memory and mappings only. Every runtime call runs with the device's context
//!   current on the calling thread, and the caller's own context is restored afterwards.
//! * **Inert in a forked child.** Every call is refused before any vendor call, and `close`
//!   revokes the host mappings without unregistering anything (`crate::fork`).
//! * Every call is validated against the ledger first (zero-byte allocations, copies past their
//!   allocation, unknown addresses are refused before any vendor call), counted and logged like
//!   sim, and an injected fault fails the call before the vendor function runs.

mod calls;
mod close;
pub mod loading;
mod mapping;
mod session;
pub mod sys;
mod visible;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

pub use loading::{
    MallocPolicy, RuntimeApi, DEFAULT_TOOLKIT_HOMES, DRIVER_LIB_DIRS, ENV_ASCEND_HOME, ENV_LIB_DIR,
};
pub use sys::{acl_code_name, drv_code_name};
pub use visible::{logical_device_id, VisibleDevices, ENV_VISIBLE_DEVICES};

use crate::device::{CloseReport, DevPtr, Device, MapGrant};
use crate::error::codes;
use crate::{DeviceError, HostMem, Ledger, Ledgered, LoadError, Op, Status};
use loading::{Hal, HalFns, Runtime};
use session::Session;
use sys::{acl_status, drv_status, ACL_ERROR_INVALID_PARAM};

/// Options of an Ascend device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AscendConfig {
    /// The device id as the user sees it (what `aclrtSetDevice` takes; renumbered by
    /// `ASCEND_RT_VISIBLE_DEVICES`).
    pub device_id: u32,
    /// Page policy of allocations.
    pub malloc_policy: MallocPolicy,
    /// Directory holding the libraries; when set, the only place searched (overrides
    /// `SIMPLER_ASCEND_LIB_DIR` and the install locations).
    pub lib_dir: Option<PathBuf>,
    /// Where the logical id comes from when the runtime does not translate it.
    pub visible_devices: VisibleDevices,
}

#[derive(Debug)]
struct MapEntry {
    bytes: u64,
    mem: Arc<HostMem>,
}

#[derive(Debug)]
struct State {
    ledger: Ledger,
    /// Live host mappings by device start address.
    mappings: BTreeMap<u64, MapEntry>,
    /// `close` ran: every call is refused.
    closed: bool,
    /// Close is releasing what a faulted device held: calls are made despite the fault.
    releasing: bool,
}

impl Ledgered for State {
    fn ledger(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

/// An Ascend NPU through the CANN runtime and HAL. See the module docs.
pub struct AscendDevice {
    config: AscendConfig,
    user: i32,
    logical: u32,
    runtime: Runtime,
    hal: Hal,
    session: Arc<Session>,
    state: Mutex<State>,
}

impl fmt::Debug for AscendDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AscendDevice")
            .field("device_id", &self.user)
            .field("logical_device_id", &self.logical)
            .field("runtime", &self.runtime.api())
            .field("runtime_library", &self.runtime.lib().path)
            .field("hal_library", &self.hal.lib.path)
            .finish_non_exhaustive()
    }
}

impl AscendDevice {
    /// Opens user device `config.device_id`: loads the libraries (HAL first; a copy the process
    /// already loaded is reused), and joins the process's session on the device (one ACL
    /// reference and one device reference, taken by the first open, given back at exit by
    /// `crate::release_sessions`), which finds the logical id the HAL wants.
    pub fn open(config: AscendConfig) -> Result<AscendDevice, LoadError> {
        let user = i32::try_from(config.device_id).map_err(|_| LoadError::Config {
            what: "device_id".to_string(),
            detail: format!("{} does not fit int32_t", config.device_id),
        })?;
        let (hal, runtime) = loading::load(&loading::search_dirs(config.lib_dir.as_ref()))?;
        let key = Self::key(runtime, user);
        let session = crate::sessions::join(key, || Session::open(runtime, user, &config))?;
        Ok(AscendDevice {
            config,
            user,
            logical: session.logical(),
            runtime,
            hal,
            session,
            state: Mutex::new(State {
                ledger: Ledger::new(),
                mappings: BTreeMap::new(),
                closed: false,
                releasing: false,
            }),
        })
    }

    /// The process this device was opened in.
    pub fn process_id(&self) -> u32 {
        self.session.process().pid
    }

    fn key(runtime: Runtime, user: i32) -> crate::sessions::Key {
        crate::sessions::Key {
            platform: "ascend",
            library: runtime.lib().path,
            device: i64::from(user),
        }
    }

    /// The key of the process's session this device belongs to.
    pub(crate) fn session_key(&self) -> crate::sessions::Key {
        Self::key(self.runtime, self.user)
    }

    /// The options this device was opened with.
    pub fn config(&self) -> &AscendConfig {
        &self.config
    }

    /// The user device id (the runtime's numbering, after `ASCEND_RT_VISIBLE_DEVICES`).
    pub fn device_id(&self) -> u32 {
        self.config.device_id
    }

    /// The logical device id, passed to the HAL.
    pub fn logical_device_id(&self) -> u32 {
        self.logical
    }

    /// The runtime API family in use.
    pub fn runtime_api(&self) -> RuntimeApi {
        self.runtime.api()
    }

    /// Where the runtime library came from (a path, or "already loaded in this process").
    pub fn runtime_library(&self) -> &str {
        self.runtime.lib().path
    }

    /// Where the HAL came from.
    pub fn hal_library(&self) -> &str {
        self.hal.lib.path
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state, for one call of `op`; refused in a forked child before the lock is taken (a
    /// parent thread may have held it when it forked).
    fn lock_for(&self, op: Op) -> Result<MutexGuard<'_, State>, DeviceError> {
        self.session.check_process(op, self.call(op))?;
        Ok(self.lock())
    }

    /// The vendor function behind `op`.
    fn call(&self, op: Op) -> &'static str {
        let c = self.runtime.calls();
        match op {
            Op::Alloc => c.malloc,
            Op::Free => c.free,
            Op::H2d | Op::D2h => c.memcpy,
            Op::Memset => c.memset,
            Op::Map => HalFns::NAMES.register,
            Op::Unmap => HalFns::NAMES.unregister,
            Op::Pin | Op::Unpin => "(no host registration on ascend)",
            Op::Module | Op::Launch | Op::Sync => "(no device code on ascend)",
            Op::Device => c.set_context,
        }
    }

    /// The status the vendor would answer for a call the driver refuses itself.
    fn own_status(op: Op, code: i64) -> Status {
        match op {
            Op::Map | Op::Unmap => drv_status(code),
            _ => acl_status(code),
        }
    }

    /// An error from the driver's own checks, made before any vendor call.
    fn refused(&self, op: Op, code: i64, detail: impl Into<String>) -> DeviceError {
        Self::own_status(op, code)
            .error(op, self.call(op), detail)
            .before_call()
    }

    /// The live allocation `(base, size)` containing `[addr, addr + bytes)`, else an error.
    fn containing(
        &self,
        st: &State,
        op: Op,
        addr: u64,
        bytes: u64,
    ) -> Result<(u64, u64), DeviceError> {
        let code = match op {
            Op::Map | Op::Unmap => codes::BAD_ADDRESS,
            _ => ACL_ERROR_INVALID_PARAM,
        };
        st.ledger
            .require(addr, bytes, |why| self.refused(op, code, why))
    }

    /// Binds the device's context for one call (see [`Session::enter`]); refused once closed,
    /// and after a device fault (naming the first one), except while close releases.
    fn enter(&self, st: &State, op: Op) -> Result<session::Bound<'_>, DeviceError> {
        if st.closed {
            return Err(self.refused(op, codes::UNINIT, "the device is closed"));
        }
        if let Some((code, first)) =
            crate::sessions::VendorSession::fault(&*self.session).filter(|_| !st.releasing)
        {
            return Err(Self::own_status(op, code)
                .error(
                    op,
                    self.call(op),
                    format!(
                        "the device is unusable after a device fault {first} reported; close \
                         every worker on this device: it works again once the last one has \
                         closed and the device was reset"
                    ),
                )
                .before_call());
        }
        self.session.enter(op)
    }

    fn do_alloc(&self, st: &mut State, bytes: u64) -> Result<DevPtr, DeviceError> {
        let op = Op::Alloc;
        self.check_open(st, op).map_err(|e| e.sized(bytes))?;
        if bytes == 0 {
            let e = self.refused(
                op,
                ACL_ERROR_INVALID_PARAM,
                "zero-byte allocation (the runtime rejects it)",
            );
            return Err(e.sized(0));
        }
        if usize::try_from(bytes).is_err() {
            return Err(self
                .refused(op, ACL_ERROR_INVALID_PARAM, "size exceeds size_t")
                .sized(bytes));
        }
        let _bound = self.enter(st, op).map_err(|e| e.sized(bytes))?;
        let p = self
            .runtime
            .malloc(bytes, self.config.malloc_policy)
            .map_err(|e| e.sized(bytes))?;
        let ptr = DevPtr(p.as_ptr() as u64);
        st.ledger.on_alloc(ptr, bytes);
        Ok(ptr)
    }

    fn do_free(&self, st: &mut State, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Free;
        self.check_open(st, op).map_err(|e| e.at(ptr.0))?;
        let size = st
            .ledger
            .require_live(ptr, |why| self.refused(op, ACL_ERROR_INVALID_PARAM, why))?;
        let mapped = st.mappings.range(ptr.0..ptr.0.saturating_add(size)).count();
        if mapped > 0 {
            let e = Self::own_status(Op::Unmap, codes::BUSY)
                .error(
                    op,
                    self.call(op),
                    format!(
                        "allocation still has {mapped} host mapping(s); unmap first (unregister \
                     must precede free)"
                    ),
                )
                .before_call();
            return Err(e.at(ptr.0).sized(size));
        }
        let _bound = self.enter(st, op).map_err(|e| e.at(ptr.0).sized(size))?;
        // A live allocation (ledger) with no host mapping left.
        self.runtime
            .free(ptr.0)
            .map_err(|e| e.at(ptr.0).sized(size))?;
        st.ledger.on_free(ptr);
        Ok(())
    }

    /// A copy or memset through the runtime, with the context bound and the status checked.
    fn transfer(
        &self,
        st: &mut State,
        op: Op,
        addr: u64,
        bytes: u64,
        call: impl FnOnce(u64) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        self.check_open(st, op)
            .map_err(|e| e.at(addr).sized(bytes))?;
        let (base, size) = self.containing(st, op, addr, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        let _bound = self.enter(st, op).map_err(|e| e.at(addr).sized(bytes))?;
        call(base + size - addr).map_err(|e| e.at(addr).sized(bytes))
    }
}

impl Device for AscendDevice {
    fn platform(&self) -> &'static str {
        "ascend"
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr, DeviceError> {
        let op = Op::Alloc;
        self.traced(&mut *self.lock_for(op)?, op, 0, bytes, |st| {
            self.do_alloc(st, bytes)
        })
    }

    fn free(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Free;
        let mut st = self.lock_for(op)?;
        let size = st.ledger.live_size(ptr).unwrap_or(0);
        self.traced(&mut st, op, ptr.0, size, |st| self.do_free(st, ptr))
    }

    fn copy_h2d(&self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::H2d, src.len() as u64);
        self.traced(&mut *self.lock_for(op)?, op, dst.0, bytes, |st| {
            self.transfer(st, op, dst.0, bytes, |dest_max| {
                // SAFETY: `[dst, dst + bytes)` lies inside a live allocation with `dest_max`
                // bytes from `dst` (checked by `transfer`).
                unsafe { self.runtime.memcpy_h2d(dst.0, dest_max, src) }
            })
        })
    }

    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::D2h, dst.len() as u64);
        self.traced(&mut *self.lock_for(op)?, op, src.0, bytes, |st| {
            self.transfer(st, op, src.0, bytes, |_| {
                // SAFETY: `[src, src + bytes)` lies inside a live allocation (checked by
                // `transfer`).
                unsafe { self.runtime.memcpy_d2h(dst, src.0) }
            })
        })
    }

    fn fill(&self, dst: DevPtr, bytes: u64, value: u8) -> Result<(), DeviceError> {
        let op = Op::Memset;
        self.traced(&mut *self.lock_for(op)?, op, dst.0, bytes, |st| {
            self.transfer(st, op, dst.0, bytes, |dest_max| {
                // SAFETY: `[dst, dst + bytes)` lies inside a live allocation with `dest_max`
                // bytes from `dst` (checked by `transfer`).
                unsafe { self.runtime.memset(dst.0, dest_max, value, bytes) }
            })
        })
    }

    fn map_host(&self, ptr: DevPtr, bytes: u64) -> Result<MapGrant, DeviceError> {
        let op = Op::Map;
        self.traced(&mut *self.lock_for(op)?, op, ptr.0, bytes, |st| {
            self.do_map(st, ptr, bytes)
        })
    }

    fn unmap_host(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Unmap;
        let mut st = self.lock_for(op)?;
        let bytes = st.mappings.get(&ptr.0).map_or(0, |m| m.bytes);
        self.traced(&mut st, op, ptr.0, bytes, |st| self.do_unmap(st, ptr.0))
    }

    fn with_ledger(&self, f: &mut dyn FnMut(&mut Ledger)) {
        f(&mut self.lock().ledger);
    }

    /// The HAL's inner error for mappings, the runtime's internal error for the rest.
    fn default_fault_code(&self, op: Op) -> i64 {
        match op {
            Op::Map | Op::Unmap => codes::INNER_ERR,
            _ => sys::ACL_ERROR_RT_INTERNAL_ERROR,
        }
    }

    /// Unmaps every mapping and frees every allocation of this device; the process's session
    /// (the device and ACL references) stays for the next worker, until exit. The device is
    /// unusable afterwards (calls fail: "the device is closed"). In a forked child nothing is
    /// done, not even a lock taken (a parent thread may have held it when it forked): every
    /// call there is refused, and the inherited mappings refuse every access.
    fn close(&self) -> CloseReport {
        self.do_close()
    }

    fn closed(&self) -> bool {
        self.lock().closed
    }
}

impl Drop for AscendDevice {
    /// Releases whatever is still live (mappings before allocations); the session's references
    /// stay with the process. Never panics: errors are logged.
    fn drop(&mut self) {
        let report = self.close();
        for e in &report.errors {
            log::warn!("ascend device {} drop: {e}", self.user);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_lib_dir_names_every_library_path_and_setting() {
        let dir = PathBuf::from("/nonexistent/simpler-ascend");
        let e = AscendDevice::open(AscendConfig {
            lib_dir: Some(dir),
            visible_devices: VisibleDevices::Unset,
            ..AscendConfig::default()
        })
        .unwrap_err();
        let msg = e.to_string();
        // The HAL is looked for first.
        for needle in [
            "libascend_hal.so",
            "/nonexistent/simpler-ascend/libascend_hal.so",
            "SIMPLER_ASCEND_LIB_DIR",
            "ASCEND_HOME_PATH",
        ] {
            assert!(msg.contains(needle), "{needle} missing from: {msg}");
        }
    }
}
