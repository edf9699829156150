//! Conversions at the boundary: Python values into the runtime's typed values, and back. No rule
//! lives here beyond "what Python type means what"; the runtime validates.

use std::sync::Mutex;

use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PySequence, PyString, PyTuple, PyType};
use pyo3::Borrowed;

use simpler_driver::sim::SvmPolicy;
use simpler_runtime::{
    DType, Direction, Geometry, Param, Replay, Signature, Staging, Value, ViewPolicy, MAX_DIMS,
};

use crate::direction::ArgDirection;
use crate::errors::{type_err, value_err, PyResultExt, PyRuntimeErr};
use crate::helpers;

/// An optional argument of a user-facing call as `T`, or an ``ArgumentTypeError`` naming the
/// call (`what`), the argument (`noun`), the kind it takes (`kind`) and what it got.
pub fn typed<T>(
    obj: Option<&Bound<'_, PyAny>>,
    what: &str,
    noun: &str,
    kind: &str,
) -> PyResult<Option<T>>
where
    for<'a, 'py> T: FromPyObject<'a, 'py>,
{
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    obj.extract::<T>().map(Some).map_err(|_| {
        type_err(format!(
            "{what}: {noun} must be {kind}, not {}",
            crate::errors::type_name(obj)
        ))
    })
}

/// `obj` as a numpy array, or the error naming `what` and what it got.
pub fn ndarray<'py>(
    obj: &Bound<'py, PyAny>,
    what: &dyn std::fmt::Display,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let host = host_array(obj, what)?;
    host.cast_into::<PyUntypedArray>().map_err(|e| {
        type_err(format!(
            "{what}: expected a numpy array (or a CPU torch tensor), got {}",
            crate::errors::type_name(e.into_inner().as_any())
        ))
    })
}

/// `obj` as a host array where it is one in another library's clothes (a CPU torch tensor
/// becomes a numpy view of its memory: `simpler._arrays.host_array`); else `obj` itself.
pub fn host_array<'py>(
    obj: &Bound<'py, PyAny>,
    what: &dyn std::fmt::Display,
) -> PyResult<Bound<'py, PyAny>> {
    if obj.cast::<PyUntypedArray>().is_ok() || plain_number(obj) {
        return Ok(obj.clone());
    }
    let py = obj.py();
    helpers::call1(py, |h| &h.host_array, (obj, what.to_string()))
}

/// `v` as a run passes a scalar on: a ctypes number as its Python value
/// (`simpler._arrays.host_scalar`), anything else as it is.
pub fn host_scalar<'py>(v: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if plain_number(v) {
        return Ok(v.clone());
    }
    helpers::call1(v.py(), |h| &h.host_scalar, (v,))
}

/// A Python int, float or bool, or a numpy scalar: a value no helper converts (told without
/// running Python, on the run's hot path).
fn plain_number(v: &Bound<'_, PyAny>) -> bool {
    v.is_exact_instance_of::<PyInt>()
        || v.is_exact_instance_of::<PyFloat>()
        || v.is_exact_instance_of::<PyBool>()
        || v.get_type()
            .module()
            .is_ok_and(|m| m.to_cow().is_ok_and(|m| m == "numpy"))
}

/// An argument's name: a non-empty string, or the error naming `what`.
pub fn arg_name(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) if !s.to_cow()?.is_empty() => Ok(s.to_cow()?.into_owned()),
        _ => Err(type_err(format!(
            "{what}: name must be a non-empty string, not {}",
            obj.repr()?
        ))),
    }
}

/// `tensor NAME`, formatted only when an error names it.
pub struct TensorName<'a>(pub &'a str);

impl std::fmt::Display for TensorName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tensor {}", self.0)
    }
}

/// A direction: an `ArgDirection` member or its name (`"IN"`, `"OUT"`, `"INOUT"`).
pub struct Dir(pub Direction);

impl<'a, 'py> FromPyObject<'a, 'py> for Dir {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(d) = obj.cast::<ArgDirection>() {
            return Ok(Dir((*d.get()).into()));
        }
        // A name, or an enum member of the user's whose value is one.
        let text = match obj.cast::<PyString>() {
            Ok(s) => s.to_cow()?.into_owned(),
            Err(_) => obj
                .getattr(intern!(obj.py(), "value"))
                .and_then(|v| v.extract::<String>())
                .map_err(|_| {
                    type_err(format!(
                        "direction must be an ArgDirection, not {}",
                        crate::errors::type_name(&obj)
                    ))
                })?,
        };
        Direction::parse(&text).map(Dir).py()
    }
}

