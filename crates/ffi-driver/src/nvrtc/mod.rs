//! NVRTC, the CUDA runtime compiler (`nvrtc.h`), opened at run time with `dlopen`, never linked.
//! Rooms: [`sys`] (signatures, result codes), [`loading`] (finding the libraries, their
//! function tables, the search order), [`choice`] (which of them compiles for the driver and
//! device at hand, and for which target); this file is the safe compiler.
//!
//! * [`choice::choose`] finds every NVRTC (see [`loading`] for the order), asks each for its
//!   version and architectures, and keeps the newest the driver can use ([`Nvrtc::open`]: the
//!   newest, for no particular driver).
//! * [`Nvrtc::compile`] compiles one source to a CUBIN ([`Target::Cubin`], falling back to PTX
//!   for the matching virtual architecture when the library has no CUBIN calls or refuses them)
//!   or to PTX ([`Target::Ptx`]). Every program is destroyed on every path (a guard), and a
//!   failed compilation is a [`CompileError`] carrying the compiler's log.
//! * NVRTC works without a GPU or a driver: nothing here touches `libcuda`.
//!
//! Concurrency: calls on distinct programs may run on several threads at once with the CUDA 12
//! and 13 libraries; an older library (found under the bare `libnvrtc.so`) is conservatively
//! given one compilation at a time.

pub mod choice;
pub mod loading;
pub mod sys;

use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use choice::{choose, Candidate, Choice};
pub use loading::{
    DEFAULT_TOOLKIT_LIB_DIR, ENV_NVRTC_LIB, NVRTC_LIB_NAMES, TOOLKIT_ENVS, WHEEL_LIB_SUBDIRS,
};
pub use sys::nvrtc_code_name;

use crate::loader::{LoadError, VendorLib};
use loading::{Found, NvrtcFns};
use sys::{NvrtcGetBytesFn, NvrtcGetSizeFn, NvrtcProgram, NVRTC_SUCCESS};

/// The largest output (PTX, CUBIN or log) accepted from NVRTC; a larger size is taken for a
/// broken library rather than allocated.
pub const MAX_OUTPUT_BYTES: usize = 1 << 30;

/// What to compile for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Machine code for `sm_{major}{minor}` (`--gpu-architecture=sm_XY`); PTX for
    /// `compute_XY` when the library cannot produce a CUBIN.
    Cubin { major: u32, minor: u32 },
    /// PTX for `compute_{major}{minor}` (`--gpu-architecture=compute_XY`).
    Ptx { major: u32, minor: u32 },
    /// Machine code for `sm_{major}{minor}a` (`--gpu-architecture=sm_XYa`): the
    /// architecture-specific features (Hopper's `wgmma` and TMA on `sm_90a`); it runs only on a
    /// device of exactly that capability, and is never replaced by PTX.
    ArchSpecific { major: u32, minor: u32 },
}

impl Target {
    /// The compute capability `(major, minor)`.
    pub fn capability(self) -> (u32, u32) {
        match self {
            Target::Cubin { major, minor }
            | Target::Ptx { major, minor }
            | Target::ArchSpecific { major, minor } => (major, minor),
        }
    }

    /// The architecture's name: `sm_90`, `compute_90` or `sm_90a`.
    pub fn arch(self) -> String {
        let (major, minor) = self.capability();
        match self {
            Target::Cubin { .. } => format!("sm_{major}{minor}"),
            Target::Ptx { .. } => format!("compute_{major}{minor}"),
            Target::ArchSpecific { .. } => format!("sm_{major}{minor}a"),
        }
    }

    /// The `--gpu-architecture` option this target compiles with.
    pub fn arch_option(self) -> String {
        format!("--gpu-architecture={}", self.arch())
    }

