//! A run that did not wait for the device (`Worker.run(..., wait=False)`): a handle whose
//! `wait()` returns the run's report. When a run may be left pending, and what waits for it, is
//! the runtime's rule (`crates/runtime/src/pending.rs`).

use std::sync::Arc;

use pyo3::prelude::*;

use simpler_runtime::{RunId, WorkerCell};

use crate::cell::Shared;
use crate::errors::done;
use crate::report::PyRunReport;

/// A run left pending by ``Worker.run(callable, args, wait=False)``: its device work was
/// enqueued and the call returned without waiting for it. ``wait()`` waits and returns the
/// ``RunReport``; the next run's execute, an orchestrator access to bytes its tasks write,
/// and any buffer copy, free or close wait for it first.
#[pyclass(module = "simpler._core", name = "PendingRun", frozen)]
pub struct PendingRun {
    cell: Arc<Shared>,
    run: RunId,
    callable: Arc<str>,
}

impl PendingRun {
    pub fn new(cell: Arc<Shared>, run: RunId, callable: &Arc<str>) -> PendingRun {
        PendingRun {
            cell,
            run,
            callable: callable.clone(),
        }
    }
}

#[pymethods]
impl PendingRun {
    /// Waits for the run's device work (unless another call did) and returns its report; the
    /// run's failure, if its device work failed, is raised here. Once only.
    fn wait(&self, py: Python<'_>) -> PyResult<PyRunReport> {
        let run = self.run;
        let report = done(py, self.cell.with(true, |w| w.wait_run(run)))?;
        Ok(PyRunReport::new(report, &self.callable))
    }

    /// Whether the run is still pending (its device work may not have run yet).
    #[getter]
    fn pending(&self) -> bool {
        let run = self.run;
        self.cell.with(false, |w| w.run_is_pending(run))
    }

    fn __repr__(&self) -> String {
        let state = if self.pending() {
            "pending"
        } else {
            "completed"
        };
        format!("PendingRun({} #{}, {state})", self.callable, self.run.0)
    }
}
