//! The NVRTC API exports, with their signatures from `nvrtc.h` (`nvrtcResult` is an `int`, 0
//! success), in the same library as the driver (link it as `libnvrtc.so` too).
//!
//! "Compiling" ([`compile`]) finds the `extern "C" __global__` entries of the source (comments
//! skipped, whitespace and newlines tolerated, `__launch_bounds__(...)` before or after `void`)
//! and counts their parameters (top-level commas; `()` and `(void)` are none). No entry, a
//! duplicate entry or an `#error` directive (even one `#if` would skip: there is no
//! preprocessor) fails with `NVRTC_ERROR_COMPILATION` and a log saying why; headers are
//! accepted but never read. The output is a module image ([`crate::image`]) for the recorded
//! `--gpu-architecture`/`-arch`, stamped with the NVRTC version; it is the PTX, and the CUBIN
//! too when the architecture is a real `sm_NN` target (otherwise `nvrtcGetCUBIN*` answer
//! `NVRTC_ERROR_INVALID_INPUT`, as NVRTC does). Output getters before a successful compile
//! answer `NVRTC_ERROR_INVALID_PROGRAM`; the log getters work at any time.
//!
//! The version (`version`) comes from the library's own file name when it was loaded as
//! `libnvrtc.so.<major>[.<minor>[.<patch>]]`, else from `FAKE_NVRTC_VERSION`, else 13.0; so a
//! test can load two copies of this file under two names and get two NVRTCs. It decides the
//! architectures `nvrtcCompileProgram` accepts ([`compile::supported_archs`]); any other
//! `--gpu-architecture` fails with `NVRTC_ERROR_INVALID_OPTION`.
//!
//! Every call is logged as `name args -> code` and can be failed by injection (by its C name);
//! NVRTC needs no `cuInit`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use fake_vendor::{c_text as text, FakeState};

use crate::image::{arch_version, Image};
use crate::{with_state, State};

pub mod compile;

/// `nvrtcResult` (`nvrtc.h`: an enum, passed as `int`).
#[allow(non_camel_case_types)] // the header's name
pub type nvrtcResult = c_int;
/// `nvrtcProgram` (`nvrtc.h`: an opaque `struct _nvrtcProgram *`).
#[allow(non_camel_case_types)] // the header's name
pub type nvrtcProgram = *mut c_void;

pub const NVRTC_SUCCESS: nvrtcResult = 0;
pub const NVRTC_ERROR_OUT_OF_MEMORY: nvrtcResult = 1;
pub const NVRTC_ERROR_PROGRAM_CREATION_FAILURE: nvrtcResult = 2;
pub const NVRTC_ERROR_INVALID_INPUT: nvrtcResult = 3;
pub const NVRTC_ERROR_INVALID_PROGRAM: nvrtcResult = 4;
pub const NVRTC_ERROR_INVALID_OPTION: nvrtcResult = 5;
pub const NVRTC_ERROR_COMPILATION: nvrtcResult = 6;

/// An NVRTC program.
pub struct Program {
    name: String,
    src: String,
    /// The output of the last compile, when it succeeded.
    image: Option<Image>,
    log: String,
}

/// The version the fake NVRTC reports when neither its file name nor `FAKE_NVRTC_VERSION` says.
const DEFAULT_VERSION: (c_int, c_int) = (13, 0);

/// `Dl_info` (`dlfcn.h`).
#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

extern "C" {
    /// `int dladdr(const void *addr, Dl_info *info)` (`dlfcn.h`).
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

/// The version a file name `libnvrtc.so.<major>[.<minor>[.<patch>]]` (any folder) says.
pub fn version_of_file(path: &str) -> Option<(c_int, c_int)> {
    let file = path.rsplit('/').next()?;
    let mut parts = file.strip_prefix("libnvrtc.so.")?.split('.');
    let major = parts.next()?.parse::<c_int>().ok()?;
    let minor = match parts.next() {
        Some(m) => m.parse::<c_int>().ok()?,
        None => 0,
    };
    match parts.next() {
        Some(p) if p.parse::<u32>().is_err() => return None,
        _ => {}
    }
    parts.next().is_none().then_some((major, minor))
}

/// The version this copy's file name says (found with `dladdr`), once.
fn file_version() -> Option<(c_int, c_int)> {
    static FOUND: OnceLock<Option<(c_int, c_int)>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let mut info = DlInfo {
            dli_fname: std::ptr::null(),
            dli_fbase: std::ptr::null_mut(),
            dli_sname: std::ptr::null(),
            dli_saddr: std::ptr::null_mut(),
        };
        let addr = nvrtcVersion as *const c_void;
        // SAFETY: `addr` is a function of this object; `info` is a valid out pointer.
        if unsafe { dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: `dladdr` set `dli_fname` to the object's NUL-terminated path name, which
        // lives as long as the object is loaded.
        let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
        version_of_file(&path)
    })
}

