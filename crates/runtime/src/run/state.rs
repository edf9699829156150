//! The state of the run in progress: its arguments, its tasks, its hazard index, where the cycle
//! stands, and the report being filled. The phases (`bind`, `access`, `submit`, `execute`,
//! `copy_back`, `finish`) are `impl RunState` blocks in their own modules.

use std::sync::Arc;
use std::time::Instant;

use simpler_driver::{DevPtr, HostMem, Stats};

use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::run::hazards::HazardIndex;
use crate::run::report::RunReport;
use crate::run::tasks::{Cursor as TaskCursor, Slot, TaskStore};
use crate::scratch::Cursor as ScratchCursor;
use crate::spec::Direction;
use crate::views::ViewEvents;

/// Identifies a run of a worker (a generation number): a handle from a finished run is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunId(pub u64);

/// Where the cycle stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Orchestrate,
    Execute,
    Executed,
    CopiedBack,
}

#[derive(Debug)]
pub(crate) enum ArgKind {
    /// A host array staged into the arena (or a fresh allocation); `host` is its index among the
    /// run's staged arguments (the order the host lends their bytes in).
    Staged { host: usize },
    /// A tensor over a device buffer (resident pass-through).
    Device,
    /// A run-scoped tensor of the orchestration (`orch.scratch`), carved from the scratch pool.
    Scratch,
}

#[derive(Debug)]
pub(crate) struct RunArg {
    /// Shared, so the per-access paths copy a pointer, not the string.
    pub name: Arc<str>,
    pub dir: Direction,
    /// Relative to `alloc`.
    pub geometry: Geometry,
    /// The allocation holding the tensor (base, size); `None` when it has no bytes.
    pub alloc: Option<(DevPtr, u64)>,
    pub kind: ArgKind,
    /// Its hazard-index region (meaningless without `alloc`).
    pub region: u32,
    /// Where orchestrator accesses through it land (see `access.rs`).
    pub resolved: Option<Resolved>,
    /// A staged or scratch argument's per-run host copy of its span (see `access.rs`).
    pub span_copy: SpanCopy,
}

/// The per-run host copy of a staged or scratch argument's span, and what decides it.
#[derive(Debug, Default)]
pub(crate) struct SpanCopy {
    pub mem: Option<Arc<HostMem>>,
    /// Element reads made this run through a mapping of its allocation (under the `auto` view
    /// policy, enough of them make the copy).
    pub reads: u64,
    /// The copy could not be made this run: the argument is read through the mapping.
    pub failed: bool,
    /// Filled from the host bytes the run uploaded (a staged IN/INOUT tensor): no device read.
    pub from_host: bool,
}

impl RunArg {
    /// Absolute device span `(start, len)` of the tensor.
    #[inline]
    pub fn span(&self) -> Option<(u64, u64)> {
        self.alloc
            .map(|(p, _)| (p.0 + self.geometry.start_byte(), self.geometry.extent()))
    }
}

/// How accesses through a resolved argument reach the device bytes.
#[derive(Debug, Clone)]
pub(crate) enum Via {
    /// `mem` is a mapping: every element read and write crosses the bus (counted, and priced by
    /// a cost model).
    Mapping,
    /// `mem` is the allocation's mirror: writes are pushed with a small H2D; a failed push
    /// marks the mirror stale.
    Mirror,
    /// `mem` is the run's copy of a staged or scratch span, filled by a D2H: writes are pushed
    /// with a small H2D; a failed push drops the copy.
    SpanCopy,
    /// `mem` is a host copy of a mapping (a cached view, or a span copy filled out of the
    /// arena's mapping): writes also go through the mapping, at this offset of it.
    Through(Arc<HostMem>, usize),
}

/// Where the accesses through one argument land, resolved once per run and kept while the view
/// cache's epoch says it still holds: host offset `host_start` is device address `dev_start`.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub mem: Arc<HostMem>,
    pub dev_start: u64,
    pub host_start: usize,
    pub via: Via,
    pub epoch: u64,
    /// Reads through the mapping not yet noted.
    pub pending_reads: u64,
}

impl Resolved {
    /// The host offset of device address `addr` (inside the resolved span).
    pub fn host_offset(&self, addr: u64) -> usize {
        self.host_start + (addr - self.dev_start) as usize
    }

