//! The simpler runtime core: how the tensor arguments of a repeatedly dispatched device program
//! reach the device.
//!
//! * [`geometry`] — checked tensor geometry (numel, nbytes, byte extent, views, indices).
//! * [`dtype`] — element types and typed scalar access.
//!
//! No pyo3 here: the bindings crate maps these types to Python.

pub mod dtype;
pub mod error;
pub mod geometry;

pub use dtype::{DType, Value};
pub use error::{Error, Phase, Result};
pub use geometry::Geometry;
