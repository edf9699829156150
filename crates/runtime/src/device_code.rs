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
    /// Compile source for the device's architecture-specific target (`sm_90a` on a 9.0
    /// device: Hopper's `wgmma` and TMA), which runs on exactly that capability.
    pub arch_specific: bool,
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
            arch_specific: false,
        })
    }

    /// Scalar `i` of a task, `v`, as its row holds it: in its declared kind (or its own kind,
    /// for code that declares none), refused when the value does not fit that kind.
    #[inline]
    pub(crate) fn encode_scalar(&self, i: usize, v: Value) -> Result<u64> {
        let kind = match &self.scalars {
            Some(k) => k[i],
            None => ScalarKind::of(v),
        };
        kind.encode(v).map_err(|why| {
            Error::Value(format!(
                "kernel {}: scalar {i} travels as {} to its device code, but {why}",
                self.name,
                kind.name()
            ))
        })
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

/// Compiles per process: `(source, options, NVRTC library, target)` -> image.
type CompileKey = (String, Vec<String>, String, nvrtc::Target);
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

/// An image ready to load, and how it was made (for the error of a load the driver refuses).
struct Made {
    image: Arc<Vec<u8>>,
    how: String,
}

/// The image of `code` for a device of capability `cc` under a driver of CUDA version
/// `driver`: compiled by the NVRTC [`nvrtc::choose`] keeps for them (or found in the process's
/// cache) for source, as given otherwise.
fn image_for(
    code: &DeviceCode,
    cc: (u32, u32),
    driver: Option<(u32, u32)>,
    nvrtc_dirs: &[PathBuf],
) -> Result<Made> {
    let (text, options) = match &code.image {
        CodeImage::Ptx(b) => {
            return Ok(Made {
                image: Arc::new(b.clone()),
                how: "the PTX the kernel carries".to_string(),
            })
        }
        CodeImage::Cubin(b) => {
            return Ok(Made {
                image: Arc::new(b.clone()),
                how: "the cubin the kernel carries".to_string(),
            })
        }
        CodeImage::Source { text, options } => (text, options),
    };
    let fail = |detail: String| Error::Compile {
        entry: code.entry.clone(),
        detail,
    };
    let choice = nvrtc::choose(nvrtc_dirs, driver, Some(cc)).map_err(|e| fail(e.to_string()))?;
    let chosen = choice.target.unwrap_or(nvrtc::Target::Cubin {
        major: cc.0,
        minor: cc.1,
    });
    let target = if code.arch_specific {
        match chosen {
            nvrtc::Target::Cubin { major, minor } => nvrtc::Target::ArchSpecific { major, minor },
            other => {
                return Err(fail(format!(
                    "arch_specific code needs a cubin for sm_{}{}a, and {} can only make {}",
                    cc.0,
                    cc.1,
                    choice.nvrtc.library(),
                    other.describe()
                )))
            }
        }
    } else {
        chosen
    };
    let (major, minor) = choice.nvrtc.version();
    let how = format!(
        "{} by NVRTC {major}.{minor} ({}){}",
        target.describe(),
        choice.nvrtc.library(),
        driver.map_or_else(String::new, |(a, b)| format!(", for CUDA driver {a}.{b}"))
    );
    let key: CompileKey = (
        text.clone(),
        options.clone(),
        choice.nvrtc.library().to_string(),
        target,
    );
    let cached = COMPILED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&key).cloned());
    if let Some(image) = cached {
        COMPILE_HITS.fetch_add(1, Ordering::Relaxed);
        return Ok(Made { image, how });
    }
    let image = choice
        .nvrtc
        .compile(text, &code.name, options, target)
        .map_err(|e| fail(format!("{e} ({how})")))?;
    COMPILES.fetch_add(1, Ordering::Relaxed);
    let image = Arc::new(image.bytes);
    COMPILED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, image.clone());
    Ok(Made { image, how })
}

/// What compiling a source for a device shows (see [`compile_report`]).
#[derive(Debug, Clone)]
pub struct CompileReport {
    /// The NVRTC choice, in one line.
    pub nvrtc: String,
    /// What was compiled for: `sm_90`, `compute_90`, `sm_90a`.
    pub target: String,
    /// `"cubin"` or `"ptx"`.
    pub kind: &'static str,
    /// The image's size.
    pub bytes: usize,
    /// The compiler's log (ptxas' resource lines included).
    pub log: String,
    /// What ptxas says of each entry (empty for PTX: ptxas did not run).
    pub kernels: Vec<nvrtc::Resources>,
}