/// The version this NVRTC is: its file name's, else `FAKE_NVRTC_VERSION`'s (`"12.4"` or `"12"`,
/// read at each call; an invalid value is logged and ignored), else 13.0.
pub(crate) fn version(st: &mut State) -> (c_int, c_int) {
    if let Some(v) = file_version() {
        return v;
    }
    let Ok(v) = std::env::var("FAKE_NVRTC_VERSION") else {
        return DEFAULT_VERSION;
    };
    let t = v.trim();
    let (a, b) = t.split_once('.').unwrap_or((t, "0"));
    match (a.parse::<c_int>(), b.parse::<c_int>()) {
        (Ok(a), Ok(b)) if a > 0 && b >= 0 => (a, b),
        _ => {
            st.config_error(&format!("FAKE_NVRTC_VERSION={v:?}"));
            DEFAULT_VERSION
        }
    }
}

/// The injected failure of this call, if any (logged).
fn gate(st: &mut State, name: &str, args: &str) -> Option<nvrtcResult> {
    st.injections.take_logged(&mut st.log, name, args)
}

/// `nvrtcResult nvrtcVersion(int *major, int *minor)`: see the module docs.
///
/// # Safety
/// `major` and `minor` must be null or valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> nvrtcResult {
    with_state(|st| {
        let name = "nvrtcVersion";
        let v = version(st);
        let args = format!("{}.{}", v.0, v.1);
        if let Some(code) = gate(st, name, &args) {
            return code;
        }
        if major.is_null() || minor.is_null() {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_INPUT);
        }
        // SAFETY: both are non-null and, per the caller, valid for these writes.
        unsafe {
            major.write(v.0);
            minor.write(v.1);
        }
        st.ret(name, &args, NVRTC_SUCCESS)
    })
}

/// `nvrtcResult nvrtcGetNumSupportedArchs(int *numArchs)`: how many architectures this
/// version compiles for ([`compile::supported_archs`]).
///
/// # Safety
/// `num_archs` must be null or valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetNumSupportedArchs(num_archs: *mut c_int) -> nvrtcResult {
    with_state(|st| {
        let name = "nvrtcGetNumSupportedArchs";
        let archs = compile::supported_archs(version(st));
        let args = archs.len().to_string();
        if let Some(code) = gate(st, name, &args) {
            return code;
        }
        if num_archs.is_null() {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_INPUT);
        }
        // SAFETY: non-null and, per the caller, valid for this write.
        unsafe { num_archs.write(archs.len() as c_int) };
        st.ret(name, &args, NVRTC_SUCCESS)
    })
}

/// `nvrtcResult nvrtcGetSupportedArchs(int *supportedArchs)`: the architectures this version
/// compiles for, ascending (`NN` of `sm_NN`: 90 for 9.0).
///
/// # Safety
/// `supported_archs` must be null or valid for writes of `nvrtcGetNumSupportedArchs` `int`s.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetSupportedArchs(supported_archs: *mut c_int) -> nvrtcResult {
    with_state(|st| {
        let name = "nvrtcGetSupportedArchs";
        let archs = compile::supported_archs(version(st));
        let shown: Vec<String> = archs.iter().map(i32::to_string).collect();
        let args = shown.join(",");
        if let Some(code) = gate(st, name, &args) {
            return code;
        }
        if supported_archs.is_null() {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_INPUT);
        }
        // SAFETY: non-null and, per the caller, valid for `archs.len()` writes.
        unsafe { std::ptr::copy_nonoverlapping(archs.as_ptr(), supported_archs, archs.len()) };
        st.ret(name, &args, NVRTC_SUCCESS)
    })
}

/// `const char *nvrtcGetErrorString(nvrtcResult result)`: a static string
/// (`"NVRTC_ERROR unknown"` for an unknown code).
#[no_mangle]
pub extern "C" fn nvrtcGetErrorString(result: nvrtcResult) -> *const c_char {
    let s: &CStr = match result {
        NVRTC_SUCCESS => c"NVRTC_SUCCESS",
        NVRTC_ERROR_OUT_OF_MEMORY => c"NVRTC_ERROR_OUT_OF_MEMORY",
        NVRTC_ERROR_PROGRAM_CREATION_FAILURE => c"NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
        NVRTC_ERROR_INVALID_INPUT => c"NVRTC_ERROR_INVALID_INPUT",
        NVRTC_ERROR_INVALID_PROGRAM => c"NVRTC_ERROR_INVALID_PROGRAM",
        NVRTC_ERROR_INVALID_OPTION => c"NVRTC_ERROR_INVALID_OPTION",
        NVRTC_ERROR_COMPILATION => c"NVRTC_ERROR_COMPILATION",
        _ => c"NVRTC_ERROR unknown",
    };
    with_state(|st| st.ret("nvrtcGetErrorString", &result.to_string(), NVRTC_SUCCESS));
    s.as_ptr()
}

