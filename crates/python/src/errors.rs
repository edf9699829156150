//! The exception mapping: each runtime error becomes the `simpler.errors` class that means it.
//! The classes are imported once (`import_exception!` caches them), never looked up per raise.

use pyo3::prelude::*;

use simpler_runtime::Error;

pyo3::import_exception!(simpler.errors, SimplerError);
pyo3::import_exception!(simpler.errors, ArgumentError);
pyo3::import_exception!(simpler.errors, ArgumentTypeError);
pyo3::import_exception!(simpler.errors, GeometryError);
pyo3::import_exception!(simpler.errors, StateError);
pyo3::import_exception!(simpler.errors, HazardError);
pyo3::import_exception!(simpler.errors, NoHostViewError);
pyo3::import_exception!(simpler.errors, DeviceError);
pyo3::import_exception!(simpler.errors, PlatformUnavailableError);

/// A runtime error on its way to Python (`?` converts it once wrapped; see [`PyResultExt`]).
pub struct PyRuntimeError(pub Error);

impl From<Error> for PyRuntimeError {
    fn from(e: Error) -> Self {
        PyRuntimeError(e)
    }
}

impl From<PyRuntimeError> for PyErr {
    fn from(e: PyRuntimeError) -> PyErr {
        Python::attach(|py| to_py(py, e.0))
    }
}

/// `result.py()?`: a runtime result as a Python one.
pub trait PyResultExt<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> PyResultExt<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| PyRuntimeError(e).into())
    }
}

fn with_attrs(err: PyErr, py: Python<'_>, attrs: &[(&str, Bound<'_, PyAny>)]) -> PyErr {
    let value = err.value(py);
    for (k, v) in attrs {
        // Setting attributes on a fresh exception instance cannot fail for these classes.
        let _ = value.setattr(*k, v);
    }
    err
}

/// The Python exception for a runtime error.
pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Device {
            phase,
            tensor,
            source,
        } => {
            let attrs = [
                (
                    "op",
                    source.op.name().into_pyobject(py).map(|o| o.into_any()),
                ),
                ("code", source.code.into_pyobject(py).map(|o| o.into_any())),
                (
                    "code_name",
                    source.code_name.into_pyobject(py).map(|o| o.into_any()),
                ),
                ("call", source.call.into_pyobject(py).map(|o| o.into_any())),
                (
                    "phase",
                    phase.name().into_pyobject(py).map(|o| o.into_any()),
                ),
                ("tensor", tensor.into_pyobject(py).map(|o| o.into_any())),
                ("addr", source.addr.into_pyobject(py).map(|o| o.into_any())),
                (
                    "nbytes",
                    source.bytes.into_pyobject(py).map(|o| o.into_any()),
                ),
            ];
            let attrs: Vec<_> = attrs
                .into_iter()
                .filter_map(|(k, v)| v.ok().map(|v| (k, v)))
                .collect();
            with_attrs(DeviceError::new_err(msg), py, &attrs)
        }
        Error::Geometry { .. } => GeometryError::new_err(msg),
        Error::NoHostView { addr, bytes, .. } => {
            let attrs = [
                ("addr", addr.into_pyobject(py).map(|o| o.into_any())),
                ("nbytes", bytes.into_pyobject(py).map(|o| o.into_any())),
            ];
            let attrs: Vec<_> = attrs
                .into_iter()
                .filter_map(|(k, v)| v.ok().map(|v| (k, v)))
                .collect();
            with_attrs(NoHostViewError::new_err(msg), py, &attrs)
        }
        Error::Value(_) => ArgumentError::new_err(msg),
        Error::Type(_) => ArgumentTypeError::new_err(msg),
        Error::State(_) => StateError::new_err(msg),
        Error::Hazard(_) => HazardError::new_err(msg),
        _ => SimplerError::new_err(msg),
    }
}

/// An `ArgumentError` (a `ValueError`).
pub fn value_err(msg: impl Into<String>) -> PyErr {
    ArgumentError::new_err(msg.into())
}

/// An `ArgumentTypeError` (a `TypeError`).
pub fn type_err(msg: impl Into<String>) -> PyErr {
    ArgumentTypeError::new_err(msg.into())
}

/// The name of `obj`'s type, for "expected X, got Y" messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}
