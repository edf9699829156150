//! The worker behind a lock, shared by the Python worker object and every run handle.
//!
//! The GIL and the worker lock never deadlock: a thread holding the GIL takes the worker lock
//! only if it is free at once, and otherwise releases the GIL before waiting for it; heavy steps
//! (bulk copies, driver waits) run without the GIL; and nothing done under the worker lock needs
//! the GIL (the runtime's log records are queued, see `logging.rs`). So no thread ever waits for
//! the GIL while it holds the worker lock.

use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::prelude::*;

use simpler_runtime::{Worker, WorkerCell};

/// See the module docs.
#[derive(Debug)]
pub struct Shared {
    worker: Mutex<Worker>,
}

fn relock(m: &Mutex<Worker>) -> MutexGuard<'_, Worker> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(w: Worker) -> Shared {
        Shared {
            worker: Mutex::new(w),
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
        Python::attach(|py| py.detach(|| f(&mut relock(&self.worker))))
    }
}
