//! The report of one run, as Python sees it: the runtime's report (phase times, counters,
//! modeled times) and the callable's name. What counts as dispatch time is the runtime's rule
//! (`Phases::dispatch`).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use simpler_driver::model::Work;

use simpler_runtime::RunReport;

use crate::errors::PyResultExt;

/// What one run did: ``phases`` (nanoseconds per phase: ``bind``, ``orchestrate``,
/// ``execute``, ``copy_back``, ``cleanup``) and ``counters`` (see ``docs/concepts.md``).
#[pyclass(module = "simpler._core", name = "RunReport", frozen)]
pub struct PyRunReport {
    report: RunReport,
    callable: Arc<str>,
}

impl PyRunReport {
    pub fn new(report: RunReport, callable: &Arc<str>) -> PyRunReport {
        PyRunReport {
            report,
            callable: callable.clone(),
        }
    }
}

/// A dict of `(name, value)` pairs whose names are made into Python strings once.
fn dict_of<'py>(
    py: Python<'py>,
    keys: &'static PyOnceLock<Vec<Py<PyString>>>,
    entries: &[(&'static str, u64)],
) -> PyResult<Bound<'py, PyDict>> {
    let names = keys.get_or_init(py, || {
        entries
            .iter()
            .map(|(k, _)| PyString::intern(py, k).unbind())
            .collect()
    });
    let d = PyDict::new(py);
    for (k, (_, v)) in names.iter().zip(entries) {
        d.set_item(k.bind(py), v)?;
    }
    Ok(d)
}

/// `{"bytes_read", "bytes_written", "flops": {precision: count}}`.
fn work_dict<'py>(py: Python<'py>, w: &Work) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes_read", w.bytes_read)?;
    d.set_item("bytes_written", w.bytes_written)?;
    let f = PyDict::new(py);
    for (p, n) in w.flops.entries() {
        f.set_item(p.name(), n)?;
    }
    d.set_item("flops", f)?;
    Ok(d)
}

static PHASES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();
static COUNTERS: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();

#[pymethods]
impl PyRunReport {
    /// Nanoseconds per phase, in phase order.
    #[getter]
    fn phases<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        dict_of(py, &PHASES, &self.report.phases.entries())
    }

    /// What the run did (staged bytes, mallocs, views, ...; see ``docs/concepts.md``).
    #[getter]
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        dict_of(py, &COUNTERS, &self.report.counters.entries())
    }

    /// Whether every phase succeeded.
    #[getter]
    fn ok(&self) -> bool {
        self.report.ok
    }

    /// The name of the callable that ran.
    #[getter]
    fn callable(&self) -> &str {
        &self.callable
    }

    /// Modeled nanoseconds per phase, on a sim worker with a cost model (``Worker(model=...)``);
    /// ``None`` otherwise. See ``docs/cost-model.md``.
    #[getter]
    fn modeled<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.report
            .modeled
            .map(|m| dict_of(py, &PHASES, &m.entries()))
            .transpose()
    }

    /// Every phase but execute: the cost of getting arguments to and from the device.
    #[getter]
    fn dispatch_ns(&self) -> u64 {
        self.report.phases.dispatch()
    }

    /// The modeled dispatch path (every modeled phase but execute), or ``None``.
    #[getter]
    fn modeled_dispatch_ns(&self) -> Option<u64> {
        self.report.modeled.map(|m| m.dispatch())
    }

    /// The modeled round: dispatch path plus modeled execute (the kernels), or ``None``.
    #[getter]
    fn modeled_round_ns(&self) -> Option<u64> {
        self.report.modeled.map(|m| m.round())
    }

    /// Modeled nanoseconds per phase under every cost model of the worker
    /// (``Worker(model="ascend-a3,h200")``), by model name, the primary model first; empty
    /// without a cost model.
    #[getter]
    fn modeled_by<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for m in &self.report.modeled_by {
            d.set_item(m.model, dict_of(py, &PHASES, &m.phases.entries())?)?;
        }
        Ok(d)
    }

    /// Per kernel, what the run's tasks did and what it costs under each cost model (empty
    /// without one): ``kernel``, ``declared`` (whether the kernel declares its work),
    /// ``batches``, ``tasks``, ``launches`` (one per dependence level of a batch, as CUDA
    /// launches it), ``per_task`` and ``work`` (``bytes_read``, ``bytes_written``, ``flops``
    /// by precision) and ``modeled`` (by model: ``overhead_ns``, ``memory_ns``,
    /// ``compute_ns``, ``ns`` and ``rate``, the fraction of the device's rates the kernel ran
    /// at: its efficiency times its launches' fill; see ``docs/cost-model.md``).
    #[getter]
    fn kernels<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let rows = self
            .report
            .kernels
            .iter()
            .map(|k| {
                let d = PyDict::new(py);
                d.set_item("kernel", &k.name)?;
                d.set_item("declared", k.declared)?;
                d.set_item("batches", k.batches)?;
                d.set_item("tasks", k.tasks)?;
                d.set_item("launches", k.launches)?;
                d.set_item("per_task", work_dict(py, &k.per_task)?)?;
                d.set_item("work", work_dict(py, &k.work)?)?;
                let by = PyDict::new(py);
                for m in &k.modeled {
                    let c = PyDict::new(py);
                    c.set_item("overhead_ns", m.overhead_ns.round() as u64)?;
                    c.set_item("memory_ns", m.memory_ns.round() as u64)?;
                    c.set_item("compute_ns", m.compute_ns.round() as u64)?;
                    c.set_item("ns", m.ns)?;
                    c.set_item("rate", (m.rate() * 1e4).round() / 1e4)?;
                    by.set_item(m.model, c)?;
                }
                d.set_item("modeled", by)?;
                Ok(d)
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, rows)
    }

    /// A JSON-serializable dict: ``callable``, ``ok``, ``phases``, ``counters`` and, with a cost
    /// model, ``modeled``, ``modeled_by`` and ``kernels``.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("callable", &*self.callable)?;
        d.set_item("ok", self.report.ok)?;
        d.set_item("phases", self.phases(py)?)?;
        d.set_item("counters", self.counters(py)?)?;
        if let Some(m) = self.modeled(py)? {
            d.set_item("modeled", m)?;
            d.set_item("modeled_by", self.modeled_by(py)?)?;
            d.set_item("kernels", self.kernels(py)?)?;
        }
        Ok(d)
    }

    /// Pickling: the callable's name and the runtime's bytes of the report, handed to
    /// ``RunReport._restore`` (a report crosses from a device group's process as itself).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let me = slf.get();
        let restore = slf.get_type().getattr("_restore")?;
        let state = (&*me.callable, PyBytes::new(py, &me.report.to_bytes()));
        PyTuple::new(py, [restore, state.into_pyobject(py)?.into_any()])
    }

    /// The report ``__reduce__`` gave the state of.
    #[staticmethod]
    fn _restore(callable: &str, state: &[u8]) -> PyResult<PyRunReport> {
        Ok(PyRunReport {
            report: RunReport::from_bytes(state).py()?,
            callable: Arc::from(callable),
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "RunReport({}, ok={}, dispatch {} ns, execute {} ns)",
            self.callable,
            self.report.ok,
            self.report.phases.dispatch(),
            self.report.phases.execute
        )
    }
}
