//! One vendor session per process and device.
//!
//! Opening a device on a vendor runtime is expensive, and so is giving it back: the last
//! `aclFinalizeReference` runs a full finalize that waits for the device log flush (up to
//! `ASCEND_LOG_DEVICE_FLUSH_TIMEOUT`, 2 s by default), the last `aclrtResetDevice` tears the
//! device down, and releasing the last reference to a CUDA primary context resets it. So a
//! process takes those references once per device, in a *session* shared by every worker that
//! opens that device, and keeps them until [`release_sessions`]: a worker's close frees its own
//! memory and mappings only, and ten workers opened and closed in a row cost one device open.
//!
//! The Python module calls [`release_sessions`] from an `atexit` hook, which runs before the
//! interpreter tears down, never from a destructor (the CANN documentation advises against
//! finalizing from destructors). Rust users call it themselves before they exit; a process that
//! never calls it leaves the references to the operating system, as an exit without finalize
//! does. A session opened in another process (the parent of a forked child) is dropped from the
//! registry without any vendor call.
//!
//! [`release_sessions`] first closes every vendor device still open (its memory and mappings go
//! before the references that keep them alive), then gives each session's references back,
//! newest session first.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::fork::Stamp;
use crate::{Device, DeviceError, LoadError};

/// A vendor session: the references one process holds on one device.
pub(crate) trait VendorSession: Send + Sync {
    /// Gives the references back, once (later calls do nothing); errors are returned, and the
    /// references count as given back either way.
    fn release(&self) -> Vec<DeviceError>;
    /// The process the session was opened in.
    fn stamp(&self) -> Stamp;
}

/// Which session: platform, the library that serves it, and the device id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    pub platform: &'static str,
    pub library: &'static str,
    pub device: i64,
}

struct Entry {
    key: Key,
    typed: Arc<dyn Any + Send + Sync>,
    session: Arc<dyn VendorSession>,
}

#[derive(Default)]
struct Registry {
    sessions: Vec<Entry>,
    /// Vendor devices opened through [`crate::open_device`] (closed by [`release_sessions`]
    /// while still open).
    devices: Vec<Weak<dyn Device>>,
    /// Sessions opened, ever (a benchmark's measure of device churn).
    opened: u64,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The session of `key`: the one this process holds, else a new one from `open` (registered
/// only when it opens). Sessions of a parent process (this is a forked child) are never reused.
pub(crate) fn shared<S: VendorSession + 'static>(
    key: Key,
    open: impl FnOnce() -> Result<S, LoadError>,
) -> Result<Arc<S>, LoadError> {
    let mut guard = registry();
    let reg = guard.get_or_insert_with(Registry::default);
    reg.sessions.retain(|e| !e.session.stamp().forked());
    if let Some(e) = reg.sessions.iter().find(|e| e.key == key) {
        if let Ok(s) = Arc::clone(&e.typed).downcast::<S>() {
            return Ok(s);
        }
    }
    let s = Arc::new(open()?);
    reg.opened += 1;
    reg.sessions.push(Entry {
        key,
        typed: Arc::clone(&s) as Arc<dyn Any + Send + Sync>,
        session: Arc::clone(&s) as Arc<dyn VendorSession>,
    });
    Ok(s)
}

/// Records a vendor device, so that [`release_sessions`] closes it if it is still open.
pub(crate) fn track(dev: &Arc<dyn Device>) {
    let mut guard = registry();
    let reg = guard.get_or_insert_with(Registry::default);
    reg.devices.retain(|d| d.strong_count() > 0);
    reg.devices.push(Arc::downgrade(dev));
}

/// Removes `session` from the registry (it is being given back out of turn: a faulted
/// context's reset), so that the next open starts a new one.
pub(crate) fn forget(session: &dyn VendorSession) {
    let target = session as *const dyn VendorSession as *const ();
    if let Some(reg) = registry().as_mut() {
        reg.sessions
            .retain(|e| Arc::as_ptr(&e.session) as *const () != target);
    }
}

/// What [`release_sessions`] did.
#[derive(Debug, Default)]
pub struct ReleaseReport {
    /// Sessions whose references were given back.
    pub sessions: u64,
    /// Vendor devices that were still open and were closed first.
    pub closed_devices: u64,
    /// Failures of the releasing calls (each also logged by the caller's choice).
    pub errors: Vec<DeviceError>,
}

/// Closes every vendor device still open, then gives back every session's references (see
/// the module docs). Idempotent; a later open starts a new session.
pub fn release_sessions() -> ReleaseReport {
    release_where(|_| true)
}

/// [`release_sessions`], for the sessions served by the library opened from `library` only
/// (the path a device reports, e.g. `AscendDevice::runtime_library`): a process hands one
/// installation's devices back and keeps the rest (tests use one private library each).
pub fn release_sessions_of(library: &str) -> ReleaseReport {
    release_where(|k| k.library == library)
}

fn release_where(pick: impl Fn(&Key) -> bool) -> ReleaseReport {
    let everything = {
        let guard = registry();
        guard
            .as_ref()
            .is_none_or(|r| r.sessions.iter().all(|e| pick(&e.key)))
    };
    let (sessions, devices) = {
        let mut guard = registry();
        let reg = guard.get_or_insert_with(Registry::default);
        // Devices are not keyed: all of them close only when every session goes.
        let devices: Vec<Arc<dyn Device>> = if everything {
            reg.devices.drain(..).filter_map(|d| d.upgrade()).collect()
        } else {
            Vec::new()
        };
        let (picked, kept) = std::mem::take(&mut reg.sessions)
            .into_iter()
            .partition(|e| pick(&e.key));
        reg.sessions = kept;
        (picked, devices)
    };
    let mut report = ReleaseReport::default();
    for dev in devices {
        if dev.closed() {
            continue;
        }
        report.closed_devices += 1;
        report.errors.extend(dev.close().errors);
    }
    for e in sessions.into_iter().rev() {
        if e.session.stamp().forked() {
            continue;
        }
        report.sessions += 1;
        report.errors.extend(e.session.release());
    }
    report
}

/// How many sessions this process has opened so far, and how many it holds now.
pub fn session_counts() -> (u64, u64) {
    let guard = registry();
    guard.as_ref().map_or((0, 0), |r| {
        let held = r.sessions.iter().filter(|e| !e.session.stamp().forked());
        (r.opened, held.count() as u64)
    })
}
