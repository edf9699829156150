//! The worker behind a lock, shared by every handle that reaches it: the Python worker object,
//! buffers and device tensors, resident sets, and a run's orchestrator and tensors each hold an
//! `Arc` of it (as cudarc's objects hold their context), so a handle never outlives what it
//! names and needs no lookup through Python.
//!
//! The GIL and the worker lock never deadlock: a thread holding the GIL takes the worker lock
//! only if it is free at once, and otherwise releases the GIL before waiting for it; heavy steps
//! (bulk copies, driver waits) run without the GIL; and nothing done under the worker lock needs
//! the GIL (the runtime's log records are queued, see `logging.rs`). So no thread ever waits for
//! the GIL while it holds the worker lock.

use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use pyo3::prelude::*;

use simpler_driver::Device;
use simpler_runtime::{Worker, WorkerCell};

/// See the module docs.
#[derive(Debug)]
#[repr(C)] // the lock first, as when the cell held nothing else (the hot path touches it)
pub struct Shared {
    worker: Mutex<Worker>,
    /// The device (for what needs no worker lock: counters, the call log, fault injection).
    pub dev: Arc<dyn Device>,
    /// The worker's id (handles carry it; the runtime refuses another worker's).
    pub id: u64,
    /// `"sim"`, `"ascend"` or `"cuda"`.
    pub platform: String,
    /// The device id the worker was opened on.
    pub device_id: u32,
}

fn relock(m: &Mutex<Worker>) -> MutexGuard<'_, Worker> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(w: Worker, platform: &str, device_id: u32) -> Shared {
        Shared {
            dev: w.device().clone(),
            id: w.id(),
            worker: Mutex::new(w),
            platform: platform.to_owned(),
            device_id,
        }
    }
}

impl WorkerCell for Shared {
    fn with<R: Send>(&self, heavy: bool, f: impl FnOnce(&mut Worker) -> R + Send) -> R {
        if !heavy {
            match self.worker.try_lock() {
                Ok(mut g) => return f(&mut g),
                Err(TryLockError::Poisoned(p)) => return f(&mut p.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        // Heavy work, or the lock is held elsewhere: wait (and work) without the GIL.
        Python::attach(|py| crate::shutdown::without_gil(py, || f(&mut relock(&self.worker))))
    }
}
