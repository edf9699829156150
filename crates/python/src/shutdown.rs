//! Threads in a run at interpreter exit.
//!
//! When the interpreter finalizes, CPython 3.11-3.13 end a daemon thread that takes the GIL back
//! with `pthread_exit`, a forced unwind. Unwinding through the native frames of a run (the
//! run cycle, the bindings) aborts the process ("FATAL: exception not rethrown"). So a thread
//! that is in a run when the interpreter exits must not take the GIL back once it finalizes:
//!
//! * an `atexit` hook (registered at import; it runs on the exiting thread before finalization)
//!   marks the exit and waits, without the GIL, for the threads running a run's Python code
//!   (the orchestration, a kernel) to come back into native code (up to [`EXIT_WAIT`]);
//! * from then on a thread that would take the GIL back (after a bulk step run without it, or
//!   before calling into Python) waits, without the GIL, for the interpreter to finalize, and
//!   then parks for good (what CPython 3.14 does with such threads). If finalization does not
//!   come within [`GRACE`] (a later exit hook is waiting for this very thread, say), it goes
//!   on.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// How long the exit waits for a run's Python code to return to native code.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// How long a thread in a run waits for finalization once the exit has begun.
const GRACE: Duration = Duration::from_secs(2);

static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread running the exit (it is never parked: it finalizes the interpreter).
static EXIT_THREAD: OnceLock<ThreadId> = OnceLock::new();
/// Threads in a run's Python code now.
static IN_PYTHON: AtomicUsize = AtomicUsize::new(0);

/// Whether this thread is to wait before taking the GIL back: the interpreter is exiting and
/// this is not the thread that exits it.
fn must_park() -> bool {
    EXITING.load(Ordering::Acquire) && EXIT_THREAD.get() != Some(&thread::current().id())
}

/// Once the exit has begun (see the module docs): waits for the interpreter to finalize and
/// then parks the calling thread for good, or returns after [`GRACE`]. Call without the GIL.
pub fn park_if_exiting() {
    if !must_park() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < GRACE {
        if simpler_driver::python_finalizing() == Some(true) {
            loop {
                thread::park();
            }
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `f` without the GIL, and takes the GIL back only if the interpreter is not exiting
/// (else parks; see the module docs). Every bulk or blocking step of the bindings runs here.
pub fn without_gil<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    py.detach(|| {
        let r = f();
        park_if_exiting();
        r
    })
}

/// Before a run calls into Python: parks (releasing the GIL) when the interpreter is exiting,
/// else counts the thread as in Python until the guard drops.
pub fn enter_python(py: Python<'_>) -> InPython {
    if must_park() {
        py.detach(park_if_exiting);
    }
    IN_PYTHON.fetch_add(1, Ordering::AcqRel);
    InPython(())
}

/// A thread in a run's Python code (see [`enter_python`]).
pub struct InPython(());

impl Drop for InPython {
    fn drop(&mut self) {
        IN_PYTHON.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The `atexit` hook: marks the exit, then waits (without the GIL, so they can finish) for the
/// threads in a run's Python code to return to native code, where they park; then gives back the
/// process's vendor sessions (closing the devices still open first), before the interpreter
/// tears down.
#[pyfunction]
pub fn _at_exit(py: Python<'_>) {
    let _ = EXIT_THREAD.set(thread::current().id());
    EXITING.store(true, Ordering::Release);
    // This thread's own Python code (the hook itself) is not counted: it is not in a run.
    py.detach(|| {
        let start = Instant::now();
        while IN_PYTHON.load(Ordering::Acquire) > 0 && start.elapsed() < EXIT_WAIT {
            thread::sleep(Duration::from_millis(1));
        }
        for e in simpler_driver::release_sessions().errors {
            log::warn!("at exit: {e}");
        }
    });
    crate::logging::flush(py);
}

/// Gives back this process's vendor sessions now: closes every ``ascend`` / ``cuda`` worker
/// still open (its memory and mappings first), then releases each device's references (ACL and
/// the device on ascend, the primary context on cuda). The exit hook does this on its own;
/// call it to hand the devices back earlier. A later ``Worker`` opens a new session. A worker
/// with a live export (a DLPack capsule or array, a tensor whose ``__cuda_array_interface__``
/// was read: another library may still use its memory) is not closed: it stays open, with its
/// session, and ``errors`` names it. Returns ``{"sessions": n, "closed_workers": k, "errors":
/// [...]}``.
#[pyfunction]
pub fn release_sessions(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let r = without_gil(py, simpler_driver::release_sessions);
    crate::logging::flush(py);
    let d = pyo3::types::PyDict::new(py);
    d.set_item("sessions", r.sessions)?;
    d.set_item("closed_workers", r.closed_devices)?;
    let errors: Vec<String> = r.errors.iter().map(|e| e.to_string()).collect();
    d.set_item("errors", errors)?;
    Ok(d)
}

/// ``{"opened": n, "held": m}``: vendor sessions this process opened so far (each one a device
/// open on the vendor runtime) and holds now.
#[pyfunction]
pub fn session_stats(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let (opened, held) = simpler_driver::session_counts();
    let d = pyo3::types::PyDict::new(py);
    d.set_item("opened", opened)?;
    d.set_item("held", held)?;
    Ok(d)
}

/// Registers [`_at_exit`] with the interpreter's `atexit`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(_at_exit, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    m.add_function(wrap_pyfunction!(release_sessions, m)?)?;
    m.add_function(wrap_pyfunction!(session_stats, m)?)?;
    Ok(())
}
