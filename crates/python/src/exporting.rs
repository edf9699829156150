//! The export protocols' one home, for device tensors and device arrays alike: the CUDA Array
//! Interface dictionary and the checks and stream ordering of a DLPack request.

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use simpler_driver::Device;
use simpler_runtime::Geometry;

use crate::shutdown;

/// `kDLCUDA` of DLPack's `DLDeviceType`.
pub const KDL_CUDA: i32 = 2;

/// The CUDA Array Interface (version 3) of `geometry`'s elements at device address `data` (0
/// for no elements), `dtype` its numpy dtype; `stream` is where the memory is ready. bfloat16
/// and the float8 kinds (numpy kind `V`) have no typestr consumers read: `TypeError`.
pub fn cai_dict<'py>(
    py: Python<'py>,
    geometry: &Geometry,
    dtype: &Bound<'py, PyAny>,
    data: u64,
    readonly: bool,
    stream: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    if dtype.getattr("kind")?.extract::<String>()? == "V" {
        return Err(PyTypeError::new_err(format!(
            "__cuda_array_interface__: {} has no typestr that consumers read as that type; use \
             DLPack (torch.from_dlpack(t), cupy.from_dlpack(t))",
            geometry.dtype().name()
        )));
    }
    let item = geometry.dtype().size();
    let d = PyDict::new(py);
    d.set_item("shape", PyTuple::new(py, geometry.shape())?)?;
    d.set_item("typestr", dtype.getattr("str")?)?;
    d.set_item("data", (data, readonly))?;
    if geometry.is_contiguous() {
        d.set_item("strides", py.None())?;
    } else {
        let s: Vec<u64> = geometry.strides().iter().map(|s| s * item).collect();
        d.set_item("strides", PyTuple::new(py, s)?)?;
    }
    d.set_item("version", 3)?;
    d.set_item("stream", stream)?;
    Ok(d)
}

/// Checks a `__dlpack__` request of memory on DLPack `device` (`what` names the exporter):
/// `copy=True` and another `dl_device` are `BufferError`s. Returns the consumer stream to order
/// after the worker's: `None` asks the legacy default stream (1), -1 nothing, 0 is refused.
pub fn dlpack_request(
    what: &str,
    device: (i32, u32),
    stream: Option<i64>,
    dl_device: Option<(i32, u32)>,
    copy: Option<bool>,
) -> PyResult<Option<u64>> {
    if copy == Some(true) {
        return Err(PyBufferError::new_err(format!(
            "{what}.__dlpack__ cannot copy (copy=True)"
        )));
    }
    if let Some(d) = dl_device.filter(|d| *d != device) {
        return Err(PyBufferError::new_err(format!(
            "the {what} is on DLPack device {device:?}, not {d:?}"
        )));
    }
    match stream {
        None => Ok(Some(1)),
        Some(-1) => Ok(None),
        Some(s) if s > 0 => Ok(Some(s as u64)),
        Some(s) => Err(PyBufferError::new_err(format!(
            "__dlpack__: stream {s} is not a CUDA stream (None or 1: legacy default, 2: \
             per-thread default, -1: no synchronization, > 2: a stream handle; 0 is ambiguous)"
        ))),
    }
}

/// Makes `consumer` wait for the worker's stream (an event), without the GIL: the device's lock
/// may be held by a thread waiting for the device.
pub fn order_after(py: Python<'_>, dev: &dyn Device, consumer: Option<u64>) -> PyResult<()> {
    let Some(s) = consumer else {
        return Ok(());
    };
    shutdown::without_gil(py, || dev.order_stream(s))
        .map_err(|e| PyBufferError::new_err(format!("__dlpack__: {e}")))
}

/// The CUDA stream handle `stream` stands for: an int (1 and 2 are the legacy and per-thread
/// default streams), an object with the `__cuda_stream__` protocol (`(version, handle)`), a
/// torch stream (`cuda_stream`) or a CuPy stream (`ptr`); an object's 0 (its default stream)
/// is the legacy default stream.
pub fn stream_handle(stream: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(h) = stream.extract::<u64>() {
        return Ok(h);
    }
    // A stream object's handle 0 is its library's default stream: the legacy one (torch and
    // CuPy hand out 0 for it). A bare 0 stays ambiguous (refused by the driver).
    let object_handle = |h: u64| if h == 0 { 1 } else { h };
    if let Ok(proto) = stream.getattr("__cuda_stream__") {
        let (_version, h): (i64, u64) = proto.call0()?.extract()?;
        return Ok(object_handle(h));
    }
    for attr in ["cuda_stream", "ptr"] {
        if let Ok(h) = stream.getattr(attr).and_then(|v| v.extract::<u64>()) {
            return Ok(object_handle(h));
        }
    }
    Err(PyTypeError::new_err(format!(
        "a CUDA stream is an int handle (1: legacy default, 2: per-thread default), an object \
         with __cuda_stream__, a torch.cuda.Stream or a cupy.cuda.Stream, not {}",
        stream.get_type().name()?
    )))
}
