//! What an open Ascend device holds of the runtime, and how calls are bound to its context.
//!
//! The runtime reference-counts both: every `aclInit` (including one answered
//! REPEAT_INITIALIZE) adds a reference to ACL, and every `aclrtSetDevice` adds a reference to the
//! device's default context. A device therefore takes exactly one of each when it opens and gives
//! each back exactly once when it closes: `aclrtResetDevice` once, and `aclFinalizeReference`
//! where the runtime exports it — never `aclFinalize`, which tears ACL down under every other
//! user in the process (and where it is not exported, ACL stays initialized).
//!
//! Threads are bound without counting: before each runtime call, [`Session::enter`] reads the
//! calling thread's current context and, when it is not this device's (a thread that never
//! bound one, or one that user code or a framework switched to another device), makes it current
//! with `aclrtSetCurrentContext`; when the call is done, a context the caller had is restored.
//! A thread that had none keeps this device's context (the `acl*` runtime has no "unbind": it
//! refuses a null context); if that device is closed and another opened, the next call binds the
//! new context and the attempt to restore the dead one is refused and logged.

use super::loading::{Calls, Runtime};
use super::sys::Context;
use crate::{DeviceError, LoadError, Op};

/// One device's references to the runtime (see the module docs).
pub(crate) struct Session {
    runtime: Runtime,
    /// The user device id (what `aclrtSetDevice` takes).
    user: i32,
    /// The device's default context; `None` once the device reference was given back.
    ctx: Option<Context>,
    /// Whether this session holds an `aclInit` reference.
    acl: bool,
}

// SAFETY: `Context` is an opaque runtime handle that the runtime lets any thread make current;
// the session never dereferences it, and the device serializes its use under its own lock.
unsafe impl Send for Session {}
// SAFETY: as above; `&Session` only reads the handle.
unsafe impl Sync for Session {}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("user_device", &self.user)
            .field("open", &self.ctx.is_some())
            .finish()
    }
}

impl Session {
    /// Takes the ACL reference (`acl*` runtime: `aclInit`). The device reference is taken by
    /// [`Session::set_device`], once the device id is known.
    pub fn init(runtime: Runtime, user: i32) -> Result<Session, LoadError> {
        let mut s = Session {
            runtime,
            user,
            ctx: None,
            acl: false,
        };
        if let Runtime::Acl(lib, f) = runtime {
            // SAFETY: `aclError aclInit(const char *configPath)` accepts NULL (no config file).
            let code = i64::from(unsafe { (f.init)(std::ptr::null()) });
            match code {
                // Success, or already initialized by someone else: either way one reference.
                0 | super::sys::ACL_ERROR_REPEAT_INITIALIZE => s.acl = true,
                _ => {
                    return Err(super::sys::acl_status(code).init_error(
                        lib.name,
                        "aclInit",
                        format!("opened from {}", lib.path),
                    ))
                }
            }
        }
        Ok(s)
    }

    fn calls(&self) -> Calls {
        self.runtime.calls()
    }

    /// Takes the device reference (`aclrtSetDevice`, once) and records the context it gives;
    /// the calling thread's previous context, if it had one, is current again afterwards. An
    /// error is an open error of `library`, naming the device and its `logical` id; a failure
    /// after the reference was taken gives it back first.
    pub fn set_device(&mut self, library: &str, logical: u32) -> Result<(), LoadError> {
        let c = self.calls();
        let user = self.user;
        let fail = |s: crate::Status, call: &str, what: &str| {
            s.init_error(
                library,
                call,
                format!("device {user} (logical {logical}): {what}"),
            )
        };
        let prev = self
            .runtime
            .current_context()
            .map_err(|s| fail(s, c.get_context, "reading the thread's current context"))?;
        self.runtime
            .set_device(user)
            .result()
            .map_err(|s| fail(s, c.set_device, "taking a reference to the device"))?;
        let ctx = match self.runtime.current_context() {
            Ok(Some(ctx)) => ctx,
            other => {
                if let Err(s) = self.runtime.reset_device(user).result() {
                    log::warn!(
                        "{} failed with code {} ({}) giving back the reference to device {user} \
                         after a failed open",
                        c.reset_device,
                        s.code,
                        s.name
                    );
                }
                if let Some(p) = prev {
                    self.restore(p);
                }
                return Err(match other {
                    Err(s) => fail(s, c.get_context, "reading the context the device gave"),
                    _ => fail(
                        super::sys::acl_status(0),
                        c.get_context,
                        "no current context after setting the device",
                    ),
                });
            }
        };
        self.ctx = Some(ctx);
        if let Some(p) = prev.filter(|&p| p != ctx) {
            self.restore(p);
        }
        Ok(())
    }

