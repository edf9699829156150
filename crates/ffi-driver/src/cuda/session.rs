//! The process's session on one CUDA device, shared by every worker that opens it
//! (`crate::sessions`): `cuInit`, and one retain of the device's primary context, released once
//! at exit (`crate::release_sessions`), never from a destructor (releasing the last reference
//! resets the context).
//!
//! A sticky fault (a kernel's 700 ILLEGAL_ADDRESS, say) poisons the primary context for every
//! worker of the process on that device, so the session keeps it: every later call of every
//! worker is refused with the first fault, and when the last worker on the device closes, the
//! session is given back at once (the context is reset, unless another library in the process
//! retains it too), so that the next worker opens a working device.

use std::sync::{RwLock, RwLockReadGuard};

use super::loading::CudaFns;
use super::sys::{status, CuContext, CuDevice};
use crate::fork::Stamp;
use crate::loader::{LoadError, VendorLib};
use crate::sessions::VendorSession;
use crate::{DeviceError, Op};

/// One process's reference to one device's primary context.
pub(crate) struct Session {
    pub lib: VendorLib,
    pub f: CudaFns,
    pub dev: CuDevice,
    pub ordinal: i32,
    stamp: Stamp,
    /// The retained primary context; `None` once released. Read-locked by every call for its
    /// duration, write-locked by the release.
    ctx: RwLock<Option<CuContext>>,
    /// The first sticky fault a call reported: (code, call).
    fault: crate::sessions::FirstFault,
}

// SAFETY: `CuContext` is an opaque driver handle that CUDA lets any thread make current; the
// session never dereferences it, and it is read and written under the `RwLock`.
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("ordinal", &self.ordinal)
            .field("library", &self.lib.path)
            .field("fault", &VendorSession::fault(self))
            .finish_non_exhaustive()
    }
}

impl Session {
    /// `cuInit(0)`, then one retain of device `ordinal`'s primary context.
    pub fn open(lib: VendorLib, f: CudaFns, ordinal: i32) -> Result<Session, LoadError> {
        f.init(lib)?;
        let dev = f.device_get(lib, ordinal)?;
        let ctx = f.primary_ctx_retain(lib, dev, ordinal)?;
        if ctx.is_null() {
            // Balances the retain that just succeeded.
            let _ = f.primary_ctx_release(dev, "after a null context");
            return Err(status(0).init_error(
                lib.name,
                CudaFns::NAMES.primary_ctx_retain,
                format!("device {ordinal}: returned success but a null context"),
            ));
        }
        Ok(Session {
            lib,
            f,
            dev,
            ordinal,
            stamp: Stamp::now(),
            ctx: RwLock::new(Some(ctx)),
            fault: crate::sessions::FirstFault::default(),
        })
    }

    /// The retained context, read-locked for one call (`None`: released).
    pub fn context(&self) -> RwLockReadGuard<'_, Option<CuContext>> {
        self.ctx.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The process the session was opened in.
    pub fn process(&self) -> Stamp {
        self.stamp
    }

    /// The refusal of any use in a forked child (no vendor call is made), if this is one.
    pub fn check_process(&self, op: Op, call: &str) -> Result<(), DeviceError> {
        if !self.stamp.forked() {
            return Ok(());
        }
        Err(status(super::sys::CUDA_ERROR_NOT_PERMITTED)
            .error(op, call, self.stamp.refusal())
            .before_call())
    }

    /// Records a sticky fault `call` reported (the first one is kept); whether it is new.
    pub fn note_fault(&self, code: i64, call: &str) -> bool {
        self.fault.note(code, call)
    }
}

impl VendorSession for Session {
    /// Releases the primary context once (`cuDevicePrimaryCtxRelease_v2`).
    fn release(&self) -> Vec<DeviceError> {
        if self.stamp.forked() {
            return Vec::new();
        }
        let mut ctx = self.ctx.write().unwrap_or_else(|e| e.into_inner());
        if ctx.take().is_none() {
            return Vec::new();
        }
        // Balances the one retain in `open`; the context is not used afterwards (`ctx` is
        // `None`).
        let what = format_args!("releasing device {}'s primary context", self.ordinal);
        self.f
            .primary_ctx_release(self.dev, what)
            .err()
            .into_iter()
            .collect()
    }

    fn fault(&self) -> Option<(i64, String)> {
        self.fault.get()
    }
}
