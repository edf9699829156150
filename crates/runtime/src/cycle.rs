//! The run cycle's one home: [`run`] drives `bind -> orchestrate -> execute -> copy back ->
//! clean up` for one call, and is the only place that knows the order of the phases.
//!
//! The embedding (the Python bindings, or a Rust test) supplies what is its own through
//! [`RunHost`]: the bytes of its host arrays, the orchestration function and the kernels. The
//! worker is reached through a [`WorkerCell`], locked once per step and never across a call
//! into the host, so an orchestration can read tensor data and submit tasks through the same
//! cell, and another thread can still reach the worker (and be refused while it is busy).
//!
//! Whatever fails, and wherever — the host's bytes, a phase, the orchestration, a kernel, an
//! interrupt the host reports at a checkpoint, or a panic — the run is finished: cleaned up, its
//! fresh staging buffers released, the worker free for the next run. A failure in an earlier
//! phase skips copy back; the first error is the one returned.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::device_code::DeviceCode;
use crate::dtype::{DType, Value};
use crate::error::{Error, Phase, Result};
use crate::geometry::Geometry;
use crate::run::submit::batch_count;
use crate::run::{
    BatchScalar, BatchSlot, HostWindow, RunId, RunReport, TaskCall, TensorInfo, BATCH_PART,
};
use crate::spec::{Direction, KernelRef, RunCall};
use crate::worker::Worker;

/// Shared access to a worker.
pub trait WorkerCell: Sync {
    /// Runs `f` with the worker locked. `heavy` says that `f` moves bulk bytes or waits on the
    /// driver: a host with an interpreter lock releases it meanwhile. A host must never wait for
    /// the worker while holding a lock that the holder of the worker may need.
    fn with<R: Send>(&self, heavy: bool, f: impl FnOnce(&mut Worker) -> R + Send) -> R;
}