/// `nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int
/// numHeaders, const char * const *headers, const char * const *includeNames)`. A null `name`
/// is `default_program`.
///
/// # Safety
/// `prog` must be null or valid for a write of one handle; `src` and `name` null or
/// NUL-terminated; `headers` and `include_names` null or holding `num_headers` pointers, each
/// null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn nvrtcCreateProgram(
    prog: *mut nvrtcProgram,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> nvrtcResult {
    // SAFETY: per the caller.
    let (source, pname) = unsafe { (text(src), text(name)) };
    let pname = pname.unwrap_or_else(|| "default_program".into());
    with_state(|st| {
        let fname = "nvrtcCreateProgram";
        let args = format!("- {pname} headers={num_headers}");
        if let Some(code) = gate(st, fname, &args) {
            return code;
        }
        let headers_ok = match usize::try_from(num_headers) {
            Ok(0) => true,
            Ok(n) if !headers.is_null() && !include_names.is_null() => (0..n).all(|i| {
                // SAFETY: both arrays hold `n` pointers per the caller.
                unsafe { !(*headers.add(i)).is_null() && !(*include_names.add(i)).is_null() }
            }),
            _ => false,
        };
        let Some(source) = source.filter(|_| !prog.is_null() && headers_ok) else {
            return st.ret(fname, &args, NVRTC_ERROR_INVALID_INPUT);
        };
        let h = crate::new_handle(crate::PROGRAM_BASE);
        let p = Program {
            name: pname.clone(),
            src: source,
            image: None,
            log: String::new(),
        };
        st.programs.insert(h, p);
        // SAFETY: `prog` is non-null and, per the caller, valid for this write.
        unsafe { prog.write(h as nvrtcProgram) };
        st.ret(fname, &format!("{h:#x}{}", &args[1..]), NVRTC_SUCCESS)
    })
}

/// `nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog)`: nulls `*prog`.
///
/// # Safety
/// `prog` must be null or valid for a read and a write of one handle.
#[no_mangle]
pub unsafe extern "C" fn nvrtcDestroyProgram(prog: *mut nvrtcProgram) -> nvrtcResult {
    with_state(|st| {
        let name = "nvrtcDestroyProgram";
        if prog.is_null() {
            return st.ret(name, "(null)", NVRTC_ERROR_INVALID_INPUT);
        }
        // SAFETY: non-null and readable per the caller.
        let h = unsafe { prog.read() } as usize;
        let args = format!("{h:#x}");
        if let Some(code) = gate(st, name, &args) {
            return code;
        }
        if st.programs.remove(&h).is_none() {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_PROGRAM);
        }
        // SAFETY: non-null and writable per the caller.
        unsafe { prog.write(std::ptr::null_mut()) };
        st.ret(name, &args, NVRTC_SUCCESS)
    })
}

/// `nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char * const
/// *options)`: see the module docs; counts successful compiles.
///
/// # Safety
/// `options` must be null or hold `num_options` pointers, each null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn nvrtcCompileProgram(
    prog: nvrtcProgram,
    num_options: c_int,
    options: *const *const c_char,
) -> nvrtcResult {
    let n = usize::try_from(num_options).ok();
    let opts: Option<Vec<String>> = match n {
        Some(0) => Some(Vec::new()),
        Some(n) if !options.is_null() => (0..n)
            // SAFETY: `options` holds `n` pointers, each null or NUL-terminated, per the caller.
            .map(|i| unsafe { text(*options.add(i)) })
            .collect(),
        _ => None,
    };
    with_state(|st| {
        let name = "nvrtcCompileProgram";
        let h = prog as usize;
        let shown = opts.as_ref().map_or("?".into(), |o| o.join(" "));
        let args = format!("{h:#x} [{shown}]");
        if let Some(code) = gate(st, name, &args) {
            return code;
        }
        if !st.programs.contains_key(&h) {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_PROGRAM);
        }
        let Some(opts) = opts else {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_INPUT);
        };
        let v = version(st);
        let Some(p) = st.programs.get_mut(&h) else {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_PROGRAM);
        };
        p.image = None;
        let arch = match compile::parse_options(&opts, compile::supported_archs(v)) {
            Ok(arch) => arch,
            Err(log) => {
                p.log = log;
                return st.ret(name, &args, NVRTC_ERROR_INVALID_OPTION);
            }
        };
        match compile::compile(&p.name, &p.src) {
            Ok(entries) => {
                p.log.clear();
                p.image = Some(Image {
                    arch,
                    cuda: Some((
                        u32::try_from(v.0).unwrap_or(0),
                        u32::try_from(v.1).unwrap_or(0),
                    )),
                    entries,
                });
                st.compiles += 1;
                st.ret(name, &args, NVRTC_SUCCESS)
            }
            Err(log) => {
                p.log = log;
                st.ret(name, &args, NVRTC_ERROR_COMPILATION)
            }
        }
    })
}

