//! What a run launches: the plan of its batches of device code (made by `launch`, or taken
//! from a kept plan of `plan_cache`), which the run's state holds while it executes.

use std::ops::Range;
use std::sync::Arc;

use simpler_driver::{DevPtr, FuncId, HostMem, LaunchCall, LaunchDims};

/// How one run argument was bound: its allocation's base address, size and generation (`None`:
/// no bytes).
pub(crate) type Binding = Option<(u64, u64, u64)>;

/// A task-row region in device memory: `(address, bytes)`.
pub(crate) type Region = (DevPtr, u64);

/// One launch of a planned batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlannedLaunch {
    pub func: FuncId,
    pub dims: LaunchDims,
    /// Byte offset of its first row in the task-row buffer.
    pub row_offset: u64,
}

impl PlannedLaunch {
    /// Each launch's one kernel parameter, its `row_offset` (where its task rows start).
    pub fn params(launches: &[PlannedLaunch]) -> Vec<[u64; 1]> {
        launches.iter().map(|l| [l.row_offset]).collect()
    }

    /// The driver's calls for `launches`, with their `params` (from [`PlannedLaunch::params`]).
    pub fn calls<'a>(launches: &[PlannedLaunch], params: &'a [[u64; 1]]) -> Vec<LaunchCall<'a>> {
        launches
            .iter()
            .zip(params)
            .map(|(l, p)| LaunchCall {
                func: l.func,
                dims: l.dims,
                params: p,
            })
            .collect()
    }
}

/// Dependence levels computed while the run's tasks were recorded (`submit.rs`), per batch:
/// `None` for a batch whose levels were not computed then (planning computes them), `Some(None)`
/// for independent tasks.
#[derive(Debug, Default)]
pub(crate) struct RecordedLevels {
    by_batch: Vec<Option<Option<Vec<u32>>>>,
}

impl RecordedLevels {
    /// Keeps batch `i`'s levels.
    pub fn set(&mut self, i: usize, levels: Option<Vec<u32>>) {
        if self.by_batch.len() <= i {
            self.by_batch.resize_with(i + 1, || None);
        }
        self.by_batch[i] = Some(levels);
    }

    /// Batch `i`'s levels, if they were computed while recording (taken).
    pub fn take(&mut self, i: usize) -> Option<Option<Vec<u32>>> {
        self.by_batch.get_mut(i).and_then(Option::take)
    }

    /// Forgets the levels of batches `batches` on (their tasks were taken back).
    pub fn truncate(&mut self, batches: usize) {
        self.by_batch.truncate(batches);
    }
}

/// The launches of one run: per batch of device code, its range of `launches`.
#[derive(Debug, Default)]
pub(crate) struct LaunchPlan {
    pub planned: bool,
    pub launches: Vec<PlannedLaunch>,
    pub batches: Vec<(usize, Range<usize>)>,
    /// The next entry of `batches` to launch.
    pub next: usize,
    /// The kept plan this run replays as a graph (`Replay::Graphs`), and whether the graph was
    /// launched (then every batch was).
    pub graph_of: Option<u64>,
    pub graph_launched: bool,
    /// A plan being made batch by batch, until its last batch is planned.
    pub cold: Option<ColdPlan>,
}

/// A plan being made batch by batch (`launch.rs`): the task-row region it fills, the
/// page-locked row buffer its rows are written into, and how far it got.
#[derive(Debug)]
pub(crate) struct ColdPlan {
    pub region: Region,
    pub rows: Arc<HostMem>,
    pub bindings: Vec<Binding>,
    /// Bytes of rows written (and uploaded, but for the chunk being planned).
    pub written: u64,
    /// The task store's next batch to plan, and one past its last batch of device code.
    pub next_batch: usize,
    pub end: usize,
    /// The least bytes the next upload carries.
    pub chunk: u64,
}

impl LaunchPlan {
    /// Forgets the plan (the run plans again, or takes a kept plan, when execution next
    /// reaches device code). The region of a cold plan left unfinished is given back first
    /// ([`LaunchPlan::take_unfinished`]).
    pub fn clear(&mut self) {
        self.cold = None;
        self.graph_of = None;
        self.graph_launched = false;
        self.planned = false;
        self.launches.clear();
        self.batches.clear();
        self.next = 0;
    }

    /// The task-row region of a plan left unfinished (execution stopped before its last batch
    /// of device code), for the caller to give back as a spare: a later plan writes it with
    /// copies queued on the same stream, behind the launches that read it.
    pub fn take_unfinished(&mut self) -> Option<Region> {
        self.cold.take().map(|c| c.region)
    }
}