impl WorkerCell for Mutex<Worker> {
    fn with<R: Send>(&self, _heavy: bool, f: impl FnOnce(&mut Worker) -> R + Send) -> R {
        f(&mut self.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// What the embedding supplies to a run.
pub trait RunHost {
    /// The embedding's own failure (a Python exception, say), handed back unchanged.
    type Error;

    /// Lends the byte extents of the staged arguments (in argument order) for the duration of
    /// `f`, which binds them.
    fn lend_staged<R>(
        &mut self,
        f: impl FnOnce(&[&[u8]]) -> R,
    ) -> std::result::Result<R, Self::Error>;

    /// Lends the host byte extent of staged argument `staged` (its index among the staged
    /// arguments) for writing, for the duration of `f`, which copies the device bytes into it.
    fn lend_output<R>(
        &mut self,
        staged: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> std::result::Result<R, Self::Error>;

    /// Runs the orchestration function of `run`; it reaches the run through the worker cell.
    fn orchestrate(&mut self, run: RunId) -> std::result::Result<(), Self::Error>;

    /// Runs one task: kernel `call.kernel` over `call.buffers` and `call.scalars`.
    fn kernel(&mut self, call: &TaskCall) -> std::result::Result<(), Self::Error>;

    /// Called between phases: a host reports a pending interrupt here (Ctrl+C while the worker
    /// was busy in native code), which ends the run like any other failure.
    fn checkpoint(&mut self) -> std::result::Result<(), Self::Error> {
        Ok(())
    }
}

/// Why a run failed: the runtime's error, or the host's own.
#[derive(Debug)]
pub enum RunError<E> {
    Runtime(Error),
    Host(E),
}

impl<E> From<Error> for RunError<E> {
    fn from(e: Error) -> Self {
        RunError::Runtime(e)
    }
}

/// Finishes a run that its driver left by unwinding (a panic): nothing else is in flight then.
struct Guard<'c, C: WorkerCell> {
    cell: &'c C,
    run: RunId,
    armed: bool,
}

impl<C: WorkerCell> Drop for Guard<'_, C> {
    fn drop(&mut self) {
        if self.armed {
            let run = self.run;
            self.cell.with(true, |w| w.abandon_run(run));
        }
    }
}

/// How a run that may be left pending ended ([`run_with`]).
#[derive(Debug)]
pub enum Outcome {
    /// It waited for the device: its report.
    Done(Box<RunReport>),
    /// It was left pending (see `pending.rs`): `Worker::wait_run` waits for it.
    Pending(RunId),
}

/// Runs `call` once. `started` is when the host's call began: converting its arguments is
/// part of the timed bind phase. Returns the run's report.
pub fn run<C: WorkerCell, H: RunHost>(
    cell: &C,
    call: &RunCall<'_>,
    host: &mut H,
    started: Instant,
) -> std::result::Result<RunReport, RunError<H::Error>> {
    match run_with(cell, call, host, started, true)? {
        Outcome::Done(report) => Ok(*report),
        Outcome::Pending(run) => cell
            .with(true, |w| w.wait_run(run))
            .map_err(RunError::Runtime),
    }
}

/// [`run`], or, with `wait == false`, a run that returns once its device work is enqueued,
/// without waiting for the device, when the runtime allows it (see `pending.rs`): then the
/// worker is free for the next run at once. With `wait == false` the outcome is always
/// `Pending`: a run that could not be left pending completed, and `Worker::wait_run` returns
/// its report.
pub fn run_with<C: WorkerCell, H: RunHost>(
    cell: &C,
    call: &RunCall<'_>,
    host: &mut H,
    started: Instant,
    wait: bool,
) -> std::result::Result<Outcome, RunError<H::Error>> {
    // A bind that moves no bytes (no staged argument) runs at once; one that uploads is heavy.
    let run = host
        .lend_staged(|hosts| {
            let begin = |w: &mut Worker| w.begin_run(call, hosts, started);
            let quick = cell.with(false, |w| w.bind_is_light(hosts).then(|| begin(w)));
            quick.unwrap_or_else(|| cell.with(true, begin))
        })
        .map_err(RunError::Host)??;
    let mut guard = Guard {
        cell,
        run,
        armed: true,
    };
    let body = phases(cell, run, host, wait);
    if let Ok(true) = body {
        guard.armed = false;
        return Ok(Outcome::Pending(run));
    }
    if body.is_err() {
        cell.with(false, |w| {
            if let Ok((r, _)) = w.active_run(run, None) {
                r.failed = true;
            }
        });
    }
    // Likewise a cleanup that frees nothing that takes time.
    let finish = |w: &mut Worker| w.finish_run(run);
    let quick = cell.with(false, |w| w.cleanup_is_light(run).then(|| finish(w)));
    let cleanup = quick.unwrap_or_else(|| cell.with(true, finish));
    guard.armed = false;
    match (body, cleanup) {
        (Ok(_), Ok(report)) if !wait => {
            // Asked not to wait, but it could not be left pending: its handle finds the report.
            cell.with(false, |w| w.keep_report(run, report));
            Ok(Outcome::Pending(run))
        }
        (Ok(_), r) => r
            .map(|report| Outcome::Done(Box::new(report)))
            .map_err(RunError::Runtime),
        (Err(e), Ok(_)) => Err(e),
        // A close from another thread ended the run (and released what it held): the run's
        // own error says so, and there was nothing left to clean up.
        (Err(e), Err(_)) if cell.with(false, |w| w.is_closed()) => Err(e),
        (Err(e), Err(ce)) => {
            log::error!("cleanup after a failed run also failed: {ce}");
            Err(e)
        }
    }
}

/// Orchestrate, execute and copy back (bind is done; cleanup follows whatever this returns,
/// unless the run was left pending: `Ok(true)`, with `wait == false`).
fn phases<C: WorkerCell, H: RunHost>(
    cell: &C,
    run: RunId,
    host: &mut H,
    wait: bool,
) -> std::result::Result<bool, RunError<H::Error>> {
    host.checkpoint().map_err(RunError::Host)?;
    host.orchestrate(run).map_err(RunError::Host)?;
    // Waits for a run left pending first (heavy work then).
    let settle = cell.with(false, |w| w.has_pending());
    cell.with(settle, |w| w.begin_execute(run))?;
    let copies = cell.with(false, |w| !w.device().has_kernel_memory());
    let mut task = TaskCall::default();
    let executed = (|| -> std::result::Result<(), RunError<H::Error>> {
        let next = |w: &mut Worker, task: &mut TaskCall| {
            let (r, mem) = w.active_run(run, Some(Phase::Execute))?;
            r.next_task(mem, task)
        };
        while cell.with(copies, |w| next(w, &mut task))? {
            host.kernel(&task).map_err(RunError::Host)?;
            if task.needs_finish {
                cell.with(true, |w| {
                    let (r, mem) = w.active_run(run, Some(Phase::Execute))?;
                    r.finish_task(mem)
                })?;
            }
        }
        Ok(())
    })();
    drop(task);
    let ok = executed.is_ok();
    if ok && !wait && cell.with(false, |w| w.leave_pending(run))? {
        return Ok(true);
    }
    // Waits for the device when device code ran: heavy where kernels are not host memory.
    let ended = cell.with(copies, |w| {
        let (r, mem) = w.active_run(run, None)?;
        r.end_execute(mem, ok)
    });
    executed?;
    ended?;
    host.checkpoint().map_err(RunError::Host)?;
    let outputs = cell.with(false, |w| w.active_run(run, None)?.0.begin_copy_back())?;
    let copied = outputs.into_iter().try_for_each(|(staged, arg)| {
        host.lend_output(staged, |dst| {
            cell.with(true, |w| {
                let (r, mem) = w.active_run(run, Some(Phase::CopyBack))?;
                r.copy_back_one(mem, arg, dst)
            })
        })
        .map_err(RunError::Host)?
        .map_err(RunError::Runtime)
    });
    cell.with(false, |w| {
        w.active_run(run, None)?.0.end_copy_back();
        Ok::<_, Error>(())
    })?;
    copied.map(|()| false)
}

/// An orchestration's handle on its run, for embeddings: each method locks the cell for one
/// step (the bindings' orchestrator object is this, made reachable from Python).
#[derive(Debug)]
pub struct Orch<'c, C: WorkerCell> {
    pub cell: &'c C,
    pub run: RunId,
}

impl<C: WorkerCell> Orch<'_, C> {
    /// Refuses a handle made in run `run` unless it is this one (a handle outlives its run: the
    /// error names the run that is over, this orchestrator's or the handle's).
    #[inline]
    pub fn owns(&self, run: RunId) -> Result<()> {
        if run == self.run {
            return Ok(());
        }
        // Name the run that is over: this handle's own, or the other handle's.
        let current = self.cell.with(false, |w| w.current_run());
        let stale = if current == Some(self.run) {
            run
        } else {
            self.run
        };
        Err(crate::worker::not_in_progress(stale))
    }

