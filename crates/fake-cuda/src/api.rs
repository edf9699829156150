//! The CUDA driver API exports, with their signatures from `cuda.h`.
//!
//! Each export first counts an injection for its exact C name (a firing one is logged with
//! ` (injected)` and returned without doing anything), then refuses to run before `cuInit`, then
//! does its work; every call is logged as `name args -> code`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::{
    ctx_of, current_ctx, set_current_ctx, with_state, CUcontext, CUdevice, CUdeviceptr, CUresult,
    ALIGN, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, FILL,
};

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
        st.initialized = true;
        st.ret("cuInit", &args, CUDA_SUCCESS)
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

/// `CUresult cuDevicePrimaryCtxRelease(CUdevice dev)` (the `_v2` entry point).
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    with_state(|st| {
        let name = "cuDevicePrimaryCtxRelease_v2";
        let args = dev.to_string();
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        if !st.valid_device(dev) {
            return st.ret(name, &args, CUDA_ERROR_INVALID_DEVICE);
        }
        let Some(count) = st.retains.get_mut(&dev).filter(|c| **c > 0) else {
            return st.ret(name, &args, CUDA_ERROR_INVALID_CONTEXT);
        };
        *count -= 1;
        let count = *count;
        if count == 0 {
            st.retains.remove(&dev);
        }
        st.ret(name, &format!("{dev} count={count}"), CUDA_SUCCESS)
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

/// `CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)` (the `_v2` entry point).
///
/// # Safety
/// `dptr` must be null or valid for a write of one `CUdeviceptr`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    with_state(|st| {
        let name = "cuMemAlloc_v2";
        let args = format!("- {bytesize}");
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        let dev = match st.current_device() {
            Ok(dev) => dev,
            Err(code) => return st.ret(name, &args, code),
        };
        if dptr.is_null() || bytesize == 0 {
            return st.ret(name, &args, CUDA_ERROR_INVALID_VALUE);
        }
        let Some(addr) = st.heap.alloc(bytesize as u64, ALIGN, FILL, dev) else {
            return st.ret(name, &args, CUDA_ERROR_OUT_OF_MEMORY);
        };
        // SAFETY: `dptr` is non-null and, per the caller, valid for this write.
        unsafe { dptr.write(addr) };
        st.ret(name, &format!("{addr:#x} {bytesize}"), CUDA_SUCCESS)
    })
}

/// `CUresult cuMemFree(CUdeviceptr dptr)` (the `_v2` entry point).
#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    with_state(|st| {
        let name = "cuMemFree_v2";
        let args = format!("{dptr:#x}");
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        let dev = match st.current_device() {
            Ok(dev) => dev,
            Err(code) => return st.ret(name, &args, code),
        };
        let Some(size) = st.heap.get(dptr).map(|b| b.size) else {
            return st.ret(name, &args, CUDA_ERROR_INVALID_VALUE);
        };
        if let Err(why) = st.device_range(dptr, size, dev) {
            return st.ret(name, &format!("{args}{why}"), CUDA_ERROR_INVALID_VALUE);
        }
        st.heap.remove(dptr, ALIGN, false);
        st.ret(name, &args, CUDA_SUCCESS)
    })
}

/// `CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)` (the
/// `_v2` entry point).
///
/// # Safety
/// `src_host` must be valid for reads of `byte_count` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst_device: CUdeviceptr,
    src_host: *const c_void,
    byte_count: usize,
) -> CUresult {
    with_state(|st| {
        let name = "cuMemcpyHtoD_v2";
        let args = format!("{dst_device:#x} {byte_count} src={:#x}", src_host as usize);
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        let dev = match st.current_device() {
            Ok(dev) => dev,
            Err(code) => return st.ret(name, &args, code),
        };
        if src_host.is_null() && byte_count > 0 {
            return st.ret(name, &args, CUDA_ERROR_INVALID_VALUE);
        }
        let to = match st.device_range(dst_device, byte_count as u64, dev) {
            Ok(to) => to,
            Err(note) => return st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_VALUE),
        };
        if byte_count > 0 {
            // SAFETY: `to` has `byte_count` bytes of a live backing block behind it (checked by
            // `device_range`); `src_host` is valid for `byte_count` bytes per the caller; caller
            // memory cannot overlap the fake's private backing block.
            unsafe { std::ptr::copy_nonoverlapping(src_host.cast::<u8>(), to, byte_count) };
        }
        st.ret(name, &args, CUDA_SUCCESS)
    })
}

