//! Directions of tensor arguments as Python sees them: one object per member, like an enum.

use pyo3::prelude::*;

use simpler_runtime::Direction;

/// Direction of a tensor argument in a signature: ``IN``, ``OUT`` or ``INOUT``.
#[pyclass(module = "simpler._core", name = "ArgDirection", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ArgDirection {
    #[pyo3(name = "IN")]
    In,
    #[pyo3(name = "OUT")]
    Out,
    #[pyo3(name = "INOUT")]
    InOut,
}

impl From<Direction> for ArgDirection {
    fn from(d: Direction) -> Self {
        match d {
            Direction::In => ArgDirection::In,
            Direction::Out => ArgDirection::Out,
            Direction::InOut => ArgDirection::InOut,
        }
    }
}

impl From<ArgDirection> for Direction {
    fn from(d: ArgDirection) -> Self {
        match d {
            ArgDirection::In => Direction::In,
            ArgDirection::Out => Direction::Out,
            ArgDirection::InOut => Direction::InOut,
        }
    }
}

impl ArgDirection {
    /// The class attribute for `d` (``ArgDirection.IN`` ...): the one object per member, so
    /// ``d is ArgDirection.IN`` holds as for a Python enum.
    pub fn member(py: Python<'_>, d: Direction) -> PyResult<Bound<'_, PyAny>> {
        py.get_type::<ArgDirection>().getattr(d.name())
    }
}

#[pymethods]
impl ArgDirection {
    /// ``ArgDirection("IN")``: the member of that name (as for an enum).
    #[new]
    fn new<'py>(py: Python<'py>, value: &str) -> PyResult<Bound<'py, ArgDirection>> {
        let d = Direction::parse(value)
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("ArgDirection: {e}")))?;
        Ok(Self::member(py, d)?.cast_into::<ArgDirection>()?)
    }

    /// ``"IN"``, ``"OUT"`` or ``"INOUT"``.
    #[getter]
    fn name(&self) -> &'static str {
        Direction::from(*self).name()
    }

    /// The same as ``name`` (the direction's spelling in signatures).
    #[getter]
    fn value(&self) -> &'static str {
        self.name()
    }

    fn __repr__(&self) -> String {
        format!("ArgDirection.{}", self.name())
    }

    /// Pickled by name (``getattr(ArgDirection, "IN")``), so a member stays the member.
    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(
        Bound<'py, PyAny>,
        (Bound<'py, pyo3::types::PyType>, &'static str),
    )> {
        let getattr = slf.py().import("builtins")?.getattr("getattr")?;
        Ok((getattr, (slf.as_any().get_type(), slf.get().name())))
    }
}
