//! Finding `libcuda` and its function table. A driver library the process already loaded (a
//! framework initialized CUDA first) is reused (`loader::open_first`).

use std::path::PathBuf;

use super::sys::*;
use crate::loader::{self, vendor_fns, LoadError, VendorLib};

/// Environment override: the path (or name) of the CUDA driver library.
pub const ENV_CUDA_LIB: &str = "SIMPLER_CUDA_LIB";
/// Library names tried when no override is given (the loader's search path applies).
pub const DEFAULT_CUDA_LIBS: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

const SEARCH_HINT: &str = "set SIMPLER_CUDA_LIB to the driver library's path, or install the \
     NVIDIA driver (libcuda.so.1 on the loader's search path, LD_LIBRARY_PATH)";

vendor_fns! {
    /// The CUDA driver API functions the driver calls.
    pub(crate) struct CudaFns, names CudaNames {
        init: "cuInit" => CuInitFn,
        device_get: "cuDeviceGet" => CuDeviceGetFn,
        primary_ctx_retain: "cuDevicePrimaryCtxRetain" => CuPrimaryCtxRetainFn,
        primary_ctx_release: "cuDevicePrimaryCtxRelease_v2" => CuPrimaryCtxReleaseFn,
        ctx_get_current: "cuCtxGetCurrent" => CuCtxGetCurrentFn,
        ctx_set_current: "cuCtxSetCurrent" => CuCtxSetCurrentFn,
        mem_alloc: "cuMemAlloc_v2" => CuMemAllocFn,
        mem_free: "cuMemFree_v2" => CuMemFreeFn,
        host_register: "cuMemHostRegister_v2" => CuMemHostRegisterFn,
        host_unregister: "cuMemHostUnregister" => CuMemHostUnregisterFn,
        memcpy_htod_async: "cuMemcpyHtoDAsync_v2" => CuMemcpyHtoDAsyncFn,
        memcpy_dtoh_async: "cuMemcpyDtoHAsync_v2" => CuMemcpyDtoHAsyncFn,
        memset_d8_async: "cuMemsetD8Async" => CuMemsetD8AsyncFn,
        stream_create: "cuStreamCreate" => CuStreamCreateFn,
        stream_destroy: "cuStreamDestroy_v2" => CuStreamDestroyFn,
        stream_synchronize: "cuStreamSynchronize" => CuStreamSynchronizeFn,
        stream_wait_event: "cuStreamWaitEvent" => CuStreamWaitEventFn,
        event_create: "cuEventCreate" => CuEventCreateFn,
        event_record: "cuEventRecord" => CuEventRecordFn,
        event_destroy: "cuEventDestroy_v2" => CuEventDestroyFn,
        module_load_data: "cuModuleLoadData" => CuModuleLoadDataFn,
        module_unload: "cuModuleUnload" => CuModuleUnloadFn,
        module_get_function: "cuModuleGetFunction" => CuModuleGetFunctionFn,
        launch_kernel: "cuLaunchKernel" => CuLaunchKernelFn,
        device_get_attribute: "cuDeviceGetAttribute" => CuDeviceGetAttributeFn,
        ctx_synchronize: "cuCtxSynchronize" => CuCtxSynchronizeFn,
    }
    optional {
        driver_get_version: "cuDriverGetVersion" => CuDriverGetVersionFn,
        func_get_attribute: "cuFuncGetAttribute" => CuFuncGetAttributeFn,
        func_set_attribute: "cuFuncSetAttribute" => CuFuncSetAttributeFn,
        event_elapsed_time: "cuEventElapsedTime" => CuEventElapsedTimeFn,
        stream_begin_capture: "cuStreamBeginCapture_v2" => CuStreamBeginCaptureFn,
        stream_end_capture: "cuStreamEndCapture" => CuStreamEndCaptureFn,
        graph_instantiate: "cuGraphInstantiateWithFlags" => CuGraphInstantiateWithFlagsFn,
        graph_launch: "cuGraphLaunch" => CuGraphLaunchFn,
        graph_exec_destroy: "cuGraphExecDestroy" => CuGraphExecDestroyFn,
        graph_destroy: "cuGraphDestroy" => CuGraphDestroyFn,
    }
}

/// Opens the driver library (`lib_path`, else `SIMPLER_CUDA_LIB`, else the default names on the
/// loader's search path) and loads its table.
pub(crate) fn load(lib_path: Option<&PathBuf>) -> Result<(VendorLib, CudaFns), LoadError> {
    let paths: Vec<PathBuf> = match (lib_path, std::env::var_os(ENV_CUDA_LIB)) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(p)) if !p.is_empty() => vec![PathBuf::from(p)],
        _ => DEFAULT_CUDA_LIBS.iter().map(PathBuf::from).collect(),
    };
    let lib = loader::open_first("libcuda.so.1", &paths, SEARCH_HINT)?;
    // SAFETY: each type in the table is the exact `cuda.h` signature of its (v2) symbol.
    let f = unsafe { CudaFns::load(&lib) }?;
    Ok((lib, f))
}