    /// In words, for messages: `cubin sm_90`, or `PTX compute_90 (...)`.
    pub fn describe(self) -> String {
        match self {
            Target::Cubin { .. } | Target::ArchSpecific { .. } => format!("cubin {}", self.arch()),
            Target::Ptx { .. } => format!(
                "PTX {} (the driver compiles it for the device when it loads it)",
                self.arch()
            ),
        }
    }
}

/// What an [`Image`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// Machine code (an ELF), for `cuModuleLoadData`.
    Cubin,
    /// PTX text, NUL-terminated, for `cuModuleLoadData` (the driver JIT-compiles it).
    Ptx,
}

/// A compiled program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The CUBIN, or the PTX with exactly one trailing NUL.
    pub bytes: Vec<u8>,
    pub kind: ImageKind,
    /// The compiler's log (warnings), empty when it had nothing to say.
    pub log: String,
}

/// A compilation that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    /// An NVRTC call returned an error. For `nvrtcCompileProgram` the log holds the compiler's
    /// diagnostics (a syntax error in the user's source shows there).
    #[error(
        "{call} failed with code {code} ({code_name}) for NVRTC program `{program}`{}",
        log_suffix(.log)
    )]
    Nvrtc {
        call: &'static str,
        code: i32,
        code_name: String,
        program: String,
        log: String,
    },
    /// An argument NVRTC cannot take (a NUL inside the source or an option, an option that
    /// fights the target), refused before any call.
    #[error("cannot compile NVRTC program `{program}`: invalid {what}: {detail}")]
    Input {
        program: String,
        what: &'static str,
        detail: String,
    },
    /// An NVRTC call reported success with an unusable result (a null program, a size that is
    /// zero or too large).
    #[error("{call} returned success for NVRTC program `{program}` but {detail}")]
    Inconsistent {
        call: &'static str,
        program: String,
        detail: String,
    },
}

fn log_suffix(log: &str) -> String {
    let log = log.trim_end();
    if log.is_empty() {
        String::new()
    } else {
        format!("; compiler log:\n{log}")
    }
}

impl CompileError {
    /// The compiler's log, empty when there is none (only [`CompileError::Nvrtc`] has one).
    pub fn log(&self) -> &str {
        match self {
            CompileError::Nvrtc { log, .. } => log,
            _ => "",
        }
    }
}

/// The NVRTC library, opened and checked. See the module docs.
pub struct Nvrtc {
    lib: VendorLib,
    /// The file it was loaded from (see [`Nvrtc::library`]).
    file: &'static str,
    f: NvrtcFns,
    version: (i32, i32),
    /// `nvrtcGetSupportedArchs`, when the library has it (CUDA 11.2 and later).
    archs: Option<Vec<u32>>,
    /// Held around each compilation when the library predates CUDA 12 (see the module docs).
    serial: Option<Mutex<()>>,
}

impl fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvrtc")
            .field("library", &self.file)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// One NVRTC program, destroyed when dropped.
struct Program<'a> {
    f: &'a NvrtcFns,
    raw: NvrtcProgram,
    name: &'a str,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `nvrtcResult nvrtcDestroyProgram(nvrtcProgram *)` on the non-null program
        // `nvrtcCreateProgram` returned; this guard is its only owner and drops once.
        let r = unsafe { (self.f.destroy_program)(&mut self.raw) };
        if r != NVRTC_SUCCESS {
            log::warn!(
                "nvrtcDestroyProgram failed with code {r} ({}) for NVRTC program `{}`",
                nvrtc_code_name(r),
                self.name
            );
        }
    }
}

