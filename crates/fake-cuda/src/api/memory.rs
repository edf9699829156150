//! Device memory: allocation, synchronous and asynchronous copies and memsets, host
//! registration.

use std::ffi::{c_uint, c_void};

use super::stream::{finish, submit};
use crate::exec::{self, Op, Source, Work};
use crate::{
    current_ctx, device_of_ctx, with_state, CUdeviceptr, CUresult, CUstream, ALIGN,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, FILL,
};

/// What the synchronous copies and memsets do first, as work of the legacy stream: wait for the
/// blocking streams of the current context's device (never for non-blocking ones).
fn legacy_barrier() {
    if let Some(dev) = device_of_ctx(current_ctx()) {
        exec::wait_device(Some(dev), true);
    }
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

/// `CUresult cuMemFree(CUdeviceptr dptr)` (the `_v2` entry point). First waits until every
/// stream is idle, as the driver synchronizes. On a poisoned context the memory is still freed
/// and the sticky error returned.
#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    exec::wait_device(None, false);
    with_state(|st| {
        let name = "cuMemFree_v2";
        let args = format!("{dptr:#x}");
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        let dev = match st.current_device_any() {
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
        let code = st.poisoned(dev);
        st.ret(name, &args, code)
    })
}

/// `CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)` (the
/// `_v2` entry point). Synchronous; waits for the blocking streams first (see
/// `legacy_barrier`).
///
/// # Safety
/// `src_host` must be valid for reads of `byte_count` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst_device: CUdeviceptr,
    src_host: *const c_void,
    byte_count: usize,
) -> CUresult {
    legacy_barrier();
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
/// entry point). Synchronous; waits for the blocking streams first.
///
/// # Safety
/// `dst_host` must be valid for writes of `byte_count` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    legacy_barrier();
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
/// point). Synchronous; waits for the blocking streams first.
#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst_device: CUdeviceptr, uc: u8, n: usize) -> CUresult {
    legacy_barrier();
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

/// `CUresult cuMemHostUnregister(void *p)`: `p` must start a registration. On a poisoned
/// context the registration is still removed and the sticky error returned.
#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    with_state(|st| {
        let name = "cuMemHostUnregister";
        let start = p as u64;
        let args = format!("{start:#x}");
        if let Some(code) = st.gate(name, &args) {
            return code;
        }
        let dev = match st.current_device_any() {
            Ok(dev) => dev,
            Err(code) => return st.ret(name, &args, code),
        };
        match st.registrations.remove(&start) {
            Some(len) => {
                let code = st.poisoned(dev);
                st.ret(name, &format!("{args} {len}"), code)
            }
            None => st.ret(name, &args, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

/// `CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
/// CUstream hStream)` (the `_v2` entry point). The range is checked at call time. From a
/// registered (pinned) range the bytes are read when the copy runs, as DMA does; from pageable
/// memory they are copied at call time. Logged with `pinned` or `pageable`.
///
/// # Safety
/// `src_host` must be valid for reads of `byte_count` bytes, until the copy ran when pinned.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst_device: CUdeviceptr,
    src_host: *const c_void,
    byte_count: usize,
    h_stream: CUstream,
) -> CUresult {
    let name = "cuMemcpyHtoDAsync_v2";
    let h = h_stream as usize;
    let src = src_host as usize;
    let mut args = format!("{dst_device:#x} {byte_count} src={src:#x} stream={h:#x}");
    let r = with_state(|st| {
        if let Some(code) = st.gate(name, &args) {
            return Err(code);
        }
        let dev = st
            .current_device()
            .map_err(|code| st.ret(name, &args, code))?;
        if src_host.is_null() && byte_count > 0 {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        if let Err(note) = st.device_range(dst_device, byte_count as u64, dev) {
            return Err(st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_VALUE));
        }
        let pinned = byte_count > 0 && st.pinned(src as u64, byte_count as u64);
        let source = if pinned {
            Source::Pinned(src)
        } else if byte_count == 0 {
            Source::Copied(Vec::new())
        } else {
            // SAFETY: `src_host` is non-null and valid for `byte_count` bytes per the caller.
            Source::Copied(
                unsafe { std::slice::from_raw_parts(src_host.cast::<u8>(), byte_count) }.to_vec(),
            )
        };
        args.push_str(if pinned { " pinned" } else { " pageable" });
        let op = Op {
            dev,
            what: format!("{name} {dst_device:#x} {byte_count}"),
            work: Work::HtoD {
                dst: dst_device,
                src: source,
                n: byte_count,
            },
        };
        submit(st, name, &args, h, op)
    });
    finish(name, &args, h, r)
}

/// `CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream
/// hStream)` (the `_v2` entry point). The range is checked at call time; `dst_host` is written
/// when the copy runs.
///
/// # Safety
/// `dst_host` must be valid for writes of `byte_count` bytes until the copy ran.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
    h_stream: CUstream,
) -> CUresult {
    let name = "cuMemcpyDtoHAsync_v2";
    let h = h_stream as usize;
    let dst = dst_host as usize;
    let args = format!("{src_device:#x} {byte_count} dst={dst:#x} stream={h:#x}");
    let r = with_state(|st| {
        if let Some(code) = st.gate(name, &args) {
            return Err(code);
        }
        let dev = st
            .current_device()
            .map_err(|code| st.ret(name, &args, code))?;
        if dst_host.is_null() && byte_count > 0 {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        if let Err(note) = st.device_range(src_device, byte_count as u64, dev) {
            return Err(st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_VALUE));
        }
        let op = Op {
            dev,
            what: format!("{name} {src_device:#x} {byte_count}"),
            work: Work::DtoH {
                dst,
                src: src_device,
                n: byte_count,
            },
        };
        submit(st, name, &args, h, op)
    });
    finish(name, &args, h, r)
}

/// `CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream
/// hStream)`. The range is checked at call time; the bytes are set when it runs.
#[no_mangle]
pub extern "C" fn cuMemsetD8Async(
    dst_device: CUdeviceptr,
    uc: u8,
    n: usize,
    h_stream: CUstream,
) -> CUresult {
    let name = "cuMemsetD8Async";
    let h = h_stream as usize;
    let args = format!("{dst_device:#x} {n} value={uc} stream={h:#x}");
    let r = with_state(|st| {
        if let Some(code) = st.gate(name, &args) {
            return Err(code);
        }
        let dev = st
            .current_device()
            .map_err(|code| st.ret(name, &args, code))?;
        if let Err(note) = st.device_range(dst_device, n as u64, dev) {
            return Err(st.ret(name, &format!("{args}{note}"), CUDA_ERROR_INVALID_VALUE));
        }
        let op = Op {
            dev,
            what: format!("{name} {dst_device:#x} {n}"),
            work: Work::Memset {
                dst: dst_device,
                value: uc,
                n,
            },
        };
        submit(st, name, &args, h, op)
    });
    finish(name, &args, h, r)
}
