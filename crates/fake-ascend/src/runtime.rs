//! The runtime exports: the `acl*` family (`libascendcl.so`, `acl/acl_rt.h`) and the older `rt*`
//! family (`libruntime.so`, `runtime/rt.h`, `runtime/context.h`, `runtime/dev.h`). Both share the
//! device, context and memory model of [`crate::State`]; the `acl*` calls also need ACL to be
//! initialized.

use std::ffi::{c_char, c_int, c_void};

use crate::{
    with_state, HugePolicy, State, ACL_ERROR_INVALID_PARAM, ACL_ERROR_REPEAT_FINALIZE,
    ACL_ERROR_REPEAT_INITIALIZE, ACL_ERROR_RT_INVALID_DEVICEID, ACL_ERROR_UNINITIALIZE,
    ACL_SUCCESS,
};

extern "C" {
    /// From the fake's load-time dependency, `libc_sec.so` (see `build.rs`).
    fn fake_c_sec_version() -> c_int;
}

/// Runs an `acl*` call when ACL is initialized; logs UNINITIALIZE otherwise.
fn acl<R: From<c_int>>(name: &str, args: &str, f: impl FnOnce(&mut State) -> R) -> R {
    with_state(|st| {
        if st.acl_refs == 0 {
            return R::from(st.ret(name, args, ACL_ERROR_UNINITIALIZE));
        }
        f(st)
    })
}

/// `aclError aclInit(const char *configPath)`: one more reference (REPEAT_INITIALIZE after the
/// first).
///
/// # Safety
/// `config_path` is not read (it may be null or any pointer).
#[no_mangle]
pub unsafe extern "C" fn aclInit(config_path: *const c_char) -> c_int {
    with_state(|st| {
        let args = format!("{:#x}", config_path as usize);
        if let Some(code) = st.injected("aclInit", &args) {
            return code;
        }
        // SAFETY: `int fake_c_sec_version(void)`, no arguments; the library is a load-time
        // dependency, so it is loaded whenever this code runs.
        if unsafe { fake_c_sec_version() } != 1 {
            return st.ret("aclInit", &args, ACL_ERROR_INVALID_PARAM);
        }
        st.acl_refs += 1;
        let code = if st.acl_refs == 1 {
            st.lifecycle.acl_inits += 1;
            ACL_SUCCESS
        } else {
            ACL_ERROR_REPEAT_INITIALIZE
        };
        let refs = st.acl_refs;
        st.ret("aclInit", &format!("{args} refs={refs}"), code)
    })
}

/// `aclError aclFinalize(void)`: tears ACL down for every user, whatever the count.
#[no_mangle]
pub extern "C" fn aclFinalize() -> c_int {
    with_state(|st| {
        if let Some(code) = st.injected("aclFinalize", "-") {
            return code;
        }
        if st.acl_refs == 0 {
            return st.ret("aclFinalize", "-", ACL_ERROR_REPEAT_FINALIZE);
        }
        let dropped = std::mem::take(&mut st.acl_refs);
        st.lifecycle.finalizes += 1;
        st.ret("aclFinalize", &format!("dropped={dropped}"), ACL_SUCCESS)
    })
}

/// `aclError aclFinalizeReference(uint64_t *refCount)`: one reference less; finalizes at zero.
///
/// # Safety
/// `ref_count` must be null or valid for a `uint64_t` write.
#[no_mangle]
pub unsafe extern "C" fn aclFinalizeReference(ref_count: *mut u64) -> c_int {
    with_state(|st| {
        if let Some(code) = st.injected("aclFinalizeReference", "-") {
            return code;
        }
        if st.acl_refs == 0 {
            return st.ret("aclFinalizeReference", "-", ACL_ERROR_REPEAT_FINALIZE);
        }
        st.acl_refs -= 1;
        if st.acl_refs == 0 {
            st.lifecycle.finalizes += 1;
        }
        if !ref_count.is_null() {
            // SAFETY: non-null and, per the caller, valid for this write.
            unsafe { *ref_count = st.acl_refs };
        }
        let left = st.acl_refs;
        st.ret("aclFinalizeReference", &format!("refs={left}"), ACL_SUCCESS)
    })
}

/// `aclError aclrtSetDevice(int32_t deviceId)`.
#[no_mangle]
pub extern "C" fn aclrtSetDevice(device_id: i32) -> c_int {
    acl("aclrtSetDevice", &device_id.to_string(), |st| {
        st.set_device("aclrtSetDevice", device_id)
    })
}

