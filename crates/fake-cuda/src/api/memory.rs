//! Device memory: allocation, synchronous and asynchronous copies and memsets, host
//! registration.
//!
//! The synchronous copies and memsets are work of the legacy stream (so they are ordered after
//! the device's blocking streams, never after `CU_STREAM_NON_BLOCKING` ones), and return as the
//! CUDA Driver API's "API synchronization behavior" says: a copy to the host or from a pinned
//! (registered) range returns once it ran; a copy from pageable memory once the bytes are staged
//! (copied at call time), before the copy ran; a memset of device memory at once.

use std::ffi::{c_uint, c_void};

use super::stream::{queue, settle, submit};
use crate::exec::{self, Op, Point, Source, Work, CU_STREAM_LEGACY};
use crate::{
    export, with_state, CUdevice, CUdeviceptr, CUresult, CUstream, ALIGN,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, FILL,
};

/// The bytes `n` at `src` as an HtoD source: read when the copy runs from a registered range
/// (`pinned`), else copied now.
///
/// # Safety
/// `src` must be valid for reads of `n` bytes (when `n > 0`).
unsafe fn host_source(src: *const c_void, n: usize, pinned: bool) -> Source {
    if pinned {
        Source::Host(src as usize)
    } else if n == 0 {
        Source::Copied(Vec::new())
    } else {
        // SAFETY: `src` is valid for `n` bytes per the caller.
        Source::Copied(unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }.to_vec())
    }
}

/// `CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)` (the `_v2` entry point).
///
/// # Safety
/// `dptr` must be null or valid for a write of one `CUdeviceptr`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    export(|st| {
        let name = "cuMemAlloc_v2";
        let args = format!("- {bytesize}");
        let dev = st.enter(name, &args)?;
        if dptr.is_null() || bytesize == 0 {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        }
        let used: u64 = st
            .heap
            .blocks()
            .filter(|(_, b)| b.meta == dev)
            .map(|(_, b)| b.size)
            .sum();
        if used.saturating_add(bytesize as u64) > st.total_mem {
            let args = format!(
                "{args} (device {dev} has {used} of {} bytes in use)",
                st.total_mem
            );
            return Err(st.ret(name, &args, CUDA_ERROR_OUT_OF_MEMORY));
        }
        let Some(addr) = st.heap.alloc(bytesize as u64, ALIGN, FILL, dev) else {
            return Err(st.ret(name, &args, CUDA_ERROR_OUT_OF_MEMORY));
        };
        // SAFETY: `dptr` is non-null and, per the caller, valid for this write.
        unsafe { dptr.write(addr) };
        Ok(st.ret(name, &format!("{addr:#x} {bytesize}"), CUDA_SUCCESS))
    })
}

/// `CUresult cuMemFree(CUdeviceptr dptr)` (the `_v2` entry point). First waits until every
/// stream is idle, as the driver synchronizes. On a poisoned context the memory is still freed
/// and the sticky error returned.
#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    exec::wait_device(None, false);
    export(|st| {
        let name = "cuMemFree_v2";
        let args = format!("{dptr:#x}");
        let dev = st.enter_any(name, &args)?;
        let Some(size) = st.heap.get(dptr).map(|b| b.size) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        };
        st.live_range((name, &args), dptr, size, dev)?;
        st.heap.remove(dptr, ALIGN, false);
        let code = st.poisoned(dev);
        Ok(st.ret(name, &args, code))
    })
}

/// `CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)` (the
/// `_v2` entry point): work of the legacy stream. From a registered (pinned) range the call
/// returns once the copy ran; from pageable memory the bytes are staged (copied) now and the
/// call returns at once, before the copy ran. Logged with `pinned` or `pageable`.
///
/// # Safety
/// `src_host` must be valid for reads of `byte_count` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst_device: CUdeviceptr,
    src_host: *const c_void,
    byte_count: usize,
) -> CUresult {
    let name = "cuMemcpyHtoD_v2";
    let src = src_host as usize;
    let mut args = format!("{dst_device:#x} {byte_count} src={src:#x}");
    let r = with_state(|st| {
        let dev = st.enter(name, &args)?;
        st.host_copy_range((name, &args), src_host, dst_device, byte_count, dev)?;
        let pinned = byte_count > 0 && st.pinned(src as u64, byte_count as u64);
        args.push_str(if pinned { " pinned" } else { " pageable" });
        let op = Op {
            dev,
            what: format!("{name} {dst_device:#x} {byte_count}"),
            work: Work::HtoD {
                dst: dst_device,
                // SAFETY: `src_host` is non-null (checked) and valid for `byte_count` bytes per
                // the caller; a pinned range is read before this call returns (it waits).
                src: unsafe { host_source(src_host, byte_count, pinned) },
                n: byte_count,
            },
        };
        let point = queue(st, (name, &args), CU_STREAM_LEGACY, op)?;
        if pinned {
            Ok(Some((dev, point)))
        } else {
            st.ret(name, &args, CUDA_SUCCESS);
            Ok(None)
        }
    });
    waited(name, &args, r)
}

