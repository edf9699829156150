//! The typed description of a run, as a host hands it over: argument directions, kernel and
//! callable signatures, and the arguments of one run (host-staged arrays, device tensors,
//! scalars). The rules about their shape live here, once: tensors come before scalars, the tensor
//! count matches the signature, a tensor's dtype matches the one its signature entry names.

use std::sync::Arc;

use simpler_driver::DevPtr;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::geometry::Geometry;

/// Argument direction, from a signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    In,
    Out,
    InOut,
}

impl Direction {
    /// Whether the device may write it.
    pub fn writes(self) -> bool {
        !matches!(self, Direction::In)
    }
    /// Whether its host contents are uploaded.
    pub fn reads(self) -> bool {
        !matches!(self, Direction::Out)
    }
    /// `"IN"`, `"OUT"`, `"INOUT"`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::In => "IN",
            Direction::Out => "OUT",
            Direction::InOut => "INOUT",
        }
    }
    /// Parses `"IN"`, `"OUT"` or `"INOUT"` (any case).
    pub fn parse(s: &str) -> Result<Direction> {
        match s.to_ascii_uppercase().as_str() {
            "IN" => Ok(Direction::In),
            "OUT" => Ok(Direction::Out),
            "INOUT" => Ok(Direction::InOut),
            _ => Err(Error::Type(format!(
                "direction must be IN, OUT or INOUT, not '{s}'"
            ))),
        }
    }
}

/// One signature entry: a direction, and optionally the dtype the tensor must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    pub dir: Direction,
    pub dtype: Option<DType>,
}

/// The tensor parameters of a kernel or a callable, in order (scalars are not listed).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Signature {
    params: Vec<Param>,
}

impl Signature {
    /// A signature of `params`.
    pub fn new(params: Vec<Param>) -> Signature {
        Signature { params }
    }
    /// The entries, in order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }
    /// Number of tensor parameters.
    pub fn len(&self) -> usize {
        self.params.len()
    }
    /// Whether it takes no tensor.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Checks that `n` tensors match the signature's count; `who` names the caller.
    pub fn check_count(&self, who: &dyn std::fmt::Display, n: usize) -> Result<()> {
        if n != self.params.len() {
            return Err(Error::Value(format!(
                "{who}: signature has {} tensor arguments, got {n}",
                self.params.len()
            )));
        }
        Ok(())
    }

    /// Checks that tensor `i` (named `name`, of `dtype`) fits entry `i`; `who` names the caller
    /// (`"run paged_attention"`, `"submit qk"`).
    pub fn check_dtype(
        &self,
        who: &dyn std::fmt::Display,
        i: usize,
        name: &str,
        dtype: DType,
    ) -> Result<()> {
        match self.params.get(i).and_then(|p| p.dtype) {
            Some(want) if want != dtype => Err(Error::Type(format!(
                "{who}: tensor '{name}' is {}, signature wants {}",
                dtype.name(),
                want.name()
            ))),
            _ => Ok(()),
        }
    }
}

/// The work one task of a kernel does, as the kernel declares it (`sp.Kernel(work=...)`): what
/// a cost model prices its execution from. Bytes left undeclared are derived from the task's
/// views (the bytes each view holds, read if the kernel reads it, written if it writes it);
/// operations are only known when declared.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeclaredWork {
    pub bytes_read: Option<u64>,
    pub bytes_written: Option<u64>,
    pub flops: simpler_driver::model::Flops,
    /// The fraction of each model's device rates the kernel reaches, in parts per million, one
    /// entry per [`simpler_driver::model::MODELS`] name (0: not declared, the model's default).
    pub efficiency_ppm: [u32; simpler_driver::model::MODELS.len()],
}

impl DeclaredWork {
    /// The work `kernel` declares per task: bytes read and written (`None`: derived from the
    /// task's views) and operations by precision name (`"bf16"`, `"fp16"`, `"fp8"`, `"int8"`,
    /// `"fp32"`); an unknown or repeated precision is an error naming the kernel.
    pub fn new(
        kernel: &str,
        bytes_read: Option<u64>,
        bytes_written: Option<u64>,
        flops: &[(String, u64)],
    ) -> Result<DeclaredWork> {
        use simpler_driver::model::Precision;
        let mut out = DeclaredWork {
            bytes_read,
            bytes_written,
            ..DeclaredWork::default()
        };
        let mut seen = Vec::new();
        for (name, n) in flops {
            let p = Precision::parse(name).ok_or_else(|| {
                let known: Vec<&str> = Precision::ALL.iter().map(|p| p.name()).collect();
                Error::Value(format!(
                    "kernel {kernel}: work flops precision must be one of {}, not '{name}'",
                    known.join(", ")
                ))
            })?;
            if seen.contains(&p) {
                return Err(Error::Value(format!(
                    "kernel {kernel}: work flops names {name} twice"
                )));
            }
            seen.push(p);
            out.flops.set(p, *n);
        }
        Ok(out)
    }

