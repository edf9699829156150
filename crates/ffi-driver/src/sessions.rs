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
//! does.
//!
//! Rules the registry keeps:
//! * **A session is never given back under an open device.** [`release_sessions`] first closes
//!   the devices opened through [`crate::open_device`] on the sessions it releases (their memory
//!   and mappings go before the references that keep them alive); a session that still has
//!   devices open after that (opened with `AscendDevice::open` / `CudaDevice::open` and not
//!   closed) is kept, and the report says so.
//! * **Memory another library uses is never freed.** A device whose owner registered a
//!   [`CloseHold`] ([`hold_close`]; the runtime's worker does, for its exports to other
//!   libraries) is closed only through it, which refuses while the memory is held: such a device
//!   stays open, with its session, and the report names it and why.
//! * **Users are counted under the registry's lock**, so a worker that joins a session can never
//!   find it given back by the last worker leaving at the same moment.
//! * **A faulted session is not handed out.** After a sticky device fault the session is given
//!   back when its last worker closes (`leave`); until then a new worker on the device is refused
//!   with the first fault.
//! * **Opening runs outside the lock** (it can take seconds); when two threads open the same
//!   device at once, the second one's session is given back and the first one's shared.
//! * **Fork.** In a forked child the registry (and whatever lock a parent thread held when it
//!   forked) is never touched: every function here returns at once, without a vendor call.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use crate::fork::Stamp;
use crate::{Device, DeviceError, LoadError};

/// A vendor session: the references one process holds on one device.
pub(crate) trait VendorSession: Send + Sync {
    /// Gives the references back, once (later calls do nothing); errors are returned, and the
    /// references count as given back either way.
    fn release(&self) -> Vec<DeviceError>;
    /// The first sticky fault a call reported on the device: its code and the call.
    fn fault(&self) -> Option<(i64, String)>;
}

/// The first sticky fault a call reported on a session's device (its code and the call); the
/// later ones are its consequences.
#[derive(Debug, Default)]
pub(crate) struct FirstFault(Mutex<Option<(i64, String)>>);

impl FirstFault {
    /// Records a fault `call` reported, unless one is recorded; whether it is the first.
    pub fn note(&self, code: i64, call: &str) -> bool {
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_some() {
            return false;
        }
        *f = Some((code, call.to_string()));
        true
    }

    /// The first fault, if any.
    pub fn get(&self) -> Option<(i64, String)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Which session: platform, the library that serves it, and the device id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    pub platform: &'static str,
    pub library: &'static str,
    pub device: i64,
}

/// What may hold a device's memory in use beyond the device's owner (another library's arrays
/// over it, made from an export): [`release_sessions`] closes a device through its hold.
pub trait CloseHold: Send + Sync {
    /// Runs `close` unless the memory is held, atomically with respect to new holds (none can be
    /// taken once `close` ran); `Err(why)` when held, with nothing closed.
    fn close_unless_held(
        &self,
        close: &mut dyn FnMut() -> crate::CloseReport,
    ) -> Result<crate::CloseReport, String>;
}

/// A device opened through [`crate::open_device`], with its session's key and its hold.
#[derive(Clone)]
struct Tracked {
    key: Key,
    dev: Weak<dyn Device>,
    hold: Option<Weak<dyn CloseHold>>,
}

struct Entry {
    key: Key,
    typed: Arc<dyn Any + Send + Sync>,
    session: Arc<dyn VendorSession>,
    /// Devices (workers) open on the session.
    users: usize,
}

