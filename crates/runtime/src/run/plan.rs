//! What a run launches: the plan of its batches of device code (made by `launch`, or taken
//! from a kept plan of `plan_cache`), which the run's state holds while it executes.

use std::ops::Range;

use simpler_driver::{FuncId, LaunchCall, LaunchDims};

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
}

impl LaunchPlan {
    /// Forgets the plan (the run plans again, or takes a kept plan, when execution next
    /// reaches device code).
    pub fn clear(&mut self) {
        self.graph_of = None;
        self.graph_launched = false;
        self.planned = false;
        self.launches.clear();
        self.batches.clear();
        self.next = 0;
    }
}
