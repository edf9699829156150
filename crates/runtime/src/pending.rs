//! Runs that did not wait for the device (`run(..., wait=False)`), so that the next round's bind
//! and orchestration overlap the device's work on this one.
//!
//! A run is left *pending* when its execute phase has enqueued everything and only the wait for
//! the device remains: it ran to the end of its tasks without a failure, launched device code,
//! and stages no argument (a staged output would need copying back into the caller's array,
//! and a staged input's arena bytes must outlive the tasks that read them; such a run waits as
//! any other). What its tasks read and write is kept, as byte ranges, for the checks below; the
//! host views of what they write go stale when it completes.
//!
//! At most one run is pending. It completes — the wait, its device time, pricing, cleanup and
//! its report — when its handle waits, and before anything that needs its results or could
//! change its inputs:
//!
//! * the next run's execute (so runs' device work, timing and plans never interleave);
//! * an orchestrator access of the next run to bytes the pending run's tasks write (a read) or
//!   touch at all (a write);
//! * any buffer operation outside a run (a copy, a free, an export, a host view), trimming the
//!   staging memory, and close.
//!
//! The report of a run completed on another call's behalf is kept for its handle (the last
//! [`REPORTS_KEPT`]; a handle dropped without waiting leaves it unclaimed until then).

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::memory::Memory;
use crate::run::{Records, RunId, RunReport, RunState};

/// Reports of completed pending runs kept for handles that have not waited yet.
pub const REPORTS_KEPT: usize = 64;

/// The bytes one run argument's tasks touch: `[start, end)`, and whether a task writes them.
type Touched = (u64, u64, bool);

#[derive(Debug)]
struct Pending {
    state: RunState,
    touched: Vec<Touched>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct PendingRuns {
    run: Option<Pending>,
    done: VecDeque<(RunId, Result<RunReport>)>,
}

impl PendingRuns {
    /// The pending run, if any.
    pub fn id(&self) -> Option<RunId> {
        self.run.as_ref().map(|p| p.state.id)
    }

    /// Keeps `state` pending (see the module docs: the caller checked
    /// `RunState::can_leave_pending`). The host views of what its tasks write go stale when it
    /// completes: an access to those bytes completes it first, and the views of other bytes stay
    /// good meanwhile.
    pub fn leave(&mut self, state: RunState) {
        debug_assert!(
            self.run.is_none(),
            "a pending run completes before the next execute"
        );
        let touched = state.touched();
        self.run = Some(Pending { state, touched });
    }

    /// Whether an access of `len` bytes at device address `start` must wait for the pending run:
    /// a read of bytes its tasks write, or a write of bytes its tasks read or write.
    pub fn conflicts(&self, start: u64, len: u64, write: bool) -> bool {
        let Some(p) = &self.run else {
            return false;
        };
        let end = start.saturating_add(len.max(1));
        p.touched
            .iter()
            .any(|&(s, e, w)| s < end && start < e && (write || w))
    }

    /// Completes the pending run, if any: waits for the device, finishes its report and cleans
    /// it up; the report is kept for its handle. Returns the run's cleared records (for the
    /// next run to reuse).
    pub fn complete(&mut self, mem: &mut Memory) -> Option<Records> {
        let Pending { mut state, .. } = self.run.take()?;
        let id = state.id;
        let waited = state.end_execute(mem, true);
        let copied = state.begin_copy_back().map(|outputs| {
            debug_assert!(outputs.is_empty(), "a pending run stages nothing");
            state.end_copy_back();
        });
        let (report, cleanup, records) = state.finish(mem);
        let result = match waited.and(copied) {
            Err(e) => Err(e),
            Ok(()) => cleanup.map_or(Ok(report), Err),
        };
        if let Err(e) = &result {
            log::debug!(
                "run {} completed after it was left pending, with an error: {e}",
                id.0
            );
        }
        self.keep(id, result);
        Some(records)
    }

    /// Keeps the report of completed run `id` for its handle.
    pub fn keep(&mut self, id: RunId, result: Result<RunReport>) {
        if self.done.len() >= REPORTS_KEPT {
            self.done.pop_front();
        }
        self.done.push_back((id, result));
    }

    /// The report of completed run `id` (taken: a second call finds nothing).
    pub fn take(&mut self, id: RunId) -> Result<RunReport> {
        match self.done.iter().position(|(r, _)| *r == id) {
            Some(i) => self
                .done
                .remove(i)
                .map_or_else(|| unreachable(id), |(_, r)| r),
            None => unreachable(id),
        }
    }

    /// Whether run `id` is still pending.
    pub fn is_pending(&self, id: RunId) -> bool {
        self.id() == Some(id)
    }
}

/// The error of a handle whose report is gone.
fn unreachable(id: RunId) -> Result<RunReport> {
    Err(Error::State(format!(
        "run {}: no report to wait for (it was waited for already, the worker was closed, or \
         more than {REPORTS_KEPT} later runs completed first)",
        id.0
    )))
}
