//! Raw CUDA driver API signatures, constants and status codes (`cuda.h`). The `_v2` entry points
//! are the ones with 64-bit `CUdeviceptr` and `size_t` sizes.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use crate::Status;

/// `CUcontext`: an opaque pointer.
pub type CuContext = *mut c_void;
/// `CUdevice`: an int.
pub type CuDevice = c_int;
/// `CUdeviceptr` (v2): unsigned long long.
pub type CuDevicePtr = c_ulonglong;
/// `CUstream`, `CUevent`, `CUmodule`, `CUfunction`: opaque pointers.
pub type CuStream = *mut c_void;
pub type CuEvent = *mut c_void;
pub type CuModule = *mut c_void;
pub type CuFunction = *mut c_void;

pub type CuInitFn = unsafe extern "C" fn(flags: c_uint) -> c_int;
pub type CuDeviceGetFn = unsafe extern "C" fn(device: *mut CuDevice, ordinal: c_int) -> c_int;
pub type CuPrimaryCtxRetainFn = unsafe extern "C" fn(pctx: *mut CuContext, dev: CuDevice) -> c_int;
pub type CuPrimaryCtxReleaseFn = unsafe extern "C" fn(dev: CuDevice) -> c_int;
pub type CuCtxGetCurrentFn = unsafe extern "C" fn(pctx: *mut CuContext) -> c_int;
pub type CuCtxSetCurrentFn = unsafe extern "C" fn(ctx: CuContext) -> c_int;
pub type CuMemAllocFn = unsafe extern "C" fn(dptr: *mut CuDevicePtr, bytesize: usize) -> c_int;
pub type CuMemFreeFn = unsafe extern "C" fn(dptr: CuDevicePtr) -> c_int;
pub type CuMemHostRegisterFn =
    unsafe extern "C" fn(p: *mut c_void, bytesize: usize, flags: c_uint) -> c_int;
pub type CuMemHostUnregisterFn = unsafe extern "C" fn(p: *mut c_void) -> c_int;
pub type CuMemcpyHtoDAsyncFn = unsafe extern "C" fn(
    dst: CuDevicePtr,
    src: *const c_void,
    bytes: usize,
    stream: CuStream,
) -> c_int;
pub type CuMemcpyDtoHAsyncFn = unsafe extern "C" fn(
    dst: *mut c_void,
    src: CuDevicePtr,
    bytes: usize,
    stream: CuStream,
) -> c_int;
pub type CuMemsetD8AsyncFn =
    unsafe extern "C" fn(dst: CuDevicePtr, uc: u8, n: usize, stream: CuStream) -> c_int;
pub type CuStreamCreateFn = unsafe extern "C" fn(stream: *mut CuStream, flags: c_uint) -> c_int;
pub type CuStreamDestroyFn = unsafe extern "C" fn(stream: CuStream) -> c_int;
pub type CuStreamSynchronizeFn = unsafe extern "C" fn(stream: CuStream) -> c_int;
pub type CuStreamWaitEventFn =
    unsafe extern "C" fn(stream: CuStream, event: CuEvent, flags: c_uint) -> c_int;
pub type CuEventCreateFn = unsafe extern "C" fn(event: *mut CuEvent, flags: c_uint) -> c_int;
pub type CuEventRecordFn = unsafe extern "C" fn(event: CuEvent, stream: CuStream) -> c_int;
pub type CuEventDestroyFn = unsafe extern "C" fn(event: CuEvent) -> c_int;
pub type CuModuleLoadDataFn =
    unsafe extern "C" fn(module: *mut CuModule, image: *const c_void) -> c_int;
pub type CuModuleUnloadFn = unsafe extern "C" fn(module: CuModule) -> c_int;
pub type CuModuleGetFunctionFn = unsafe extern "C" fn(
    func: *mut CuFunction,
    module: CuModule,
    name: *const std::ffi::c_char,
) -> c_int;
pub type CuLaunchKernelFn = unsafe extern "C" fn(
    f: CuFunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    shared_bytes: c_uint,
    stream: CuStream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> c_int;
pub type CuCtxSynchronizeFn = unsafe extern "C" fn() -> c_int;
pub type CuDriverGetVersionFn = unsafe extern "C" fn(version: *mut c_int) -> c_int;
pub type CuDeviceGetAttributeFn =
    unsafe extern "C" fn(value: *mut c_int, attribute: c_int, dev: CuDevice) -> c_int;

/// `CUgraph`, `CUgraphExec`: opaque pointers.
pub type CuGraph = *mut c_void;
pub type CuGraphExec = *mut c_void;
/// `cuStreamBeginCapture_v2` (what `cuStreamBeginCapture` names since CUDA 10.1).
pub type CuStreamBeginCaptureFn = unsafe extern "C" fn(stream: CuStream, mode: c_uint) -> c_int;
pub type CuStreamEndCaptureFn =
    unsafe extern "C" fn(stream: CuStream, graph: *mut CuGraph) -> c_int;
pub type CuGraphInstantiateWithFlagsFn =
    unsafe extern "C" fn(exec: *mut CuGraphExec, graph: CuGraph, flags: c_ulonglong) -> c_int;
pub type CuGraphLaunchFn = unsafe extern "C" fn(exec: CuGraphExec, stream: CuStream) -> c_int;
pub type CuGraphExecDestroyFn = unsafe extern "C" fn(exec: CuGraphExec) -> c_int;
pub type CuGraphDestroyFn = unsafe extern "C" fn(graph: CuGraph) -> c_int;

/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: only this thread's unsafe calls invalidate the capture.
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_uint = 1;

/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronize with the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)`.
pub type CuFuncGetAttributeFn =
    unsafe extern "C" fn(pi: *mut c_int, attrib: c_int, func: CuFunction) -> c_int;
/// `CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)`.
pub type CuFuncSetAttributeFn =
    unsafe extern "C" fn(func: CuFunction, attrib: c_int, value: c_int) -> c_int;
/// `CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)`.
pub type CuEventElapsedTimeFn =
    unsafe extern "C" fn(ms: *mut f32, start: CuEvent, end: CuEvent) -> c_int;

/// `CUfunction_attribute` values (`cuda.h`).
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_int = 1;
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_int = 3;
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: c_int = 4;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
/// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`: the most shared memory a block may
/// use once its function opted in.
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: c_int = 97;
/// `CU_EVENT_DEFAULT`: an event that records time.
pub const CU_EVENT_DEFAULT: c_uint = 0;