    /// This work with the efficiency `kernel` declares per model (`(model name, fraction)`,
    /// the fraction in (0, 1]); an unknown or repeated model, or a fraction outside (0, 1], is
    /// an error naming the kernel.
    pub fn with_efficiency(
        mut self,
        kernel: &str,
        per_model: &[(String, f64)],
    ) -> Result<DeclaredWork> {
        use simpler_driver::model::MODELS;
        for (name, e) in per_model {
            let i = MODELS.iter().position(|m| m == name).ok_or_else(|| {
                Error::Value(format!(
                    "kernel {kernel}: work efficiency names a model of {}, not '{name}'",
                    MODELS.join(", ")
                ))
            })?;
            if !(e.is_finite() && *e > 0.0 && *e <= 1.0) {
                return Err(Error::Value(format!(
                    "kernel {kernel}: work efficiency for {name} must be in (0, 1], not {e}"
                )));
            }
            if self.efficiency_ppm[i] != 0 {
                return Err(Error::Value(format!(
                    "kernel {kernel}: work efficiency names {name} twice"
                )));
            }
            self.efficiency_ppm[i] = ((e * 1e6).round() as u32).max(1);
        }
        Ok(self)
    }

    /// The efficiency declared for `model`, if any.
    pub fn efficiency(&self, model: &str) -> Option<f64> {
        let i = simpler_driver::model::MODELS
            .iter()
            .position(|m| *m == model)?;
        let ppm = self.efficiency_ppm[i];
        (ppm > 0).then(|| f64::from(ppm) / 1e6)
    }
}

/// A kernel as the run cycle records it: the host's id for it, its name and its signature,
/// its device launch when it carries device code, and the work it declares.
#[derive(Debug, Clone, Copy)]
pub struct KernelRef<'a> {
    pub id: u32,
    pub name: &'a str,
    pub sig: &'a Signature,
    pub device: Option<crate::device_code::DeviceLaunch<'a>>,
    /// The host function takes device arrays (no host copies) where device memory is not host
    /// memory.
    pub device_arrays: bool,
    /// The work one task does, for a cost model (`None`: bytes derived from the views, no
    /// operations). Borrowed, so a `KernelRef` stays small to pass along.
    pub work: Option<&'a DeclaredWork>,
    /// The threads one task's launch runs (its grid times its block), wherever the kernel's
    /// launch function ran (sim included, where `device` is dropped): a cost model's fill.
    pub threads: Option<u64>,
}

/// A handle to a device allocation: the worker that made it, its base address and its
/// generation. Real drivers reuse addresses; the generation tells a handle to a freed allocation
/// from a newer one at the same address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferRef {
    pub worker: u64,
    pub ptr: DevPtr,
    pub gen: u64,
}

/// One argument of a run, as the host describes it.
#[derive(Debug, Clone)]
pub enum ArgValue {
    /// A host array, staged for this run. `geometry` has offset 0; the host lends its byte
    /// extent (`geometry.extent()` bytes from the first element) during bind and copy-back.
    /// `writable`: whether the host array may be written (copy back needs it).
    Staged { geometry: Geometry, writable: bool },
    /// A tensor over a device buffer: passed through, nothing staged.
    Device {
        buffer: BufferRef,
        geometry: Geometry,
    },
    /// A scalar (handed to the orchestration by the host; the runtime only checks its place).
    Scalar,
}

/// A named argument of a run.
#[derive(Debug, Clone)]
pub struct RunArgSpec {
    pub name: Arc<str>,
    pub value: ArgValue,
}

/// A run: the callable's name and signature, and its arguments in order.
#[derive(Debug, Clone, Copy)]
pub struct RunCall<'a> {
    pub callable: &'a str,
    pub sig: &'a Signature,
    pub args: &'a [RunArgSpec],
}

impl RunCall<'_> {
    /// Checks the arguments against the signature before any device work: tensors first, as
    /// many as the signature lists, each of the dtype its entry names. Returns the tensor count.
    pub fn validate(&self) -> Result<usize> {
        let who = format_args!("run {}", self.callable);
        let mut tensors = 0;
        let mut seen_scalar: Option<&str> = None;
        for a in self.args {
            let geometry = match &a.value {
                ArgValue::Scalar => {
                    seen_scalar.get_or_insert(&a.name);
                    continue;
                }
                ArgValue::Staged { geometry, .. } | ArgValue::Device { geometry, .. } => geometry,
            };
            if let Some(s) = seen_scalar {
                return Err(Error::Value(format!(
                    "{who}: tensor '{}' after scalar '{s}' (tensors come first)",
                    a.name
                )));
            }
            if let Some(p) = self.sig.params().get(tensors) {
                self.sig
                    .check_dtype(&who, tensors, &a.name, geometry.dtype())?;
                if let ArgValue::Staged {
                    writable: false, ..
                } = a.value
                {
                    if p.dir.writes() {
                        return Err(Error::Value(format!(
                            "{who}: tensor '{}' is {} but its array is read-only",
                            a.name,
                            p.dir.name()
                        )));
                    }
                }
            }
            tensors += 1;
        }
        self.sig.check_count(&who, tensors)?;
        Ok(tensors)
    }
}