    /// Name, geometry and direction of the run's first `n` arguments (its tensors).
    #[inline]
    pub fn tensors(&self, n: usize) -> Result<Vec<TensorInfo>> {
        let run = self.run;
        self.cell.with(false, |w| {
            let (r, _) = w.active_run(run, None)?;
            (0..n as u32).map(|i| r.tensor_info(i)).collect()
        })
    }

    /// [`Orch::tensors`], except the arguments `held` says the host already holds a
    /// description of (`held(arg, name, geometry, direction)`, asked with the worker locked: it
    /// must not call into the host's interpreter): `None` for those, so nothing is copied for
    /// them (a warm run handing its orchestration the objects of the last run).
    pub fn tensors_except(
        &self,
        n: usize,
        held: &(dyn Fn(u32, &str, &Geometry, Direction) -> bool + Sync),
    ) -> Result<Vec<Option<TensorInfo>>> {
        let run = self.run;
        self.cell
            .with(false, |w| w.active_run(run, None)?.0.tensor_infos(n, held))
    }

    /// Name, geometry and direction of argument `arg` (a scratch tensor is an argument too).
    #[inline]
    pub fn tensor(&self, arg: u32) -> Result<TensorInfo> {
        let run = self.run;
        self.cell
            .with(false, |w| w.active_run(run, None)?.0.tensor_info(arg))
    }

    /// Whether staged argument `arg` wants the bytes the run uploaded from the host before its
    /// first access: a staged tensor is read from them (never mapped, never read back); the
    /// host supplies them with [`Orch::supply_staged`].
    #[inline]
    pub fn wants_staged(&self, arg: u32) -> bool {
        let run = self.run;
        self.cell.with(false, |w| w.orch_wants_staged(run, arg))
    }

    /// Gives staged argument `arg` the bytes of its extent that the run uploaded (what the host
    /// lent at bind): its orchestrator reads are served from a copy of them.
    pub fn supply_staged(&self, arg: u32, host: &[u8]) -> Result<()> {
        let run = self.run;
        self.cell.with(host.len() > (1 << 20), |w| {
            let (r, _) = w.active_run(run, Some(Phase::Orchestrate))?;
            r.supply_staged(arg, host)
        })
    }

    /// Runs an access to argument `arg`: at once while its view is resolved (the hot path, one
    /// lock), else as heavy work (establishing a view or refreshing a mirror or cache moves
    /// bulk bytes, which a host runs without its interpreter lock).
    #[inline]
    fn access<R: Send>(
        &self,
        arg: u32,
        f: impl Fn(&mut Worker) -> Result<R> + Send + Sync,
    ) -> Result<R> {
        let run = self.run;
        let quick = self
            .cell
            .with(false, |w| w.orch_is_resolved(run, arg).then(|| f(w)));
        match quick {
            Some(r) => r,
            None => self.cell.with(true, f),
        }
    }

    /// `get_tensor_data`: at once when nothing stands in the way (one lock, no step that can
    /// fail), else through [`Orch::access`], which reports what failed or establishes the view.
    #[inline]
    pub fn read(&self, arg: u32, view: &Geometry, index: &[i64]) -> Result<Value> {
        let run = self.run;
        let quick = self
            .cell
            .with(false, |w| w.orch_read_quick(run, arg, view, index));
        match quick {
            Some(r) => r,
            None => self.access(arg, |w| w.orch_read(run, arg, view, index)),
        }
    }

