//! Rust log records, delivered to Python's `logging` without ever needing the GIL to log.
//!
//! The runtime logs while it holds a worker's lock, often with the GIL released (a close that
//! frees thousands of buffers, a failed unmap). Taking the GIL there could deadlock against a
//! thread that holds the GIL and waits for that lock. So records are queued here, and emitted by
//! the bindings whenever they hold the GIL and no lock ([`flush`], called as every entry point
//! returns). They arrive under the `simpler.` hierarchy: `simpler_runtime::views` logs to
//! `simpler.runtime.views`, `simpler_driver::ascend` to `simpler.driver.ascend`, so
//! `logging.getLogger("simpler")` controls them all.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use log::{Level, LevelFilter, Log, Metadata, Record};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// Records kept while no thread flushes (older ones are dropped and counted).
const CAPACITY: usize = 10_000;

struct Queued {
    level: Level,
    target: String,
    message: String,
}

static QUEUE: Mutex<Vec<Queued>> = Mutex::new(Vec::new());
static PENDING: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);

struct Buffered;

impl Log for Buffered {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= Level::Debug
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let mut q = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= CAPACITY {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push(Queued {
            level: record.level(),
            target: record.target().to_owned(),
            message: record.args().to_string(),
        });
        PENDING.store(true, Ordering::Release);
    }

    fn flush(&self) {}
}

static LOGGER: Buffered = Buffered;

/// Installs the logger (once per process; a second install is a no-op).
pub fn init() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(LevelFilter::Debug);
    }
}

/// The Python logger name for a Rust log target.
fn logger_name(target: &str) -> String {
    let mut parts = target.split("::");
    let krate = match parts.next() {
        Some("simpler_runtime") => "runtime",
        Some("simpler_driver") => "driver",
        _ => "native",
    };
    let rest: Vec<&str> = parts.collect();
    if rest.is_empty() {
        format!("simpler.{krate}")
    } else {
        format!("simpler.{krate}.{}", rest.join("."))
    }
}

fn python_level(l: Level) -> u8 {
    match l {
        Level::Error => 40,
        Level::Warn => 30,
        Level::Info => 20,
        Level::Debug | Level::Trace => 10,
    }
}

/// Emits the queued records through Python's `logging`. Call with the GIL held and no worker
/// lock held; cheap when nothing is queued (one load, inlined into every call of the hot path).
#[inline(always)]
pub fn flush(py: Python<'_>) {
    if PENDING.load(Ordering::Acquire) {
        emit(py);
    }
}

/// [`flush`] when something is queued.
#[cold]
#[inline(never)]
fn emit(py: Python<'_>) {
    PENDING.store(false, Ordering::Release);
    let records = std::mem::take(&mut *QUEUE.lock().unwrap_or_else(|e| e.into_inner()));
    static GET_LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let Ok(get_logger) = GET_LOGGER.get_or_try_init(py, || {
        py.import("logging")?
            .getattr("getLogger")
            .map(|f| f.unbind())
    }) else {
        return;
    };
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        if let Ok(l) = get_logger.call1(py, ("simpler",)) {
            let msg = format!("{dropped} native log record(s) were dropped (queue full)");
            let _ = l.call_method1(py, "warning", (msg,));
        }
    }
    for r in records {
        if let Ok(l) = get_logger.call1(py, (logger_name(&r.target),)) {
            // Logging never raises into the caller; a failing handler is logging's own business.
            let _ = l.call_method1(py, "log", (python_level(r.level), "%s", r.message));
        }
    }
}