/// Why a size-then-bytes read failed.
enum ReadError {
    /// The call returned this code.
    Call(&'static str, c_int),
    /// The call succeeded with an unusable size.
    Size(&'static str, String),
}

/// The C strings of one compilation, checked for interior NULs.
struct Inputs {
    source: CString,
    name: CString,
    options: Vec<CString>,
}

impl Nvrtc {
    /// Finds every NVRTC (see [`loading`] for the order) and opens the newest: the choice of
    /// [`choice::choose`] for no particular driver or device. The error lists every path tried
    /// and how to fix the search.
    pub fn open(extra_dirs: &[PathBuf]) -> Result<Arc<Nvrtc>, LoadError> {
        Ok(Arc::clone(&choose(extra_dirs, None, None)?.nvrtc))
    }

    /// Checks a library the search opened: it answers `nvrtcVersion` (and, where it has it,
    /// `nvrtcGetSupportedArchs`).
    pub(crate) fn from_found(found: Found) -> Result<Nvrtc, LoadError> {
        let Found { lib, f, file } = found;
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: `nvrtcResult nvrtcVersion(int *major, int *minor)` with two live ints.
        let r = unsafe { (f.version)(&mut major, &mut minor) };
        if r != NVRTC_SUCCESS {
            return Err(LoadError::Init {
                library: lib.path.to_string(),
                call: NvrtcFns::NAMES.version.to_string(),
                code: i64::from(r),
                code_name: code_name(&f, r),
                detail: "the library does not report its version".to_string(),
            });
        }
        let archs = supported_archs(&f);
        log::debug!(
            "NVRTC {major}.{minor} opened from {} (architectures {archs:?})",
            lib.path
        );
        Ok(Nvrtc {
            lib,
            file,
            f,
            version: (major, minor),
            archs,
            serial: (major < 12).then(|| Mutex::new(())),
        })
    }

    /// The architectures the library can target (`90` for `sm_90`), ascending, when it says
    /// (`nvrtcGetSupportedArchs`).
    pub fn archs(&self) -> Option<&[u32]> {
        self.archs.as_deref()
    }

    /// The library's version `(major, minor)` (`nvrtcVersion`), e.g. `(13, 0)`.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Where the library came from: the path (or name) it was opened by, or, for a copy the
    /// process had already loaded, the file the dynamic loader recorded for it.
    pub fn library(&self) -> &str {
        self.file
    }

    /// Whether the library has the CUBIN calls (`nvrtcGetCUBINSize`, `nvrtcGetCUBIN`).
    pub fn has_cubin(&self) -> bool {
        self.f.get_cubin_size.is_some() && self.f.get_cubin.is_some()
    }

    /// Compiles `source` (CUDA C++; kernels meant to be looked up by name should be
    /// `extern "C" __global__`) as program `name` (used in diagnostics) with `options` (NVRTC
    /// options such as `-default-device` or `--std=c++17`; the architecture comes from
    /// `target`, so `--gpu-architecture` / `-arch` options are refused).
    ///
    /// [`Target::Cubin`] returns a CUBIN when the library can produce one, else PTX for the
    /// matching `compute_XY` (the image's `kind` says which); [`Target::Ptx`] returns PTX.
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        options: &[String],
        target: Target,
    ) -> Result<Image, CompileError> {
        let inputs = prepare(source, name, options, target)?;
        let (major, minor) = target.capability();
        let _serial = self
            .serial
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
        match target {
            Target::Ptx { .. } => self.build(&inputs, name, target, ImageKind::Ptx),
            Target::ArchSpecific { .. } => self.build(&inputs, name, target, ImageKind::Cubin),
            Target::Cubin { .. } => {
                if self.has_cubin() {
                    match self.build(&inputs, name, target, ImageKind::Cubin) {
                        Err(CompileError::Nvrtc { call, code, .. })
                            if call == NvrtcFns::NAMES.get_cubin_size
                                || call == NvrtcFns::NAMES.get_cubin =>
                        {
                            log::debug!(
                                "{call} refused with code {code} ({}) for NVRTC program \
                                 `{name}`; compiling PTX for compute_{major}{minor} instead",
                                nvrtc_code_name(code)
                            );
                        }
                        Err(CompileError::Inconsistent { call, detail, .. })
                            if call == NvrtcFns::NAMES.get_cubin_size =>
                        {
                            log::debug!(
                                "{call} gave no CUBIN ({detail}) for NVRTC program `{name}`; \
                                 compiling PTX for compute_{major}{minor} instead"
                            );
                        }
                        other => return other,
                    }
                } else {
                    log::debug!(
                        "{} has no nvrtcGetCUBIN; compiling PTX for compute_{major}{minor}",
                        self.lib.path
                    );
                }
                let ptx = Target::Ptx { major, minor };
                self.build(&inputs, name, ptx, ImageKind::Ptx)
            }
        }
    }

    /// Creates, compiles and reads one program; the guard destroys it on every path.
    fn build(
        &self,
        inputs: &Inputs,
        name: &str,
        target: Target,
        kind: ImageKind,
    ) -> Result<Image, CompileError> {
        let f = &self.f;
        let names = NvrtcFns::NAMES;
        let fail = |call: &'static str, code: c_int, log: String| CompileError::Nvrtc {
            call,
            code,
            code_name: code_name(f, code),
            program: name.to_string(),
            log,
        };
        let mut raw: NvrtcProgram = std::ptr::null_mut();
        // SAFETY: `nvrtcCreateProgram(nvrtcProgram *, const char *src, const char *name, int,
        // const char * const *, const char * const *)` with a live out-pointer, two
        // NUL-terminated strings that outlive the call, and no headers (0, NULL, NULL).
        let r = unsafe {
            (f.create_program)(
                &mut raw,
                inputs.source.as_ptr(),
                inputs.name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != NVRTC_SUCCESS {
            return Err(fail(names.create_program, r, String::new()));
        }
        if raw.is_null() {
            return Err(CompileError::Inconsistent {
                call: names.create_program,
                program: name.to_string(),
                detail: "the program is null".to_string(),
            });
        }
        let prog = Program { f, raw, name };

        let arch = CString::new(target.arch_option()).map_err(|_| CompileError::Input {
            program: name.to_string(),
            what: "target",
            detail: format!("{target:?}"),
        })?;
        let ptrs: Vec<*const c_char> = std::iter::once(arch.as_ptr())
            .chain(inputs.options.iter().map(|o| o.as_ptr()))
            .collect();
        let count = c_int::try_from(ptrs.len()).map_err(|_| CompileError::Input {
            program: name.to_string(),
            what: "options",
            detail: format!("{} options are more than NVRTC takes", inputs.options.len()),
        })?;
        // SAFETY: `nvrtcCompileProgram(nvrtcProgram, int, const char * const *)` on the live
        // program with `count` pointers to NUL-terminated strings (`arch`, `inputs.options`)
        // that outlive the call.
        let r = unsafe { (f.compile_program)(prog.raw, count, ptrs.as_ptr()) };
        let log = self.log(&prog);
        if r != NVRTC_SUCCESS {
            return Err(fail(names.compile_program, r, log));
        }

        let (size_fn, size_name, get_fn, get_name) = match kind {
            ImageKind::Ptx => (
                Some(f.get_ptx_size),
                names.get_ptx_size,
                Some(f.get_ptx),
                names.get_ptx,
            ),
            ImageKind::Cubin => (
                f.get_cubin_size,
                names.get_cubin_size,
                f.get_cubin,
                names.get_cubin,
            ),
        };
        let (Some(size_fn), Some(get_fn)) = (size_fn, get_fn) else {
            return Err(CompileError::Inconsistent {
                call: size_name,
                program: name.to_string(),
                detail: "the library does not export it".to_string(),
            });
        };
        let mut bytes = match read(&prog, (size_name, size_fn), (get_name, get_fn)) {
            Ok(b) => b,
            Err(ReadError::Call(call, code)) => return Err(fail(call, code, log)),
            Err(ReadError::Size(call, detail)) => {
                return Err(CompileError::Inconsistent {
                    call,
                    program: name.to_string(),
                    detail,
                })
            }
        };
        if kind == ImageKind::Ptx {
            // Exactly one trailing NUL, whatever the library wrote.
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            bytes.truncate(end);
            bytes.push(0);
        }
        Ok(Image { bytes, kind, log })
    }

    /// The program's log (empty when there is none); a failure to read it is described in the
    /// text instead, so that it never hides the error being reported.
    fn log(&self, prog: &Program<'_>) -> String {
        let names = NvrtcFns::NAMES;
        let size = (names.get_program_log_size, self.f.get_program_log_size);
        let get = (names.get_program_log, self.f.get_program_log);
        match read(prog, size, get) {
            Ok(bytes) => {
                let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                String::from_utf8_lossy(&bytes[..end])
                    .trim_end()
                    .to_string()
            }
            Err(ReadError::Call(call, code)) => format!(
                "(log unavailable: {call} failed with code {code} ({}))",
                code_name(&self.f, code)
            ),
            Err(ReadError::Size(call, detail)) => {
                format!("(log unavailable: {call} returned success but {detail})")
            }
        }
    }
}

/// Checks the arguments of [`Nvrtc::compile`] and makes their C strings.
fn prepare(
    source: &str,
    name: &str,
    options: &[String],
    target: Target,
) -> Result<Inputs, CompileError> {
    let input = |what: &'static str, detail: String| CompileError::Input {
        program: name.to_string(),
        what,
        detail,
    };
    let (major, minor) = target.capability();
    if major == 0 || minor > 9 {
        return Err(input(
            "target",
            format!(
                "compute capability {major}.{minor} (the major version must be at least 1 and \
                 the minor a single digit)"
            ),
        ));
    }
    if let Some(o) = options
        .iter()
        .find(|o| o.starts_with("-arch") || o.starts_with("--gpu-architecture"))
    {
        return Err(input(
            "option",
            format!("`{o}`: the target ({target:?}) sets the architecture"),
        ));
    }
    let c = |what: &'static str, s: &str| {
        CString::new(s).map_err(|e| {
            input(
                what,
                format!("it contains a NUL byte at offset {}", e.nul_position()),
            )
        })
    };
    Ok(Inputs {
        source: c("source", source)?,
        name: c("program name", name)?,
        options: options
            .iter()
            .map(|o| c("option", o))
            .collect::<Result<_, _>>()?,
    })
}