    /// Reads and writes hit the mapping itself.
    pub fn mapped(&self) -> bool {
        matches!(self.via, Via::Mapping)
    }

    /// `mem` is host-owned: a window over it needs no copy (a vendor mapping can be revoked).
    pub fn zero_copy(&self) -> bool {
        self.mem.owned_addr().is_some()
    }
}

/// A task tensor handed to a kernel as a host copy (drivers without kernel memory): written back
/// to `addr` after the kernel when `dir` writes.
#[derive(Debug)]
pub(crate) struct PendingCopy {
    pub addr: u64,
    pub mem: Arc<HostMem>,
    pub dir: Direction,
    pub name: Arc<str>,
    /// The view's layout over the copy (offset 0).
    pub geometry: Geometry,
}

/// What the run's orchestration sees of an argument (or of a view handle made from one).
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: Arc<str>,
    pub geometry: Geometry,
    pub dir: Direction,
}

/// A host window over device bytes handed to a kernel or returned by `read_tensor`: `len` bytes
/// at `offset` of `mem`, laid out as `geometry` (rebased to start at `offset`).
#[derive(Debug, Clone)]
pub struct HostWindow {
    pub mem: Arc<HostMem>,
    pub offset: usize,
    pub len: usize,
    pub geometry: Geometry,
    /// True when `mem` is the device memory itself or a view cache entry (no copy was made).
    pub zero_copy: bool,
    /// Whether the holder may write the bytes (a kernel's OUT/INOUT tensors).
    pub writable: bool,
}

impl HostWindow {
    /// A window over no bytes (a tensor without elements), laid out as `geometry`.
    pub(crate) fn empty(geometry: Geometry, writable: bool, tensor: &str) -> Result<HostWindow> {
        let mem = Arc::new(HostMem::new(1, 0).map_err(|e| Error::host(tensor, e))?);
        Ok(HostWindow {
            mem,
            offset: 0,
            len: 0,
            geometry,
            zero_copy: false,
            writable,
        })
    }
}

/// One task to run, filled by `Worker::next_task` (reused from task to task).
#[derive(Debug, Default)]
pub struct TaskCall {
    /// Its index in submission order.
    pub task: u64,
    /// The host's id of its kernel.
    pub kernel: u32,
    /// Its scalars.
    pub scalars: Vec<crate::dtype::Value>,
    /// One window per tensor, in the kernel's signature order.
    pub buffers: Vec<HostWindow>,
    /// The run argument each window views (for messages).
    pub names: Vec<Arc<str>>,
    /// Whether host copies must be written back, or the device waited for, after the kernel
    /// (`Worker::finish_task`).
    pub needs_finish: bool,
    /// The kernel takes device arrays: `device_views` replaces `buffers`.
    pub on_device: bool,
    /// Per tensor: the device address of the view's first element (0 when empty), its
    /// geometry rebased to that element, and whether the kernel may write it.
    pub device_views: Vec<(u64, crate::geometry::Geometry, bool)>,
    pub(crate) tensors: Vec<(Slot, u64)>,
}

/// The records a run fills: kept by the worker between runs, cleared.
#[derive(Debug, Default)]
pub struct Records {
    pub(crate) tasks: TaskStore,
    pub(crate) hazards: HazardIndex,
    pub(crate) plan: crate::run::plan::LaunchPlan,
    /// The argument table's memory (empty).
    pub(crate) args: Vec<RunArg>,
}

