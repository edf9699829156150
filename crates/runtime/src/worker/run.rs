//! The worker's side of one run: its steps, in the order `cycle.rs` takes them, and a run left
//! pending.

use std::sync::Arc;
use std::time::Instant;

use simpler_driver::POISON;

use super::{not_in_progress, Worker};
use crate::device_code::DeviceCode;
use crate::dtype::{DType, Value};
use crate::error::{Error, Phase, Result};
use crate::geometry::Geometry;
use crate::memory::Memory;
use crate::run::{BatchScalar, BatchSlot, HostWindow, RunId, RunReport, RunState};
use crate::spec::{KernelRef, RunCall};

impl Worker {
    // ---- the run -------------------------------------------------------------------------

    pub(super) fn active(&mut self, run: RunId) -> Result<(&mut RunState, &mut Memory)> {
        match &mut self.run {
            Some(r) if r.id == run => Ok((r, &mut self.mem)),
            _ => Err(not_in_progress(run)),
        }
    }

    /// The run in progress `run` and the memory it works in: the one handle through which the
    /// run cycle (`cycle.rs`) reaches the run's own steps (`RunState`'s methods), after entering
    /// `phase` where one is given (a driver error is then filed under it). A run not in
    /// progress is a `StateError` naming it.
    pub(crate) fn active_run(
        &mut self,
        run: RunId,
        phase: Option<Phase>,
    ) -> Result<(&mut RunState, &mut Memory)> {
        if let Some(p) = phase {
            self.enter(p);
        }
        self.active(run)
    }

    /// Binds a new run (validated first): stages host arrays (`hosts` lends their byte extents,
    /// in order) and records device tensors as lazy view entries. `started` is when the run's
    /// call began (bind is timed from there). On failure everything this call took is released
    /// and no run is in progress.
    pub(crate) fn begin_run(
        &mut self,
        call: &RunCall<'_>,
        hosts: &[&[u8]],
        started: Instant,
    ) -> Result<RunId> {
        self.enter(Phase::Bind);
        self.check_open()?;
        if self.run.is_some() {
            return Err(Error::State(
                "worker busy: a run is in progress (one worker runs one call at a time)".into(),
            ));
        }
        call.validate()?;
        // Another library may have written exported memory since the last run: its host views
        // are stale, and the run's stream waits for those writes.
        if !self.mem.exports.is_empty() {
            for (p, _) in self.mem.exports.all() {
                self.mem.views.mark_stale(p);
            }
        }
        self.mem
            .order_after_consumers()
            .map_err(|e| Error::device(Phase::Bind, None, e))?;
        let id = RunId(self.next_run);
        self.next_run += 1;
        let records = std::mem::take(&mut self.spare);
        let mut run = RunState::new(id, started, self.mem.dev.stats(), records);
        run.tasks.follow(self.mem.plans.latest());
        if self.mem.dev.cost_model().is_some() {
            run.modeled_before = self.mem.dev.modeled();
        }
        run.poison = self.poison.then_some(POISON);
        run.time_device = self.time_device;
        match run.bind(&mut self.mem, &mut self.arena, self.staging, call, hosts) {
            Ok(()) => {
                run.report.phases.bind = run.lap();
                self.run = Some(run);
                Ok(id)
            }
            Err(e) => {
                // Fresh staging allocations of this bind are released; the arena is retained.
                for (name, p) in run.fresh.drain(..).rev() {
                    let _ = self.mem.release_or_orphan(
                        p,
                        &format_args!("bind rollback of the staging buffer of tensor {name}"),
                    );
                }
                Err(e)
            }
        }
    }

    /// Whether binding a run over `hosts` (the staged arguments' bytes) moves no bytes and waits
    /// for nothing: no staged argument (so no upload, no poison fill, no arena to grow) and no
    /// other library's work to order after. Such a bind is a few vector pushes; a host need not
    /// release its interpreter lock for it.
    pub(crate) fn bind_is_light(&self, hosts: &[&[u8]]) -> bool {
        hosts.is_empty() && !self.mem.exports.order_pending()
    }

    /// Whether cleaning up `run` frees nothing that takes time: no fresh staging buffer to give
    /// back and no per-run host copy to drop (see `RunState::cleanup_is_light`).
    pub(crate) fn cleanup_is_light(&self, run: RunId) -> bool {
        matches!(&self.run, Some(r) if r.id == run && r.cleanup_is_light())
    }

    /// Whether an orchestrator access to argument `arg` of `run` needs no bulk work (see
    /// `RunState::is_resolved`); `false` for a run not in progress (the access reports that).
    pub(crate) fn orch_is_resolved(&self, run: RunId, arg: u32) -> bool {
        matches!(&self.run, Some(r) if r.id == run
            && r.is_resolved(&self.mem, arg)
            && !r.waits_for(&self.pending, arg, true))
    }

    /// Whether staged argument `arg` of `run` wants the bytes the run uploaded for its reads
    /// (see `RunState::wants_staged_bytes`).
    pub(crate) fn orch_wants_staged(&self, run: RunId, arg: u32) -> bool {
        matches!(&self.run, Some(r) if r.id == run && r.wants_staged_bytes(arg))
    }

