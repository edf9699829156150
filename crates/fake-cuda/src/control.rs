//! Control and observation functions for tests (C ABI, not part of `cuda.h`).

use std::ffi::{c_char, c_int, CStr};

use crate::{with_state, CUdevice};

/// Clears the call log, pending injections and the violation count, and re-reads the
/// environment (`FAKE_CUDA_DEVICES`, `FAKE_CUDA_INJECT`, `FAKE_CUDA_REUSE`). Initialization,
/// live allocations, registrations and retain counts are kept.
#[no_mangle]
pub extern "C" fn fake_cuda_reset() {
    with_state(|st| {
        st.log.clear();
        st.injections.clear();
        st.violations = 0;
        st.apply_env();
    })
}

/// Makes the `nth` (>= 1) next call of function `name` (its exact C name) return `code` without
/// doing anything. Returns 0, or -1 when `name` is null or `nth` is 0.
///
/// # Safety
/// `name` must be a valid NUL-terminated string (or null, which is rejected).
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_inject(name: *const c_char, nth: u32, code: i32) -> c_int {
    if name.is_null() {
        return -1;
    }
    // SAFETY: non-null and NUL-terminated per the caller.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    if with_state(|st| st.injections.push(&name, nth, code)) {
        0
    } else {
        -1
    }
}

/// Copies up to `cap` bytes of the call log (UTF-8 text, one line per call, not NUL-terminated)
/// into `buf` and returns the log's full length; call again with a larger buffer when it
/// exceeds `cap`.
///
/// # Safety
/// `buf` must be valid for writes of `cap` bytes (or null with `cap` 0).
#[no_mangle]
pub unsafe extern "C" fn fake_cuda_call_log(buf: *mut c_char, cap: usize) -> usize {
    // SAFETY: forwarded caller guarantee on `buf`.
    with_state(|st| unsafe { st.log.copy_out(buf.cast::<u8>(), cap) })
}

/// Number of live (not freed) device allocations.
#[no_mangle]
pub extern "C" fn fake_cuda_live_allocations() -> u64 {
    with_state(|st| st.heap.len() as u64)
}

/// Number of live host registrations.
#[no_mangle]
pub extern "C" fn fake_cuda_live_registrations() -> u64 {
    with_state(|st| st.registrations.len() as u64)
}

/// Total bytes of live host registrations.
#[no_mangle]
pub extern "C" fn fake_cuda_registered_bytes() -> u64 {
    with_state(|st| st.registrations.values().sum())
}

/// The primary-context retain count of `dev`, or -1 for an invalid device.
#[no_mangle]
pub extern "C" fn fake_cuda_retain_count(dev: CUdevice) -> i64 {
    with_state(|st| {
        if st.valid_device(dev) {
            i64::try_from(st.retain_count(dev)).unwrap_or(i64::MAX)
        } else {
            -1
        }
    })
}

/// Number of wrong-context uses (frees, copies or memsets of another device's allocation);
/// must stay 0.
#[no_mangle]
pub extern "C" fn fake_cuda_violations() -> u64 {
    with_state(|st| st.violations)
}

/// The device of the live allocation containing `dptr`, or -1 if none does.
#[no_mangle]
pub extern "C" fn fake_cuda_alloc_device(dptr: u64) -> c_int {
    with_state(|st| st.heap.translate(dptr, 0).map_or(-1, |(_, _, b)| b.meta))
}

/// Sets the number of devices (negative counts as 0).
#[no_mangle]
pub extern "C" fn fake_cuda_set_devices(n: c_int) {
    with_state(|st| st.devices = n.max(0));
}

/// Turns reuse of freed device addresses on (non-zero) or off (0).
#[no_mangle]
pub extern "C" fn fake_cuda_set_reuse(on: c_int) {
    with_state(|st| st.heap.reuse = on != 0);
}
