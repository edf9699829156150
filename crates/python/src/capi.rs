//! The bindings' only unsafe code: what pyo3's safe API does not reach of the interpreter's C API
//! (`Python.h`) and the DLPack ABI (`dlpack.h`).
//!
//! * **DLPack capsules.** [`dlpack_capsule`] hands a consumer (PyTorch, CuPy, JAX, ...) a capsule
//!   named `"dltensor"` holding a `DLManagedTensor` that describes device memory, without a copy.
//!   A consumer renames the capsule `"used_dltensor"` and then owns the tensor: it calls the
//!   `deleter` when done, from any thread, with or without the GIL. A capsule dropped still named
//!   `"dltensor"` was never consumed, and its destructor calls the deleter. A consumer that
//!   refuses the capsule (numpy, for CUDA memory) drops it with its own error set; the destructor
//!   then leaves that error untouched (it puts it aside with `PyErr_Fetch` and back with
//!   `PyErr_Restore` around the deleter), which pyo3's capsule type, whose destructor takes a
//!   closure over the pointer and not the capsule, cannot do. The deleter frees the structures
//!   and drops what the tensor kept alive: the exporting object and the export guard.
//! * **Numpy arrays over memory something else owns** ([`flat_bytes`], [`array_over_window`]):
//!   numpy's C API (`PyArray_NewFromDescr`, `PyArray_SetBaseObject`) with the bounds checked
//!   here, where the Python helpers went through `__array_interface__` and `np.ndarray` twice per
//!   array.
//! * **The interpreter's finalization flag** ([`python_finalizing`]), read without the GIL by a
//!   thread that must not take it back while the interpreter finalizes (see `shutdown.rs`).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use numpy::npyffi::{self, npy_intp, NpyTypes, NPY_ARRAY_WRITEABLE, PY_ARRAY_API};
use numpy::{
    dtype, PyArray1, PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use simpler_runtime::{DType, ExportGuard, Geometry, HostWindow};

use crate::errors::state_err;

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor`.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What a capsule's tensor owns: the structure first (so a pointer to it is a pointer to the
/// whole), then the arrays its `shape` and `strides` point into and what must outlive it.
#[repr(C)]
struct Exported {
    managed: DlManagedTensor,
    shape: Vec<i64>,
    strides: Vec<i64>,
    _owner: Py<PyAny>,
    _guard: Option<ExportGuard>,
}

const CAPSULE_NAME: &CStr = c"dltensor";

/// `DLDataTypeCode` of `dtype`: int, uint, float, bfloat, bool; `None` for the float8 and
/// float4 kinds, which this producer does not describe.
fn dl_dtype(dtype: DType) -> Option<DlDataType> {
    let code = match dtype {
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 0,
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => 1,
        DType::F16 | DType::F32 | DType::F64 => 2,
        DType::BF16 => 4,
        DType::Bool => 6,
        DType::F8E4M3FN | DType::F8E5M2 | DType::F4E2M1FN => return None,
    };
    let bits = u8::try_from(dtype.size() * 8).ok()?;
    Some(DlDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// A `"dltensor"` capsule of `geometry`'s elements whose first is at device address `data` (0
/// when there are none) on DLPack `device`; `owner` (the exporting object) and `guard` (the
/// export, when there is one) live until the tensor's deleter runs. `BufferError` for a dtype
/// DLPack cannot describe or a rank or extent it cannot hold.
pub fn dlpack_capsule<'py>(
    owner: &Bound<'py, PyAny>,
    data: u64,
    device: (i32, u32),
    geometry: &Geometry,
    guard: Option<ExportGuard>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = owner.py();
    let name = geometry.dtype().name();
    let dtype = dl_dtype(geometry.dtype())
        .ok_or_else(|| PyBufferError::new_err(format!("dtype {name} has no DLPack type")))?;
    let too_big = |what: &str| {
        PyBufferError::new_err(format!("__dlpack__: {what} do not fit DLPack's int64"))
    };
    let shape = geometry
        .shape()
        .iter()
        .map(|&n| i64::try_from(n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| too_big("the shape's extents"))?;
    let strides = geometry
        .strides()
        .iter()
        .map(|&s| i64::try_from(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| too_big("the strides"))?;
    let ndim = i32::try_from(shape.len()).map_err(|_| too_big("the rank"))?;
    let device_id = i32::try_from(device.1).map_err(|_| too_big("the device ordinal"))?;
    let mut exported = Box::new(Exported {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: data as usize as *mut c_void,
                device: DlDevice {
                    device_type: device.0,
                    device_id,
                },
                ndim,
                dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported),
        },
        shape,
        strides,
        _owner: owner.clone().unbind(),
        _guard: guard,
    });
    // The vectors' buffers stay where they are when the box (not they) is moved.
    exported.managed.dl_tensor.shape = exported.shape.as_mut_ptr();
    exported.managed.dl_tensor.strides = exported.strides.as_mut_ptr();
    let managed = Box::into_raw(exported).cast::<DlManagedTensor>();
    // SAFETY: attached to the interpreter (`py`); `managed` is a live `DLManagedTensor` whose
    // ownership passes to the capsule (its destructor, or a consumer, calls the deleter once);
    // the name is a static C string, as the capsule keeps the pointer.
    let raw = unsafe {
        ffi::PyCapsule_New(
            managed.cast(),
            CAPSULE_NAME.as_ptr(),
            Some(capsule_destructor),
        )
    };
    if raw.is_null() {
        // SAFETY: no capsule took `managed`; it is freed here, once.
        unsafe { delete_exported(managed) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `raw` is a new (owned) reference to the capsule just made.
    Ok(unsafe { Bound::from_owned_ptr(py, raw) })
}

/// The `deleter` of the tensors [`dlpack_capsule`] makes: frees the [`Exported`] it heads. A
/// consumer may call it from any thread, holding the GIL or not: it attaches to the interpreter
/// so the exporting object is let go at once, except while the interpreter finalizes, when a
/// thread taking the GIL would be ended inside this frame: the export guard is dropped then (it
/// needs no GIL) and the rest is left to the process's exit.
unsafe extern "C" fn delete_exported(managed: *mut DlManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` heads an `Exported` boxed by `dlpack_capsule` (`repr(C)`, first field),
    // and DLPack's owner calls the deleter once.
    let mut exported = unsafe { Box::from_raw(managed.cast::<Exported>()) };
    if python_finalizing() == Some(true) {
        drop(exported._guard.take());
        std::mem::forget(exported);
        return;
    }
    let _ = Python::try_attach(move |_| drop(exported));
}

