//! The worker: owner of every device allocation it makes (user buffers, resident sets, the
//! staging arena, the scratch pool), of the allocation-scoped host-view cache, and of the run in
//! progress.
//!
//! Its run methods are the steps of one run; `cycle.rs` calls them in order. Each takes the run's
//! [`RunId`], so a handle from a finished run is refused rather than misused. A buffer bound to
//! the run in progress cannot be freed or released.

use std::sync::Arc;
use std::time::Instant;

use simpler_driver::{CloseReport, DevPtr, Device, Stats};

use crate::device_code::DeviceCode;
use crate::dtype::{DType, Value};
use crate::error::{Error, Phase, Result};
use crate::exports::ExportGuard;
use crate::geometry::Geometry;
use crate::memory::{Memory, Owner};
use crate::pending::PendingRuns;
use crate::resident::ResidentSets;
use crate::run::{
    BatchScalar, BatchSlot, HostWindow, Records, Replay, RunId, RunReport, RunState, TaskCall,
    TensorInfo,
};
use crate::scratch::ScratchPool;
use crate::spec::{BufferRef, Direction, KernelRef, RunCall};
use crate::staging::{Arena, Staging};

use simpler_driver::POISON;

/// What `close` found.
#[derive(Debug, Default, Clone)]
pub struct CloseSummary {
    /// User buffers still live at close (freed by close).
    pub user_buffers: u64,
    /// Resident sets still live at close (released by close).
    pub resident_sets: u64,
    /// What the driver's own close found after that (should be nothing).
    pub device: CloseReport,
    /// Failures while releasing.
    pub errors: Vec<Error>,
}

/// The worker. Not `Sync`: hosts share it behind a lock (see `cycle.rs`).
#[derive(Debug)]
pub struct Worker {
    mem: Memory,
    staging: Staging,
    /// Fill staged outputs and scratch tensors with [`POISON`] at the start of every run.
    poison: bool,
    arena: Arena,
    scratch: ScratchPool,
    resident: ResidentSets,
    run: Option<RunState>,
    /// A run left pending (`run(..., wait=False)`), and the reports of those completed.
    pending: PendingRuns,
    /// The cleared records of the last run, reused by the next.
    spare: Records,
    next_run: u64,
    closed: bool,
    /// The phase the driver's call log labels calls with (set on change only).
    phase: Option<Phase>,
    /// Time the device's part of execute with events (`SIMPLER_DEVICE_TIMING`, or
    /// [`Worker::set_device_timing`]).
    time_device: bool,
}

/// The error for a step of a run that is not in progress (a handle kept past its run).
pub(crate) fn not_in_progress(run: RunId) -> Error {
    Error::State(format!(
        "run {} is not in progress (this handle belongs to a finished run, or the worker was closed)",
        run.0
    ))
}

/// Environment switch: time the device's part of execute with events (see
/// [`Worker::device_timing`]); `1`, `true`, `yes` or `on` turn it on.
pub const ENV_DEVICE_TIMING: &str = "SIMPLER_DEVICE_TIMING";

/// Environment switch: the replay mode new workers start with (see [`Worker::replay`]):
/// `off`, `plans` or `graphs`.
pub const ENV_REPLAY: &str = "SIMPLER_REPLAY";

fn buffer_err(e: simpler_driver::DeviceError) -> Error {
    Error::device(Phase::Buffer, None, e)
}

impl Worker {
    /// A worker over `dev`. With `poison`, never-written memory shows: a staged OUT tensor and a
    /// scratch tensor hold [`POISON`] bytes at the start of every run, warm runs included.
    pub fn new(dev: Arc<dyn Device>, staging: Staging, poison: bool) -> Worker {
        let mut mem = Memory::new(dev);
        if let Ok(v) = std::env::var(ENV_REPLAY) {
            match Replay::parse(v.trim()) {
                Some(m) => mem.plans.replay = m,
                None => log::warn!("ignoring {ENV_REPLAY}={v:?} (not one of off, plans, graphs)"),
            }
        }
        // The process's session release closes this device only through the export table, which
        // refuses while another library may use its memory (see `exports.rs`).
        let hold: Arc<dyn simpler_driver::CloseHold> = mem.exports.clone();
        simpler_driver::hold_close(&mem.dev, Arc::downgrade(&hold));
        Worker {
            mem,
            staging,
            poison,
            arena: Arena::default(),
            scratch: ScratchPool::default(),
            resident: ResidentSets::default(),
            run: None,
            pending: PendingRuns::default(),
            spare: Records::default(),
            next_run: 1,
            closed: false,
            phase: None,
            time_device: std::env::var(ENV_DEVICE_TIMING).is_ok_and(|v| {
                !["", "0", "false", "no", "off"].contains(&v.trim().to_ascii_lowercase().as_str())
            }),
        }
    }