    /// `get_tensor_data` on the hot path (see `RunState::read_quick`); `None` when the run is
    /// not in progress or the read needs [`Worker::orch_read`].
    #[inline]
    pub(crate) fn orch_read_quick(
        &mut self,
        run: RunId,
        arg: u32,
        view: &Geometry,
        index: &[i64],
    ) -> Option<Result<Value>> {
        self.enter(Phase::Orchestrate);
        match &mut self.run {
            Some(r) if r.id == run && !r.waits_for(&self.pending, arg, false) => {
                r.read_quick(&mut self.mem, arg, view, index)
            }
            _ => None,
        }
    }

    /// `get_tensor_data`: the element at `index` of `view` (a view of argument `arg`).
    pub(crate) fn orch_read(
        &mut self,
        run: RunId,
        arg: u32,
        view: &Geometry,
        index: &[i64],
    ) -> Result<Value> {
        self.enter(Phase::Orchestrate);
        self.settle_for(run, arg, false);
        let (r, mem) = self.active(run)?;
        r.read(mem, arg, view, index)
    }

    /// `set_tensor_data`: writes `value` at `index` of `view`.
    pub(crate) fn orch_write(
        &mut self,
        run: RunId,
        arg: u32,
        view: &Geometry,
        index: &[i64],
        value: Value,
    ) -> Result<()> {
        self.enter(Phase::Orchestrate);
        self.settle_for(run, arg, true);
        let (r, mem) = self.active(run)?;
        r.write(mem, arg, view, index, value)
    }

    /// `read_tensor`: a host window over `view`'s bytes.
    pub(crate) fn orch_read_tensor(
        &mut self,
        run: RunId,
        arg: u32,
        view: &Geometry,
    ) -> Result<HostWindow> {
        self.enter(Phase::Orchestrate);
        self.settle_for(run, arg, false);
        let (r, mem) = self.active(run)?;
        r.read_window(mem, arg, view)
    }

    /// `orch.scratch`: a run-scoped tensor; returns its argument index.
    pub(crate) fn scratch(
        &mut self,
        run: RunId,
        name: Option<&str>,
        dtype: DType,
        shape: &[u64],
    ) -> Result<u32> {
        self.enter(Phase::Orchestrate);
        match &mut self.run {
            Some(r) if r.id == run => {
                r.scratch(&mut self.mem, &mut self.scratch, name, dtype, shape)
            }
            _ => Err(not_in_progress(run)),
        }
    }

    /// `submit`: one task; returns its index.
    pub(crate) fn submit<G: std::borrow::Borrow<Geometry>>(
        &mut self,
        run: RunId,
        kernel: &KernelRef<'_>,
        tensors: &[(u32, G)],
        scalars: &[Value],
    ) -> Result<u64> {
        // A kernel without device code (the common case) is taken as it is, not copied.
        let on_device;
        let kernel = if kernel.device.is_some() {
            on_device = self.on_device(*kernel);
            &on_device
        } else {
            kernel
        };
        self.check_priceable(kernel, "submit")?;
        self.fit_launch(kernel, "submit")?;
        let (r, _) = self.active(run)?;
        r.submit(kernel, tensors, scalars)
    }

    /// Refuses a kernel whose declared work has operations at a precision one of the worker's
    /// cost models has no units for (fp8 on `ascend-a3`): its price there would mean nothing.
    pub(super) fn check_priceable(&self, kernel: &KernelRef<'_>, who: &str) -> Result<()> {
        let Some(work) = &kernel.work else {
            return Ok(());
        };
        for m in self.mem.dev.cost_models() {
            if let Some(p) = m.lacks(&work.flops) {
                return Err(Error::Value(format!(
                    "{who} {name}: kernel {name} declares {p} operations, which model {model} \
                     cannot price: its device has no {p} units (declare them at a precision it \
                     runs, or leave {model} out of the worker's models)",
                    name = kernel.name,
                    p = p.name(),
                    model = m.name,
                )));
            }
        }
        Ok(())
    }

    /// Checks a device launch against the device's limits for its function, opting it in to
    /// more dynamic shared memory where the launch asks for it (see `Launcher::fit`).
    pub(super) fn fit_launch(&mut self, kernel: &KernelRef<'_>, what: &str) -> Result<()> {
        let Some(d) = &kernel.device else {
            return Ok(());
        };
        let dev = self.mem.dev.clone();
        self.mem.launcher.fit(
            &*dev,
            d.code,
            d.dims,
            &format_args!("{what} {}", kernel.name),
        )
    }