/// A staging mode: `"arena"` or `"fresh"`.
pub struct StagingMode(pub Staging);

impl<'a, 'py> FromPyObject<'a, 'py> for StagingMode {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let s: String = obj
            .extract()
            .map_err(|_| type_err(format!("staging must be a string, not {obj:?}")))?;
        Staging::parse(&s).map(StagingMode).py()
    }
}

/// A host-view policy: `"auto"`, `"mapping"`, `"cached"` or `"mirror"`.
pub struct ViewPolicyArg(pub ViewPolicy);

impl<'a, 'py> FromPyObject<'a, 'py> for ViewPolicyArg {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let s: String = obj
            .extract()
            .map_err(|_| type_err(format!("view_policy must be a string, not {obj:?}")))?;
        ViewPolicy::parse(&s).map(ViewPolicyArg).ok_or_else(|| {
            let names: Vec<String> = ViewPolicy::ALL
                .iter()
                .map(|p| format!("'{}'", p.name()))
                .collect();
            let (last, rest) = names.split_last().expect("ALL is not empty");
            value_err(format!(
                "view_policy must be {} or {last}, not '{s}'",
                rest.join(", ")
            ))
        })
    }
}

/// A replay mode: `"off"`, `"plans"` or `"graphs"`.
pub struct ReplayArg(pub Replay);

impl<'a, 'py> FromPyObject<'a, 'py> for ReplayArg {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let s: String = obj
            .extract()
            .map_err(|_| type_err(format!("replay must be a string, not {obj:?}")))?;
        Replay::parse(&s).map(ReplayArg).ok_or_else(|| {
            let names: Vec<String> = Replay::ALL
                .iter()
                .map(|p| format!("'{}'", p.name()))
                .collect();
            let (last, rest) = names.split_last().expect("ALL is not empty");
            value_err(format!(
                "replay must be {} or {last}, not '{s}'",
                rest.join(", ")
            ))
        })
    }
}

/// A sim mapping policy: `"always"`, `"never"` or a minimum byte count (int or numeric string).
pub struct Svm(pub SvmPolicy);

impl<'a, 'py> FromPyObject<'a, 'py> for Svm {
    type Error = PyErr;
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyBool>() {
            return Err(type_err(
                "svm must be 'always', 'never' or a byte count, not a bool",
            ));
        }
        if let Ok(i) = obj.cast::<PyInt>() {
            let n: i128 = i
                .extract()
                .map_err(|_| value_err(format!("svm byte count {obj:?} out of range")))?;
            let n = u64::try_from(n)
                .map_err(|_| value_err(format!("svm byte count {n} out of range")))?;
            return Ok(Svm(SvmPolicy::MinBytes(n)));
        }
        let text = obj.extract::<String>().map_err(|_| {
            type_err(format!(
                "svm must be 'always', 'never' or a byte count, not {}",
                crate::errors::type_name(&obj)
            ))
        })?;
        SvmPolicy::parse(&text).map(Svm).map_err(value_err)
    }
}

/// A non-negative integer argument of a user-facing call (`malloc`'s size, a byte offset,
/// `nth`, ...): anything else is an error naming `what` and the `noun`, never a bare
/// `OverflowError`.
pub fn u64_arg(obj: &Bound<'_, PyAny>, what: &str, noun: &str) -> PyResult<u64> {
    let not_int = || {
        type_err(format!(
            "{what}: {noun} must be an int, not {}",
            crate::errors::type_name(obj)
        ))
    };
    if obj.is_instance_of::<PyBool>() || obj.is_instance_of::<PyFloat>() {
        return Err(not_int());
    }
    let n: i128 = obj
        .call_method0("__index__")
        .map_err(|_| not_int())?
        .extract()
        .map_err(|_| value_err(format!("{what}: {noun} {obj} does not fit 64 bits")))?;
    if n < 0 {
        return Err(value_err(format!("{what}: negative {noun} {n}")));
    }
    u64::try_from(n).map_err(|_| value_err(format!("{what}: {noun} {n} does not fit 64 bits")))
}

