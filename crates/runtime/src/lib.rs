//! The simpler runtime core: how the tensor arguments of a repeatedly dispatched device program
//! reach the device.
//!
//! * [`geometry`] — checked tensor geometry (numel, nbytes, byte extent, views, indices).
//! * [`dtype`] — element types and typed scalar access.
//! * [`arena`] — the retained staging arena's slice planning.
//! * [`views`] — the allocation-scoped host-view cache (mapping or mirror).
//! * [`worker`] — ownership: buffers, resident sets, the arena, the view cache, `close`.
//! * [`run`] — the run cycle and its report.
//!
//! No pyo3 here: the bindings crate maps these types to Python.

pub mod arena;
pub mod dtype;
pub mod error;
pub mod geometry;
pub mod run;
pub mod views;
pub mod worker;

pub use dtype::{DType, Value};
pub use error::{Error, Phase, Result};
pub use geometry::Geometry;
pub use run::{BindArg, Counters, HostWindow, Phases, RunReport};
pub use worker::{CloseSummary, Direction, Staging, Worker};
