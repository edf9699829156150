//! The worker: owner of every device allocation it makes (user buffers, resident sets, the
//! staging arena, the scratch pool), of the allocation-scoped host-view cache, and of the run in
//! progress.
//!
//! Three rooms: this one (the worker, its options and statistics, close), `buffers.rs` (user
//! buffers, copies, host views, exports, resident sets) and `run.rs` (the worker's side of a
//! run). A run's steps take its [`RunId`], so a handle from a finished run is refused rather than
//! misused; `cycle.rs` reaches the run's own steps (`RunState`'s methods) through one handle,
//! `Worker::active_run`, and calls the worker only where it does more than forward (binding,
//! settling a pending run, submitting, cleanup). A buffer bound to the run in progress cannot be
//! freed or released.

use std::sync::Arc;

use simpler_driver::{CloseReport, DevPtr, Device, Stats};

use crate::error::{Error, Phase, Result};
use crate::memory::{Memory, Owner};
use crate::pending::PendingRuns;
use crate::resident::ResidentSets;
use crate::run::{Records, Replay, RunId, RunState};
use crate::scratch::ScratchPool;
use crate::staging::{Arena, Staging};

mod buffers;
mod run;

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
