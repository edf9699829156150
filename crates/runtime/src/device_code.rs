//! Device code: the program a kernel carries for a device that runs device code (CUDA), and the
//! worker's table of the programs loaded into its device.
//!
//! A kernel's device code is CUDA C++ source (compiled with NVRTC for the device's compute
//! capability, once per process for each source, options and capability), or a PTX / cubin
//! image. A worker loads each program once into its device's context (`cuModuleLoadData`) and
//! resolves its entry; launches then go through the resolved function. On a device that does
//! not run device code (sim, ascend) nothing is loaded and the kernel's Python function runs.
//!
//! The argument ABI (`docs/device-kernels.md`): every entry takes one parameter, the device
//! address of its launch's first task row; a row is one 8-byte field per tensor (the device
//! address of the view's first element), per scalar (in its declared kind) and per launch
//! constant (int64).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use simpler_driver::nvrtc;
use simpler_driver::{Device, FuncId, LaunchDims};

use crate::dtype::Value;
use crate::error::{Error, Phase, Result};

/// How a kernel's device program is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodeImage {
    /// CUDA C++ source, compiled with NVRTC with these options (besides the architecture,
    /// which the runtime adds).
    Source { text: String, options: Vec<String> },
    /// PTX text.
    Ptx(Vec<u8>),
    /// A cubin (an ELF image for one architecture).
    Cubin(Vec<u8>),
}

/// How a scalar travels in a task row: 8 bytes, little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarKind {
    I64,
    U64,
    F64,
}

impl ScalarKind {
    /// Parses `"int64"`, `"uint64"` or `"float64"`.
    pub fn parse(name: &str) -> Option<ScalarKind> {
        match name {
            "int64" => Some(ScalarKind::I64),
            "uint64" => Some(ScalarKind::U64),
            "float64" => Some(ScalarKind::F64),
            _ => None,
        }
    }

    /// The name [`ScalarKind::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            ScalarKind::I64 => "int64",
            ScalarKind::U64 => "uint64",
            ScalarKind::F64 => "float64",
        }
    }

    /// The row field of `v`: its bits in this kind, or why it does not fit.
    pub fn encode(self, v: Value) -> std::result::Result<u64, String> {
        let exact_int = |f: f64| f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15;
        match (self, v) {
            (ScalarKind::I64, Value::Int(i)) => Ok(i as u64),
            (ScalarKind::I64, Value::UInt(u)) => i64::try_from(u)
                .map(|i| i as u64)
                .map_err(|_| format!("{u} does not fit int64")),
            (ScalarKind::I64, Value::Bool(b)) | (ScalarKind::U64, Value::Bool(b)) => {
                Ok(u64::from(b))
            }
            (ScalarKind::I64, Value::Float(f)) if exact_int(f) => Ok(f as i64 as u64),
            (ScalarKind::U64, Value::UInt(u)) => Ok(u),
            (ScalarKind::U64, Value::Int(i)) => {
                u64::try_from(i).map_err(|_| format!("{i} does not fit uint64"))
            }
            (ScalarKind::U64, Value::Float(f)) if exact_int(f) && f >= 0.0 => Ok(f as u64),
            (ScalarKind::I64 | ScalarKind::U64, Value::Float(f)) => {
                Err(format!("{f} is not an integer"))
            }
            (ScalarKind::F64, Value::Float(f)) => Ok(f.to_bits()),
            (ScalarKind::F64, Value::Int(i)) => Ok((i as f64).to_bits()),
            (ScalarKind::F64, Value::UInt(u)) => Ok((u as f64).to_bits()),
            (ScalarKind::F64, Value::Bool(b)) => Ok(f64::from(u8::from(b)).to_bits()),
        }
    }

    /// The kind a value travels in when the code declares none: its own.
    pub fn of(v: Value) -> ScalarKind {
        match v {
            Value::Int(_) | Value::Bool(_) => ScalarKind::I64,
            Value::UInt(_) => ScalarKind::U64,
            Value::Float(_) => ScalarKind::F64,
        }
    }
}

static NEXT_CODE: AtomicU64 = AtomicU64::new(1);

/// A kernel's device program. Built once (by the kernel) and shared; `key` identifies it in
/// each worker's table of loaded programs.
#[derive(Debug)]
pub struct DeviceCode {
    pub key: u64,
    /// The program's name (for NVRTC and messages): the kernel's.
    pub name: String,
    pub image: CodeImage,
    pub entry: String,
    /// The kind of each scalar in a task row; `None`: each value's own kind.
    pub scalars: Option<Vec<ScalarKind>>,
    /// The device code reads every view as row-major contiguous (only an address travels), so
    /// a submit of another layout is refused.
    pub contiguous: bool,
}