/// Reads one output of `prog` with its size call then its bytes call. A zero size is an error
/// (the caller decides what it means); a size over [`MAX_OUTPUT_BYTES`], or one that cannot be
/// allocated, too.
fn read(
    prog: &Program<'_>,
    (size_name, size_fn): (&'static str, NvrtcGetSizeFn),
    (get_name, get_fn): (&'static str, NvrtcGetBytesFn),
) -> Result<Vec<u8>, ReadError> {
    let mut size: usize = 0;
    // SAFETY: `nvrtcResult (nvrtcProgram, size_t *)` on the live program with a live out-size.
    let r = unsafe { size_fn(prog.raw, &mut size) };
    if r != NVRTC_SUCCESS {
        return Err(ReadError::Call(size_name, r));
    }
    if size == 0 {
        return Err(ReadError::Size(size_name, "the size is 0".to_string()));
    }
    if size > MAX_OUTPUT_BYTES {
        return Err(ReadError::Size(
            size_name,
            format!("the size {size} exceeds the {MAX_OUTPUT_BYTES}-byte limit"),
        ));
    }
    let mut buf: Vec<u8> = Vec::new();
    buf.try_reserve_exact(size)
        .map_err(|e| ReadError::Size(size_name, format!("{size} bytes: {e}")))?;
    buf.resize(size, 0);
    // SAFETY: `nvrtcResult (nvrtcProgram, char *)` writes the `size` bytes the size call just
    // reported for this program (which nothing else touches meanwhile) into a buffer of exactly
    // that many initialized bytes.
    let r = unsafe { get_fn(prog.raw, buf.as_mut_ptr().cast::<c_char>()) };
    if r != NVRTC_SUCCESS {
        return Err(ReadError::Call(get_name, r));
    }
    Ok(buf)
}

/// What `ptxas` says of one compiled entry (NVRTC's log with `--ptxas-options=-v`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub entry: String,
    /// The architecture it was compiled for (`sm_90`).
    pub arch: String,
    pub registers: u32,
    pub barriers: u32,
    pub stack_bytes: u64,
    pub spill_store_bytes: u64,
    pub spill_load_bytes: u64,
}

impl Resources {
    /// Whether the entry spills registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_store_bytes > 0 || self.spill_load_bytes > 0
    }
}

