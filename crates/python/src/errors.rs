//! The exception hierarchy, declared here (the native module imports nothing from `simpler`;
//! `simpler.errors` re-exports these classes), and the mapping of each runtime error to the class
//! that means it.
//!
//! Where a Python user expects a built-in category a class also derives from it (`ArgumentError`
//! is a `ValueError`, `ArgumentTypeError` a `TypeError`), so the classes are made with `type()`
//! (several bases) once, when the module is first imported.

use pyo3::exceptions::{PyException, PyLookupError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::BoundObject;

use simpler_runtime::Error;

use crate::logging;

/// The classes, in declaration order (a class's bases come before it).
#[derive(Clone, Copy)]
pub enum Exc {
    Simpler,
    Argument,
    ArgumentType,
    Geometry,
    State,
    Hazard,
    NoHostView,
    PlatformUnavailable,
    Device,
    Compile,
}

/// A base of a declared class: one declared before it, or a built-in category.
enum Base {
    Own(Exc),
    Builtin(fn(Python<'_>) -> Bound<'_, PyType>),
}

struct Declared {
    name: &'static str,
    bases: &'static [Base],
    doc: &'static str,
    /// Attributes that default to `None` on the class (set on instances by `to_py`).
    attrs: &'static [&'static str],
}

const CLASSES: [Declared; 10] = [
    Declared {
        name: "SimplerError",
        bases: &[Base::Builtin(|py| py.get_type::<PyException>())],
        doc: "Base class of every simpler error.",
        attrs: &[],
    },
    Declared {
        name: "ArgumentError",
        bases: &[
            Base::Own(Exc::Simpler),
            Base::Builtin(|py| py.get_type::<PyValueError>()),
        ],
        doc: "A bad argument value: wrong count, bad index, a tensor larger than its buffer...",
        attrs: &[],
    },
    Declared {
        name: "ArgumentTypeError",
        bases: &[
            Base::Own(Exc::Simpler),
            Base::Builtin(|py| py.get_type::<PyTypeError>()),
        ],
        doc: "An argument of the wrong kind: unsupported dtype, a float where an int is needed...",
        attrs: &[],
    },
    Declared {
        name: "GeometryError",
        bases: &[Base::Own(Exc::Argument)],
        doc: "A shape, stride, offset or size computation overflowed or is invalid for the tensor.",
        attrs: &[],
    },
    Declared {
        name: "StateError",
        bases: &[
            Base::Own(Exc::Simpler),
            Base::Builtin(|py| py.get_type::<PyRuntimeError>()),
        ],
        doc: "An operation invalid in the current state: use after free, release or close; a \
              busy worker.",
        attrs: &[],
    },
    Declared {
        name: "HazardError",
        bases: &[
            Base::Own(Exc::Simpler),
            Base::Builtin(|py| py.get_type::<PyRuntimeError>()),
        ],
        doc: "An orchestrator access to bytes that a task submitted earlier in the run reads or \
              writes.",
        attrs: &[],
    },
    Declared {
        name: "NoHostViewError",
        bases: &[
            Base::Own(Exc::Simpler),
            Base::Builtin(|py| py.get_type::<PyLookupError>()),
        ],
        doc: "An access to a device address that no host view of the run covers.\n\n\
              Attributes:\n    addr, nbytes: the device address and size of the access.",
        attrs: &["addr", "nbytes"],
    },
    Declared {
        name: "PlatformUnavailableError",
        bases: &[
            Base::Own(Exc::Simpler),
            Base::Builtin(|py| py.get_type::<PyRuntimeError>()),
        ],
        doc: "The platform's vendor library is missing or failed to initialize.",
        attrs: &[],
    },
    Declared {
        name: "DeviceError",
        bases: &[
            Base::Own(Exc::Simpler),
            Base::Builtin(|py| py.get_type::<PyRuntimeError>()),
        ],
        doc: "A driver call failed.\n\n\
              Attributes:\n    \
              op: the driver operation (``alloc``, ``free``, ``h2d``, ``d2h``, ``map``, \
              ``unmap``, ``memset``, ``pin``, ``unpin``, ``module``, ``launch``, ``sync``).\n    \
              code: the driver's status code; ``code_name`` its symbolic name.\n    \
              call: the vendor (or sim) function that failed.\n    \
              phase: where it happened (``bind``, ``orchestrate``, ``execute``, ``copy_back``,\n        \
              ``cleanup``, ``resident_add``, ``release``, ``close``, ``buffer``).\n    \
              tensor: the tensor being handled, if any.\n    \
              addr, nbytes: the device address and size involved, if known.",
        attrs: &[
            "op",
            "code",
            "code_name",
            "call",
            "phase",
            "tensor",
            "addr",
            "nbytes",
        ],
    },
    Declared {
        name: "CompileError",
        bases: &[
            Base::Own(Exc::Simpler),
            Base::Builtin(|py| py.get_type::<PyRuntimeError>()),
        ],
        doc: "A kernel's device code did not compile (the message carries the compiler's log), or \
              the compiler (NVRTC) could not be found (the message lists where it looked).",
        attrs: &[],
    },
];

static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn types(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    TYPES.get_or_try_init(py, || {
        let mut made: Vec<Py<PyType>> = Vec::with_capacity(CLASSES.len());
        let type_ = py.get_type::<PyType>();
        for c in &CLASSES {
            let bases: Vec<Bound<'_, PyType>> = c
                .bases
                .iter()
                .map(|b| match b {
                    Base::Own(e) => made[*e as usize].bind(py).clone(),
                    Base::Builtin(f) => f(py),
                })
                .collect();
            let ns = PyDict::new(py);
            ns.set_item("__doc__", c.doc)?;
            // Where users import them from (and where pickle finds them).
            ns.set_item("__module__", "simpler.errors")?;
            for a in c.attrs {
                ns.set_item(*a, py.None())?;
            }
            let t = type_.call1((c.name, PyTuple::new(py, bases)?, ns))?;
            made.push(t.cast_into::<PyType>()?.unbind());
        }
        Ok::<_, PyErr>(made)
    })
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for (c, t) in CLASSES.iter().zip(types(py)?) {
        m.add(c.name, t.bind(py))?;
    }
    Ok(())
}

impl Exc {
    /// A new exception of this class with `msg`.
    pub fn err(self, msg: impl Into<String>) -> PyErr {
        let msg = msg.into();
        Python::attach(|py| match types(py) {
            Ok(t) => PyErr::from_type(t[self as usize].bind(py).clone(), msg),
            // Declared at import, so only reachable if that failed: the reason is the error.
            Err(e) => e,
        })
    }
}

/// A runtime error on its way to Python (`?` converts it once wrapped; see [`PyResultExt`]).
pub struct PyRuntimeErr(pub Error);

impl From<Error> for PyRuntimeErr {
    fn from(e: Error) -> Self {
        PyRuntimeErr(e)
    }
}

impl From<PyRuntimeErr> for PyErr {
    fn from(e: PyRuntimeErr) -> PyErr {
        Python::attach(|py| to_py(py, e.0))
    }
}

/// `result.py()?`: a runtime result as a Python one.
pub trait PyResultExt<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> PyResultExt<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(|e| PyRuntimeErr(e).into())
    }
}