/// `CU_EVENT_DISABLE_TIMING`: an event for ordering only (cheaper).
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR`.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;

pub const CUDA_ERROR_INVALID_VALUE: i64 = 1;
pub const CUDA_ERROR_INVALID_CONTEXT: i64 = 201;
pub const CUDA_ERROR_NOT_PERMITTED: i64 = 800;
pub const CUDA_ERROR_INVALID_HANDLE: i64 = 400;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: i64 = 700;
pub const CUDA_ERROR_NOT_SUPPORTED: i64 = 801;
pub const CUDA_ERROR_NOT_READY: i64 = 600;

const CODES: &[(i64, &str)] = &[
    (0, "CUDA_SUCCESS"),
    (1, "CUDA_ERROR_INVALID_VALUE"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY"),
    (3, "CUDA_ERROR_NOT_INITIALIZED"),
    (4, "CUDA_ERROR_DEINITIALIZED"),
    (34, "CUDA_ERROR_STUB_LIBRARY"),
    (46, "CUDA_ERROR_DEVICE_UNAVAILABLE"),
    (100, "CUDA_ERROR_NO_DEVICE"),
    (101, "CUDA_ERROR_INVALID_DEVICE"),
    (200, "CUDA_ERROR_INVALID_IMAGE"),
    (201, "CUDA_ERROR_INVALID_CONTEXT"),
    (209, "CUDA_ERROR_NO_BINARY_FOR_GPU"),
    (218, "CUDA_ERROR_INVALID_PTX"),
    (222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
    (400, "CUDA_ERROR_INVALID_HANDLE"),
    (401, "CUDA_ERROR_ILLEGAL_STATE"),
    (500, "CUDA_ERROR_NOT_FOUND"),
    (600, "CUDA_ERROR_NOT_READY"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"),
    (710, "CUDA_ERROR_ASSERT"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (800, "CUDA_ERROR_NOT_PERMITTED"),
    (801, "CUDA_ERROR_NOT_SUPPORTED"),
    (900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
    (901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
    (999, "CUDA_ERROR_UNKNOWN"),
];

/// Whether `code` is a sticky fault: the CUDA documentation says the context is unusable after
/// it and every later call returns it (an illegal address, a failed or timed-out launch, a
/// device assert, an illegal instruction, a misaligned or invalid address space, an invalid
/// program counter, a hardware stack error).
pub fn is_sticky(code: i64) -> bool {
    matches!(code, 700 | 702 | 710 | 714..=719)
}

/// The symbolic name of a `CUresult`, or `"UNKNOWN"`.
pub fn cuda_code_name(code: i64) -> &'static str {
    CODES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("UNKNOWN", |(_, n)| n)
}

/// A `CUresult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct CuResult(pub c_int);

impl CuResult {
    /// `Ok` for `CUDA_SUCCESS`, else the code and its name.
    pub fn result(self) -> Result<(), Status> {
        match self.0 {
            0 => Ok(()),
            c => Err(status(i64::from(c))),
        }
    }
}

/// The status for `code` (for calls the driver refuses itself, and injected faults).
pub fn status(code: i64) -> Status {
    Status {
        code,
        name: cuda_code_name(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_code_names() {
        assert_eq!(cuda_code_name(0), "CUDA_SUCCESS");
        assert_eq!(cuda_code_name(34), "CUDA_ERROR_STUB_LIBRARY");
        assert_eq!(
            cuda_code_name(712),
            "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
        );
        assert_eq!(cuda_code_name(801), "CUDA_ERROR_NOT_SUPPORTED");
        assert_eq!(cuda_code_name(9999), "UNKNOWN");
        assert_eq!(
            CuResult(201).result().unwrap_err().name,
            "CUDA_ERROR_INVALID_CONTEXT"
        );
    }
}