/// The resources of every entry a verbose `ptxas` log (`--ptxas-options=-v`) describes, in log
/// order; lines it does not know are skipped.
pub fn resources(log: &str) -> Vec<Resources> {
    let number_before = |text: &str, word: &str| -> Option<u64> {
        let at = text.find(word)?;
        text[..at].split_whitespace().last()?.parse().ok()
    };
    let mut out: Vec<Resources> = Vec::new();
    // The function whose properties the next "bytes stack frame" line gives: the current entry,
    // or a device function it calls (whose lines are not the entry's).
    let mut properties_of = String::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            properties_of = rest.trim().to_string();
            continue;
        }
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let entry = parts.next().unwrap_or_default().to_string();
            let arch = parts.nth(1).unwrap_or_default().to_string();
            out.push(Resources {
                entry,
                arch,
                ..Resources::default()
            });
            continue;
        }
        let Some(r) = out.last_mut() else {
            continue;
        };
        if line.contains("bytes stack frame") {
            if properties_of != r.entry {
                continue;
            }
            r.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
            r.spill_store_bytes = number_before(line, "bytes spill stores").unwrap_or(0);
            r.spill_load_bytes = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used ") && line.contains(" registers") {
            let used = line.split("Used ").nth(1).unwrap_or_default();
            r.registers = number_before(used, "registers").map_or(0, |n| n as u32);
            r.barriers = line
                .split("used ")
                .nth(1)
                .and_then(|t| number_before(t, "barriers"))
                .map_or(0, |n| n as u32);
        }
    }
    out
}