    /// Whether runs time the device's part of execute with events around each batch of
    /// launches (`RunReport` counter `device_ns`); on devices that cannot time (sim, ascend)
    /// the counter stays 0.
    pub fn device_timing(&self) -> bool {
        self.time_device
    }

    /// Turns the device timing of [`Worker::device_timing`] on or off.
    pub fn set_device_timing(&mut self, on: bool) {
        self.time_device = on;
    }

    /// Whether runs reuse the kept launch plan of an earlier round that recorded exactly the
    /// same tasks over the same allocations (see `run/plan_cache.rs`).
    pub fn replay(&self) -> Replay {
        self.mem.plans.replay
    }

    /// Sets [`Worker::replay`]; takes effect at the next run. The kept plans stay.
    pub fn set_replay(&mut self, mode: Replay) {
        self.mem.plans.replay = mode;
    }

    /// Launch plans the worker keeps for warm rounds (at most [`crate::PLANS_KEPT`]).
    pub fn plans_kept(&self) -> usize {
        self.mem.plans.len()
    }

    /// Labels the driver calls that follow with `p` (see `Device::set_phase`).
    fn enter(&mut self, p: Phase) {
        if self.phase != Some(p) {
            self.phase = Some(p);
            self.mem.dev.set_phase(p.name());
        }
    }

    /// This worker's id (handles carry it).
    pub fn id(&self) -> u64 {
        self.mem.id
    }

