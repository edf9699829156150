//! The CUDA driver API exports, with their signatures from `cuda.h`, by room: initialization,
//! devices and contexts here; memory in [`memory`]; streams and events in [`stream`]; modules
//! and launches in [`module`]; stream capture and graphs in [`graph`].
//!
//! Each export first counts an injection for its exact C name (a firing one is logged with
//! ` (injected)` and returned without doing anything), then refuses to run from a host kernel
//! and before `cuInit`, then does its work; every call is logged as `name args -> code`.

use std::ffi::{c_char, c_int, c_uint, CStr};

use crate::{
    ctx_of, current_ctx, export, set_current_ctx, with_state, CUcontext, CUdevice,
    CUdevice_attribute, CUresult, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_NOT_READY, CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, CUDA_SUCCESS,
};

pub mod graph;
pub mod memory;
pub mod module;
pub mod stream;

pub use graph::*;
pub use memory::*;
pub use module::*;
pub use stream::*;

/// `CUresult cuInit(unsigned int Flags)`. `Flags` must be 0.
#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    with_state(|st| {
        let args = flags.to_string();
        if let Some(code) = st.gate("cuInit", &args) {
            return code;
        }
        if flags != 0 {
            return st.ret("cuInit", &args, CUDA_ERROR_INVALID_VALUE);
        }
        if !st.initialized {
            st.lifecycle.inits += 1;
        }
        st.initialized = true;
        st.ret("cuInit", &args, CUDA_SUCCESS)
    })
}

/// `CUresult cuDriverGetVersion(int *driverVersion)`: 13000 (CUDA 13.0), or
/// `FAKE_CUDA_DRIVER_VERSION` (read at each call). Works before `cuInit`, as in the driver.
///
/// # Safety
/// `version` must be null or valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    with_state(|st| {
        if let Some(code) = st
            .injections
            .take_logged(&mut st.log, "cuDriverGetVersion", "")
        {
            return code;
        }
        if version.is_null() {
            return st.ret("cuDriverGetVersion", "", CUDA_ERROR_INVALID_VALUE);
        }
        let v = crate::driver_version();
        // SAFETY: `version` is non-null and, per the caller, valid for this write.
        unsafe { version.write(v) };
        st.ret("cuDriverGetVersion", &v.to_string(), CUDA_SUCCESS)
    })
}

/// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
///
/// # Safety
/// `device` must be null or valid for a write of one `CUdevice`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    with_state(|st| {
        let args = ordinal.to_string();
        if let Some(code) = st.gate("cuDeviceGet", &args) {
            return code;
        }
        if device.is_null() {
            return st.ret("cuDeviceGet", &args, CUDA_ERROR_INVALID_VALUE);
        }
        if !st.valid_device(ordinal) {
            return st.ret("cuDeviceGet", &args, CUDA_ERROR_INVALID_DEVICE);
        }
        // SAFETY: `device` is non-null and, per the caller, valid for this write.
        unsafe { device.write(ordinal) };
        st.ret("cuDeviceGet", &args, CUDA_SUCCESS)
    })
}

/// `CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
///
/// # Safety
/// `pctx` must be null or valid for a write of one `CUcontext`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    with_state(|st| {
        let name = "cuDevicePrimaryCtxRetain";
        let args = dev.to_string();
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        if pctx.is_null() {
            return st.ret(name, &args, CUDA_ERROR_INVALID_VALUE);
        }
        if !st.valid_device(dev) {
            return st.ret(name, &args, CUDA_ERROR_INVALID_DEVICE);
        }
        let count = st.retains.entry(dev).or_insert(0);
        *count += 1;
        let count = *count;
        if count == 1 {
            st.lifecycle.ctx_creates += 1;
        }
        let ctx = ctx_of(dev);
        // SAFETY: `pctx` is non-null and, per the caller, valid for this write.
        unsafe { pctx.write(ctx as CUcontext) };
        st.ret(
            name,
            &format!("{dev} ctx={ctx:#x} count={count}"),
            CUDA_SUCCESS,
        )
    })
}

/// `CUresult cuDevicePrimaryCtxRelease(CUdevice dev)` (the `_v2` entry point). Works on a
/// poisoned context; at count 0 the context is destroyed and its sticky error cleared.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    export(|st| {
        let name = "cuDevicePrimaryCtxRelease_v2";
        let args = dev.to_string();
        st.enter_device(name, &args, dev)?;
        let Some(count) = st.retains.get_mut(&dev).filter(|c| **c > 0) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_CONTEXT));
        };
        *count -= 1;
        let count = *count;
        let mut args = format!("{dev} count={count}");
        if count == 0 {
            // The primary context is destroyed: the next retain makes a fresh, healthy one.
            st.retains.remove(&dev);
            st.lifecycle.ctx_destroys += 1;
            if let Some(code) = st.poison.remove(&dev) {
                args.push_str(&format!(" (sticky error {code} cleared)"));
            }
        }
        Ok(st.ret(name, &args, CUDA_SUCCESS))
    })
}