/// See the module docs.
#[derive(Debug)]
pub struct RunState {
    pub(crate) id: RunId,
    pub(crate) args: Vec<RunArg>,
    pub(crate) tasks: TaskStore,
    pub(crate) hazards: HazardIndex,
    pub(crate) stage: Stage,
    pub(crate) failed: bool,
    mark: Instant,
    pub(crate) report: RunReport,
    pub(crate) stats_before: Stats,
    /// The device's modeled time by phase, per cost model, when the run started (sim).
    pub(crate) modeled_before: Vec<(&'static str, simpler_driver::model::PerModel)>,
    pub(crate) events: ViewEvents,
    /// Fresh staging allocations of this run, with the tensor each holds.
    pub(crate) fresh: Vec<(Arc<str>, DevPtr)>,
    pub(crate) scratch_at: ScratchCursor,
    pub(crate) exec: TaskCursor,
    /// Host copies of the task being executed (drivers without kernel memory).
    pub(crate) pending: Vec<PendingCopy>,
    /// The task being executed took device arrays: the device is waited for after it.
    pub(crate) device_task: bool,
    /// The byte staged outputs and scratch tensors are filled with (`None`: no poisoning).
    pub(crate) poison: Option<u8>,
    /// The launches of the run's batches of device code (planned when execution reaches the
    /// first).
    pub(crate) plan: crate::run::plan::LaunchPlan,
    /// Dependence levels computed as batches of device code were recorded.
    pub(crate) levels: crate::run::plan::RecordedLevels,
    /// Time each batch's launches on the device (events around them).
    pub(crate) time_device: bool,
}

impl RunState {
    /// A run; `records` is the memory of an earlier run's task store and hazard index, cleared
    /// (a warm run reuses it instead of allocating and page-faulting it in again).
    pub(crate) fn new(
        id: RunId,
        started: Instant,
        stats_before: Stats,
        records: Records,
    ) -> RunState {
        RunState {
            id,
            args: records.args,
            tasks: records.tasks,
            hazards: records.hazards,
            plan: records.plan,
            stage: Stage::Orchestrate,
            failed: false,
            mark: started,
            report: RunReport::default(),
            stats_before,
            modeled_before: Vec::new(),
            events: ViewEvents::default(),
            fresh: Vec::new(),
            scratch_at: ScratchCursor::default(),
            exec: TaskCursor::default(),
            pending: Vec::new(),
            device_task: false,
            poison: None,
            levels: Default::default(),
            time_device: false,
        }
    }

    /// Nanoseconds since the last lap (or the run's start).
    pub(crate) fn lap(&mut self) -> u64 {
        let now = Instant::now();
        let ns = now.duration_since(self.mark).as_nanos() as u64;
        self.mark = now;
        ns
    }

    /// Whether cleanup frees nothing that takes time: no fresh staging allocation and no per-run
    /// host copy of a span (a copy may be large; giving it back unmaps its pages).
    pub(crate) fn cleanup_is_light(&self) -> bool {
        self.fresh.is_empty() && self.args.iter().all(|a| a.span_copy.mem.is_none())
    }

    /// Whether a device argument of this run lives in the allocation at `ptr`.
    pub(crate) fn binds(&self, ptr: DevPtr) -> bool {
        self.args
            .iter()
            .any(|a| matches!(a.kind, ArgKind::Device) && a.alloc.is_some_and(|(p, _)| p == ptr))
    }

    /// Argument `arg`, or an error naming the index.
    pub(crate) fn arg(&self, arg: u32) -> Result<&RunArg> {
        self.args
            .get(arg as usize)
            .ok_or_else(|| Error::Value(format!("run has no argument {arg}")))
    }

    /// What the orchestration sees of argument `arg`: its name, geometry (relative to its
    /// allocation) and direction.
    pub(crate) fn tensor_info(&self, arg: u32) -> Result<TensorInfo> {
        let a = self.arg(arg)?;
        Ok(TensorInfo {
            name: a.name.clone(),
            geometry: a.geometry,
            dir: a.dir,
        })
    }

    /// [`RunState::tensor_info`] of its first `n` arguments (its tensors), `None` for those
    /// `held(arg, name, geometry, direction)` says the host already holds.
    pub(crate) fn tensor_infos(
        &self,
        n: usize,
        held: &(dyn Fn(u32, &str, &Geometry, Direction) -> bool + Sync),
    ) -> Result<Vec<Option<TensorInfo>>> {
        (0..n as u32)
            .map(|i| {
                let a = self.arg(i)?;
                Ok((!held(i, &a.name, &a.geometry, a.dir)).then(|| TensorInfo {
                    name: a.name.clone(),
                    geometry: a.geometry,
                    dir: a.dir,
                }))
            })
            .collect()
    }

    /// Fails unless the cycle is at `stage`; `what` says what was attempted.
    pub(crate) fn expect(&self, stage: Stage, what: &str) -> Result<()> {
        if self.stage != stage {
            return Err(Error::State(format!(
                "{what} (run {} is past that phase)",
                self.id.0
            )));
        }
        Ok(())
    }

    /// The hazard region of a device argument over the allocation at `base`: shared with the
    /// earlier device arguments over the same allocation.
    pub(crate) fn device_region(&mut self, base: DevPtr) -> u32 {
        self.hazards.device_region(base)
    }
}
