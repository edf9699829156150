//! Control and observation functions for tests (C ABI).

use std::ffi::{c_char, c_int, c_uint};

use fake_vendor::c_text as text;

use crate::{current_ctx, parse_addresses, parse_map, parse_visible, with_state, STATE};

/// Clears the call log, pending injections and the violation count, and re-reads the
/// environment. Live allocations, mappings and reference counts are kept.
#[no_mangle]
pub extern "C" fn fake_ascend_reset() {
    with_state(|st| {
        st.log.clear();
        st.injections.clear();
        st.violations = 0;
        st.apply_env();
    })
}

/// Sets the mapping mode (`FAKE_ASCEND_MAP` syntax). Returns 0, or -1 for an invalid spec.
///
/// # Safety
/// `spec` must be a valid NUL-terminated string (or null, which is rejected).
#[no_mangle]
pub unsafe extern "C" fn fake_ascend_set_map(spec: *const c_char) -> c_int {
    // SAFETY: forwarded caller guarantee.
    match unsafe { text(spec) }.as_deref().and_then(parse_map) {
        Some(m) => with_state(|st| {
            st.map_mode = m;
            0
        }),
        None => -1,
    }
}

/// Sets the address mode (`distinct` or `host`). Returns 0, or -1 for an invalid spec or while
/// allocations are live.
///
/// # Safety
/// `spec` must be a valid NUL-terminated string (or null, which is rejected).
#[no_mangle]
pub unsafe extern "C" fn fake_ascend_set_addresses(spec: *const c_char) -> c_int {
    // SAFETY: forwarded caller guarantee.
    match unsafe { text(spec) }.as_deref().and_then(parse_addresses) {
        Some(m) => with_state(|st| if st.heap.set_mode(m) { 0 } else { -1 }),
        None => -1,
    }
}

/// Turns address reuse after free on (non-zero) or off.
#[no_mangle]
pub extern "C" fn fake_ascend_set_reuse(on: c_int) {
    with_state(|st| st.heap.reuse = on != 0);
}

/// Sets the `ASCEND_RT_VISIBLE_DEVICES` renumbering (null: unset). Returns 0: every spec is
/// accepted and read by the runtime's rules (`parse_visible`).
///
/// # Safety
/// `spec` must be null or a valid NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn fake_ascend_set_visible(spec: *const c_char) -> c_int {
    // SAFETY: forwarded caller guarantee.
    let v = unsafe { text(spec) };
    with_state(|st| st.visible = v.map(|s| parse_visible(&s, st.devices)));
    0
}

/// Sets the bytes the HAL may map at once (the BAR budget); 0 removes the limit.
#[no_mangle]
pub extern "C" fn fake_ascend_set_bar(bytes: u64) {
    with_state(|st| st.bar_budget = (bytes > 0).then_some(bytes));
}

/// Lifecycle events so far and their modeled cost: writes `[acl_inits, device_opens,
/// device_resets, finalizes]` into `out` (when not null) and returns the modeled nanoseconds.
///
/// # Safety
/// `out` must be null or valid for writes of four `u64`.
#[no_mangle]
pub unsafe extern "C" fn fake_ascend_lifecycle(out: *mut u64) -> u64 {
    with_state(|st| {
        let l = st.lifecycle;
        if !out.is_null() {
            let v = [l.acl_inits, l.device_opens, l.device_resets, l.finalizes];
            // SAFETY: non-null and, per the caller, valid for four `u64` writes.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, 4) };
        }
        l.ns()
    })
}

/// The first device fault of logical device `dev` while it is poisoned, else 0.
#[no_mangle]
pub extern "C" fn fake_ascend_poisoned(dev: c_uint) -> c_int {
    with_state(|st| st.poisoned.get(&dev).copied().unwrap_or(0))
}

/// Sets the number of logical devices.
#[no_mangle]
pub extern "C" fn fake_ascend_set_devices(n: c_uint) {
    with_state(|st| st.devices = n);
}

/// Makes the `nth` (>= 1) next call of function `name` return `code`. Returns 0, or -1 when
/// `name` is null or `nth` is 0.
///
/// # Safety
/// `name` must be a valid NUL-terminated string (or null, which is rejected).
#[no_mangle]
pub unsafe extern "C" fn fake_ascend_inject(name: *const c_char, nth: u32, code: i32) -> c_int {
    // SAFETY: forwarded caller guarantee.
    unsafe { STATE.inject(name, nth, code) }
}

/// Copies up to `cap` bytes of the call log (UTF-8 text, one line per call, not NUL-terminated)
/// into `buf` and returns the log's full length; call again with a larger buffer when it
/// exceeds `cap`.
///
/// # Safety
/// `buf` must be valid for writes of `cap` bytes (or null with `cap` 0).
#[no_mangle]
pub unsafe extern "C" fn fake_ascend_call_log(buf: *mut c_char, cap: usize) -> usize {
    // SAFETY: forwarded caller guarantee.
    unsafe { STATE.copy_log(buf, cap) }
}

/// Number of live (not freed) allocations.
#[no_mangle]
pub extern "C" fn fake_ascend_live_allocations() -> u64 {
    with_state(|st| st.heap.len() as u64)
}

/// Number of live host registrations.
#[no_mangle]
pub extern "C" fn fake_ascend_live_mappings() -> u64 {
    with_state(|st| st.mappings.len() as u64)
}

/// Number of violations (frees of still-mapped allocations, accesses to another device's
/// allocation); must stay 0.
#[no_mangle]
pub extern "C" fn fake_ascend_violations() -> u64 {
    with_state(|st| st.violations)
}

/// Number of `aclInit` references held (0: ACL not initialized).
#[no_mangle]
pub extern "C" fn fake_ascend_init_count() -> u64 {
    with_state(|st| st.acl_refs)
}

/// Device references (sets minus resets) of logical device `dev`.
#[no_mangle]
pub extern "C" fn fake_ascend_device_refs(dev: c_uint) -> u64 {
    with_state(|st| st.device_refs.get(&dev).copied().unwrap_or(0))
}

/// Allocations freed by a device reset (live when their device's last reference went).
#[no_mangle]
pub extern "C" fn fake_ascend_reset_freed() -> u64 {
    with_state(|st| st.reset_freed)
}

/// The logical device of the live allocation containing device address `addr`; -1 if none.
#[no_mangle]
pub extern "C" fn fake_ascend_alloc_device(addr: u64) -> c_int {
    with_state(|st| {
        st.heap
            .translate(addr, 0)
            .map_or(-1, |(_, _, b)| b.meta.device as c_int)
    })
}

/// The calling thread's current context handle (0: none).
#[no_mangle]
pub extern "C" fn fake_ascend_current_context() -> usize {
    current_ctx()
}
