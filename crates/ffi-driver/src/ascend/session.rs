//! The process's session on one Ascend device, shared by every worker that opens it
//! (`crate::sessions`), and how calls are bound to the device's context.
//!
//! The runtime reference-counts both: every `aclInit` (including one answered
//! REPEAT_INITIALIZE) adds a reference to ACL, and every `aclrtSetDevice` adds a reference to the
//! device's default context. A session therefore takes exactly one of each when it opens and
//! gives each back exactly once, from `crate::release_sessions` (an exit hook), never from a
//! destructor: `aclrtResetDevice` once, and `aclFinalizeReference` where the runtime exports
//! it — never `aclFinalize`, which tears ACL down under every other user in the process (and
//! where it is not exported, ACL stays initialized).
//!
//! Threads are bound without counting: before each runtime call, [`Session::enter`] reads the
//! calling thread's current context and, when it is not this device's (a thread that never
//! bound one, or one that user code or a framework switched to another device), makes it current
//! with `aclrtSetCurrentContext`; when the call is done, a context the caller had is restored.
//! A thread that had none keeps this device's context (the `acl*` runtime has no "unbind": it
//! refuses a null context). A context this process gave back and left on such a thread is never
//! restored (restoring a context of a reset device is forbidden): the thread is bound afresh by
//! its next call, and keeps what that call bound. A context the thread had of its own (a
//! framework's, which may be the same device's default context, alive through the framework's
//! reference) is always restored.

use std::sync::{Mutex, RwLock, RwLockReadGuard};

use super::loading::{Calls, Runtime};
use super::sys::{self, Context};
use super::visible::logical_device_id;
use super::AscendConfig;
use crate::fork::Stamp;
use crate::sessions::VendorSession;
use crate::{DeviceError, LoadError, Op};

/// Context handles this process gave back (a reset device's), with the runtime library they
/// belong to. The runtime reuses a device's context object when the device is set again, so a
/// handle leaves this list when a session gets it back from `aclrtSetDevice`.
static RETIRED: Mutex<Vec<(&'static str, usize)>> = Mutex::new(Vec::new());

fn retired() -> std::sync::MutexGuard<'static, Vec<(&'static str, usize)>> {
    RETIRED.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The context this thread was left on by a call of ours (it had none before): the only
    /// context of the thread that may be one we gave back.
    static LEFT: std::cell::Cell<Option<(&'static str, usize)>> =
        const { std::cell::Cell::new(None) };
}

/// What a session holds; `ctx` is `None` once it was given back.
#[derive(Debug)]
pub(crate) struct Held {
    ctx: Option<Context>,
    acl: bool,
}

/// One process's references to one device (see the module docs).
pub(crate) struct Session {
    runtime: Runtime,
    /// The user device id (what `aclrtSetDevice` takes).
    user: i32,
    /// The logical id (what the HAL takes).
    logical: u32,
    stamp: Stamp,
    /// Read-locked by every call for its duration, write-locked by the release.
    held: RwLock<Held>,
    /// The first device fault a call reported: (code, call).
    fault: crate::sessions::FirstFault,
}

// SAFETY: `Context` is an opaque runtime handle that the runtime lets any thread make current;
// the session never dereferences it, and reads and writes of it go through the `RwLock`.
unsafe impl Send for Session {}
// SAFETY: as above.
unsafe impl Sync for Session {}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("user_device", &self.user)
            .field("logical_device", &self.logical)
            .field("open", &self.is_open())
            .finish()
    }
}

impl Session {
    /// Opens the session of `config`'s device: one ACL reference (`acl*` runtime: `aclInit`),
    /// the logical id, one device reference (`aclrtSetDevice`). A failure gives back what was
    /// taken; the calling thread's previous context, if it had one, is current again afterwards.
    pub fn open(runtime: Runtime, user: i32, config: &AscendConfig) -> Result<Session, LoadError> {
        let mut s = Session {
            runtime,
            user,
            logical: 0,
            stamp: Stamp::now(),
            held: RwLock::new(Held {
                ctx: None,
                acl: false,
            }),
            fault: crate::sessions::FirstFault::default(),
        };
        let lib = runtime.lib();
        // Success, or already initialized by someone else: either way one reference.
        if runtime.init()? {
            s.write().acl = true;
        }
        match s.logical_id(config) {
            Ok(logical) => s.logical = logical,
            Err(e) => return Err(s.fail_open(e)),
        }
        match s.set_device(lib.name) {
            Ok(()) => Ok(s),
            Err(e) => Err(s.fail_open(e)),
        }
    }