/// Ends a synchronous call: waits for its operation's point when it has to (`Some`), then
/// returns the context's sticky error or success.
fn waited(name: &str, args: &str, r: Result<Option<(CUdevice, Point)>, CUresult>) -> CUresult {
    match r {
        Err(code) => code,
        Ok(None) => CUDA_SUCCESS,
        Ok(Some((dev, point))) => settle(name, args, dev, || exec::wait_point(point)),
    }
}

/// `CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)` (the `_v2`
/// entry point): work of the legacy stream; returns once the copy ran (with the context's
/// sticky error when it, or earlier work, faulted).
///
/// # Safety
/// `dst_host` must be valid for writes of `byte_count` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst_host: *mut c_void,
    src_device: CUdeviceptr,
    byte_count: usize,
) -> CUresult {
    let name = "cuMemcpyDtoH_v2";
    let dst = dst_host as usize;
    let args = format!("{src_device:#x} {byte_count} dst={dst:#x}");
    let r = with_state(|st| {
        let dev = st.enter(name, &args)?;
        st.host_copy_range((name, &args), dst_host, src_device, byte_count, dev)?;
        let op = Op {
            dev,
            what: format!("{name} {src_device:#x} {byte_count}"),
            work: Work::DtoH {
                dst,
                src: src_device,
                n: byte_count,
            },
        };
        let point = queue(st, (name, &args), CU_STREAM_LEGACY, op)?;
        Ok(Some((dev, point)))
    });
    waited(name, &args, r)
}

/// `CUresult cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)` (the `_v2` entry
/// point): work of the legacy stream; the range is checked now, the call returns at once (a
/// memset of device memory is asynchronous with respect to the host).
#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst_device: CUdeviceptr, uc: u8, n: usize) -> CUresult {
    export(|st| {
        let name = "cuMemsetD8_v2";
        let args = format!("{dst_device:#x} {n} value={uc}");
        let dev = st.enter(name, &args)?;
        st.live_range((name, &args), dst_device, n as u64, dev)?;
        let op = Op {
            dev,
            what: format!("{name} {dst_device:#x} {n}"),
            work: Work::Memset {
                dst: dst_device,
                value: uc,
                n,
            },
        };
        submit(st, name, &args, CU_STREAM_LEGACY, op)
    })
}

/// `CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)` (the `_v2` entry
/// point). Records the range; the memory itself is never touched. A range that shares a host
/// page with another registration is refused (`FAKE_CUDA_HOST_PAGE`).
#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    export(|st| {
        let name = "cuMemHostRegister_v2";
        let start = p as u64;
        let args = format!("{start:#x} {bytesize} flags={flags}");
        st.enter(name, &args)?;
        let len = bytesize as u64;
        let Some(end) = start.checked_add(len).filter(|_| start != 0 && len != 0) else {
            return Err(st.ret(name, &args, CUDA_ERROR_INVALID_VALUE));
        };
        // Whole pages: [first page, last page + 1) of either range.
        let page = st.host_page;
        let pages = |s: u64, l: u64| (s / page, (s + l).div_ceil(page));
        let (first, past) = (start / page, end.div_ceil(page));
        let shared = st
            .registrations
            .range(..past.saturating_mul(page))
            .next_back()
            .filter(|(&s, &l)| pages(s, l).1 > first)
            .map(|(&s, _)| s);
        if let Some(other) = shared {
            let args = format!("{args} shares-a-page-with={other:#x}");
            return Err(st.ret(name, &args, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED));
        }
        st.registrations.insert(start, len);
        Ok(st.ret(name, &args, CUDA_SUCCESS))
    })
}

/// `CUresult cuMemHostUnregister(void *p)`: `p` must start a registration. On a poisoned
/// context the registration is still removed and the sticky error returned.
#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    export(|st| {
        let name = "cuMemHostUnregister";
        let start = p as u64;
        let args = format!("{start:#x}");
        let dev = st.enter_any(name, &args)?;
        Ok(match st.registrations.remove(&start) {
            Some(len) => {
                let code = st.poisoned(dev);
                st.ret(name, &format!("{args} {len}"), code)
            }
            None => st.ret(name, &args, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        })
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
    export(|st| {
        let dev = st.enter(name, &args)?;
        st.host_copy_range((name, &args), src_host, dst_device, byte_count, dev)?;
        let pinned = byte_count > 0 && st.pinned(src as u64, byte_count as u64);
        // SAFETY: `src_host` is non-null (checked) and valid for `byte_count` bytes per the
        // caller, until the copy ran when pinned.
        let source = unsafe { host_source(src_host, byte_count, pinned) };
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
    })
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
    export(|st| {
        let dev = st.enter(name, &args)?;
        st.host_copy_range((name, &args), dst_host, src_device, byte_count, dev)?;
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
    })
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
    export(|st| {
        let dev = st.enter(name, &args)?;
        st.live_range((name, &args), dst_device, n as u64, dev)?;
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
    })
}
