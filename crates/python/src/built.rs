//! Built run arguments: values in order, with their names.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use pyo3::{PyTraverseError, PyVisit};

/// Arguments ready for ``Worker.run``: values in order, with names (what
/// ``ResidentTaskArgs.build_args`` and ``TaskArgsBuilder`` give).
///
/// A read-only sequence of the values; ``names`` gives the names. ``BuiltArgs(pairs)`` takes
/// ``(name, value)`` pairs.
#[pyclass(module = "simpler._core", name = "BuiltArgs", frozen, sequence)]
pub struct BuiltArgs {
    pub names: Vec<Arc<str>>,
    pub values: Vec<Py<PyAny>>,
}

impl BuiltArgs {
    pub fn from_pairs(pairs: Vec<(Arc<str>, Py<PyAny>)>) -> BuiltArgs {
        let (names, values) = pairs.into_iter().unzip();
        BuiltArgs { names, values }
    }
}

#[pymethods]
impl BuiltArgs {
    #[new]
    fn new(pairs: &Bound<'_, PyAny>) -> PyResult<Self> {
        let pairs = pairs
            .try_iter()?
            .map(|p| {
                let (n, v) = p?.extract::<(Bound<'_, PyString>, Py<PyAny>)>()?;
                Ok((Arc::from(&*n.to_cow()?), v))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(BuiltArgs::from_pairs(pairs))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for v in &self.values {
            visit.call(v)?;
        }
        Ok(())
    }

    /// The argument names, in order.
    #[getter]
    fn names(&self) -> Vec<&str> {
        self.names.iter().map(|n| &**n).collect()
    }

    /// ``(name, value)`` pairs: the named-arguments protocol ``Worker.run`` reads.
    fn __simpler_args__(&self, py: Python<'_>) -> Vec<(&str, Py<PyAny>)> {
        self.names
            .iter()
            .zip(&self.values)
            .map(|(n, v)| (&**n, v.clone_ref(py)))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.values.len()
    }

    /// A value by position, or a list of them for a slice.
    fn __getitem__<'py>(&self, py: Python<'py>, i: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        let all = PyList::new(py, self.values.iter().map(|v| v.clone_ref(py)))?;
        Ok(all.as_any().get_item(i)?.unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let names = PyList::new(py, self.names())?;
        Ok(format!("BuiltArgs({})", names.repr()?))
    }
}
