//! Threads in a run at interpreter exit.
//!
//! When the interpreter finalizes, CPython 3.11-3.13 end a daemon thread that takes the GIL back
//! with `pthread_exit`, a forced unwind. Unwinding through the native frames of a run (the
//! run cycle, the bindings) aborts the process ("FATAL: exception not rethrown"). So a thread
//! that is in a run when the interpreter exits must not take the GIL back once it finalizes:
//!
//! * an `atexit` hook (registered at import; it runs on the exiting thread before finalization)
//!   marks the exit and waits, without the GIL, for the threads running a run's Python code
//!   (the orchestration, a kernel) to come back into native code (up to [`EXIT_WAIT`]), and for
//!   the threads taking the GIL back to hold it (see below);
//! * from then on a thread that would take the GIL back (after a bulk step run without it, or
//!   before calling into Python) waits, without the GIL, for the interpreter to finalize, and
//!   then parks for good (what CPython 3.14 does with such threads). If finalization has not
//!   come [`GRACE`] after the exit hook returned (a later exit hook waits for this very thread,
//!   say), it goes on; from then on it checks for finalization before each time it takes the
//!   GIL back, and parks for good once it has begun.
//!
//! No thread can pass the check and then take the GIL back during finalization: a thread
//! publishes itself first (in [`IN_PYTHON`] before it calls into Python, in [`REACQUIRING`]
//! before it takes the GIL back) and then reads [`EXITING`]; the hook sets [`EXITING`] and then
//! reads both counts, all sequentially consistent. So either the thread sees the exit (and
//! parks), or the hook sees the thread and waits until it holds the GIL, after which it cannot
//! be ended by finalization before it lets the GIL go again through one of these checks (or
//! returns to plain Python code, which finalization may end safely). The grace period starts
//! when the hook has returned, not when a thread parks: while the hook still waits for other
//! threads, a parked thread's grace cannot run out.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// How long the exit waits for a run's Python code to return to native code.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// How long the exit waits for the threads taking the GIL back to hold it (they wait for the GIL
/// the hook lets go of; only other threads' Python code can delay them).
const REACQUIRE_WAIT: Duration = Duration::from_secs(20);

/// How long after the exit hook returned a parked thread waits for finalization before it
/// goes on.
const GRACE: Duration = Duration::from_secs(2);

static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread running the exit (it is never parked: it finalizes the interpreter).
static EXIT_THREAD: OnceLock<ThreadId> = OnceLock::new();
/// When the exit hook returned (a parked thread's grace starts then).
static HOOK_DONE: OnceLock<Instant> = OnceLock::new();
/// Threads in a run's Python code now.
static IN_PYTHON: AtomicUsize = AtomicUsize::new(0);
/// Threads that are taking the GIL back, from before their exit check until they hold it.
static REACQUIRING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's grace ran out once (see the module docs): it no longer waits for it.
    static WENT_ON: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is to wait before taking the GIL back: the interpreter is exiting and
/// this is not the thread that exits it. Read after the thread published itself (SeqCst: see
/// the module docs).
fn must_park() -> bool {
    EXITING.load(Ordering::SeqCst) && EXIT_THREAD.get() != Some(&thread::current().id())
}

/// Once the exit has begun (see the module docs): waits for the interpreter to finalize and
/// then parks the calling thread for good, or returns once [`GRACE`] has passed since the exit
/// hook returned (at once, and only when the interpreter is not finalizing, for a thread whose
/// grace ran out before). Call without the GIL.
fn park_while_exiting() {
    if !must_park() {
        return;
    }
    loop {
        if crate::capi::python_finalizing() == Some(true) {
            loop {
                thread::park();
            }
        }
        if WENT_ON.get() || HOOK_DONE.get().is_some_and(|t| t.elapsed() >= GRACE) {
            WENT_ON.set(true);
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// A thread taking the GIL back, counted in [`REACQUIRING`] until it holds it (dropped then).
struct Reacquiring(());

impl Drop for Reacquiring {
    fn drop(&mut self) {
        REACQUIRING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Called without the GIL just before taking it back: publishes the thread, then checks for the
/// exit, parking (unpublished) while it is under way. The GIL is taken back while the returned
/// guard lives; drop it once the GIL is held.
fn before_reacquire() -> Reacquiring {
    REACQUIRING.fetch_add(1, Ordering::SeqCst);
    if must_park() {
        REACQUIRING.fetch_sub(1, Ordering::SeqCst);
        park_while_exiting();
        REACQUIRING.fetch_add(1, Ordering::SeqCst);
    }
    Reacquiring(())
}

/// Runs `f` without the GIL, and takes the GIL back only if the interpreter is not exiting
/// (else parks; see the module docs). Every bulk or blocking step of the bindings runs here.
pub fn without_gil<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    let (r, back) = py.detach(|| {
        let r = f();
        (r, before_reacquire())
    });
    // The GIL is held again: the exit need not wait for this thread any more.
    drop(back);
    r
}

/// Before a run calls into Python: publishes the thread as in Python until the guard drops;
/// when the interpreter is exiting, lets the GIL go and parks first (see the module docs).
pub fn enter_python(py: Python<'_>) -> InPython {
    IN_PYTHON.fetch_add(1, Ordering::SeqCst);
    if must_park() {
        IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
        without_gil(py, || ());
        IN_PYTHON.fetch_add(1, Ordering::SeqCst);
    }
    InPython(())
}

/// A thread in a run's Python code (see [`enter_python`]).
pub struct InPython(());

impl Drop for InPython {
    fn drop(&mut self) {
        IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `atexit` hook: marks the exit, then waits (without the GIL, so they can finish) for the
/// threads in a run's Python code to return to native code, where they park, and for the threads
/// taking the GIL back to hold it; then gives back the process's vendor sessions (closing the
/// devices still open first, but a worker's whose memory another library holds), before the
/// interpreter tears down.
#[pyfunction]
pub fn _at_exit(py: Python<'_>) {
    let _ = EXIT_THREAD.set(thread::current().id());
    EXITING.store(true, Ordering::SeqCst);
    // This thread's own Python code (the hook itself) is not counted: it is not in a run.
    py.detach(|| {
        let start = Instant::now();
        loop {
            let waited = start.elapsed();
            let in_python = IN_PYTHON.load(Ordering::SeqCst) > 0 && waited < EXIT_WAIT;
            let reacquiring = REACQUIRING.load(Ordering::SeqCst) > 0 && waited < REACQUIRE_WAIT;
            if !in_python && !reacquiring {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        for e in simpler_driver::release_sessions().errors {
            log::warn!("at exit: {e}");
        }
    });
    crate::logging::flush(py);
    let _ = HOOK_DONE.set(Instant::now());
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