    /// The logical id the HAL wants: the runtime's translation where it exports one, else
    /// `ASCEND_RT_VISIBLE_DEVICES` read the runtime's way.
    fn logical_id(&self, config: &AscendConfig) -> Result<u32, LoadError> {
        let (runtime, user) = (self.runtime, self.user);
        let lib = runtime.lib();
        match runtime.logic_id(user) {
            Some(Ok(id)) => u32::try_from(id).map_err(|_| LoadError::Config {
                what: "logical device id".to_string(),
                detail: format!(
                    "{} returned success but a negative id ({id}) for device {user}",
                    runtime.calls().logic_id
                ),
            }),
            Some(Err(e)) => Err(e.into_init(lib.name)),
            None => logical_device_id(config.device_id, config.visible_devices.value().as_deref())
                .map_err(|detail| LoadError::Config {
                    what: "device id".to_string(),
                    detail,
                }),
        }
    }

    /// Gives back what a failed open took; the error of the open.
    fn fail_open(&self, e: LoadError) -> LoadError {
        for r in self.release() {
            log::warn!("ascend: giving back after a failed open: {r}");
        }
        e
    }

    fn calls(&self) -> Calls {
        self.runtime.calls()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Held> {
        self.held.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, Held> {
        self.held.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The logical device id.
    pub fn logical(&self) -> u32 {
        self.logical
    }

    /// The process the session was opened in.
    pub fn process(&self) -> Stamp {
        self.stamp
    }

    /// Takes the device reference (`aclrtSetDevice`, once) and records the context it gives;
    /// a failure after the reference was taken gives it back first.
    fn set_device(&self, library: &str) -> Result<(), LoadError> {
        let (user, logical) = (self.user, self.logical);
        let at = |what: &str| format!("device {user} (logical {logical}): {what}");
        let op = Op::Device;
        let prev = self
            .runtime
            .current_context(op, at("reading the thread's current context"))
            .map_err(|e| e.into_init(library))?;
        self.runtime
            .set_device(user, at("taking a reference to the device"))
            .map_err(|e| e.into_init(library))?;
        let gave = at("reading the context the device gave");
        let ctx = match self.runtime.current_context(op, gave) {
            Ok(Some(ctx)) => ctx,
            other => {
                if let Err(e) = self.runtime.reset_device(user) {
                    log::warn!(
                        "{} failed with code {} ({}) giving back the reference to device {user} \
                         after a failed open",
                        e.call,
                        e.code,
                        e.code_name
                    );
                }
                if let Some(p) = prev {
                    self.restore(p, 0);
                }
                return Err(match other {
                    Err(e) => e.into_init(library),
                    _ => sys::acl_status(0).init_error(
                        library,
                        self.calls().get_context,
                        at("no current context after setting the device"),
                    ),
                });
            }
        };
        let lib = self.runtime.lib().path;
        retired().retain(|&r| r != (lib, ctx as usize));
        self.write().ctx = Some(ctx);
        if let Some(p) = prev.filter(|&p| p != ctx) {
            self.restore(p, ctx as usize);
        }
        Ok(())
    }

    /// Makes `prev` (the context the thread had before the call) current again, unless a call
    /// of ours left it there and this process gave it back since; a failure is logged, naming
    /// the call, its code and this device.
    /// `bound` is the context the call made current.
    fn restore(&self, prev: Context, bound: usize) {
        let ours = (self.runtime.lib().path, prev as usize);
        if LEFT.with(|l| l.get()) == Some(ours) && retired().contains(&ours) {
            // The thread keeps the context this call bound.
            LEFT.with(|l| l.set(Some((ours.0, bound))));
            return;
        }
        let restoring = "restoring the caller's context";
        if let Err(e) = self.runtime.set_context(Op::Device, prev, restoring) {
            log::warn!(
                "{} failed with code {} ({}) restoring the caller's context (device {})",
                e.call,
                e.code,
                e.code_name,
                self.user
            );
        }
    }

    /// Records the device fault `e` reported (the first one is kept); whether it is new.
    pub fn note_fault(&self, e: &DeviceError) -> bool {
        self.fault.note(e.code, &e.call)
    }

    /// Whether the device reference is still held.
    pub fn is_open(&self) -> bool {
        self.read().ctx.is_some()
    }

    /// The refusal of any use in a forked child (no vendor call is made), if this is one.
    pub fn check_process(&self, op: Op, call: &str) -> Result<(), DeviceError> {
        if !self.stamp.forked() {
            return Ok(());
        }
        Err(DeviceError::new(
            op,
            call,
            crate::error::codes::OPER_NOT_PERMITTED,
            "DRV_ERROR_OPER_NOT_PERMITTED",
            self.stamp.refusal(),
        )
        .before_call())
    }

    /// Keeps the session from being released for the duration of a call that needs no context
    /// (the HAL's); refused once it was released, and in a forked child.
    pub fn hold(&self, op: Op, call: &str) -> Result<RwLockReadGuard<'_, Held>, DeviceError> {
        self.check_process(op, call)?;
        let held = self.read();
        if held.ctx.is_none() {
            return Err(DeviceError::new(
                op,
                call,
                crate::error::codes::UNINIT,
                "DRV_ERROR_UNINIT",
                "the process's session on this device was released (at exit, or by \
                 release_sessions)",
            )
            .before_call());
        }
        Ok(held)
    }

    /// Binds this device's context to the calling thread for one call; the guard restores the
    /// caller's own context (if it had one that is not given back) when dropped, and keeps the
    /// session from being released meanwhile.
    pub fn enter(&self, op: Op) -> Result<Bound<'_>, DeviceError> {
        let c = self.calls();
        self.check_process(op, c.set_context)?;
        let held = self.read();
        let Some(ctx) = held.ctx else {
            return Err(DeviceError::new(
                op,
                c.set_context,
                sys::ACL_ERROR_RT_CONTEXT_NULL,
                "ACL_ERROR_RT_CONTEXT_NULL",
                "the process's session on this device was released (at exit, or by \
                 release_sessions)",
            )
            .before_call());
        };
        let cur = self
            .runtime
            .current_context(op, "reading the thread's current context")?;
        if cur == Some(ctx) {
            return Ok(Bound {
                session: self,
                restore: None,
                bound: ctx as usize,
                _held: held,
            });
        }
        if cur.is_none() {
            // Nothing to restore: the thread keeps this context after the call.
            LEFT.with(|l| l.set(Some((self.runtime.lib().path, ctx as usize))));
        }
        let what = format_args!("binding device {}'s context to this thread", self.user);
        self.runtime.set_context(op, ctx, what)?;
        Ok(Bound {
            session: self,
            restore: cur,
            bound: ctx as usize,
            _held: held,
        })
    }
}

impl VendorSession for Session {
    /// Gives back the device reference (`aclrtResetDevice`) and the ACL reference
    /// (`aclFinalizeReference` where exported), each once; the context is retired first.
    fn release(&self) -> Vec<DeviceError> {
        let mut errors = Vec::new();
        if self.stamp.forked() {
            return errors;
        }
        let mut held = self.write();
        if let Some(ctx) = held.ctx.take() {
            retired().push((self.runtime.lib().path, ctx as usize));
            errors.extend(self.runtime.reset_device(self.user).err());
        }
        if std::mem::take(&mut held.acl) {
            match self.runtime.finalize_reference() {
                Some(Ok(left)) => log::debug!("aclFinalizeReference: {left} reference(s) left"),
                Some(Err(e)) => errors.push(e),
                None => {}
            }
        }
        errors
    }

    fn fault(&self) -> Option<(i64, String)> {
        self.fault.get()
    }
}

/// This device's context bound to the calling thread for one call (see [`Session::enter`]).
pub(crate) struct Bound<'a> {
    session: &'a Session,
    restore: Option<Context>,
    /// The context the call made current.
    bound: usize,
    _held: RwLockReadGuard<'a, Held>,
}

impl Drop for Bound<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            self.session.restore(prev, self.bound);
        }
    }
}