/// Compiles `source` (named `name` in messages) with `options` for a device of capability
/// `cc` under a driver of CUDA version `driver`, with the NVRTC a worker would use
/// ([`nvrtc::choose`]), asking ptxas for its resource lines (`--ptxas-options=-v`): registers,
/// stack and spills per entry. No device is needed. `arch_specific` compiles for `sm_XYa`.
pub fn compile_report(
    source: &str,
    name: &str,
    options: &[String],
    cc: (u32, u32),
    driver: Option<(u32, u32)>,
    arch_specific: bool,
    nvrtc_dirs: &[PathBuf],
) -> Result<CompileReport> {
    let fail = |detail: String| Error::Compile {
        entry: name.to_string(),
        detail,
    };
    let choice = nvrtc::choose(nvrtc_dirs, driver, Some(cc)).map_err(|e| fail(e.to_string()))?;
    let mut target = choice.target.unwrap_or(nvrtc::Target::Cubin {
        major: cc.0,
        minor: cc.1,
    });
    if arch_specific {
        match target {
            nvrtc::Target::Cubin { major, minor } => {
                target = nvrtc::Target::ArchSpecific { major, minor };
            }
            other => {
                return Err(fail(format!(
                    "arch_specific code needs a cubin for sm_{}{}a, and {} can only make {}",
                    cc.0,
                    cc.1,
                    choice.nvrtc.library(),
                    other.describe()
                )))
            }
        }
    }
    let mut opts = options.to_vec();
    if !opts
        .iter()
        .any(|o| o.starts_with("--ptxas-options") || o.starts_with("-Xptxas"))
    {
        opts.push("--ptxas-options=-v".to_string());
    }
    let image = choice
        .nvrtc
        .compile(source, name, &opts, target)
        .map_err(|e| fail(e.to_string()))?;
    let kind = match image.kind {
        nvrtc::ImageKind::Cubin => "cubin",
        nvrtc::ImageKind::Ptx => "ptx",
    };
    Ok(CompileReport {
        nvrtc: choice.summary(),
        target: target.arch(),
        kind,
        bytes: image.bytes.len(),
        kernels: nvrtc::resources(&image.log),
        log: image.log,
    })
}

/// The least bytes of a page-locked task-row buffer.
const ROW_BUFFER_MIN: u64 = 64 << 10;

/// The worker's device-code state: programs loaded into its device, and the page-locked host
/// buffers its runs' task rows are written into (the device regions they are uploaded into
/// belong to the plans kept for warm rounds: `run/plan_cache.rs`).
#[derive(Debug, Default)]
pub(crate) struct Launcher {
    loaded: Vec<(u64, FuncId, Arc<DeviceCode>)>,
    /// Modules loaded, one per distinct image (the entries of one source share its module),
    /// kept when resolving an entry failed (a retry reuses it).
    modules: Vec<(Arc<Vec<u8>>, simpler_driver::ModuleId)>,
    /// The launch limits of each loaded function (its `FuncId`), read once; the dynamic shared
    /// memory it was opted in to is kept up to date.
    limits: HashMap<u64, simpler_driver::FuncLimits>,
    /// The page-locked buffers cold plans write their task rows into, taken in turn
    /// ([`Launcher::row_buffer`]).
    row_buffers: [Option<Arc<simpler_driver::HostMem>>; 2],
    row_turn: usize,
}

impl Launcher {
    /// The next page-locked row buffer (`Device::alloc_mirror`), of at least `need` bytes. The
    /// two buffers are taken in turn, so a plan writes its rows while the previous plan's
    /// asynchronous uploads may still be reading the other one; the plan before that one has
    /// run by then (its run waited for the device). A buffer too small is replaced.
    pub fn row_buffer(
        &mut self,
        dev: &dyn Device,
        need: u64,
    ) -> std::result::Result<Arc<simpler_driver::HostMem>, simpler_driver::HostMemError> {
        let turn = self.row_turn;
        self.row_turn ^= 1;
        if let Some(b) = &self.row_buffers[turn] {
            if b.len() as u64 >= need {
                return Ok(b.clone());
            }
        }
        self.release_row_buffer(dev, turn);
        let len = usize::try_from(need.max(ROW_BUFFER_MIN))
            .map_err(|_| simpler_driver::HostMemError::Alloc(usize::MAX))?;
        let b = dev.alloc_mirror(len)?;
        self.row_buffers[turn] = Some(b.clone());
        Ok(b)
    }

