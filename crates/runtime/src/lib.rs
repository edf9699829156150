//! The simpler runtime core: how the tensor arguments of a repeatedly dispatched device program
//! reach the device.
//!
//! * [`addr`] — tables keyed by device address.
//! * [`geometry`] — checked tensor geometry (numel, nbytes, byte extent, views, indices).
//! * [`dtype`] — element types and typed scalar access.
//! * [`spec`] — the typed boundary: directions, signatures, the arguments of a run.
//! * [`memory`] — the driver, the allocation table (owners, generations) and the view cache.
//! * [`views`] — the allocation-scoped host-view cache (mapping or mirror).
//! * [`staging`] — the staging mode and the retained staging arena.
//! * [`scratch`] — the retained scratch pool of run-scoped tensors.
//! * [`resident`] — resident sets (case-owned device buffers).
//! * [`run`] — the state and the phases of a run, and its report.
//! * [`worker`] — the owner of all of the above; the steps of a run.
//! * [`cycle`] — the one entry point that runs a call, phase by phase, under a guard.
//!
//! No pyo3 here: the bindings crate maps these types to Python.

pub mod addr;
pub mod cycle;
pub mod dtype;
pub mod error;
pub mod geometry;
pub mod memory;
pub mod resident;
pub mod run;
pub mod scratch;
pub mod spec;
pub mod staging;
pub mod views;
pub mod worker;

pub use cycle::{run, Orch, RunError, RunHost, WorkerCell};
pub use dtype::{DType, Value};
pub use error::{Error, Phase, Result};
pub use geometry::Geometry;
pub use run::{
    BatchScalar, BatchSlot, Counters, HostWindow, Phases, RunId, RunReport, TaskCall, TensorInfo,
};
pub use spec::{ArgValue, BufferRef, Direction, KernelRef, Param, RunArgSpec, RunCall, Signature};
pub use staging::Staging;
pub use worker::{CloseSummary, Worker};