/// The dtype of a numpy array. numpy computes `dtype.name` in Python (microseconds), so the
/// answer is remembered per scalar type (`dtype.type`: `np.float32`, `ml_dtypes.bfloat16`, ...).
/// Byte order is not part of it: `array_geometry` checks that separately.
pub fn array_dtype(
    descr: &Bound<'_, PyArrayDescr>,
    what: &dyn std::fmt::Display,
) -> PyResult<DType> {
    static KNOWN: Mutex<Vec<(Py<PyType>, DType)>> = Mutex::new(Vec::new());
    let ty = descr.typeobj();
    {
        let known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = known.iter().find(|(t, _)| t.as_ptr() == ty.as_ptr()) {
            return Ok(*d);
        }
    }
    let d = dtype(descr.as_any(), what)?;
    KNOWN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((ty.unbind(), d));
    Ok(d)
}

/// A tensor's start offset in elements: a negative one is a `GeometryError` naming the tensor.
pub fn element_offset(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    let n: i128 = obj
        .call_method0("__index__")
        .and_then(|i| i.extract())
        .map_err(|_| type_err(format!("{what}: offset must be an int, not {obj}")))?;
    u64::try_from(n).map_err(|_| {
        PyRuntimeErr(simpler_runtime::Error::geometry(
            what,
            if n < 0 {
                format!("negative offset {n}")
            } else {
                format!("offset {n} does not fit 64 bits")
            },
        ))
        .into()
    })
}

/// A dtype given as a name, a numpy dtype or a scalar type.
pub fn dtype(obj: &Bound<'_, PyAny>, what: &dyn std::fmt::Display) -> PyResult<DType> {
    if let Ok(s) = obj.cast::<PyString>() {
        if let Ok(d) = DType::parse(&s.to_cow()?) {
            return Ok(d);
        }
    }
    let py = obj.py();
    let name: String = helpers::call1(py, |h| &h.dtype_name, (obj,))?.extract()?;
    DType::parse(&name).map_err(|e| type_err(format!("{what}: {e}")))
}

/// A kernel's or callable's signature: a sequence of directions or `(direction, dtype)` pairs.
pub fn signature(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Signature> {
    let seq = obj
        .cast::<PySequence>()
        .map_err(|_| type_err(format!("{what}: signature must be a list of directions")))?;
    let mut params = Vec::with_capacity(seq.len()?);
    for (i, entry) in seq.try_iter()?.enumerate() {
        let entry = entry?;
        if let Ok(t) = entry.cast::<PyTuple>() {
            if t.len() != 2 {
                return Err(value_err(format!(
                    "{what}: signature entry {i} must be a direction or (direction, dtype)"
                )));
            }
            let Dir(dir) = t.get_item(0)?.extract().map_err(|e| prefix(e, what))?;
            let dt = dtype(&t.get_item(1)?, &what)?;
            params.push(Param {
                dir,
                dtype: Some(dt),
            });
        } else {
            let Dir(dir) = entry.extract().map_err(|e| prefix(e, what))?;
            params.push(Param { dir, dtype: None });
        }
    }
    Ok(Signature::new(params))
}

fn prefix(e: PyErr, what: &str) -> PyErr {
    Python::attach(|py| {
        let msg = format!("{what}: {}", e.value(py));
        if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) {
            type_err(msg)
        } else {
            value_err(msg)
        }
    })
}

/// One entry of an index or a shape: an int (or numpy integer), never a bool or a float.
#[inline(always)]
fn int_entry(o: &Borrowed<'_, '_, PyAny>, name: &dyn std::fmt::Display) -> PyResult<i64> {
    match exact_int(o) {
        Some(v) => Ok(v),
        None => slow_int_entry(&o.to_owned(), name),
    }
}

/// The value of `o` when it is an exact `int` that fits 64 bits, else `None` (the orchestrator's
/// hot path parses four of these per view).
#[inline(always)]
fn exact_int(o: &Borrowed<'_, '_, PyAny>) -> Option<i64> {
    if !o.is_exact_instance_of::<PyInt>() {
        return None;
    }
    o.extract::<i64>().ok()
}

/// `int_entry` for anything but an int that fits 64 bits (and for the errors).
fn slow_int_entry(o: &Bound<'_, PyAny>, name: &dyn std::fmt::Display) -> PyResult<i64> {
    let out_of_bounds = || {
        value_err(format!(
            "{name}: index entry {o} out of bounds (it does not fit 64 bits)"
        ))
    };
    if o.is_exact_instance_of::<PyInt>() {
        return Err(out_of_bounds());
    }
    if o.is_instance_of::<PyBool>() || o.is_instance_of::<PyFloat>() {
        return Err(type_err(format!(
            "{name}: index entries must be integers, not {o}"
        )));
    }
    let i = o
        .call_method0(intern!(o.py(), "__index__"))
        .map_err(|_| type_err(format!("{name}: index entries must be integers, not {o}")))?;
    i.extract::<i64>().map_err(|_| out_of_bounds())
}

