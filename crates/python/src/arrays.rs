//! Numpy conversions of the caller's arrays: the staged copy of an array the runtime cannot take
//! byte for byte and its write-back, the offsets of a batch of views, the per-task scalars of a
//! batched submit. Numpy's own functions do the work, called through pyo3 (a copy may let the
//! GIL go, so each call counts as a run's Python code: see `shutdown.rs`); the byte views
//! without a copy are `capi`'s.

use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyEllipsis};

use simpler_runtime::DType;

use crate::errors::Exc;
use crate::helpers;
use crate::shutdown;

/// The numpy dtype of `dtype`, as the package's `np_dtype` names it (ml_dtypes' for bfloat16
/// and the float8 and float4 kinds), asked once per dtype and kept: window arrays and exports
/// need it per tensor. A failure (ml_dtypes missing) is not kept.
pub fn np_dtype(py: Python<'_>, dtype: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    static KEPT: [PyOnceLock<Py<PyArrayDescr>>; DType::ALL.len()] =
        [const { PyOnceLock::new() }; DType::ALL.len()];
    let i = DType::ALL.iter().position(|&d| d == dtype).unwrap_or(0);
    KEPT[i]
        .get_or_try_init(py, || {
            let dt = helpers::call1(py, |h| &h.np_dtype, (dtype.name(),))?;
            Ok::<_, PyErr>(dt.cast_into::<PyArrayDescr>()?.unbind())
        })
        .map(|d| d.bind(py).clone())
}

/// The `numpy` module, imported once.
fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    NUMPY
        .get_or_try_init(py, || Ok(py.import("numpy")?.unbind()))
        .map(|m| m.bind(py))
}

/// `numpy.<name>(*args, **kwargs)`, counted as a run's Python code.
fn call<'py>(
    py: Python<'py>,
    name: &Bound<'py, pyo3::types::PyString>,
    args: impl pyo3::call::PyCallArgs<'py>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let f = numpy(py)?.getattr(name)?;
    let _in_python = shutdown::enter_python(py);
    f.call(args, kwargs)
}

/// `numpy.ascontiguousarray(values, dtype=dtype)` (`dtype` `None`: the array's own).
fn contiguous<'py>(
    values: &Bound<'py, PyAny>,
    dtype: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = values.py();
    let kwargs = PyDict::new(py);
    if let Some(dt) = dtype {
        kwargs.set_item(intern!(py, "dtype"), dt)?;
    }
    call(
        py,
        intern!(py, "ascontiguousarray"),
        (values,),
        Some(&kwargs),
    )
}

/// A C-contiguous copy of `arr` in native byte order: what is staged for an array the runtime
/// cannot take byte for byte (ml_dtypes' kinds carry no byte order).
pub fn native_copy<'py>(arr: &Bound<'py, PyUntypedArray>) -> PyResult<Bound<'py, PyAny>> {
    let py = arr.py();
    let dtype = arr.dtype();
    if dtype.kind() == b'V' {
        return contiguous(arr.as_any(), None);
    }
    let native = dtype.call_method1(intern!(py, "newbyteorder"), ("=",))?;
    let work = contiguous(arr.as_any(), None)?;
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "copy"), false)?;
    let _in_python = shutdown::enter_python(py);
    work.call_method(intern!(py, "astype"), (native,), Some(&kwargs))
}

/// Copies a staged copy's outputs into the caller's array: `orig[...] = work`.
pub fn write_back(orig: &Bound<'_, PyAny>, work: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = orig.py();
    let _in_python = shutdown::enter_python(py);
    orig.set_item(PyEllipsis::get(py), work)
}

/// `values` as a numpy array; ragged or unconvertible input is an `ArgumentError` naming `what`.
fn as_array<'py>(values: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = values.py();
    match call(py, intern!(py, "asarray"), (values,), None) {
        Ok(a) => Ok(a.cast_into::<PyUntypedArray>()?),
        Err(e) if e.is_instance_of::<PyValueError>(py) || e.is_instance_of::<PyTypeError>(py) => {
            Err(Exc::Argument.err(format!(
                "{what} must be a rectangular array of numbers: {}",
                e.value(py)
            )))
        }
        Err(e) => Err(e),
    }
}

/// Numpy's repr of `a`'s shape, as its errors print it: `(2, 3)`.
fn shape_repr(a: &Bound<'_, PyUntypedArray>) -> PyResult<String> {
    Ok(a.getattr(intern!(a.py(), "shape"))?.repr()?.to_string())
}

/// The offsets of a batch of views as a C-contiguous `(n, rank)` int64 array (`(n,)` is taken
/// for rank 1; a 0-d view has no coordinates, so its rows are `(n, 0)`). Errors name `what`:
/// offsets that are not integers (`ArgumentTypeError`), an unsigned one past `i64::MAX`, or
/// another shape (`ArgumentError`).
pub fn offset_rows<'py>(
    offsets: &Bound<'py, PyAny>,
    rank: usize,
    what: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let py = offsets.py();
    let mut a = as_array(offsets, &format!("{what}: view offsets"))?;
    let kind = a.dtype().kind();
    if !matches!(kind, b'i' | b'u') && a.len() > 0 {
        return Err(Exc::ArgumentType.err(format!(
            "{what}: view offsets must be integers, not {}",
            a.dtype()
        )));
    }
    if kind == b'u' && a.len() > 0 {
        let max: u64 = call(py, intern!(py, "max"), (&a,), None)?.extract()?;
        if i64::try_from(max).is_err() {
            return Err(Exc::Argument.err(format!(
                "{what}: view offset {max} is out of range (at most 2**63 - 1)"
            )));
        }
    }
    if a.ndim() == 1 && rank == 1 {
        a = a
            .call_method1(intern!(py, "reshape"), (-1, 1))?
            .cast_into::<PyUntypedArray>()?;
    }
    if a.ndim() != 2 || a.shape()[1] != rank {
        return Err(Exc::Argument.err(format!(
            "{what}: view offsets must have shape (n, {rank}), not {} (one column per dimension \
             of the view)",
            shape_repr(&a)?
        )));
    }
    contiguous(a.as_any(), Some(&intern!(py, "int64").clone().into_any()))
}

/// Per-task scalars as a 1-D C-contiguous array of `dtype` (a numpy dtype name).
pub fn column<'py>(values: &Bound<'py, PyAny>, dtype: &str) -> PyResult<Bound<'py, PyAny>> {
    let a = as_array(values, "per-task scalars")?;
    if a.ndim() != 1 {
        return Err(Exc::Argument.err(format!(
            "per-task scalars must be a 1-D array, not shape {}",
            shape_repr(&a)?
        )));
    }
    let dt = pyo3::types::PyString::new(values.py(), dtype).into_any();
    contiguous(a.as_any(), Some(&dt))
}