/// What an output getter reads.
#[derive(Clone, Copy)]
enum Output {
    Ptx,
    Cubin,
    Log,
}

/// The bytes (NUL-terminated) of output `what` of program `h`, or the NVRTC error.
fn output(st: &State, h: usize, what: Output) -> Result<Vec<u8>, nvrtcResult> {
    let p = st.programs.get(&h).ok_or(NVRTC_ERROR_INVALID_PROGRAM)?;
    if let Output::Log = what {
        let mut v = p.log.clone().into_bytes();
        v.push(0);
        return Ok(v);
    }
    let img = p.image.as_ref().ok_or(NVRTC_ERROR_INVALID_PROGRAM)?;
    if let Output::Cubin = what {
        let real = img
            .arch
            .as_deref()
            .and_then(arch_version)
            .is_some_and(|(_, real)| real);
        if !real {
            return Err(NVRTC_ERROR_INVALID_INPUT);
        }
    }
    Ok(img.render())
}

/// An output getter: `size` writes the byte count (NUL included), else the bytes go to `out`.
///
/// # Safety
/// `out` must be null or valid for writes of the output's size (or of one `size_t`, with
/// `size`).
unsafe fn get(
    name: &str,
    prog: nvrtcProgram,
    what: Output,
    size: bool,
    out: *mut c_void,
) -> nvrtcResult {
    with_state(|st| {
        let h = prog as usize;
        let args = format!("{h:#x}");
        if let Some(code) = gate(st, name, &args) {
            return code;
        }
        let bytes = match output(st, h, what) {
            Ok(b) => b,
            Err(code) => return st.ret(name, &args, code),
        };
        if out.is_null() {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_INPUT);
        }
        if size {
            // SAFETY: `out` is non-null and, per the caller, valid for one `size_t`.
            unsafe { out.cast::<usize>().write_unaligned(bytes.len()) };
            return st.ret(name, &format!("{args} size={}", bytes.len()), NVRTC_SUCCESS);
        }
        // SAFETY: `out` is non-null and, per the caller, valid for `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), bytes.len()) };
        st.ret(name, &args, NVRTC_SUCCESS)
    })
}

/// `nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *ptxSizeRet)`.
///
/// # Safety
/// `size` must be null or valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTXSize(prog: nvrtcProgram, size: *mut usize) -> nvrtcResult {
    // SAFETY: forwarded caller guarantee.
    unsafe { get("nvrtcGetPTXSize", prog, Output::Ptx, true, size.cast()) }
}

/// `nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx)`.
///
/// # Safety
/// `ptx` must be null or valid for writes of `nvrtcGetPTXSize` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTX(prog: nvrtcProgram, ptx: *mut c_char) -> nvrtcResult {
    // SAFETY: forwarded caller guarantee.
    unsafe { get("nvrtcGetPTX", prog, Output::Ptx, false, ptx.cast()) }
}

/// `nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *cubinSizeRet)`: only for a real
/// `sm_NN` target.
///
/// # Safety
/// `size` must be null or valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBINSize(prog: nvrtcProgram, size: *mut usize) -> nvrtcResult {
    // SAFETY: forwarded caller guarantee.
    unsafe { get("nvrtcGetCUBINSize", prog, Output::Cubin, true, size.cast()) }
}

/// `nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin)`: only for a real `sm_NN` target.
///
/// # Safety
/// `cubin` must be null or valid for writes of `nvrtcGetCUBINSize` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetCUBIN(prog: nvrtcProgram, cubin: *mut c_char) -> nvrtcResult {
    // SAFETY: forwarded caller guarantee.
    unsafe { get("nvrtcGetCUBIN", prog, Output::Cubin, false, cubin.cast()) }
}

/// `nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet)`: NUL included
/// (1 for an empty log).
///
/// # Safety
/// `size` must be null or valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLogSize(
    prog: nvrtcProgram,
    size: *mut usize,
) -> nvrtcResult {
    // SAFETY: forwarded caller guarantee.
    unsafe {
        get(
            "nvrtcGetProgramLogSize",
            prog,
            Output::Log,
            true,
            size.cast(),
        )
    }
}

/// `nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log)`.
///
/// # Safety
/// `log` must be null or valid for writes of `nvrtcGetProgramLogSize` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLog(prog: nvrtcProgram, log: *mut c_char) -> nvrtcResult {
    // SAFETY: forwarded caller guarantee.
    unsafe { get("nvrtcGetProgramLog", prog, Output::Log, false, log.cast()) }
}