/// Up to [`MAX_DIMS`] integers: an int, or a tuple / list of them. Returns them and the count.
///
/// The orchestrator's hot path (`orch.get_tensor_data(t, (i, j))`, `t.view([1, 16], [i, 0])`,
/// tens of thousands of calls per run): a tuple's items are read borrowed and a list's by index,
/// with no iterator and no closure.
pub fn small_ints(
    obj: &Bound<'_, PyAny>,
    name: &dyn std::fmt::Display,
) -> PyResult<([i64; MAX_DIMS], usize)> {
    let mut out = [0i64; MAX_DIMS];
    let n = small_ints_into(obj, name, &mut out)?;
    Ok((out, n))
}

/// [`small_ints`] into `out` (the caller's array: nothing is copied back); returns the count.
pub fn small_ints_into(
    obj: &Bound<'_, PyAny>,
    name: &dyn std::fmt::Display,
    out: &mut [i64; MAX_DIMS],
) -> PyResult<usize> {
    // An exact tuple or list is told by its type pointer (no call into the interpreter).
    let tuple = obj
        .cast_exact::<PyTuple>()
        .or_else(|_| obj.cast::<PyTuple>());
    if let Ok(t) = tuple {
        let len = t.len();
        if len > MAX_DIMS {
            return Err(too_many_entries(name, len));
        }
        for (k, slot) in out.iter_mut().enumerate().take(len) {
            *slot = int_entry(&t.get_borrowed_item(k)?, name)?;
        }
        return Ok(len);
    }
    let list = obj.cast_exact::<PyList>().or_else(|_| obj.cast::<PyList>());
    if let Ok(l) = list {
        let len = l.len();
        if len > MAX_DIMS {
            return Err(too_many_entries(name, len));
        }
        for (k, slot) in out.iter_mut().enumerate().take(len) {
            // An entry's `__index__` may run Python code that shortens the list: it then ends
            // early, as iterating it would.
            let Ok(o) = l.get_item(k) else { break };
            *slot = int_entry(&o.as_borrowed(), name)?;
        }
        return Ok(len);
    }
    let mut fill =
        |items: &mut dyn Iterator<Item = Bound<'_, PyAny>>, len: usize| -> PyResult<usize> {
            if len > MAX_DIMS {
                return Err(too_many_entries(name, len));
            }
            for (k, o) in items.enumerate() {
                out[k] = int_entry(&o.as_borrowed(), name)?;
            }
            Ok(len)
        };
    let n = if let Some(list) = array_items(obj)? {
        // A numpy array of integers (not 0-d): its entries, as a list.
        fill(&mut list.iter(), list.len())?
    } else if obj.is_exact_instance_of::<PyInt>() || obj.hasattr(intern!(obj.py(), "__index__"))? {
        out[0] = int_entry(&obj.as_borrowed(), name)?;
        1
    } else if let Ok(seq) = obj.cast::<PySequence>() {
        let items: Vec<Bound<'_, PyAny>> = seq.try_iter()?.collect::<PyResult<_>>()?;
        let len = items.len();
        fill(&mut items.into_iter(), len)?
    } else {
        return Err(type_err(format!(
            "{name}: expected an int or a sequence of ints, not {}",
            obj.get_type().name()?
        )));
    };
    Ok(n)
}

/// The error for an index or shape of `len` entries, past the supported rank.
fn too_many_entries(name: &dyn std::fmt::Display, len: usize) -> PyErr {
    value_err(format!(
        "{name}: {len} entries exceed the supported rank of {MAX_DIMS}"
    ))
}

/// The entries of a numpy array of one or more dimensions, as a list; `None` for anything else
/// (a 0-d array is one integer).
fn array_items<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyList>>> {
    match obj.cast::<PyUntypedArray>() {
        Ok(a) if a.ndim() > 0 => Ok(Some(
            obj.call_method0(intern!(obj.py(), "tolist"))?
                .cast_into::<PyList>()?,
        )),
        _ => Ok(None),
    }
}

/// A shape: non-negative entries.
pub fn shape(obj: &Bound<'_, PyAny>, what: &dyn std::fmt::Display) -> PyResult<Vec<u64>> {
    dims(obj, what, "shape")
}