/// `void destructor(PyObject *capsule)`: see the module docs. Called by the interpreter, with the
/// GIL held, when a capsule made by [`dlpack_capsule`] is deallocated.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    let name: *const c_char = CAPSULE_NAME.as_ptr();
    let (mut t, mut v, mut tb) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: the interpreter calls capsule destructors with the GIL held; fetch moves any
    // pending error into the three locals (owned references) and restore moves it back, so
    // nothing below sees or clears it. A capsule still named "dltensor" holds the
    // `DLManagedTensor` it was made with, never consumed: its deleter is called once, here.
    unsafe {
        ffi::PyErr_Fetch(&mut t, &mut v, &mut tb);
        if ffi::PyCapsule_IsValid(capsule, name) != 0 {
            let managed = ffi::PyCapsule_GetPointer(capsule, name).cast::<DlManagedTensor>();
            if !managed.is_null() {
                if let Some(deleter) = (*managed).deleter {
                    deleter(managed);
                }
            }
        }
        ffi::PyErr_Restore(t, v, tb);
    }
}

/// The bytes from the first element that an array of `shape` and byte `strides`, of items of
/// `item` bytes, reaches (0 without elements); `None` on a negative stride of a dimension that
/// has more than one element (a dimension of one element never steps, whatever its stride), or
/// an overflow.
fn extent(shape: &[usize], strides: &[isize], item: usize) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().zip(strides).try_fold(item, |end, (&n, &s)| {
        if n == 1 {
            return Some(end);
        }
        let step = usize::try_from(s).ok()?;
        end.checked_add((n - 1).checked_mul(step)?)
    })
}

