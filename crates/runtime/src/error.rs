//! Runtime errors. Each names what a user needs to act: the tensor, the device address, the
//! size, the phase of the run, and (through [`DeviceError`]) the driver call and its code.

use std::fmt;

use simpler_driver::DeviceError;

/// A step of the run cycle, or a worker operation outside a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Bind,
    Orchestrate,
    Execute,
    CopyBack,
    Cleanup,
    /// `ResidentTaskArgs.add` (resident setup).
    ResidentAdd,
    /// `ResidentTaskArgs.release`.
    Release,
    /// `Worker.close`.
    Close,
    /// `Worker.malloc` / `free` / `copy_to` / `copy_from`.
    Buffer,
}

impl Phase {
    /// The name used in messages and reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Bind => "bind",
            Phase::Orchestrate => "orchestrate",
            Phase::Execute => "execute",
            Phase::CopyBack => "copy_back",
            Phase::Cleanup => "cleanup",
            Phase::ResidentAdd => "resident_add",
            Phase::Release => "release",
            Phase::Close => "close",
            Phase::Buffer => "buffer",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that can go wrong in the runtime.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A driver call failed.
    #[error("[{phase}] {}{source}", .tensor.as_ref().map(|t| format!("tensor {t}: ")).unwrap_or_default())]
    Device {
        phase: Phase,
        tensor: Option<String>,
        #[source]
        source: Box<DeviceError>,
    },
    /// A size, offset, stride or index computation overflowed or left its bounds.
    #[error("geometry error for {what}: {detail}")]
    Geometry { what: String, detail: String },
    /// An access to a device address that no host view covers.
    #[error("no host view for device address {addr:#x} ({bytes} bytes): {detail}")]
    NoHostView {
        addr: u64,
        bytes: u64,
        detail: String,
    },
    /// A bad argument value (maps to `ValueError`).
    #[error("{0}")]
    Value(String),
    /// An argument of the wrong kind (maps to `TypeError`).
    #[error("{0}")]
    Type(String),
    /// An operation invalid in the current state: use after free/release/close, a second run on
    /// a busy worker, an access from a finished run.
    #[error("{0}")]
    State(String),
    /// An orchestrator access that would see bytes a submitted task has not produced yet.
    #[error("{0}")]
    Hazard(String),
    /// A kernel's device code could not be compiled (the compiler's log is in `detail`), or
    /// the compiler could not be found.
    #[error("device code {entry}: {detail}")]
    Compile { entry: String, detail: String },
}

impl Error {
    /// The one refusal of a host array whose bytes are not its elements in order (`layout`
    /// describes what it got): resident fixtures and whole-buffer copies need C-contiguous
    /// arrays in native byte order.
    pub fn not_contiguous(what: &dyn std::fmt::Display, layout: &dyn std::fmt::Display) -> Error {
        Error::Value(format!(
            "{what}: array must be C-contiguous in native byte order ({layout}); use \
             np.ascontiguousarray"
        ))
    }

    /// A driver error in `phase`, for `tensor` if known.
    pub fn device(phase: Phase, tensor: Option<&str>, source: DeviceError) -> Error {
        Error::Device {
            phase,
            tensor: tensor.map(str::to_owned),
            source: Box::new(source),
        }
    }

    /// A failed access to host memory (a view, a mirror, a copy) of `tensor`.
    pub fn host(tensor: &str, e: simpler_driver::HostMemError) -> Error {
        Error::Value(format!("tensor {tensor}: host view access failed: {e}"))
    }

    /// A failed orchestrator access of `bytes` at device address `addr` through a host view of
    /// `tensor`: a view that is no longer there is `NoHostView`.
    pub fn host_view(
        tensor: &str,
        addr: u64,
        bytes: u64,
        e: simpler_driver::HostMemError,
    ) -> Error {
        match e {
            simpler_driver::HostMemError::Revoked => Error::NoHostView {
                addr,
                bytes,
                detail: format!("tensor {tensor}: its host mapping was torn down"),
            },
            other => Error::Value(format!(
                "tensor {tensor}: host view access failed ({bytes} bytes at {addr:#x}): {other}"
            )),
        }
    }

    /// A geometry error.
    pub fn geometry(what: impl Into<String>, detail: impl Into<String>) -> Error {
        Error::Geometry {
            what: what.into(),
            detail: detail.into(),
        }
    }
}

/// Shorthand.
pub type Result<T, E = Error> = std::result::Result<T, E>;