impl DeviceCode {
    /// A program; refuses an empty entry name or image.
    pub fn new(
        name: &str,
        image: CodeImage,
        entry: &str,
        scalars: Option<Vec<ScalarKind>>,
    ) -> Result<DeviceCode> {
        let what = format!("device code of kernel {name}");
        if entry.is_empty() || entry.contains('\0') {
            return Err(Error::Value(format!(
                "{what}: the entry must be a non-empty name without NUL bytes, not {entry:?}"
            )));
        }
        let empty = match &image {
            CodeImage::Source { text, .. } => text.trim().is_empty(),
            CodeImage::Ptx(b) | CodeImage::Cubin(b) => b.is_empty(),
        };
        if empty {
            return Err(Error::Value(format!("{what}: the program is empty")));
        }
        Ok(DeviceCode {
            key: NEXT_CODE.fetch_add(1, Ordering::Relaxed),
            name: name.to_owned(),
            image,
            entry: entry.to_owned(),
            scalars,
            contiguous: false,
        })
    }

    /// The row field of each scalar of one task, appended to `row`; the error names the kernel
    /// and the scalar.
    pub(crate) fn encode_scalars(&self, values: &[Value], row: &mut Vec<u64>) -> Result<()> {
        for (i, v) in values.iter().enumerate() {
            let kind = match &self.scalars {
                Some(k) => k[i],
                None => ScalarKind::of(*v),
            };
            let bits = kind.encode(*v).map_err(|why| {
                Error::Value(format!(
                    "kernel {}: scalar {i} travels as {} to its device code, but {why}",
                    self.name,
                    kind.name()
                ))
            })?;
            row.push(bits);
        }
        Ok(())
    }

    /// Checks a task's scalar count against the declared kinds.
    pub(crate) fn check_scalars(&self, who: &dyn std::fmt::Display, n: usize) -> Result<()> {
        match &self.scalars {
            Some(k) if k.len() != n => Err(Error::Value(format!(
                "{who}: its device code declares {} scalar(s) ({}), the task has {n}",
                k.len(),
                k.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
            ))),
            _ => Ok(()),
        }
    }
}

/// A device launch as a submit call gives it: the program, the per-task geometry and the launch
/// constants (evaluated once per submit call).
#[derive(Debug, Clone, Copy)]
pub struct DeviceLaunch<'a> {
    pub code: &'a Arc<DeviceCode>,
    pub dims: LaunchDims,
    pub consts: &'a [i64],
}

impl DeviceLaunch<'_> {
    /// Checks a submit call against the device code: the scalar count and kinds (every value
    /// must travel in its declared kind), the per-task geometry (every dimension >= 1, grid z
    /// at most 65535, shared memory), and, for code that reads contiguous views only, the
    /// views' layouts.
    pub(crate) fn check<'g>(
        &self,
        who: &dyn std::fmt::Display,
        scalars: &[crate::run::BatchScalar<'_>],
        views: impl Iterator<Item = &'g crate::geometry::Geometry>,
    ) -> Result<()> {
        use crate::run::BatchScalar;
        let d = self.dims;
        if d.grid.contains(&0) || d.block.contains(&0) || d.grid[2] > 65_535 {
            return Err(Error::Value(format!(
                "{who}: launch geometry grid {:?} block {:?}: every dimension must be >= 1 and \
                 grid z at most 65535",
                d.grid, d.block
            )));
        }
        if d.shared_bytes > MAX_SHARED_BYTES {
            return Err(Error::Value(format!(
                "{who}: {} bytes of dynamic shared memory: at most {MAX_SHARED_BYTES} (48 KiB; \
                 more needs a per-function opt-in the runtime does not make)",
                d.shared_bytes
            )));
        }
        self.code.check_scalars(who, scalars.len())?;
        if self.code.contiguous {
            if let Some((i, _)) = views.enumerate().find(|(_, g)| !g.is_contiguous()) {
                return Err(Error::Value(format!(
                    "{who}: tensor {i} is not a row-major contiguous view, and the device code \
                     `{}` reads only contiguous ones (only the address of a view's first element \
                     travels); pass a contiguous view, or declare the code contiguous=False and \
                     give it the layout",
                    self.code.entry
                )));
            }
        }
        let Some(kinds) = &self.code.scalars else {
            return Ok(());
        };
        for (i, (col, kind)) in scalars.iter().zip(kinds).enumerate() {
            let values: &[Value] = match col {
                BatchScalar::One(v) => std::slice::from_ref(v),
                BatchScalar::PerTask(v) => v,
            };
            for v in values {
                kind.encode(*v).map_err(|why| {
                    Error::Value(format!(
                        "{who}: scalar {i} travels as {} to the device code, but {why}",
                        kind.name()
                    ))
                })?;
            }
        }
        Ok(())
    }
}

/// Dynamic shared memory a launch may ask for without a per-function opt-in (48 KiB on every
/// CUDA architecture).
const MAX_SHARED_BYTES: u32 = 48 * 1024;

