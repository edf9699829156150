//! Raw CANN signatures, constants and status codes: the runtime (`acl/acl_rt.h`,
//! `acl/acl_base_rt.h`, `acl/error_codes/rt_error_codes.h`, `runtime/rt.h`) and the driver's HAL
//! (`ascend_hal.h`). Widths are exact: `int32_t` = `i32`, `int` = `c_int`, `size_t` = `usize`,
//! `uint64_t` / `UINT64` = `u64` / `c_ulonglong`, `uint32_t` / `UINT32` = `c_uint`,
//! `uint16_t` = `u16`; `aclError`, `rtError_t` and `drvError_t` are 32-bit ints.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use crate::Status;

/// `aclrtContext` / `rtContext_t`: an opaque handle.
pub type Context = *mut c_void;

pub type AclInitFn = unsafe extern "C" fn(config_path: *const c_char) -> c_int;
pub type AclFinalizeReferenceFn = unsafe extern "C" fn(ref_count: *mut u64) -> c_int;
/// `aclrtSetDevice` / `aclrtResetDevice` / `rtSetDevice` / `rtDeviceReset`.
pub type DeviceFn = unsafe extern "C" fn(device_id: i32) -> c_int;
/// `aclrtGetCurrentContext` / `rtCtxGetCurrent`.
pub type GetContextFn = unsafe extern "C" fn(ctx: *mut Context) -> c_int;
/// `aclrtSetCurrentContext` / `rtCtxSetCurrent`.
pub type SetContextFn = unsafe extern "C" fn(ctx: Context) -> c_int;
/// `aclrtGetLogicDevIdByUserDevId` / `rtGetLogicDevIdByUserDevId`.
pub type LogicIdFn = unsafe extern "C" fn(user: i32, logic: *mut i32) -> c_int;
pub type AclMallocFn =
    unsafe extern "C" fn(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> c_int;
/// `aclrtFree` / `rtFree`.
pub type FreeFn = unsafe extern "C" fn(dev_ptr: *mut c_void) -> c_int;
pub type AclMemcpyFn = unsafe extern "C" fn(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> c_int;
pub type AclMemsetFn =
    unsafe extern "C" fn(dev_ptr: *mut c_void, max_count: usize, value: i32, count: usize) -> c_int;
pub type RtMallocFn = unsafe extern "C" fn(
    dev_ptr: *mut *mut c_void,
    size: u64,
    mem_type: u32,
    module_id: u16,
) -> i32;
pub type RtMemcpyFn = unsafe extern "C" fn(
    dst: *mut c_void,
    dest_max: u64,
    src: *const c_void,
    cnt: u64,
    kind: c_int,
) -> i32;
pub type RtMemsetFn =
    unsafe extern "C" fn(dev_ptr: *mut c_void, dest_max: u64, value: u32, count: u64) -> i32;
pub type HalHostRegisterFn = unsafe extern "C" fn(
    src_ptr: *mut c_void,
    size: c_ulonglong,
    flag: c_uint,
    devid: c_uint,
    dst_ptr: *mut *mut c_void,
) -> c_int;
pub type HalHostUnregisterFn = unsafe extern "C" fn(src_ptr: *mut c_void, devid: c_uint) -> c_int;

/// `halHostRegister` flag: map device memory for the host (`DEV_SVM_MAP_HOST`, process type 0).
pub const DEV_SVM_MAP_HOST: c_uint = 2;
pub const MEMCPY_HOST_TO_DEVICE: c_int = 1;
pub const MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `rtMalloc` memory type: HBM.
pub const RT_MEMORY_HBM: u32 = 0x2;

pub const ACL_ERROR_INVALID_PARAM: i64 = 100_000;
pub const ACL_ERROR_REPEAT_INITIALIZE: i64 = 100_002;
pub const ACL_ERROR_API_NOT_SUPPORT: i64 = 200_001;
pub const ACL_ERROR_RT_CONTEXT_NULL: i64 = 107_002;
pub const ACL_ERROR_RT_FEATURE_NOT_SUPPORT: i64 = 207_000;
pub const ACL_ERROR_RT_INTERNAL_ERROR: i64 = 507_000;

/// Whether a runtime code is a device fault after which the device is unusable until it is
/// reset (`acl/error_codes/rt_error_codes.h`: lost heartbeat, DMA, AI Core and AI CPU timeouts
/// and exceptions, device memory and ECC errors, the driver's internal error; not the generic
/// 507000 internal error).
pub fn is_device_fault(code: i64) -> bool {
    matches!(
        code,
        507_010 | 507_013..=507_018 | 507_053 | 507_054 | 507_899
    )
}

/// Status codes of the `acl*` and `rt*` runtime (`acl/acl_base_rt.h` and
/// `acl/error_codes/rt_error_codes.h`; the `rt*` functions return the same `ACL_ERROR_RT_*`
/// numbers).
const ACL_CODES: &[(i64, &str)] = &[
    (0, "ACL_SUCCESS"),
    (100_000, "ACL_ERROR_INVALID_PARAM"),
    (100_001, "ACL_ERROR_UNINITIALIZE"),
    (100_002, "ACL_ERROR_REPEAT_INITIALIZE"),
    (100_037, "ACL_ERROR_REPEAT_FINALIZE"),
    (107_000, "ACL_ERROR_RT_PARAM_INVALID"),
    (107_001, "ACL_ERROR_RT_INVALID_DEVICEID"),
    (107_002, "ACL_ERROR_RT_CONTEXT_NULL"),
    (107_003, "ACL_ERROR_RT_STREAM_CONTEXT"),
    (107_008, "ACL_ERROR_RT_ADDR_UNALIGNED"),
    (107_016, "ACL_ERROR_RT_INVALID_MEMORY_TYPE"),
    (107_017, "ACL_ERROR_RT_INVALID_HANDLE"),
    (107_018, "ACL_ERROR_RT_INVALID_MALLOC_TYPE"),
    (107_019, "ACL_ERROR_RT_WAIT_TIMEOUT"),
    (107_020, "ACL_ERROR_RT_TASK_TIMEOUT"),
    (200_000, "ACL_ERROR_BAD_ALLOC"),
    (200_001, "ACL_ERROR_API_NOT_SUPPORT"),
    (200_002, "ACL_ERROR_INVALID_DEVICE"),
    (200_003, "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED"),
    (207_000, "ACL_ERROR_RT_FEATURE_NOT_SUPPORT"),
    (207_001, "ACL_ERROR_RT_MEMORY_ALLOCATION"),
    (207_002, "ACL_ERROR_RT_MEMORY_FREE"),
    (207_004, "ACL_ERROR_RT_NO_DEVICE"),
    (207_005, "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL"),
    (207_006, "ACL_ERROR_RT_NO_PERMISSION"),
    (207_012, "ACL_ERROR_RT_OVER_LIMIT"),
    (207_015, "ACL_ERROR_RT_REPEATED_INIT"),
    (207_018, "ACL_ERROR_RT_DEVICE_OOM"),
    (207_020, "ACL_ERROR_RT_TIMEOUT"),
    (500_000, "ACL_ERROR_INTERNAL_ERROR"),
    (500_001, "ACL_ERROR_FAILURE"),
    (500_003, "ACL_ERROR_RT_FAILURE"),
    (500_004, "ACL_ERROR_DRV_FAILURE"),
    (507_000, "ACL_ERROR_RT_INTERNAL_ERROR"),
    (507_001, "ACL_ERROR_RT_TS_ERROR"),
    (507_007, "ACL_ERROR_RT_CONTEXT_RELEASE_ERROR"),
    (507_010, "ACL_ERROR_RT_LOST_HEARTBEAT"),
    (507_013, "ACL_ERROR_RT_SYS_DMA"),
    (507_014, "ACL_ERROR_RT_AICORE_TIMEOUT"),
    (507_015, "ACL_ERROR_RT_AICORE_EXCEPTION"),
    (507_016, "ACL_ERROR_RT_AICORE_TRAP_EXCEPTION"),
    (507_017, "ACL_ERROR_RT_AICPU_TIMEOUT"),
    (507_018, "ACL_ERROR_RT_AICPU_EXCEPTION"),
    (507_033, "ACL_ERROR_RT_DEV_SETUP_ERROR"),
    (507_052, "ACL_ERROR_RT_COPY_DATA"),
    (507_053, "ACL_ERROR_RT_DEVICE_MEM_ERROR"),
    (507_054, "ACL_ERROR_RT_HBM_MULTI_BIT_ECC_ERROR"),
    (507_899, "ACL_ERROR_RT_DRV_INTERNAL_ERROR"),
    (507_900, "ACL_ERROR_RT_AICPU_INTERNAL_ERROR"),
    (507_910, "ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
    (507_911, "ACL_ERROR_HOST_MEMORY_NOT_REGISTERED"),
];

/// The symbolic name of an `aclError` / `rtError_t`, or `"UNKNOWN"`.
pub fn acl_code_name(code: i64) -> &'static str {
    ACL_CODES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("UNKNOWN", |(_, n)| n)
}

/// The symbolic name of a HAL `drvError_t` (`ascend_hal.h`), or `"UNKNOWN"`.
pub fn drv_code_name(code: i64) -> &'static str {
    crate::codes::name(code)
}

/// A runtime status (`aclError`, or `rtError_t` from the `rt*` family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct AclStatus(pub c_int);

impl AclStatus {
    /// `Ok` for `ACL_SUCCESS`, else the code and its name.
    pub fn result(self) -> Result<(), Status> {
        match self.0 {
            0 => Ok(()),
            c => Err(Status {
                code: i64::from(c),
                name: acl_code_name(i64::from(c)),
            }),
        }
    }
}

/// A HAL status (`drvError_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct DrvStatus(pub c_int);

impl DrvStatus {
    /// `Ok` for `DRV_ERROR_NONE`, else the code and its name.
    pub fn result(self) -> Result<(), Status> {
        match self.0 {
            0 => Ok(()),
            c => Err(Status {
                code: i64::from(c),
                name: drv_code_name(i64::from(c)),
            }),
        }
    }
}

/// A runtime status the driver made up for a call it refused itself.
pub fn acl_status(code: i64) -> Status {
    Status {
        code,
        name: acl_code_name(code),
    }
}

/// A HAL status the driver made up for a call it refused itself.
pub fn drv_status(code: i64) -> Status {
    Status {
        code,
        name: drv_code_name(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_follow_the_vendor_tables() {
        assert_eq!(acl_code_name(507_000), "ACL_ERROR_RT_INTERNAL_ERROR");
        assert_eq!(acl_code_name(507_899), "ACL_ERROR_RT_DRV_INTERNAL_ERROR");
        assert_eq!(acl_code_name(207_018), "ACL_ERROR_RT_DEVICE_OOM");
        assert_eq!(acl_code_name(107_001), "ACL_ERROR_RT_INVALID_DEVICEID");
        assert_eq!(acl_code_name(100_000), "ACL_ERROR_INVALID_PARAM");
        assert_eq!(acl_code_name(1), "UNKNOWN");
        assert_eq!(drv_code_name(0xfffe), "DRV_ERROR_NOT_SUPPORT");
        assert_eq!(drv_code_name(8), "DRV_ERROR_PARA_ERROR");
        assert_eq!(AclStatus(0).result(), Ok(()));
        let s = AclStatus(107_002).result().unwrap_err();
        assert_eq!((s.code, s.name), (107_002, "ACL_ERROR_RT_CONTEXT_NULL"));
        assert_eq!(
            DrvStatus(3).result().unwrap_err().name,
            "DRV_ERROR_INVALID_VALUE"
        );
    }
}
