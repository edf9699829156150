//! `simpler._core`: pyo3 classes over the runtime. Glue only — argument conversion, the
//! exception mapping, the GIL-aware worker lock and the log bridge. All behaviour, including the
//! order of a run's phases, lives in `simpler-runtime` and `simpler-driver`.
//!
//! * `errors` — runtime errors as `simpler.errors` exceptions;
//! * `logging` — Rust log records queued and emitted into Python's `logging`;
//! * `convert` — Python values into typed runtime values and back;
//! * `cell` — the worker behind a lock that respects the GIL;
//! * `worker` — the native worker (buffers, resident sets, counters, close, `run`);
//! * `runhost` — one run: its arguments converted, the host side of the run cycle;
//! * `orch` — the orchestrator handle and run tensors;
//! * `tensors` — kernels, callables, device tensors, host windows.

mod cell;
mod convert;
mod errors;
mod logging;
mod orch;
mod runhost;
mod tensors;
mod worker;

use pyo3::prelude::*;

use simpler_runtime::DType;

/// Parses a sim ``svm`` option (``"always"``, ``"never"`` or a minimum byte count, as a string
/// or an int); returns it as ``"always"``, ``"never"`` or an int. Raises ``ArgumentError``.
#[pyfunction]
fn parse_svm(value: convert::Svm) -> PyResult<Py<PyAny>> {
    use simpler_driver::sim::SvmPolicy;
    Python::attach(|py| {
        Ok(match value.0 {
            SvmPolicy::Always => "always".into_pyobject(py)?.into_any().unbind(),
            SvmPolicy::Never => "never".into_pyobject(py)?.into_any().unbind(),
            SvmPolicy::MinBytes(n) => n.into_pyobject(py)?.into_any().unbind(),
        })
    })
}

/// Checks that ``value`` is a scalar argument (int, float or bool, numpy scalars included);
/// raises ``ArgumentTypeError`` naming ``what`` otherwise. The rule runs and submits apply.
#[pyfunction]
fn check_scalar(value: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    convert::scalar(value, &what).map(|_| ())
}

/// Native core of simpler (use the `simpler` package).
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::init();
    m.add_class::<worker::PyWorker>()?;
    m.add_class::<tensors::PyHostWindow>()?;
    m.add_class::<tensors::Kernel>()?;
    m.add_class::<tensors::Callable>()?;
    m.add_class::<tensors::DeviceTensor>()?;
    m.add_class::<orch::RunTensor>()?;
    m.add_class::<orch::RunViews>()?;
    m.add_class::<orch::Orchestrator>()?;
    m.add_function(wrap_pyfunction!(parse_svm, m)?)?;
    m.add_function(wrap_pyfunction!(check_scalar, m)?)?;
    let dtypes: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    m.add("DTYPES", dtypes)?;
    m.add("PLATFORMS", simpler_driver::PLATFORMS.to_vec())?;
    m.add("MODELS", simpler_driver::model::MODELS.to_vec())?;
    let policies: Vec<&str> = simpler_runtime::views::ViewPolicy::ALL
        .iter()
        .map(|p| p.name())
        .collect();
    m.add("VIEW_POLICIES", policies)?;
    m.add(
        "STAGING_MODES",
        simpler_runtime::Staging::ALL.map(simpler_runtime::Staging::name),
    )?;
    Ok(())
}