/// `CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)`:
/// `flags` 0 (none is ever set), `active` 1 while the primary context is retained (poisoned or
/// not), else 0. Needs no context, as in the driver.
///
/// # Safety
/// `flags` and `active` must be null or valid for a write of one `unsigned int` / `int`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    export(|st| {
        let name = "cuDevicePrimaryCtxGetState";
        let args = dev.to_string();
        st.enter_device(name, &args, dev)?;
        if flags.is_null() || active.is_null() {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let on = c_int::from(st.retain_count(dev) > 0);
        // SAFETY: both are non-null and, per the caller, valid for these writes.
        unsafe {
            flags.write(0);
            active.write(on);
        }
        Ok(st.ret(name, &format!("{args} flags=0 active={on}"), CUDA_SUCCESS))
    })
}

/// `CUresult cuCtxGetCurrent(CUcontext *pctx)`: the calling thread's current context (null when
/// none; a released context's handle stays current, dangling).
///
/// # Safety
/// `pctx` must be null or valid for a write of one `CUcontext`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    with_state(|st| {
        let ctx = current_ctx();
        let args = format!("{ctx:#x}");
        if let Some(code) = st.gate("cuCtxGetCurrent", &args) {
            return code;
        }
        if pctx.is_null() {
            return st.ret("cuCtxGetCurrent", &args, CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `pctx` is non-null and, per the caller, valid for this write.
        unsafe { pctx.write(ctx as CUcontext) };
        st.ret("cuCtxGetCurrent", &args, CUDA_SUCCESS)
    })
}

/// `CUresult cuCtxSetCurrent(CUcontext ctx)`: binds `ctx` (an active primary context) to the
/// calling thread; null unbinds it.
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    with_state(|st| {
        let handle = ctx as usize;
        let args = format!("{handle:#x}");
        if let Some(code) = st.gate("cuCtxSetCurrent", &args) {
            return code;
        }
        if handle != 0 && st.active_device(handle).is_none() {
            return st.ret("cuCtxSetCurrent", &args, CUDA_ERROR_INVALID_CONTEXT);
        }
        set_current_ctx(handle);
        st.ret("cuCtxSetCurrent", &args, CUDA_SUCCESS)
    })
}

