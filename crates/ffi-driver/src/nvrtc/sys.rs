//! Raw NVRTC signatures and result codes (`nvrtc.h`). `nvrtcResult` is a C enum (an `int`);
//! `nvrtcProgram` is an opaque pointer.

use std::ffi::{c_char, c_int, c_void};

/// `nvrtcProgram`: `struct _nvrtcProgram *`, opaque.
pub type NvrtcProgram = *mut c_void;

/// `nvrtcResult nvrtcVersion(int *major, int *minor)`.
pub type NvrtcVersionFn = unsafe extern "C" fn(major: *mut c_int, minor: *mut c_int) -> c_int;
/// `const char *nvrtcGetErrorString(nvrtcResult result)`.
pub type NvrtcGetErrorStringFn = unsafe extern "C" fn(result: c_int) -> *const c_char;
/// `nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
/// int numHeaders, const char * const *headers, const char * const *includeNames)`.
pub type NvrtcCreateProgramFn = unsafe extern "C" fn(
    prog: *mut NvrtcProgram,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> c_int;
/// `nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog)`.
pub type NvrtcDestroyProgramFn = unsafe extern "C" fn(prog: *mut NvrtcProgram) -> c_int;
/// `nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions,
/// const char * const *options)`.
pub type NvrtcCompileProgramFn = unsafe extern "C" fn(
    prog: NvrtcProgram,
    num_options: c_int,
    options: *const *const c_char,
) -> c_int;
/// `nvrtcGetPTXSize`, `nvrtcGetCUBINSize`, `nvrtcGetProgramLogSize`:
/// `nvrtcResult (nvrtcProgram prog, size_t *sizeRet)`.
pub type NvrtcGetSizeFn = unsafe extern "C" fn(prog: NvrtcProgram, size: *mut usize) -> c_int;
/// `nvrtcGetPTX`, `nvrtcGetCUBIN`, `nvrtcGetProgramLog`: `nvrtcResult (nvrtcProgram prog,
/// char *out)`, writing exactly the size the matching size call reported.
pub type NvrtcGetBytesFn = unsafe extern "C" fn(prog: NvrtcProgram, out: *mut c_char) -> c_int;

/// `nvrtcResult nvrtcGetNumSupportedArchs(int *numArchs)` (CUDA 11.2 and later).
pub type NvrtcGetNumSupportedArchsFn = unsafe extern "C" fn(num: *mut c_int) -> c_int;
/// `nvrtcResult nvrtcGetSupportedArchs(int *supportedArchs)`: the architectures (`75` for
/// `sm_75`), ascending, as many as `nvrtcGetNumSupportedArchs` reported.
pub type NvrtcGetSupportedArchsFn = unsafe extern "C" fn(archs: *mut c_int) -> c_int;

/// `NVRTC_SUCCESS`.
pub const NVRTC_SUCCESS: c_int = 0;

const CODES: &[(c_int, &str)] = &[
    (0, "NVRTC_SUCCESS"),
    (1, "NVRTC_ERROR_OUT_OF_MEMORY"),
    (2, "NVRTC_ERROR_PROGRAM_CREATION_FAILURE"),
    (3, "NVRTC_ERROR_INVALID_INPUT"),
    (4, "NVRTC_ERROR_INVALID_PROGRAM"),
    (5, "NVRTC_ERROR_INVALID_OPTION"),
    (6, "NVRTC_ERROR_COMPILATION"),
    (7, "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE"),
    (8, "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION"),
    (9, "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION"),
    (10, "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID"),
    (11, "NVRTC_ERROR_INTERNAL_ERROR"),
    (12, "NVRTC_ERROR_TIME_FILE_WRITE_FAILED"),
    (13, "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED"),
    (14, "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED"),
    (15, "NVRTC_ERROR_PCH_CREATE"),
    (16, "NVRTC_ERROR_CANCELLED"),
    (17, "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED"),
    (18, "NVRTC_ERROR_BUSY"),
];

/// The symbolic name of an `nvrtcResult` from `nvrtc.h` (CUDA 13), or `"UNKNOWN"`. The library's
/// own `nvrtcGetErrorString` is preferred where a library is at hand.
pub fn nvrtc_code_name(code: i32) -> &'static str {
    CODES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("UNKNOWN", |(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvrtc_code_names() {
        assert_eq!(nvrtc_code_name(0), "NVRTC_SUCCESS");
        assert_eq!(nvrtc_code_name(6), "NVRTC_ERROR_COMPILATION");
        assert_eq!(nvrtc_code_name(18), "NVRTC_ERROR_BUSY");
        assert_eq!(nvrtc_code_name(-1), "UNKNOWN");
    }
}
