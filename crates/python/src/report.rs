//! The report of one run, as Python sees it: the runtime's report (phase times, counters,
//! modeled times) and the callable's name. What counts as dispatch time is the runtime's rule
//! (`Phases::dispatch`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};

use simpler_runtime::RunReport;

/// What one run did: ``phases`` (nanoseconds per phase: ``bind``, ``orchestrate``,
/// ``execute``, ``copy_back``, ``cleanup``) and ``counters`` (see ``docs/concepts.md``).
#[pyclass(module = "simpler._core", name = "RunReport", frozen)]
pub struct PyRunReport {
    report: RunReport,
    callable: String,
}

impl PyRunReport {
    pub fn new(report: RunReport, callable: &str) -> PyRunReport {
        PyRunReport {
            report,
            callable: callable.to_owned(),
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

    /// A JSON-serializable dict: ``callable``, ``ok``, ``phases``, ``counters`` and, with a cost
    /// model, ``modeled``.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("callable", &self.callable)?;
        d.set_item("ok", self.report.ok)?;
        d.set_item("phases", self.phases(py)?)?;
        d.set_item("counters", self.counters(py)?)?;
        if let Some(m) = self.modeled(py)? {
            d.set_item("modeled", m)?;
        }
        Ok(d)
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