    /// Makes `prev` (the caller's own context) current again; a failure is logged, naming the
    /// call, its code and this device.
    fn restore(&self, prev: Context) {
        if let Err(s) = self.runtime.set_context(prev).result() {
            log::warn!(
                "{} failed with code {} ({}) restoring the caller's context (device {})",
                self.calls().set_context,
                s.code,
                s.name,
                self.user
            );
        }
    }

    /// Whether the device reference is still held.
    pub fn is_open(&self) -> bool {
        self.ctx.is_some()
    }

    /// Binds this device's context to the calling thread for one call; the guard restores the
    /// caller's own context (if it had one) when dropped.
    pub fn enter(&self, op: Op) -> Result<Bound<'_>, DeviceError> {
        let c = self.calls();
        let Some(ctx) = self.ctx else {
            return Err(DeviceError::new(
                op,
                c.set_context,
                super::sys::ACL_ERROR_RT_CONTEXT_NULL,
                "ACL_ERROR_RT_CONTEXT_NULL",
                "the device is closed",
            )
            .before_call());
        };
        let cur = self
            .runtime
            .current_context()
            .map_err(|s| s.error(op, c.get_context, "reading the thread's current context"))?;
        if cur == Some(ctx) {
            return Ok(Bound {
                session: self,
                restore: None,
            });
        }
        self.runtime.set_context(ctx).result().map_err(|s| {
            s.error(
                op,
                c.set_context,
                format!("binding device {}'s context to this thread", self.user),
            )
        })?;
        Ok(Bound {
            session: self,
            restore: cur,
        })
    }

    /// Gives back the device reference (`aclrtResetDevice`) and the ACL reference
    /// (`aclFinalizeReference` where exported), each once; errors are returned, the references
    /// count as given back either way.
    pub fn close(&mut self) -> Vec<DeviceError> {
        let mut errors = Vec::new();
        if self.ctx.take().is_some() {
            let c = self.calls();
            if let Err(s) = self.runtime.reset_device(self.user).result() {
                errors.push(s.error(
                    Op::Device,
                    c.reset_device,
                    format!("giving back the reference to device {} on close", self.user),
                ));
            }
        }
        if std::mem::take(&mut self.acl) {
            if let Runtime::Acl(_, f) = self.runtime {
                if let Some(fin) = f.finalize_reference {
                    let mut left: u64 = 0;
                    // SAFETY: `aclError aclFinalizeReference(uint64_t *refCount)`; `&mut left`
                    // is valid for the write of the remaining count.
                    let status = super::sys::AclStatus(unsafe { fin(&mut left) });
                    match status.result() {
                        Ok(()) => log::debug!("aclFinalizeReference: {left} reference(s) left"),
                        Err(s) => errors.push(s.error(
                            Op::Device,
                            super::loading::AclFns::NAMES.finalize_reference,
                            "giving back the ACL reference on close",
                        )),
                    }
                }
            }
        }
        errors
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for e in self.close() {
            log::warn!("ascend: {e}");
        }
    }
}

/// This device's context bound to the calling thread for one call (see [`Session::enter`]).
pub(crate) struct Bound<'a> {
    session: &'a Session,
    restore: Option<Context>,
}

impl Drop for Bound<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            self.session.restore(prev);
        }
    }
}
