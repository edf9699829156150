//! Device drivers for simpler.
//!
//! This crate holds the workspace's `unsafe` code for devices: raw host memory ([`HostMem`]) and,
//! for vendor backends, foreign function calls into libraries opened at run time. It knows
//! nothing of Python. Everything above it is safe Rust over the [`Device`] trait defined here:
//! the runtime core forbids `unsafe`, and the bindings allow it in one module of theirs, for the
//! interpreter's C API (DLPack capsules).
//!
//! Backends:
//! * [`sim`] — host memory standing in for device memory, with device addresses in a distinct,
//!   non-dereferenceable range, a mapping policy, poison fill, fault injection and counters.

pub mod ascend;
pub mod cuda;
mod device;
mod error;
pub mod fork;
mod hostmem;
mod ledger;
mod loader;
pub mod model;
pub mod nvrtc;
mod open;
mod sessions;
pub mod sim;

pub use device::{
    CallRecord, CloseReport, DevPtr, Device, FuncId, FuncLimits, GraphId, LaunchCall, LaunchDims,
    MapGrant, ModuleId, Stats,
};
pub use error::{codes, DeviceError, Op, Status};
pub use hostmem::{host_page_size, HostMem, HostMemError};
pub use ledger::{traced, Ledger, Ledgered, Outcome};
pub use loader::{LoadAttempt, LoadError};
pub use model::CostModel;
pub use open::{open_device, DeviceSpec, OpenError, PLATFORMS};
pub use sessions::{
    hold_close, release_sessions, release_sessions_of, session_counts, CloseHold, ReleaseReport,
};

/// The byte that never-written memory holds: the sim fills fresh allocations with it, and the
/// runtime fills staged outputs and scratch tensors with it at the start of every run (a host
/// memset on sim, a device memset on the vendor drivers).
pub const POISON: u8 = 0xA5;

/// CUDA's legacy default stream (`CU_STREAM_LEGACY`), as [`Device::wait_for_stream`] and
/// [`Device::order_stream`] take it: where torch and CuPy run unless told otherwise, and the
/// stream that waits for every blocking stream of the context.
pub const LEGACY_STREAM: u64 = 1;