/// Flushes queued log records, then converts a runtime result.
pub fn done<T>(py: Python<'_>, r: Result<T, Error>) -> PyResult<T> {
    logging::flush(py);
    r.py()
}

/// Sets `attrs` on the instance of `err` (attributes a fresh instance of these classes takes).
fn with_attrs<'py>(
    err: PyErr,
    py: Python<'py>,
    attrs: impl IntoIterator<Item = (&'static str, PyResult<Bound<'py, PyAny>>)>,
) -> PyErr {
    let value = err.value(py);
    for (k, v) in attrs {
        if let Ok(v) = v {
            let _ = value.setattr(k, v);
        }
    }
    err
}

/// The Python exception for a runtime error.
pub fn to_py(py: Python<'_>, e: Error) -> PyErr {
    fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, v: T) -> PyResult<Bound<'py, PyAny>> {
        v.into_pyobject(py)
            .map(|o| o.into_any().into_bound())
            .map_err(Into::into)
    }
    let msg = e.to_string();
    match e {
        Error::Device {
            phase,
            tensor,
            source,
        } => with_attrs(
            Exc::Device.err(msg),
            py,
            [
                ("op", obj(py, source.op.name())),
                ("code", obj(py, source.code)),
                ("code_name", obj(py, source.code_name)),
                ("call", obj(py, source.call)),
                ("phase", obj(py, phase.name())),
                ("tensor", obj(py, tensor)),
                ("addr", obj(py, source.addr)),
                ("nbytes", obj(py, source.bytes)),
            ],
        ),
        Error::Geometry { .. } => Exc::Geometry.err(msg),
        Error::NoHostView { addr, bytes, .. } => with_attrs(
            Exc::NoHostView.err(msg),
            py,
            [("addr", obj(py, addr)), ("nbytes", obj(py, bytes))],
        ),
        Error::Value(_) => Exc::Argument.err(msg),
        Error::Type(_) => Exc::ArgumentType.err(msg),
        Error::State(_) => Exc::State.err(msg),
        Error::Hazard(_) => Exc::Hazard.err(msg),
        Error::Compile { .. } => Exc::Compile.err(msg),
        _ => Exc::Simpler.err(msg),
    }
}

/// An `ArgumentError` (a `ValueError`).
pub fn value_err(msg: impl Into<String>) -> PyErr {
    Exc::Argument.err(msg)
}

/// An `ArgumentTypeError` (a `TypeError`).
pub fn type_err(msg: impl Into<String>) -> PyErr {
    Exc::ArgumentType.err(msg)
}

/// A `StateError` (a `RuntimeError`).
pub fn state_err(msg: impl Into<String>) -> PyErr {
    Exc::State.err(msg)
}

/// The name of `obj`'s type, for "expected X, got Y" messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}