    /// The driver.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.mem.dev
    }

    /// The staging mode.
    pub fn staging(&self) -> Staging {
        self.staging
    }

    /// Cumulative driver counters.
    pub fn stats(&self) -> Stats {
        self.mem.dev.stats()
    }

    /// The current staging arena allocation, if any.
    pub fn arena(&self) -> Option<(DevPtr, u64)> {
        self.arena.current()
    }

    /// The scratch pool's chunks (base, size).
    pub fn scratch_chunks(&self) -> &[(DevPtr, u64)] {
        self.scratch.chunks()
    }

    /// Live host views: (mapped, mirrored, refused staging allocations).
    pub fn view_counts(&self) -> (u64, u64, u64) {
        self.mem.views.counts()
    }

    /// Whether `close` has run.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The run in progress, if any.
    pub fn current_run(&self) -> Option<RunId> {
        self.run.as_ref().map(|r| r.id)
    }

    /// Whether a run is in progress.
    pub fn is_busy(&self) -> bool {
        self.run.is_some()
    }

    fn check_open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::State("worker is closed".into()));
        }
        Ok(())
    }

    fn bound_to_run(&self, ptr: DevPtr) -> bool {
        self.run.as_ref().is_some_and(|r| r.binds(ptr))
    }

    // ---- buffers -------------------------------------------------------------------------

    /// Allocates a user buffer of `bytes` (> 0).
    pub fn malloc(&mut self, bytes: u64) -> Result<BufferRef> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        if bytes == 0 {
            return Err(Error::Value(
                "malloc of 0 bytes: a device buffer needs at least 1 byte".into(),
            ));
        }
        self.mem.alloc(bytes, Owner::User, Phase::Buffer, None)
    }

    /// Frees a user buffer: its host view first, then the allocation.
    pub fn free(&mut self, buf: BufferRef) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        let info = self.mem.lookup(buf, &"free")?;
        match info.owner {
            Owner::User => {}
            Owner::Resident(_) => {
                return Err(Error::State(format!(
                    "free: buffer {} is owned by a ResidentTaskArgs; release that instead",
                    buf.ptr
                )))
            }
            _ => {
                return Err(Error::State(format!(
                    "free: buffer {} is owned by the worker",
                    buf.ptr
                )))
            }
        }
        self.mem.exports.refuse(buf.ptr, "free")?;
        if self.bound_to_run(buf.ptr) {
            return Err(Error::State(format!(
                "free: buffer {} is bound as an argument of the run in progress",
                buf.ptr
            )));
        }
        self.mem.settle_before_free().map_err(buffer_err)?;
        self.mem.release(buf.ptr).map_err(buffer_err)
    }

    /// [`Worker::free`] for the end of a buffer's scope (a context manager's exit): a buffer
    /// freed already, or one of a closed worker, is nothing to do (`Ok(false)`); every other
    /// refusal (owned by a resident set, bound to the run in progress) is an error as for
    /// `free`.
    pub fn free_if_live(&mut self, buf: BufferRef) -> Result<bool> {
        if self.closed || !self.mem.names_live(buf) {
            return Ok(false);
        }
        self.free(buf).map(|()| true)
    }

    /// Copies host bytes into a buffer at `offset`. A mirror of the buffer goes stale.
    pub fn copy_to(&mut self, buf: BufferRef, offset: u64, src: &[u8]) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        self.mem
            .check_span(buf, offset, src.len() as u64, "copy_to")?;
        if src.is_empty() {
            return Ok(());
        }
        if let Some(r) = self.run.as_mut() {
            r.check_host_copy(buf.ptr, offset, src.len() as u64, true, "copy_to")?;
        }
        self.mem.order_after_consumers().map_err(buffer_err)?;
        let r = self.mem.dev.copy_h2d(DevPtr(buf.ptr.0 + offset), src);
        // Even a failed copy may have moved some bytes.
        self.mem.views.mark_stale(buf.ptr);
        r.map_err(buffer_err)
    }

    /// Copies `dst.len()` bytes at `offset` of a buffer to the host.
    pub fn copy_from(&mut self, buf: BufferRef, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        self.mem
            .check_span(buf, offset, dst.len() as u64, "copy_from")?;
        if dst.is_empty() {
            return Ok(());
        }
        if let Some(r) = self.run.as_mut() {
            r.check_host_copy(buf.ptr, offset, dst.len() as u64, false, "copy_from")?;
        }
        self.mem.order_after_consumers().map_err(buffer_err)?;
        self.mem
            .dev
            .copy_d2h(dst, DevPtr(buf.ptr.0 + offset))
            .map_err(buffer_err)
    }

    /// Checks that `geometry` fits the live buffer (a device tensor over it).
    pub fn check_tensor(
        &self,
        buf: BufferRef,
        geometry: &Geometry,
        what: &dyn std::fmt::Display,
    ) -> Result<()> {
        self.check_open()?;
        self.mem.check_tensor(buf, geometry, what).map(|_| ())
    }

    /// The host-view mechanism of the buffer's allocation: `"mapping"`, `"mirror"`, or `None`.
    pub fn host_view_info(&self, buf: BufferRef) -> Result<Option<&'static str>> {
        self.mem.lookup(buf, &"host_view_info")?;
        Ok(self.mem.views.kind(buf.ptr))
    }

    /// Releases the staging arena and the scratch pool (e.g. after a one-off large run). Not
    /// during a run.
    pub fn trim_staging(&mut self) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        if self.run.is_some() {
            return Err(Error::State("trim_staging: a run is in progress".into()));
        }
        self.spare = Records::default();
        self.arena.trim(&mut self.mem)?;
        let regions = self.mem.plans.drain();
        self.mem.bury_graphs();
        self.mem.launcher.release_row_buffers(&*self.mem.dev);
        for (p, _) in regions {
            self.mem
                .release_or_orphan(p, &"a task-row region")
                .map_err(buffer_err)?;
        }
        self.scratch.trim(&mut self.mem)
    }

    // ---- resident sets -------------------------------------------------------------------

    /// Opens an empty resident set; returns its id.
    pub fn resident_open(&mut self) -> Result<u64> {
        self.check_open()?;
        Ok(self.resident.open())
    }

    /// Makes a host fixture resident in `set` (see `resident.rs`); `Ok(None)` when it has no
    /// bytes and stays host-staged.
    pub fn resident_add(
        &mut self,
        set: u64,
        name: &str,
        geometry: &Geometry,
        dir: Direction,
        host: &[u8],
    ) -> Result<Option<BufferRef>> {
        self.enter(Phase::ResidentAdd);
        self.check_open()?;
        self.resident
            .add(&mut self.mem, set, name, geometry, dir, host)
    }

    /// Undoes the newest add of `set` (named `name`) after a later step of it failed (a view
    /// that could not be established, say): frees its allocation and forgets the name.
    pub fn resident_roll_back(&mut self, set: u64, name: &str) -> Result<()> {
        self.enter(Phase::ResidentAdd);
        self.resident.roll_back(&mut self.mem, set, name)
    }

    /// Sets the host-view policy of allocations without a hint of their own.
    pub fn set_view_policy(&mut self, policy: crate::views::ViewPolicy) {
        self.mem.views.policy = policy;
    }

    /// The host-view policy of allocations without a hint.
    pub fn view_policy(&self) -> crate::views::ViewPolicy {
        self.mem.views.policy
    }

    /// Sets the host-view policy of `buf`'s allocation (before its view is established).
    pub fn hint_view(&mut self, buf: BufferRef, policy: crate::views::ViewPolicy) -> Result<()> {
        self.check_open()?;
        self.mem.lookup(buf, &"view hint")?;
        self.mem.views.hint(buf.ptr, policy);
        Ok(())
    }

    /// Establishes the host view of a buffer now instead of at its first orchestrator access
    /// (`ResidentTaskArgs.add(..., eager=True)`), so the first run pays nothing for it.
    /// Returns the means: `"mapping"`, `"cached"` or `"mirror"`.
    pub fn establish_view(&mut self, buf: BufferRef, tensor: &str) -> Result<&'static str> {
        self.check_open()?;
        self.settle();
        self.enter(Phase::ResidentAdd);
        let info = self.mem.lookup(buf, &format_args!("tensor {tensor}"))?;
        let mut ev = crate::views::ViewEvents::default();
        let means = self.mem.views.ensure(
            &*self.mem.dev,
            buf.ptr,
            info.bytes,
            true,
            crate::views::Who {
                tensor,
                phase: Phase::ResidentAdd,
            },
            &mut ev,
        )?;
        Ok(means.kind())
    }

    /// Releases a resident set in LIFO order (see `resident.rs`): every free is attempted, and
    /// the failures come back (each also logged). `Err` when the release is refused, with nothing
    /// freed and the set still open: one of its tensors is bound to the run in progress.
    /// Releasing a released set does nothing.
    pub fn resident_release(&mut self, set: u64) -> Result<Vec<Error>> {
        self.enter(Phase::Release);
        self.settle();
        if let Some((name, _)) = self
            .resident
            .buffers(set)
            .find(|(_, b)| self.bound_to_run(b.ptr))
        {
            return Err(Error::State(format!(
                "release: resident tensor '{name}' is bound to the run in progress"
            )));
        }
        for (name, b) in self.resident.buffers(set) {
            self.mem
                .exports
                .refuse(b.ptr, &format!("release of resident tensor '{name}'"))?;
        }
        if let Err(e) = self.mem.settle_before_free() {
            return Err(Error::device(Phase::Release, None, e));
        }
        Ok(self.resident.release(&mut self.mem, set))
    }

    /// Exports `buf` to another library (see `exports.rs`): refused for a freed buffer or a
    /// closed worker; the buffer's host view goes stale (the consumer may write).
    pub fn export(&mut self, buf: BufferRef) -> Result<ExportGuard> {
        self.check_open()?;
        self.settle();
        self.mem.lookup(buf, &"export")?;
        self.mem.views.mark_stale(buf.ptr);
        self.mem.exports.add(buf)
    }

    /// Makes the worker's stream wait for the work queued so far on `stream` (a CUDA stream
    /// handle, or 1 / 2 for the legacy / per-thread default stream), without blocking the host:
    /// what another library wrote from that stream is then ordered before the worker's next
    /// run, copy, host-view refresh or free. Nothing to do on devices without streams.
    pub fn wait_stream(&mut self, stream: u64) -> Result<()> {
        self.enter(Phase::Buffer);
        self.check_open()?;
        self.settle();
        self.mem.dev.wait_for_stream(stream).map_err(buffer_err)
    }

    /// `close`, refused while another library may use memory of this worker (live exports).
    pub fn close_checked(&mut self) -> Result<CloseSummary> {
        if !self.closed {
            if let Some((p, _)) = self.mem.exports.all().first() {
                self.mem.exports.refuse(*p, "close")?;
            }
        }
        Ok(self.close())
    }

    // ---- the run -------------------------------------------------------------------------

    fn active(&mut self, run: RunId) -> Result<(&mut RunState, &mut Memory)> {
        match &mut self.run {
            Some(r) if r.id == run => Ok((r, &mut self.mem)),
            _ => Err(not_in_progress(run)),
        }
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

    /// Name, geometry (relative to its allocation) and direction of argument `arg` of the run.
    pub(crate) fn run_tensor(&mut self, run: RunId, arg: u32) -> Result<TensorInfo> {
        let (r, _) = self.active(run)?;
        let a = r.arg(arg)?;
        Ok(TensorInfo {
            name: a.name.clone(),
            geometry: a.geometry,
            dir: a.dir,
        })
    }

    /// [`Worker::run_tensors`], `None` for the arguments `held` says the host already holds
    /// (see `Orch::tensors_except`).
    pub(crate) fn run_tensors_except(
        &mut self,
        run: RunId,
        n: usize,
        held: &(dyn Fn(u32, &str, &Geometry, Direction) -> bool + Sync),
    ) -> Result<Vec<Option<TensorInfo>>> {
        let (r, _) = self.active(run)?;
        let mut out = Vec::with_capacity(n);
        for i in 0..n as u32 {
            let a = r.arg(i)?;
            out.push((!held(i, &a.name, &a.geometry, a.dir)).then(|| TensorInfo {
                name: a.name.clone(),
                geometry: a.geometry,
                dir: a.dir,
            }));
        }
        Ok(out)
    }

    /// Name, geometry and direction of the first `n` arguments of the run (its tensors).
    pub(crate) fn run_tensors(&mut self, run: RunId, n: usize) -> Result<Vec<TensorInfo>> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n as u32 {
            out.push(self.run_tensor(run, i)?);
        }
        Ok(out)
    }

    /// Whether an orchestrator access to argument `arg` of `run` needs no bulk work (see
    /// `RunState::is_resolved`); `false` for a run not in progress (the access reports that).
    pub(crate) fn orch_is_resolved(&self, run: RunId, arg: u32) -> bool {
        matches!(&self.run, Some(r) if r.id == run
            && r.is_resolved(&self.mem, arg)
            && !r.waits_for(&self.pending, arg, true))
    }

    /// Takes back the tasks of `run` from task `first` on (see `RunState::discard_tasks`).
    pub(crate) fn orch_discard_tasks(&mut self, run: RunId, first: u64) -> Result<()> {
        let (r, _) = self.active(run)?;
        r.discard_tasks(first)
    }

    /// Whether staged argument `arg` of `run` wants the bytes the run uploaded for its reads
    /// (see `RunState::wants_staged_bytes`).
    pub(crate) fn orch_wants_staged(&self, run: RunId, arg: u32) -> bool {
        matches!(&self.run, Some(r) if r.id == run && r.wants_staged_bytes(arg))
    }

    /// Serves staged argument `arg`'s reads from `host`, the bytes of its extent the run
    /// uploaded (see `RunState::supply_staged`).
    pub(crate) fn orch_supply_staged(&mut self, run: RunId, arg: u32, host: &[u8]) -> Result<()> {
        self.enter(Phase::Orchestrate);
        let (r, _) = self.active(run)?;
        r.supply_staged(arg, host)
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
    fn check_priceable(&self, kernel: &KernelRef<'_>, who: &str) -> Result<()> {
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
    fn fit_launch(&mut self, kernel: &KernelRef<'_>, what: &str) -> Result<()> {
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
    fn on_device<'k>(&self, mut kernel: KernelRef<'k>) -> KernelRef<'k> {
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

    /// `submit_many`: `count` tasks of one kernel; returns the first task's index.
    pub(crate) fn submit_many(
        &mut self,
        run: RunId,
        kernel: KernelRef<'_>,
        slots: &[BatchSlot<'_>],
        scalars: &[BatchScalar<'_>],
        count: Option<u64>,
    ) -> Result<u64> {
        self.submit_batch(run, kernel, slots, scalars, count, true)
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
    fn settle(&mut self) {
        if let Some(records) = self.pending.complete(&mut self.mem) {
            if self.run.is_none() {
                self.spare = records;
            }
        }
    }

    /// Completes the pending run first when run `run`'s access to argument `arg` (a write, or
    /// a read) must wait for it.
    fn settle_for(&mut self, run: RunId, arg: u32, write: bool) {
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

    /// Fills `call` with the next task; false after the last.
    pub(crate) fn next_task(&mut self, run: RunId, call: &mut TaskCall) -> Result<bool> {
        self.enter(Phase::Execute);
        let (r, mem) = self.active(run)?;
        r.next_task(mem, call)
    }

    /// Writes back the host copies of the task that just ran.
    pub(crate) fn finish_task(&mut self, run: RunId) -> Result<()> {
        self.enter(Phase::Execute);
        let (r, mem) = self.active(run)?;
        r.finish_task(mem)
    }

    /// Ends execution (`ok == false` when a task failed).
    pub(crate) fn end_execute(&mut self, run: RunId, ok: bool) -> Result<()> {
        let (r, mem) = self.active(run)?;
        r.end_execute(mem, ok)
    }

    /// Starts copy back: `(staged index, argument)` of every staged output to copy (none after a
    /// failure).
    pub(crate) fn begin_copy_back(&mut self, run: RunId) -> Result<Vec<(usize, u32)>> {
        let (r, _) = self.active(run)?;
        r.begin_copy_back()
    }

    /// Copies staged output `arg` into `dst`, its host byte extent.
    pub(crate) fn copy_back_one(&mut self, run: RunId, arg: u32, dst: &mut [u8]) -> Result<()> {
        self.enter(Phase::CopyBack);
        let (r, mem) = self.active(run)?;
        r.copy_back_one(mem, arg, dst)
    }

    /// Ends copy back.
    pub(crate) fn end_copy_back(&mut self, run: RunId) -> Result<()> {
        let (r, _) = self.active(run)?;
        r.end_copy_back();
        Ok(())
    }

    /// Marks the run failed (an orchestration or kernel error): copy back will be skipped.
    pub(crate) fn fail_run(&mut self, run: RunId) {
        if let Ok((r, _)) = self.active(run) {
            r.failed = true;
        }
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
        if self.run.as_ref().is_some_and(|r| r.id == run) {
            self.fail_run(run);
            if let Err(e) = self.finish_run(run) {
                log::error!("abandoning run {}: {e}", run.0);
            }
        }
    }

    /// Abandons the run in progress, if any (`close` from another thread ends a run this way;
    /// that run's next step finds it gone).
    fn abort_run(&mut self) {
        if let Some(id) = self.run.as_ref().map(|r| r.id) {
            self.abandon_run(id);
        }
    }

    // ---- close ---------------------------------------------------------------------------

    /// Ends the run in progress (if any), releases resident sets (newest first), user buffers,
    /// the arena and the scratch pool — each view before its allocation — then closes the driver.
    /// Idempotent.
    pub fn close(&mut self) -> CloseSummary {
        self.enter(Phase::Close);
        let mut s = CloseSummary::default();
        if self.closed {
            return s;
        }
        self.settle();
        // Nothing enqueued may still use memory this close frees (a run aborted from another
        // thread mid-execute, say, or another library's last writes through an export).
        let drained = match self.mem.dev.closed() {
            true => Ok(()),
            false => self
                .mem
                .order_after_consumers()
                .and_then(|_| self.mem.dev.synchronize()),
        };
        if let Err(e) = drained {
            log::warn!("close: waiting for the device: {e}");
        }
        self.abort_run();
        // The kept plans go; their task-row regions are live allocations, freed below, and
        // their graphs go with the device.
        self.mem.plans.drain();
        self.mem.plans.dead_graphs.clear();
        self.mem.launcher.release_row_buffers(&*self.mem.dev);
        for (p, n) in self.mem.exports.all() {
            log::warn!(
                "closing the worker while allocation {p} has {n} live export(s): another \
                 library's arrays over it now dangle"
            );
        }
        let sets = self.resident.ids_newest_first();
        s.resident_sets = sets.len() as u64;
        // After a sticky fault no call can free anything: the driver's close gives it all up
        // with the context, in one report. A device closed already (the process's sessions
        // were released at exit, which closes every device first) has nothing left to free.
        let faulted = self.mem.dev.fault().is_some() || self.mem.dev.closed();
        for set in sets {
            if faulted {
                self.resident.forget(set);
            } else {
                s.errors.extend(self.resident.release(&mut self.mem, set));
            }
        }
        for (p, info) in self.mem.live() {
            if info.owner == Owner::User {
                s.user_buffers += 1;
            }
            if faulted {
                continue;
            }
            if let Err(e) = self.mem.release(p) {
                let what = format!("<{} of {} bytes>", info.owner.what(), info.bytes);
                s.errors.push(Error::device(Phase::Close, Some(&what), e));
            }
        }
        self.arena.forget();
        self.scratch.forget();
        self.mem.launcher.forget();
        s.device = self.mem.dev.close();
        // The driver's close removed every mapping, including those whose unmap failed above:
        // drop their view entries too, so nothing of the device outlives close.
        self.mem.forget_all();
        self.closed = true;
        if s.user_buffers > 0 || s.resident_sets > 0 {
            log::warn!(
                "worker closed with {} live buffer(s) and {} unreleased resident set(s); freed them",
                s.user_buffers,
                s.resident_sets
            );
        }
        s
    }
}