/// Names of the codes this fake returns (and a few common ones tests like to inject).
const ERROR_NAMES: &[(CUresult, &CStr)] = &[
    (CUDA_SUCCESS, c"CUDA_SUCCESS"),
    (CUDA_ERROR_INVALID_VALUE, c"CUDA_ERROR_INVALID_VALUE"),
    (CUDA_ERROR_OUT_OF_MEMORY, c"CUDA_ERROR_OUT_OF_MEMORY"),
    (CUDA_ERROR_NOT_INITIALIZED, c"CUDA_ERROR_NOT_INITIALIZED"),
    (CUDA_ERROR_NO_DEVICE, c"CUDA_ERROR_NO_DEVICE"),
    (CUDA_ERROR_INVALID_DEVICE, c"CUDA_ERROR_INVALID_DEVICE"),
    (CUDA_ERROR_INVALID_IMAGE, c"CUDA_ERROR_INVALID_IMAGE"),
    (CUDA_ERROR_INVALID_CONTEXT, c"CUDA_ERROR_INVALID_CONTEXT"),
    (
        CUDA_ERROR_NO_BINARY_FOR_GPU,
        c"CUDA_ERROR_NO_BINARY_FOR_GPU",
    ),
    (
        CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        c"CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    ),
    (CUDA_ERROR_INVALID_HANDLE, c"CUDA_ERROR_INVALID_HANDLE"),
    (CUDA_ERROR_NOT_FOUND, c"CUDA_ERROR_NOT_FOUND"),
    (CUDA_ERROR_NOT_READY, c"CUDA_ERROR_NOT_READY"),
    (CUDA_ERROR_ILLEGAL_ADDRESS, c"CUDA_ERROR_ILLEGAL_ADDRESS"),
    (
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        c"CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    ),
    (
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    ),
    (
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    ),
    (CUDA_ERROR_LAUNCH_FAILED, c"CUDA_ERROR_LAUNCH_FAILED"),
    (CUDA_ERROR_NOT_PERMITTED, c"CUDA_ERROR_NOT_PERMITTED"),
    (CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN"),
];

/// `CUresult cuGetErrorName(CUresult error, const char **pStr)`: a static NUL-terminated name;
/// `CUDA_ERROR_INVALID_VALUE` (and a null `*pStr`) for an unknown code. Works before `cuInit`,
/// as in the driver.
///
/// # Safety
/// `pstr` must be null or valid for a write of one pointer.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    with_state(|st| {
        let args = error.to_string();
        if let Some(code) = st.gate("cuGetErrorName", &args) {
            return code;
        }
        if pstr.is_null() {
            return st.ret("cuGetErrorName", &args, CUDA_ERROR_INVALID_VALUE);
        }
        let found = ERROR_NAMES.iter().find(|(c, _)| *c == error);
        let (ptr, code) = match found {
            Some((_, s)) => (s.as_ptr(), CUDA_SUCCESS),
            None => (std::ptr::null(), CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: `pstr` is non-null and, per the caller, valid for this write.
        unsafe { pstr.write(ptr) };
        st.ret("cuGetErrorName", &args, code)
    })
}

/// `CU_DEVICE_ATTRIBUTE_*` values the fake answers: the compute capability (`FAKE_CUDA_CC`),
/// the launch limits `cuLaunchKernel` enforces, the shared memory limits (the opt-in from
/// `FAKE_CUDA_SHARED_OPTIN`), the multiprocessor count (`FAKE_CUDA_SM_COUNT`) and an H200's
/// clocks and memory bus.
fn attribute(attrib: CUdevice_attribute, st: &crate::State) -> Option<c_int> {
    Some(match attrib {
        1 => 1024,                                    // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,                                // MAX_BLOCK_DIM_X, _Y
        4 => 64,                                      // MAX_BLOCK_DIM_Z
        5 => i32::MAX,                                // MAX_GRID_DIM_X
        6 | 7 => 65535,                               // MAX_GRID_DIM_Y, _Z
        8 => 48 << 10,                                // MAX_SHARED_MEMORY_PER_BLOCK
        10 => 32,                                     // WARP_SIZE
        13 => 1_980_000,                              // CLOCK_RATE (kHz)
        16 => st.sm_count,                            // MULTIPROCESSOR_COUNT
        36 => 2_619_000,                              // MEMORY_CLOCK_RATE (kHz)
        37 => 6144,                                   // GLOBAL_MEMORY_BUS_WIDTH (bits)
        75 => st.cc.0,                                // COMPUTE_CAPABILITY_MAJOR
        76 => st.cc.1,                                // COMPUTE_CAPABILITY_MINOR
        97 => c_int::try_from(st.shared_optin).ok()?, // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        _ => return None,
    })
}

/// `CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)`: answers
/// the launch limits (1-8, 10), `CLOCK_RATE` (13: 1980000 kHz), `MULTIPROCESSOR_COUNT` (16:
/// `FAKE_CUDA_SM_COUNT`, default 132), `MEMORY_CLOCK_RATE` (36: 2619000 kHz),
/// `GLOBAL_MEMORY_BUS_WIDTH` (37: 6144), the compute capability (75, 76: `FAKE_CUDA_CC`,
/// default 9.0) and `MAX_SHARED_MEMORY_PER_BLOCK_OPTIN` (97: `FAKE_CUDA_SHARED_OPTIN`, default
/// 232448); any other attribute is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `pi` must be null or valid for a write of one `int`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    export(|st| {
        let name = "cuDeviceGetAttribute";
        let args = format!("{attrib} dev={dev}");
        st.enter_device(name, &args, dev)?;
        let Some(value) = attribute(attrib, st).filter(|_| !pi.is_null()) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        };
        // SAFETY: `pi` is non-null and, per the caller, valid for this write.
        unsafe { pi.write(value) };
        Ok(st.ret(name, &format!("{args} value={value}"), CUDA_SUCCESS))
    })
}

/// `CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)` (the `_v2` entry point): the
/// device's memory, `FAKE_CUDA_TOTAL_MEM` (default 150754820096, an H200's); `cuMemAlloc_v2`
/// refuses to hand out more.
///
/// # Safety
/// `bytes` must be null or valid for a write of one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    export(|st| {
        let name = "cuDeviceTotalMem_v2";
        let args = format!("dev={dev}");
        st.enter_device(name, &args, dev)?;
        let Some(total) = usize::try_from(st.total_mem)
            .ok()
            .filter(|_| !bytes.is_null())
        else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        };
        // SAFETY: `bytes` is non-null and, per the caller, valid for this write.
        unsafe { bytes.write(total) };
        Ok(st.ret(name, &format!("{args} bytes={total}"), CUDA_SUCCESS))
    })
}

/// The name every fake device reports.
const DEVICE_NAME: &[u8] = b"Fake CUDA device (H200-like)";

/// `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`: "Fake CUDA device
/// (H200-like)", NUL-terminated, truncated to `len - 1` characters.
///
/// # Safety
/// `name` must be null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    export(|st| {
        let fname = "cuDeviceGetName";
        let args = format!("{len} dev={dev}");
        st.enter_device(fname, &args, dev)?;
        let cap = usize::try_from(len).unwrap_or(0);
        if name.is_null() || cap == 0 {
            return Err(st.ret(fname, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let n = DEVICE_NAME.len().min(cap - 1);
        // SAFETY: `name` is valid for `cap > n` bytes per the caller; the source is a static.
        unsafe {
            std::ptr::copy_nonoverlapping(DEVICE_NAME.as_ptr(), name.cast::<u8>(), n);
            name.add(n).write(0);
        }
        Ok(st.ret(fname, &args, CUDA_SUCCESS))
    })
}