/// Compiles per process: `(source, options, capability)` -> image.
type CompileKey = (String, Vec<String>, (u32, u32));
static COMPILED: Mutex<Option<HashMap<CompileKey, Arc<Vec<u8>>>>> = Mutex::new(None);
static COMPILES: AtomicU64 = AtomicU64::new(0);
static COMPILE_HITS: AtomicU64 = AtomicU64::new(0);

/// `(compiles, cache hits)` of device-code source in this process.
pub fn compile_stats() -> (u64, u64) {
    (
        COMPILES.load(Ordering::Relaxed),
        COMPILE_HITS.load(Ordering::Relaxed),
    )
}

/// The image of `code` for a device of capability `cc`: compiled (or found in the process's
/// cache) for source, as given otherwise.
fn image_for(
    code: &DeviceCode,
    cc: (u32, u32),
    driver: Option<(u32, u32)>,
    nvrtc_dirs: &[PathBuf],
) -> Result<Arc<Vec<u8>>> {
    let (text, options) = match &code.image {
        CodeImage::Ptx(b) | CodeImage::Cubin(b) => return Ok(Arc::new(b.clone())),
        CodeImage::Source { text, options } => (text, options),
    };
    let key: CompileKey = (text.clone(), options.clone(), cc);
    let cached = COMPILED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&key).cloned());
    if let Some(image) = cached {
        COMPILE_HITS.fetch_add(1, Ordering::Relaxed);
        return Ok(image);
    }
    let fail = |detail: String| Error::Compile {
        entry: code.entry.clone(),
        detail,
    };
    let compiler = nvrtc::shared(nvrtc_dirs).map_err(|e| fail(e.to_string()))?;
    let (major, minor) = compiler.version();
    if let Some((d_major, d_minor)) = driver.filter(|d| (major.max(0) as u32) > d.0) {
        return Err(fail(format!(
            "NVRTC {major}.{minor} ({}) makes code for CUDA {major} drivers, and this driver is \
             CUDA {d_major}.{d_minor}: install the NVRTC of CUDA {d_major} (for CUDA 12, `pip \
             install nvidia-cuda-nvrtc-cu12`) or point SIMPLER_NVRTC_LIB at it",
            compiler.library()
        )));
    }
    let target = nvrtc::Target::Cubin {
        major: cc.0,
        minor: cc.1,
    };
    let image = compiler
        .compile(text, &code.name, options, target)
        .map_err(|e| fail(e.to_string()))?;
    COMPILES.fetch_add(1, Ordering::Relaxed);
    let image = Arc::new(image.bytes);
    COMPILED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, image.clone());
    Ok(image)
}

/// The worker's device-code state: programs loaded into its device, and the device buffer its
/// runs' task rows are uploaded into (kept across runs, grown when a run needs more).
#[derive(Debug, Default)]
pub(crate) struct Launcher {
    loaded: Vec<(u64, FuncId, Arc<DeviceCode>)>,
    /// Modules loaded per program, kept when resolving the entry failed (a retry reuses it).
    modules: Vec<(u64, simpler_driver::ModuleId)>,
    /// The task-row buffer: `(address, bytes)`.
    pub table: Option<(simpler_driver::DevPtr, u64)>,
    /// The rows of the run being executed (kept, so a warm run allocates nothing here).
    pub rows: Vec<u8>,
}

impl Launcher {
    /// The resolved function of program `key`, and the program, when it is loaded.
    pub fn get(&self, key: u64) -> Option<(FuncId, &Arc<DeviceCode>)> {
        self.loaded
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, f, c)| (*f, c))
    }

    /// Loads `code` into `dev` unless it is loaded already, or `dev` runs no device code.
    pub fn prepare(
        &mut self,
        dev: &dyn Device,
        code: &Arc<DeviceCode>,
        nvrtc_dirs: &[PathBuf],
    ) -> Result<()> {
        if !dev.runs_device_code() || self.get(code.key).is_some() {
            return Ok(());
        }
        let in_kernel = |mut e: simpler_driver::DeviceError| {
            e.detail = format!("device code of kernel {}: {}", code.name, e.detail);
            Error::device(Phase::Orchestrate, None, e)
        };
        let module = match self.modules.iter().find(|(k, _)| *k == code.key) {
            Some((_, m)) => *m,
            None => {
                let cc = dev.compute_capability().map_err(in_kernel)?;
                let image = image_for(code, cc, dev.driver_version(), nvrtc_dirs)?;
                let m = dev.load_module(&image).map_err(in_kernel)?;
                self.modules.push((code.key, m));
                m
            }
        };
        let func = dev.function(module, &code.entry).map_err(in_kernel)?;
        self.loaded.push((code.key, func, code.clone()));
        Ok(())
    }

    /// Forgets every loaded program (the device closed, which unloaded them).
    pub fn forget(&mut self) {
        self.loaded.clear();
        self.modules.clear();
        self.table = None;
    }
}
