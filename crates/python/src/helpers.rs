//! What the bindings leave to Python (`simpler._arrays`, `simpler._cuda`): dtypes from numpy and
//! ml_dtypes, copies and write-backs of odd layouts, per-task columns, the torch, ctypes and
//! CuPy adapters, file lookups. Handed to the native module once, when the package is imported
//! (`install_helpers`). The
//! native module never imports its own package: a module that imports `simpler._core` alone
//! gets a clear error at the first call that needs one of these.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::errors::state_err;

/// Declares the helpers: one field per function, and `install_helpers` taking each by keyword.
macro_rules! helpers {
    ($($name:ident: $doc:literal,)*) => {
        /// The Python functions the bindings call.
        pub struct Helpers {
            $(#[doc = $doc] pub $name: Py<PyAny>,)*
        }

        /// Hands the native module the Python helpers it calls (``simpler._arrays`` does this
        /// once, at import). A second call is ignored.
        #[pyfunction]
        #[allow(clippy::too_many_arguments)] // one keyword per helper
        #[pyo3(signature = (*, $($name),*))]
        pub fn install_helpers(py: Python<'_>, $($name: Py<PyAny>),*) {
            let _ = HELPERS.set(py, Helpers { $($name),* });
        }
    };
}

helpers! {
    dtype_name: "`(dtype) -> str`: numpy's name of a dtype-like object.",
    np_dtype: "`(name) -> numpy dtype` (ml_dtypes' for bfloat16 and the fp8 kinds).",
    nvrtc_dirs: "`() -> list[str]`: folders of the NVRTC wheels found on `sys.path`.",
    device_array: "`(kind, DeviceArray) -> array`: a CuPy array or a torch tensor over it.",
    host_array: "`(value, what) -> value`: a torch tensor as a numpy view; else unchanged.",
    host_scalar: "`(value) -> value`: a ctypes number as its Python value; else unchanged.",
}

static HELPERS: PyOnceLock<Helpers> = PyOnceLock::new();

/// The installed helpers.
pub fn get(py: Python<'_>) -> PyResult<&Helpers> {
    HELPERS.get(py).ok_or_else(|| {
        state_err("simpler._core is used through the simpler package: import simpler first")
    })
}

/// Calls the helper `which` picks with `args`, counted as a run's Python code (see
/// `shutdown.rs`): a helper runs Python bytecode, which may let the GIL go, and a thread that
/// takes it back after the interpreter finalized must not be inside native frames.
pub fn call1<'py>(
    py: Python<'py>,
    which: impl FnOnce(&Helpers) -> &Py<PyAny>,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    let f = which(get(py)?).bind(py);
    let _in_python = crate::shutdown::enter_python(py);
    f.call1(args)
}
