//! `simpler._core`: pyo3 classes over the runtime. Glue only — argument conversion, the
//! exception mapping, the GIL-aware worker lock and the log bridge. All behaviour, including the
//! order of a run's phases, lives in `simpler-runtime` and `simpler-driver`. The module imports
//! nothing from the `simpler` package: its exceptions are declared here, and the Python helpers
//! it calls are handed over once when the package is imported.
//!
//! Modules, each using only those above it:
//!
//! * `capi` — the only unsafe code: DLPack capsules, numpy arrays over memory another object
//!   owns, the interpreter's finalization flag;
//! * `logging` — Rust log records queued and emitted into Python's `logging`;
//! * `shutdown` — threads in a run at interpreter exit park instead of taking the GIL back;
//! * `errors` — the exception classes, and runtime errors as them;
//! * `arrays` — numpy conversions: staged copies and write-backs, view offsets, per-task columns;
//! * `helpers` — the Python helpers handed over at import;
//! * `cell` — the worker behind a lock that respects the GIL, shared by every handle;
//! * `direction` — `ArgDirection`;
//! * `convert` — Python values into typed runtime values and back;
//! * `handles` — buffers, device tensors, host windows;
//! * `kernels` — kernels and callables;
//! * `built` — built run arguments;
//! * `report` — the run report;
//! * `orch` — the orchestrator handle and run tensors;
//! * `runhost` — one run: its arguments converted, the host side of the run cycle;
//! * `worker` — the native worker;
//! * `resident` — resident sets.

// Unsafe code lives in the driver crate (`simpler-driver`) and, here, in `capi` alone: the
// compiler holds every other module to that (`tests/test_public_api.py` checks no other module
// lifts the lint).
#![deny(unsafe_code)]

mod arrays;
mod built;
#[allow(unsafe_code)]
mod capi;
mod cell;
mod convert;
mod devarray;
mod devcode;
mod direction;
mod errors;
mod exporting;
mod handles;
mod helpers;
mod kernels;
mod logging;
mod orch;
mod pending;
mod report;
mod resident;
mod runhost;
mod shutdown;
mod worker;

use pyo3::prelude::*;

use simpler_runtime::{DType, Staging, ViewPolicy};

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

/// Checks that ``name`` is a non-empty string (an argument's name); raises
/// ``ArgumentTypeError`` naming ``what`` otherwise. Returns it.
#[pyfunction]
fn check_name(name: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    convert::arg_name(name, what)
}

/// Native core of simpler (use the `simpler` package).
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logging::init();
    shutdown::register(m)?;
    errors::register(m)?;
    m.add_class::<direction::ArgDirection>()?;
    m.add_class::<handles::Buffer>()?;
    m.add_class::<handles::DeviceTensor>()?;
    m.add_class::<handles::PyHostWindow>()?;
    m.add_class::<kernels::Kernel>()?;
    m.add_class::<kernels::KernelWork>()?;
    m.add_class::<devcode::CudaCode>()?;
    m.add_class::<devcode::Launch>()?;
    m.add_class::<devarray::DeviceArray>()?;
    m.add_class::<kernels::Callable>()?;
    m.add_class::<built::BuiltArgs>()?;
    m.add_class::<report::PyRunReport>()?;
    m.add_class::<pending::PendingRun>()?;
    m.add_class::<orch::RunTensor>()?;
    m.add_class::<orch::RunViews>()?;
    m.add_class::<orch::Orchestrator>()?;
    m.add_class::<worker::PyWorker>()?;
    m.add_class::<resident::ResidentSet>()?;
    m.add_function(wrap_pyfunction!(parse_svm, m)?)?;
    m.add_function(wrap_pyfunction!(check_scalar, m)?)?;
    m.add_function(wrap_pyfunction!(check_name, m)?)?;
    m.add_function(wrap_pyfunction!(worker::check_worker_options, m)?)?;
    m.add_function(wrap_pyfunction!(helpers::install_helpers, m)?)?;
    m.add_function(wrap_pyfunction!(devcode::device_code_stats, m)?)?;
    m.add_function(wrap_pyfunction!(devcode::nvrtc_info, m)?)?;
    m.add_function(wrap_pyfunction!(devcode::compile_cuda, m)?)?;
    let dtypes: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    m.add("DTYPES", dtypes)?;
    m.add("PLATFORMS", simpler_driver::PLATFORMS.to_vec())?;
    m.add("MODELS", simpler_driver::model::MODELS.to_vec())?;
    let policies: Vec<&str> = ViewPolicy::ALL.iter().map(|p| p.name()).collect();
    m.add("VIEW_POLICIES", policies)?;
    m.add("STAGING_MODES", Staging::ALL.map(Staging::name))?;
    m.add("PHASES", simpler_runtime::Phases::NAMES.to_vec())?;
    let ops: Vec<&str> = simpler_driver::Op::ALL.iter().map(|o| o.name()).collect();
    m.add("DRIVER_OPS", ops)?;
    m.add(
        "NVRTC_WHEEL_SUBDIRS",
        simpler_driver::nvrtc::WHEEL_LIB_SUBDIRS.to_vec(),
    )?;
    Ok(())
}
