//! The NVRTC API exports, with their signatures from `nvrtc.h` (`nvrtcResult` is an `int`, 0
//! success), in the same library as the driver (link it as `libnvrtc.so` too).
//!
//! "Compiling" ([`compile`]) finds the `extern "C" __global__` entries of the source (comments
//! skipped, whitespace and newlines tolerated, `__launch_bounds__(...)` before or after `void`)
//! and counts their parameters (top-level commas; `()` and `(void)` are none). No entry, a
//! duplicate entry or an `#error` directive (even one `#if` would skip: there is no
//! preprocessor) fails with `NVRTC_ERROR_COMPILATION` and a log saying why; headers are
//! accepted but never read. The output is a module image ([`crate::image`]) for the recorded
//! `--gpu-architecture`/`-arch`; it is the PTX, and the CUBIN too when the architecture is a
//! real `sm_NN` target (otherwise `nvrtcGetCUBIN*` answer `NVRTC_ERROR_INVALID_INPUT`, as
//! NVRTC does). Output getters before a successful compile answer
//! `NVRTC_ERROR_INVALID_PROGRAM`; the log getters work at any time.
//!
//! Every call is logged as `name args -> code` and can be failed by injection (by its C name);
//! NVRTC needs no `cuInit`.

use std::ffi::{c_char, c_int, c_void, CStr};

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

/// The version the fake NVRTC reports.
const VERSION: (c_int, c_int) = (13, 0);

/// The injected failure of this call, if any (logged).
fn gate(st: &mut State, name: &str, args: &str) -> Option<nvrtcResult> {
    st.injections.take_logged(&mut st.log, name, args)
}

/// `nvrtcResult nvrtcVersion(int *major, int *minor)`: 13.0.
///
/// # Safety
/// `major` and `minor` must be null or valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> nvrtcResult {
    with_state(|st| {
        let name = "nvrtcVersion";
        let args = format!("{}.{}", VERSION.0, VERSION.1);
        if let Some(code) = gate(st, name, &args) {
            return code;
        }
        if major.is_null() || minor.is_null() {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_INPUT);
        }
        // SAFETY: both are non-null and, per the caller, valid for these writes.
        unsafe {
            major.write(VERSION.0);
            minor.write(VERSION.1);
        }
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

/// A NUL-terminated argument as a string (`None` for null).
///
/// # Safety
/// `p` must be null or NUL-terminated.
unsafe fn text(p: *const c_char) -> Option<String> {
    // SAFETY: non-null and NUL-terminated per the caller.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
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
        let Some(p) = st.programs.get_mut(&h) else {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_PROGRAM);
        };
        let Some(opts) = opts else {
            return st.ret(name, &args, NVRTC_ERROR_INVALID_INPUT);
        };
        p.image = None;
        let arch = match compile::parse_options(&opts) {
            Ok(arch) => arch,
            Err(log) => {
                p.log = log;
                return st.ret(name, &args, NVRTC_ERROR_INVALID_OPTION);
            }
        };
        match compile::compile(&p.name, &p.src) {
            Ok(entries) => {
                p.log.clear();
                p.image = Some(Image { arch, entries });
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