/// `nvrtcGetSupportedArchs`, when the library has it and answers sensibly (at most 256
/// architectures, each positive).
fn supported_archs(f: &NvrtcFns) -> Option<Vec<u32>> {
    let (num, get) = (f.get_num_supported_archs?, f.get_supported_archs?);
    let mut n: c_int = 0;
    // SAFETY: `nvrtcResult nvrtcGetNumSupportedArchs(int *)` with a live int.
    if unsafe { num(&mut n) } != NVRTC_SUCCESS || !(1..=256).contains(&n) {
        return None;
    }
    let mut v: Vec<c_int> = vec![0; n as usize];
    // SAFETY: `nvrtcResult nvrtcGetSupportedArchs(int *)` writes exactly the count the call
    // above reported into a buffer of that many ints.
    if unsafe { get(v.as_mut_ptr()) } != NVRTC_SUCCESS {
        return None;
    }
    let mut archs: Vec<u32> = v.iter().filter_map(|&a| u32::try_from(a).ok()).collect();
    archs.retain(|&a| a > 0);
    archs.sort_unstable();
    (!archs.is_empty()).then_some(archs)
}

/// The name of `code`: the library's own (`nvrtcGetErrorString`), else the `nvrtc.h` table.
fn code_name(f: &NvrtcFns, code: c_int) -> String {
    // SAFETY: `const char *nvrtcGetErrorString(nvrtcResult)` takes any value and returns a
    // static string (or, defensively, null, handled below).
    let p = unsafe { (f.get_error_string)(code) };
    if p.is_null() {
        return nvrtc_code_name(code).to_string();
    }
    // SAFETY: non-null: a NUL-terminated string with static lifetime inside the library, which
    // is never unloaded; copied out at once.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    if s.is_empty() {
        nvrtc_code_name(code).to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests;