    /// Releases both row buffers (the device ran every upload from them: the caller waited).
    pub fn release_row_buffers(&mut self, dev: &dyn Device) {
        self.release_row_buffer(dev, 0);
        self.release_row_buffer(dev, 1);
    }

    fn release_row_buffer(&mut self, dev: &dyn Device, turn: usize) {
        if let Some(old) = self.row_buffers[turn].take() {
            if let Err(e) = dev.free_mirror(&old) {
                log::warn!("releasing a task-row buffer: {e}");
            }
        }
    }

    /// The resolved function of program `key`, and the program, when it is loaded.
    pub fn get(&self, key: u64) -> Option<(FuncId, &Arc<DeviceCode>)> {
        self.loaded
            .iter()
            .find(|(k, _, _)| *k == key)
            .map(|(_, f, c)| (*f, c))
    }

    /// Loads `code` into `dev` unless it is loaded already (its image, or an identical one), or
    /// `dev` runs no device code.
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
        let cc = dev.compute_capability().map_err(in_kernel)?;
        let made = image_for(code, cc, dev.driver_version(), nvrtc_dirs)?;
        let same = |m: &Arc<Vec<u8>>| Arc::ptr_eq(m, &made.image) || **m == *made.image;
        let module = match self.modules.iter().find(|(m, _)| same(m)) {
            Some((_, m)) => *m,
            None => {
                let m = dev.load_module(&made.image).map_err(|mut e| {
                    let driver = dev
                        .driver_version()
                        .map_or("unknown".to_string(), |(a, b)| format!("CUDA {a}.{b}"));
                    e.detail = format!(
                        "{} (the image: {}; the device: compute capability {}.{}, driver {driver})",
                        e.detail, made.how, cc.0, cc.1
                    );
                    in_kernel(e)
                })?;
                self.modules.push((made.image, m));
                m
            }
        };
        let func = dev.function(module, &code.entry).map_err(in_kernel)?;
        self.loaded.push((code.key, func, code.clone()));
        Ok(())
    }

    /// Checks a launch of loaded `code` with `dims` against the device's limits for its
    /// function (threads per block; dynamic shared memory), and opts the function in to more
    /// than the default 48 KiB of dynamic shared memory when the launch asks for it and the
    /// device allows it (once per function and size). Nothing for code not loaded here.
    pub fn fit(
        &mut self,
        dev: &dyn Device,
        code: &DeviceCode,
        dims: LaunchDims,
        who: &dyn std::fmt::Display,
    ) -> Result<()> {
        let Some((func, _)) = self.get(code.key) else {
            return Ok(());
        };
        let in_kernel = |mut e: simpler_driver::DeviceError| {
            e.detail = format!("{who}: device code {}: {}", code.entry, e.detail);
            Error::device(Phase::Orchestrate, None, e)
        };
        let lim = match self.limits.get(&func.0) {
            Some(l) => *l,
            None => {
                let l = dev.function_limits(func).map_err(in_kernel)?;
                self.limits.insert(func.0, l);
                l
            }
        };
        let threads = dims.block.iter().map(|&b| u64::from(b)).product::<u64>();
        if threads > u64::from(lim.max_threads) {
            return Err(Error::Value(format!(
                "{who}: block {:?} has {threads} threads, and `{}` can be launched with at most \
                 {} per block on this device (its __launch_bounds__, or what its {} registers \
                 per thread leave)",
                dims.block, code.entry, lim.max_threads, lim.registers
            )));
        }
        if dims.shared_bytes > lim.dynamic_shared {
            if dims.shared_bytes > lim.dynamic_shared_optin {
                return Err(Error::Value(format!(
                    "{who}: {} bytes of dynamic shared memory, and `{}` may use at most {} on \
                     this device (its limit per block, less the {} bytes the code declares \
                     statically)",
                    dims.shared_bytes, code.entry, lim.dynamic_shared_optin, lim.static_shared
                )));
            }
            dev.allow_dynamic_shared(func, dims.shared_bytes)
                .map_err(in_kernel)?;
            if let Some(l) = self.limits.get_mut(&func.0) {
                l.dynamic_shared = dims.shared_bytes;
            }
        }
        Ok(())
    }

    /// Forgets every loaded program (the device closed, which unloaded them).
    pub fn forget(&mut self) {
        self.loaded.clear();
        self.modules.clear();
        self.limits.clear();
    }
}