#[derive(Default)]
struct Registry {
    sessions: Vec<Entry>,
    /// Vendor devices opened through [`crate::open_device`] (closed by the release of their
    /// session while still open, through their hold when they have one).
    devices: Vec<Tracked>,
    /// Sessions opened, ever (a benchmark's measure of device churn).
    opened: u64,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
/// The process the registry was first used in (read without its lock, so a forked child never
/// waits for a lock a parent thread held when it forked).
static REGISTRY_PROCESS: OnceLock<Stamp> = OnceLock::new();

/// The registry, or `None` in a forked child of the process that used it.
fn registry() -> Option<MutexGuard<'static, Option<Registry>>> {
    if REGISTRY_PROCESS.get_or_init(Stamp::now).forked() {
        return None;
    }
    Some(REGISTRY.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The refusal of a forked child's open (the registry belongs to the parent).
fn forked_open(key: &Key) -> LoadError {
    let stamp = REGISTRY_PROCESS.get_or_init(Stamp::now);
    LoadError::Config {
        what: format!("{} device {}", key.platform, key.device),
        detail: stamp.refusal(),
    }
}

/// Joins the session of `key` (counted as one more user): the one this process holds, else a
/// new one from `open`. A session with a sticky fault is refused.
pub(crate) fn join<S: VendorSession + 'static>(
    key: Key,
    open: impl FnOnce() -> Result<S, LoadError>,
) -> Result<Arc<S>, LoadError> {
    if let Some(s) = join_existing::<S>(&key)? {
        return Ok(s);
    }
    let fresh = Arc::new(open()?);
    let mut guard = registry().ok_or_else(|| forked_open(&key))?;
    let reg = guard.get_or_insert_with(Registry::default);
    // Another thread may have opened the same device meanwhile: share the first one.
    if let Some(e) = reg.sessions.iter_mut().find(|e| e.key == key) {
        if let Ok(s) = Arc::clone(&e.typed).downcast::<S>() {
            e.users += 1;
            drop(guard);
            for err in fresh.release() {
                log::warn!("giving back a second session opened at the same time: {err}");
            }
            return Ok(s);
        }
    }
    reg.opened += 1;
    reg.sessions.push(Entry {
        key,
        typed: Arc::clone(&fresh) as Arc<dyn Any + Send + Sync>,
        session: Arc::clone(&fresh) as Arc<dyn VendorSession>,
        users: 1,
    });
    Ok(fresh)
}

/// The held session of `key`, joined, if there is one; a faulted one is an error.
fn join_existing<S: VendorSession + 'static>(key: &Key) -> Result<Option<Arc<S>>, LoadError> {
    let mut guard = registry().ok_or_else(|| forked_open(key))?;
    let reg = guard.get_or_insert_with(Registry::default);
    let Some(e) = reg.sessions.iter_mut().find(|e| &e.key == key) else {
        return Ok(None);
    };
    if let Some((code, call)) = e.session.fault() {
        return Err(LoadError::Config {
            what: format!("{} device {}", key.platform, key.device),
            detail: format!(
                "the device is unusable after a sticky fault {call} reported (code {code}); \
                 close the {} worker(s) still open on it: the last close resets the device",
                e.users
            ),
        });
    }
    let Ok(s) = Arc::clone(&e.typed).downcast::<S>() else {
        return Ok(None);
    };
    e.users += 1;
    Ok(Some(s))
}

/// A worker on `session` closed. After a sticky fault, the last one removes the session from
/// the registry and gives it back at once (the device is reset for the next worker); the
/// release's errors are returned.
pub(crate) fn leave(session: &dyn VendorSession) -> Vec<DeviceError> {
    let target = session as *const dyn VendorSession as *const ();
    let last_faulted = {
        let Some(mut guard) = registry() else {
            return Vec::new();
        };
        let Some(reg) = guard.as_mut() else {
            return Vec::new();
        };
        let Some(i) = reg
            .sessions
            .iter()
            .position(|e| Arc::as_ptr(&e.session) as *const () == target)
        else {
            return Vec::new();
        };
        let e = &mut reg.sessions[i];
        e.users = e.users.saturating_sub(1);
        (e.users == 0 && e.session.fault().is_some()).then(|| reg.sessions.remove(i))
    };
    last_faulted.map_or_else(Vec::new, |e| e.session.release())
}

/// Records a device opened through [`crate::open_device`] on the session of `key`, so that the
/// release of that session closes it first if it is still open.
pub(crate) fn track(key: Key, dev: &Arc<dyn Device>) {
    if let Some(mut guard) = registry() {
        let reg = guard.get_or_insert_with(Registry::default);
        reg.devices.retain(|t| t.dev.strong_count() > 0);
        reg.devices.push(Tracked {
            key,
            dev: Arc::downgrade(dev),
            hold: None,
        });
    }
}