/// `aclError aclrtResetDevice(int32_t deviceId)`.
#[no_mangle]
pub extern "C" fn aclrtResetDevice(device_id: i32) -> c_int {
    acl("aclrtResetDevice", &device_id.to_string(), |st| {
        st.reset_device("aclrtResetDevice", device_id)
    })
}

/// `aclError aclrtGetCurrentContext(aclrtContext *context)`.
///
/// # Safety
/// `context` must be null or valid for a pointer-sized write.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetCurrentContext(context: *mut *mut c_void) -> c_int {
    // SAFETY: forwarded caller guarantee on `context`.
    acl("aclrtGetCurrentContext", "-", |st| unsafe {
        st.get_context("aclrtGetCurrentContext", context)
    })
}

/// `aclError aclrtSetCurrentContext(aclrtContext context)`.
#[no_mangle]
pub extern "C" fn aclrtSetCurrentContext(context: *mut c_void) -> c_int {
    let ctx = context as usize;
    acl("aclrtSetCurrentContext", &format!("{ctx:#x}"), |st| {
        st.set_context("aclrtSetCurrentContext", ctx)
    })
}

/// Common body of `aclrtGetLogicDevIdByUserDevId` and `rtGetLogicDevIdByUserDevId`.
///
/// # Safety
/// `logic` must be null or valid for an `int32_t` write.
unsafe fn logic_id(st: &mut State, name: &str, user: i32, logic: *mut i32) -> c_int {
    let args = user.to_string();
    if let Some(code) = st.injected(name, &args) {
        return code;
    }
    if logic.is_null() {
        return st.ret(name, &args, ACL_ERROR_INVALID_PARAM);
    }
    let Some(id) = st.logical(user) else {
        return st.ret(name, &args, ACL_ERROR_RT_INVALID_DEVICEID);
    };
    // SAFETY: non-null and, per the caller, valid for this write; `id` < devices fits i32.
    unsafe { *logic = id as i32 };
    st.ret(name, &format!("{args} logical={id}"), ACL_SUCCESS)
}

/// `aclError aclrtGetLogicDevIdByUserDevId(const int32_t userDevid, int32_t *const logicDevId)`.
///
/// # Safety
/// `logic_dev_id` must be null or valid for an `int32_t` write.
#[no_mangle]
pub unsafe extern "C" fn aclrtGetLogicDevIdByUserDevId(
    user_devid: i32,
    logic_dev_id: *mut i32,
) -> c_int {
    let name = "aclrtGetLogicDevIdByUserDevId";
    // SAFETY: forwarded caller guarantee on `logic_dev_id`.
    acl(name, &user_devid.to_string(), |st| unsafe {
        logic_id(st, name, user_devid, logic_dev_id)
    })
}

/// `aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)`.
///
/// # Safety
/// `dev_ptr` must be null or valid for a pointer-sized write.
#[no_mangle]
pub unsafe extern "C" fn aclrtMalloc(
    dev_ptr: *mut *mut c_void,
    size: usize,
    policy: c_int,
) -> c_int {
    acl("aclrtMalloc", &format!("- {size}"), |st| {
        let p = match policy {
            0 => HugePolicy::HugeFirst,
            1 => HugePolicy::HugeOnly,
            2 => HugePolicy::NormalOnly,
            _ => {
                let args = format!("- {size} policy={policy}");
                return st.ret("aclrtMalloc", &args, ACL_ERROR_INVALID_PARAM);
            }
        };
        // SAFETY: forwarded caller guarantee on `dev_ptr`.
        unsafe { st.malloc("aclrtMalloc", dev_ptr, size as u64, p) }
    })
}

/// `aclError aclrtFree(void *devPtr)`.
#[no_mangle]
pub extern "C" fn aclrtFree(dev_ptr: *mut c_void) -> c_int {
    let addr = dev_ptr as u64;
    acl("aclrtFree", &format!("{addr:#x}"), |st| {
        st.free("aclrtFree", addr)
    })
}

/// `aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
/// aclrtMemcpyKind kind)`.
///
/// # Safety
/// Host-side pointers must be valid for `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> c_int {
    // SAFETY: forwarded caller guarantee on the host pointers.
    acl(
        "aclrtMemcpy",
        &format!("{count} kind={kind}"),
        |st| unsafe { st.memcpy("aclrtMemcpy", dst, dest_max as u64, src, count as u64, kind) },
    )
}

