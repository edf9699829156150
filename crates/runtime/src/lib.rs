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
//! * [`pending`] — a run that did not wait for the device, and what waits for it.
//! * [`cycle`] — the one entry point that runs a call, phase by phase, under a guard.
//!
//! No pyo3 here: the bindings crate maps these types to Python. The modules are private; the
//! re-exports below are the crate's surface, and a run's steps are reachable only through
//! [`run`] and the orchestrator handle [`Orch`] it gives out.

// Unsafe code lives in the driver crate (`simpler-driver`) only: the compiler holds this one to
// that.
#![forbid(unsafe_code)]

mod addr;
mod cycle;
mod device_code;
mod dtype;
mod error;
mod exports;
mod geometry;
mod memory;
mod pending;
mod resident;
mod run;
mod scratch;
mod spec;
mod staging;
mod views;
mod worker;

// What embeddings (the bindings, the tests) use: the entry point and the handles it takes, the
// typed boundary, the worker's own surface (buffers, resident sets, views, close).
pub use cycle::{run, run_with, Orch, Outcome, RunError, RunHost, WorkerCell};
pub use device_code::{
    compile_report, compile_stats, CodeImage, CompileReport, DeviceCode, DeviceLaunch, ScalarKind,
};
pub use dtype::{DType, Value};
pub use error::{Error, Phase, Result};
pub use exports::ExportGuard;
pub use geometry::{Geometry, MAX_DIMS};
pub use run::{
    BatchScalar, BatchSlot, Counters, HostWindow, KernelCost, KernelModeled, ModeledRun, Phases,
    Replay, RunId, RunReport, TaskCall, TensorInfo, BATCH_PART, PLANS_KEPT,
};
pub use simpler_driver::LaunchDims;
pub use spec::{
    ArgValue, BufferRef, DeclaredWork, Direction, KernelRef, Param, RunArgSpec, RunCall, Signature,
};
pub use staging::Staging;
pub use views::ViewPolicy;
pub use worker::{CloseSummary, Worker};