    /// `kernel` as this worker runs it: its device launch dropped unless its code is loaded
    /// (a device that runs no device code runs the host function).
    pub(super) fn on_device<'k>(&self, mut kernel: KernelRef<'k>) -> KernelRef<'k> {
        kernel.device = kernel
            .device
            .filter(|d| self.mem.launcher.get(d.code.key).is_some());
        kernel
    }

    /// Whether `code` needs no preparation here (see `Orch::device_ready`).
    pub(crate) fn device_ready(&self, code: &DeviceCode) -> bool {
        !self.mem.dev.runs_device_code() || self.mem.launcher.get(code.key).is_some()
    }

    /// Loads `code` into the device once (see `Orch::prepare_device`).
    pub(crate) fn prepare_device(
        &mut self,
        code: &Arc<DeviceCode>,
        nvrtc_dirs: &[std::path::PathBuf],
    ) -> Result<()> {
        self.check_open()?;
        let dev = self.mem.dev.clone();
        self.mem.launcher.prepare(&*dev, code, nvrtc_dirs)
    }

    /// `submit_many`, or a further part of one call (see `RunState::submit_batch`).
    pub(crate) fn submit_batch(
        &mut self,
        run: RunId,
        kernel: KernelRef<'_>,
        slots: &[BatchSlot<'_>],
        scalars: &[BatchScalar<'_>],
        count: Option<u64>,
        new_call: bool,
    ) -> Result<u64> {
        let kernel = self.on_device(kernel);
        self.check_priceable(&kernel, "submit_many")?;
        self.fit_launch(&kernel, "submit_many")?;
        let (r, _) = self.active(run)?;
        r.submit_batch(&kernel, slots, scalars, count, new_call)
    }

    /// Ends orchestration; returns the number of tasks to run.
    pub(crate) fn begin_execute(&mut self, run: RunId) -> Result<u64> {
        self.active(run)?;
        self.settle();
        let (r, _) = self.active(run)?;
        r.begin_execute()
    }

    /// Leaves run `run` pending instead of waiting for the device, when it may be (see
    /// `pending.rs`); false when it waits as usual. The worker is free for the next run.
    pub(crate) fn leave_pending(&mut self, run: RunId) -> Result<bool> {
        let (r, _) = self.active(run)?;
        if !r.can_leave_pending() {
            return Ok(false);
        }
        let Some(state) = self.run.take() else {
            unreachable!("checked by active()")
        };
        self.pending.leave(state);
        Ok(true)
    }

    /// Completes the pending run, if any (see `pending.rs`); its report is kept for its handle.
    pub(super) fn settle(&mut self) {
        if let Some(records) = self.pending.complete(&mut self.mem) {
            if self.run.is_none() {
                self.spare = records;
            }
        }
    }

    /// Completes the pending run first when run `run`'s access to argument `arg` (a write, or
    /// a read) must wait for it.
    pub(super) fn settle_for(&mut self, run: RunId, arg: u32, write: bool) {
        if self
            .run
            .as_ref()
            .is_some_and(|r| r.id == run && r.waits_for(&self.pending, arg, write))
        {
            self.settle();
        }
    }

    /// Keeps the report of run `run`, which was asked not to wait but could not be left pending
    /// (it completed at once), for its handle ([`Worker::wait_run`]).
    pub(crate) fn keep_report(&mut self, run: RunId, report: RunReport) {
        self.pending.keep(run, Ok(report));
    }

    /// Waits for pending run `run` (completing it, if no other call did) and returns its report.
    pub fn wait_run(&mut self, run: RunId) -> Result<RunReport> {
        if self.pending.is_pending(run) {
            self.settle();
        }
        self.pending.take(run)
    }

    /// Whether a run is pending: a call that may complete it (see `pending.rs`) waits for the
    /// device, which a host runs as heavy work.
    pub fn has_pending(&self) -> bool {
        self.pending.id().is_some()
    }

    /// Whether run `run` is still pending: its device work may not have run yet.
    pub fn run_is_pending(&self, run: RunId) -> bool {
        self.pending.is_pending(run)
    }

    /// Cleans up the run (always) and returns its report; a cleanup failure is returned after
    /// everything was attempted. The worker is free for the next run either way.
    pub(crate) fn finish_run(&mut self, run: RunId) -> Result<RunReport> {
        self.enter(Phase::Cleanup);
        self.active(run)?;
        let Some(state) = self.run.take() else {
            unreachable!("checked by active()")
        };
        let (report, err, records) = state.finish(&mut self.mem);
        self.spare = records;
        match err {
            None => Ok(report),
            Some(e) => Err(e),
        }
    }

    /// Abandons `run` if it is still in progress: marks it failed and cleans it up (used by the
    /// cycle's guard when a run is left by a panic).
    pub(crate) fn abandon_run(&mut self, run: RunId) {
        if let Some(r) = self.run.as_mut().filter(|r| r.id == run) {
            r.failed = true;
            if let Err(e) = self.finish_run(run) {
                log::error!("abandoning run {}: {e}", run.0);
            }
        }
    }

    /// Abandons the run in progress, if any (`close` from another thread ends a run this way;
    /// that run's next step finds it gone).
    pub(super) fn abort_run(&mut self) {
        if let Some(id) = self.run.as_ref().map(|r| r.id) {
            self.abandon_run(id);
        }
    }
}