/// `aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)`.
#[no_mangle]
pub extern "C" fn aclrtMemset(
    dev_ptr: *mut c_void,
    max_count: usize,
    value: i32,
    count: usize,
) -> c_int {
    let addr = dev_ptr as u64;
    acl("aclrtMemset", &format!("{addr:#x} {count}"), |st| {
        st.memset(
            "aclrtMemset",
            addr,
            max_count as u64,
            value as u8,
            count as u64,
        )
    })
}

/// `rtError_t rtSetDevice(int32_t devId)`.
#[no_mangle]
pub extern "C" fn rtSetDevice(dev_id: i32) -> c_int {
    with_state(|st| st.set_device("rtSetDevice", dev_id))
}

/// `rtError_t rtDeviceReset(int32_t devId)`.
#[no_mangle]
pub extern "C" fn rtDeviceReset(dev_id: i32) -> c_int {
    with_state(|st| st.reset_device("rtDeviceReset", dev_id))
}

/// `rtError_t rtCtxGetCurrent(rtContext_t *currentCtx)`.
///
/// # Safety
/// `current_ctx` must be null or valid for a pointer-sized write.
#[no_mangle]
pub unsafe extern "C" fn rtCtxGetCurrent(current_ctx: *mut *mut c_void) -> c_int {
    // SAFETY: forwarded caller guarantee on `current_ctx`.
    with_state(|st| unsafe { st.get_context("rtCtxGetCurrent", current_ctx) })
}

/// `rtError_t rtCtxSetCurrent(rtContext_t currentCtx)`.
#[no_mangle]
pub extern "C" fn rtCtxSetCurrent(current_ctx: *mut c_void) -> c_int {
    with_state(|st| st.set_context("rtCtxSetCurrent", current_ctx as usize))
}

/// `rtError_t rtGetLogicDevIdByUserDevId(const int32_t userDevId, int32_t *const logicDevId)`.
///
/// # Safety
/// `logic_dev_id` must be null or valid for an `int32_t` write.
#[no_mangle]
pub unsafe extern "C" fn rtGetLogicDevIdByUserDevId(
    user_dev_id: i32,
    logic_dev_id: *mut i32,
) -> c_int {
    // SAFETY: forwarded caller guarantee on `logic_dev_id`.
    with_state(|st| unsafe {
        logic_id(st, "rtGetLogicDevIdByUserDevId", user_dev_id, logic_dev_id)
    })
}

/// `rtError_t rtMalloc(void **devPtr, uint64_t size, rtMemType_t type, uint16_t moduleId)`.
///
/// # Safety
/// `dev_ptr` must be null or valid for a pointer-sized write.
#[no_mangle]
pub unsafe extern "C" fn rtMalloc(
    dev_ptr: *mut *mut c_void,
    size: u64,
    mem_type: u32,
    _module_id: u16,
) -> c_int {
    let p = if mem_type & 0x800 != 0 {
        HugePolicy::HugeOnly
    } else if mem_type & 0x1000 != 0 {
        HugePolicy::NormalOnly
    } else {
        HugePolicy::HugeFirst
    };
    // SAFETY: forwarded caller guarantee on `dev_ptr`.
    with_state(|st| unsafe { st.malloc("rtMalloc", dev_ptr, size, p) })
}

/// `rtError_t rtFree(void *devPtr)`.
#[no_mangle]
pub extern "C" fn rtFree(dev_ptr: *mut c_void) -> c_int {
    with_state(|st| st.free("rtFree", dev_ptr as u64))
}

/// `rtError_t rtMemcpy(void *dst, uint64_t destMax, const void *src, uint64_t cnt,
/// rtMemcpyKind_t kind)`.
///
/// # Safety
/// Host-side pointers must be valid for `cnt` bytes.
#[no_mangle]
pub unsafe extern "C" fn rtMemcpy(
    dst: *mut c_void,
    dest_max: u64,
    src: *const c_void,
    cnt: u64,
    kind: c_int,
) -> c_int {
    // SAFETY: forwarded caller guarantee on the host pointers.
    with_state(|st| unsafe { st.memcpy("rtMemcpy", dst, dest_max, src, cnt, kind) })
}

/// `rtError_t rtMemset(void *devPtr, uint64_t destMax, uint32_t value, uint64_t count)`.
#[no_mangle]
pub extern "C" fn rtMemset(dev_ptr: *mut c_void, dest_max: u64, value: u32, count: u64) -> c_int {
    with_state(|st| st.memset("rtMemset", dev_ptr as u64, dest_max, value as u8, count))
}