/// A numpy array of `descr` with `shape` and byte `strides` whose first element is at `data`, in
/// memory `base` keeps alive (`base` becomes the array's base); read-only unless `writable`.
/// Without elements the array owns its (empty) memory instead.
///
/// # Safety
/// `data` must be valid for reads (and writes, when `writable`) of the array's
/// [`extent`] bytes for as long as `base` lives.
unsafe fn array_over<'py>(
    base: &Bound<'py, PyAny>,
    data: usize,
    descr: Bound<'py, PyArrayDescr>,
    shape: &[usize],
    strides: &[isize],
    writable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let py = base.py();
    let nd = i32::try_from(shape.len()).map_err(|_| PyValueError::new_err("rank too large"))?;
    let mut dims = shape
        .iter()
        .map(|&n| npy_intp::try_from(n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| PyValueError::new_err("extent too large"))?;
    let mut steps: Vec<npy_intp> = strides.to_vec();
    let empty = shape.contains(&0);
    // Without data, numpy reads any flags as a request for Fortran order: none then (a read-only
    // empty array is made so below).
    let flags = if writable && !empty {
        NPY_ARRAY_WRITEABLE
    } else {
        0
    };
    // SAFETY: attached (`py`); `PyArray_NewFromDescr` steals the reference to `descr` and reads
    // `nd` dimensions and strides; with data given (the caller's promise covers it) the array
    // does not own it, and without (no elements) numpy allocates.
    let raw = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            nd,
            dims.as_mut_ptr(),
            if empty {
                std::ptr::null_mut()
            } else {
                steps.as_mut_ptr()
            },
            if empty {
                std::ptr::null_mut()
            } else {
                data as *mut c_void
            },
            flags,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: `raw` is a new reference, or null with an exception set.
    let arr = unsafe { Bound::from_owned_ptr_or_err(py, raw)? };
    let ptr = arr.as_ptr().cast::<npyffi::PyArrayObject>();
    if empty {
        if !writable {
            // SAFETY: a live array just made, not yet shared: `PyArray_CLEARFLAGS`.
            unsafe { (*ptr).flags &= !NPY_ARRAY_WRITEABLE };
        }
        return Ok(arr);
    }
    // SAFETY: `arr` does not own its data; `PyArray_SetBaseObject` steals the new reference to
    // `base`, which keeps the memory alive for the array's life.
    if unsafe { PY_ARRAY_API.PyArray_SetBaseObject(py, ptr, base.clone().into_ptr()) } != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(arr)
}

/// A 1-D uint8 view of the `nbytes` bytes of `arr` from its first element (no copy), writable
/// when `arr` is (an empty one always is). `nbytes` must be within the array's extent (checked: `ValueError`), which
/// negative strides have none of.
pub fn flat_bytes<'py>(
    arr: &Bound<'py, PyUntypedArray>,
    nbytes: u64,
) -> PyResult<Bound<'py, PyArray1<u8>>> {
    let py = arr.py();
    let item = arr.dtype().itemsize();
    let reach = extent(arr.shape(), arr.strides(), item);
    let n = usize::try_from(nbytes)
        .ok()
        .filter(|&n| reach.is_some_and(|r| n <= r));
    let Some(n) = n else {
        return Err(PyValueError::new_err(format!(
            "{nbytes} bytes are not within the array's extent ({reach:?} bytes from its first element)"
        )));
    };
    let ptr = arr.as_array_ptr();
    // SAFETY: `arr` is a live array: its data pointer and flags are readable fields.
    let (data, writable) = unsafe {
        (
            (*ptr).data as usize,
            (*ptr).flags & NPY_ARRAY_WRITEABLE != 0,
        )
    };
    // No bytes: an empty array of its own, writable.
    let writable = writable || n == 0;
    // SAFETY: the `n` bytes from the first element lie within the array's memory (its extent,
    // checked above), which the array, as the new array's base, keeps alive; writes only where
    // the array allows them.
    let out = unsafe { array_over(arr.as_any(), data, dtype::<u8>(py), &[n], &[1], writable)? };
    Ok(out.cast_into::<PyArray1<u8>>()?)
}