/// Strides (in elements): non-negative entries.
pub fn strides(obj: &Bound<'_, PyAny>, what: &dyn std::fmt::Display) -> PyResult<Vec<u64>> {
    dims(obj, what, "stride")
}

fn dims(obj: &Bound<'_, PyAny>, what: &dyn std::fmt::Display, field: &str) -> PyResult<Vec<u64>> {
    let (v, n) = small_ints(obj, what)?;
    v[..n]
        .iter()
        .map(|&x| {
            u64::try_from(x).map_err(|_| {
                PyErr::from(PyRuntimeErr(simpler_runtime::Error::geometry(
                    what.to_string(),
                    format!("negative {field} entry {x} in {:?}", &v[..n]),
                )))
            })
        })
        .collect()
}

/// A value written into a tensor: int, float or bool (numpy scalars too).
pub fn value(v: &Bound<'_, PyAny>, name: &dyn std::fmt::Display) -> PyResult<Value> {
    number(v, name, "values")
}

/// A scalar argument of a run or a task: int, float or bool (numpy scalars too).
pub fn scalar(v: &Bound<'_, PyAny>, name: &dyn std::fmt::Display) -> PyResult<Value> {
    number(v, name, "scalars")
}

fn number(v: &Bound<'_, PyAny>, name: &dyn std::fmt::Display, noun: &str) -> PyResult<Value> {
    if v.is_exact_instance_of::<PyInt>() {
        if let Ok(x) = v.extract::<i64>() {
            return Ok(Value::Int(x));
        }
    } else if v.is_exact_instance_of::<PyFloat>() {
        return Ok(Value::Float(v.extract()?));
    }
    // numpy's float64 is a float: taken before the type's name is asked for (numpy's bool is
    // known only by its name).
    if v.is_instance_of::<PyFloat>() {
        return Ok(Value::Float(v.extract()?));
    }
    if v.is_instance_of::<PyBool>() || v.get_type().name()?.to_str()? == "bool" {
        return Ok(Value::Bool(v.is_truthy()?));
    }
    let py = v.py();
    if let Ok(i) = v.call_method0(intern!(py, "__index__")) {
        if let Ok(x) = i.extract::<i64>() {
            return Ok(Value::Int(x));
        }
        if let Ok(x) = i.extract::<u64>() {
            return Ok(Value::UInt(x));
        }
        return Err(value_err(format!(
            "{name}: value {v} out of range: it does not fit 64 bits"
        )));
    }
    if let Ok(f) = v.call_method0(intern!(py, "__float__")) {
        return Ok(Value::Float(f.extract()?));
    }
    // A ctypes number (`ctypes.c_float(1.0)`): its Python value.
    let plain = host_scalar(v)?;
    if !plain.is(v) {
        return number(&plain, name, noun);
    }
    Err(type_err(format!(
        "{name}: {noun} must be int, float or bool, not {}",
        v.get_type().name()?
    )))
}

/// A typed value as a Python object.
pub fn value_py(py: Python<'_>, v: Value) -> PyResult<Bound<'_, PyAny>> {
    Ok(match v {
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::UInt(u) => u.into_pyobject(py)?.into_any(),
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
    })
}

/// How a numpy array lays out its elements, when the runtime can take it byte for byte: a
/// supported dtype in native byte order, non-negative strides that are multiples of the item
/// size. `None` otherwise (the caller stages a contiguous copy).
pub fn array_geometry(
    arr: &Bound<'_, PyUntypedArray>,
    what: &dyn std::fmt::Display,
) -> PyResult<Option<Geometry>> {
    let descr = arr.dtype();
    let dt = array_dtype(&descr, what)?;
    let order = descr.byteorder();
    let native = order == b'='
        || order == b'|'
        || (cfg!(target_endian = "little") && order == b'<')
        || (cfg!(target_endian = "big") && order == b'>');
    if !native {
        return Ok(None);
    }
    let item = dt.size() as isize;
    let shape: Vec<u64> = arr.shape().iter().map(|&s| s as u64).collect();
    let mut strides = Vec::with_capacity(shape.len());
    for (&st, &n) in arr.strides().iter().zip(&shape) {
        if n <= 1 {
            strides.push(0);
        } else if st < 0 || st % item != 0 {
            return Ok(None);
        } else {
            strides.push((st / item) as u64);
        }
    }
    Geometry::new(what, dt, &shape, Some(&strides), 0)
        .py()
        .map(Some)
}