    /// `set_tensor_data`.
    #[inline]
    pub fn write(&self, arg: u32, view: &Geometry, index: &[i64], value: Value) -> Result<()> {
        let run = self.run;
        self.access(arg, |w| w.orch_write(run, arg, view, index, value))
    }

    /// `read_tensor`.
    #[inline]
    pub fn read_tensor(&self, arg: u32, view: &Geometry) -> Result<HostWindow> {
        let run = self.run;
        self.access(arg, |w| w.orch_read_tensor(run, arg, view))
    }

    /// `orch.scratch`; returns the new argument's index.
    #[inline]
    pub fn scratch(&self, name: Option<&str>, dtype: DType, shape: &[u64]) -> Result<u32> {
        let run = self.run;
        self.cell
            .with(false, |w| w.scratch(run, name, dtype, shape))
    }

    /// Whether `code` is ready for this run's device: loaded, or the device runs no device code
    /// (then the kernel's host function runs). A host calls [`Orch::prepare_device`] otherwise.
    #[inline]
    pub fn device_ready(&self, code: &DeviceCode) -> bool {
        self.cell.with(false, |w| w.device_ready(code))
    }

    /// Loads `code` into the device (compiling source with NVRTC, found through
    /// `nvrtc_dirs` among other places), once per worker; heavy work.
    pub fn prepare_device(&self, code: &Arc<DeviceCode>, nvrtc_dirs: &[PathBuf]) -> Result<()> {
        self.cell.with(true, |w| w.prepare_device(code, nvrtc_dirs))
    }

    /// `submit`; returns the task's index. Each tensor is `(argument, view)`, the view owned or
    /// borrowed.
    #[inline]
    pub fn submit<G: std::borrow::Borrow<Geometry> + Sync>(
        &self,
        kernel: KernelRef<'_>,
        tensors: &[(u32, G)],
        scalars: &[Value],
    ) -> Result<u64> {
        let run = self.run;
        self.cell
            .with(false, |w| w.submit(run, &kernel, tensors, scalars))
    }

    /// `submit_many`; returns the first task's index.
    #[inline]
    pub fn submit_many(
        &self,
        kernel: KernelRef<'_>,
        slots: &[BatchSlot<'_>],
        scalars: &[BatchScalar<'_>],
        count: Option<u64>,
    ) -> Result<u64> {
        let run = self.run;
        self.cell.with(false, |w| {
            w.submit_batch(run, kernel, slots, scalars, count, true)
        })
    }

    /// `submit_many`, with `checkpoint` called between the parts of a batch of more than
    /// [`BATCH_PART`] tasks (a host answers an interrupt there; the worker is not locked
    /// meanwhile). The call records all of its tasks or none: a refused part, or a checkpoint's
    /// error, takes the parts before it back. Returns the first task's index.
    pub fn submit_many_checked<E>(
        &self,
        kernel: KernelRef<'_>,
        slots: &[BatchSlot<'_>],
        scalars: &[BatchScalar<'_>],
        count: Option<u64>,
        mut checkpoint: impl FnMut() -> std::result::Result<(), E>,
    ) -> std::result::Result<u64, RunError<E>> {
        let run = self.run;
        let who = format_args!("submit_many {}", kernel.name);
        let n = match batch_count(&who, slots, scalars, count) {
            Ok(n) if n as usize > BATCH_PART => n as usize,
            // One part (or a count the runtime refuses, with its own message).
            _ => return Ok(self.submit_many(kernel, slots, scalars, count)?),
        };
        let mut first = None;
        for lo in (0..n).step_by(BATCH_PART) {
            let hi = (lo + BATCH_PART).min(n);
            let part: Vec<BatchSlot<'_>> = slots.iter().map(|s| s.part(lo, hi)).collect();
            let cols: Vec<BatchScalar<'_>> = scalars.iter().map(|s| s.part(lo, hi)).collect();
            let new_call = first.is_none();
            let recorded = self
                .cell
                .with(false, |w| {
                    w.submit_batch(run, kernel, &part, &cols, Some((hi - lo) as u64), new_call)
                })
                .map_err(RunError::Runtime)
                .and_then(|f| {
                    first.get_or_insert(f);
                    checkpoint().map_err(RunError::Host)
                });
            if let Err(e) = recorded {
                if let Some(f) = first {
                    self.cell
                        .with(false, |w| w.active_run(run, None)?.0.discard_tasks(f))?;
                }
                return Err(e);
            }
        }
        Ok(first.unwrap_or_default())
    }
}