/// A numpy array of `descr` over the bytes of host window `win` (no copy), laid out as its
/// tensor, with `base` (the object holding the window) as its base; read-only unless `writable`.
/// `ValueError` when the layout or the dtype's item size does not fit the window's bytes.
pub fn array_over_window<'py>(
    base: &Bound<'py, PyAny>,
    win: &HostWindow,
    writable: bool,
    descr: Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyAny>> {
    let g = &win.geometry;
    let item = usize::try_from(g.dtype().size()).ok();
    let bad = |what: &str| PyValueError::new_err(format!("host window: {what}"));
    if item != Some(descr.itemsize()) {
        return Err(bad("the dtype's item size is not the tensor's"));
    }
    let item = descr.itemsize();
    let shape = g
        .shape()
        .iter()
        .map(|&n| usize::try_from(n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad("shape too large"))?;
    let strides = g
        .strides()
        .iter()
        .map(|&s| {
            isize::try_from(s)
                .ok()
                .and_then(|s| s.checked_mul(isize::try_from(item).ok()?))
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("strides too large"))?;
    let within = win
        .offset
        .checked_add(win.len)
        .is_some_and(|end| end <= win.mem.len());
    let fits = extent(&shape, &strides, item).is_some_and(|e| e <= win.len);
    if !within || !fits {
        return Err(bad("the tensor's elements reach past its bytes"));
    }
    let data = win
        .mem
        .owned_addr()
        .and_then(|a| a.checked_add(win.offset))
        .ok_or_else(|| state_err("host window over revocable memory"))?;
    // SAFETY: the window owns its `len` bytes at `data` for its life (`owned_addr`), the
    // elements lie within them (checked above), and `base`, which holds the window, becomes the
    // new array's base; writes only where the caller allows them.
    unsafe { array_over(base, data, descr, &shape, &strides, writable) }
}

/// CPython's `int f(void)` finalization flag: `Py_IsFinalizing` (3.13 on) or `_Py_IsFinalizing`
/// (before), looked up in the running process once; `None` where neither is exported.
type Flag = unsafe extern "C" fn() -> c_int;

fn finalizing_flag() -> Option<Flag> {
    static FLAG: OnceLock<Option<Flag>> = OnceLock::new();
    *FLAG.get_or_init(|| {
        let this = libloading::os::unix::Library::this();
        let found = [&b"Py_IsFinalizing\0"[..], &b"_Py_IsFinalizing\0"[..]]
            .into_iter()
            // SAFETY: where the process exports these names they are CPython's `int f(void)`
            // finalization flag; the pointer is copied out of the symbol and stays valid for
            // the process's life (the executable, or libpython, is never unloaded).
            .find_map(|name| unsafe { this.get::<Flag>(name) }.ok().map(|s| *s));
        // The handle of the running program: nothing to close.
        std::mem::forget(this);
        found
    })
}

/// Whether the interpreter hosting this process is finalizing; `None` when the process exports
/// no such flag. Needs no GIL.
pub fn python_finalizing() -> Option<bool> {
    // SAFETY: an `int f(void)` reading one field of CPython's runtime state, documented as
    // callable from any thread without the GIL (`Py_IsFinalizing`, 3.13), as its private
    // predecessor is.
    finalizing_flag().map(|f| unsafe { f() } != 0)
}