/// Registers `hold` for `dev` (a device [`crate::open_device`] opened; others are not closed by
/// [`release_sessions`], and this does nothing for them): from now on the release closes `dev`
/// only through `hold`, and keeps it open, with its session, while `hold` refuses.
pub fn hold_close(dev: &Arc<dyn Device>, hold: Weak<dyn CloseHold>) {
    let target = Arc::as_ptr(dev) as *const ();
    if let Some(mut guard) = registry() {
        let reg = guard.get_or_insert_with(Registry::default);
        if let Some(t) = reg
            .devices
            .iter_mut()
            .find(|t| t.dev.as_ptr() as *const () == target)
        {
            t.hold = Some(hold);
        }
    }
}

/// What [`release_sessions`] did.
#[derive(Debug, Default)]
pub struct ReleaseReport {
    /// Sessions whose references were given back.
    pub sessions: u64,
    /// Vendor devices that were still open and were closed first.
    pub closed_devices: u64,
    /// Failures of the releasing calls, and sessions kept because devices are still open on
    /// them (opened outside [`crate::open_device`]).
    pub errors: Vec<DeviceError>,
}

/// Closes every device still open on this process's sessions, then gives back each session's
/// references (see the module docs). Idempotent; a later open starts a new session. Does
/// nothing in a forked child.
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
    let mut report = ReleaseReport::default();
    // 1. The devices of the picked sessions that are still open, closed outside the lock (a
    // device's close leaves its session, which takes the lock), each through its hold when it
    // has one; a held one stays open and tracked.
    let devices: Vec<Tracked> = {
        let Some(mut guard) = registry() else {
            return report;
        };
        let reg = guard.get_or_insert_with(Registry::default);
        let (picked, kept) = std::mem::take(&mut reg.devices)
            .into_iter()
            .partition(|t| pick(&t.key));
        reg.devices = kept;
        picked
    };
    let mut held: Vec<Tracked> = Vec::new();
    for t in devices {
        let Some(dev) = t.dev.upgrade() else {
            continue;
        };
        if dev.closed() {
            continue;
        }
        let closed = match t.hold.as_ref().and_then(Weak::upgrade) {
            Some(hold) => hold.close_unless_held(&mut || dev.close()),
            None => Ok(dev.close()),
        };
        match closed {
            Ok(r) => {
                report.closed_devices += 1;
                report.errors.extend(r.errors);
            }
            Err(why) => {
                report.errors.push(DeviceError::new(
                    crate::Op::Device,
                    "(release_sessions)",
                    0,
                    "NONE",
                    format!(
                        "{} device {}: a worker was kept open, with its session: {why}",
                        t.key.platform, t.key.device
                    ),
                ));
                held.push(t);
            }
        }
    }
    if !held.is_empty() {
        if let Some(mut guard) = registry() {
            guard
                .get_or_insert_with(Registry::default)
                .devices
                .extend(held.iter().cloned());
        }
    }
    // 2. The picked sessions nobody uses any more leave the registry, under one lock.
    let released: Vec<Entry> = {
        let Some(mut guard) = registry() else {
            return report;
        };
        let reg = guard.get_or_insert_with(Registry::default);
        let (picked, kept): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut reg.sessions)
            .into_iter()
            .partition(|e| pick(&e.key) && e.users == 0);
        reg.sessions = kept;
        for e in reg.sessions.iter().filter(|e| pick(&e.key)) {
            // The devices kept for a hold were reported above.
            let kept_held = held.iter().filter(|t| t.key == e.key).count();
            let outside = e.users.saturating_sub(kept_held);
            if outside == 0 {
                continue;
            }
            report.errors.push(DeviceError::new(
                crate::Op::Device,
                "(release_sessions)",
                0,
                "NONE",
                format!(
                    "{} device {}'s session was kept: {outside} device(s) opened on it outside \
                     open_device are still open; close them first",
                    e.key.platform, e.key.device
                ),
            ));
        }
        picked
    };
    // 3. Their references, newest session first, outside the lock (a finalize can take
    // seconds).
    for e in released.into_iter().rev() {
        report.sessions += 1;
        report.errors.extend(e.session.release());
    }
    report
}

/// How many sessions this process has opened so far, and how many it holds now (a forked
/// child holds none).
pub fn session_counts() -> (u64, u64) {
    registry()
        .and_then(|g| g.as_ref().map(|r| (r.opened, r.sessions.len() as u64)))
        .unwrap_or((0, 0))
}