/// `CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)` (the `_v2`
/// entry point).
///
/// # Safety
/// `dst_host` must be valid for writes of `byte_count` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    with_state(|st| {
        let name = "cuMemcpyDtoH_v2";
        let args = format!("{src_device:#x} {byte_count} dst={:#x}", dst_host as usize);
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        let dev = match st.current_device() {
            Ok(dev) => dev,
            Err(code) => return st.ret(name, &args, code),
        };
        if dst_host.is_null() && byte_count > 0 {
            return st.ret(name, &args, CUDA_ERROR_INVALID_VALUE);
        }
        let from = match st.device_range(src_device, byte_count as u64, dev) {
            Ok(from) => from,
            Err(note) => return st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_VALUE),
        };
        if byte_count > 0 {
            // SAFETY: `from` has `byte_count` bytes of a live backing block behind it (checked by
            // `device_range`); `dst_host` is valid for `byte_count` bytes per the caller; caller
            // memory cannot overlap the fake's private backing block.
            unsafe { std::ptr::copy_nonoverlapping(from, dst_host.cast::<u8>(), byte_count) };
        }
        st.ret(name, &args, CUDA_SUCCESS)
    })
}

/// `CUresult cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)` (the `_v2` entry
/// point).
#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst_device: CUdeviceptr, uc: u8, n: usize) -> CUresult {
    with_state(|st| {
        let name = "cuMemsetD8_v2";
        let args = format!("{dst_device:#x} {n} value={uc}");
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        let dev = match st.current_device() {
            Ok(dev) => dev,
            Err(code) => return st.ret(name, &args, code),
        };
        let to = match st.device_range(dst_device, n as u64, dev) {
            Ok(to) => to,
            Err(note) => return st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_VALUE),
        };
        // SAFETY: `to` has `n` bytes of a live backing block behind it (checked by
        // `device_range`).
        unsafe { std::ptr::write_bytes(to, uc, n) };
        st.ret(name, &args, CUDA_SUCCESS)
    })
}

/// `CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)` (the `_v2` entry
/// point). Records the range; the memory itself is never touched.
#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    with_state(|st| {
        let name = "cuMemHostRegister_v2";
        let start = p as u64;
        let args = format!("{start:#x} {bytesize} flags={flags}");
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        if let Err(code) = st.current_device() {
            return st.ret(name, &args, code);
        }
        let len = bytesize as u64;
        let Some(end) = start.checked_add(len).filter(|_| start != 0 && len != 0) else {
            return st.ret(name, &args, CUDA_ERROR_INVALID_VALUE);
        };
        let overlaps = st
            .registrations
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > start);
        if overlaps {
            return st.ret(name, &args, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        st.registrations.insert(start, len);
        st.ret(name, &args, CUDA_SUCCESS)
    })
}

/// `CUresult cuMemHostUnregister(void *p)`: `p` must start a registration.
#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    with_state(|st| {
        let name = "cuMemHostUnregister";
        let start = p as u64;
        let args = format!("{start:#x}");
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        if let Err(code) = st.current_device() {
            return st.ret(name, &args, code);
        }
        match st.registrations.remove(&start) {
            Some(len) => st.ret(name, &format!("{args} {len}"), CUDA_SUCCESS),
            None => st.ret(name, &args, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
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
    (CUDA_ERROR_INVALID_CONTEXT, c"CUDA_ERROR_INVALID_CONTEXT"),
    (CUDA_ERROR_ILLEGAL_ADDRESS, c"CUDA_ERROR_ILLEGAL_ADDRESS"),
    (
        CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    ),
    (
        CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    ),
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
