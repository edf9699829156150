//! The HAL exports (`libascend_hal.so`, `ascend_hal.h`): host registration of device memory and
//! the feature query.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use crate::{
    with_state, MapMode, Mapping, DRV_ERROR_INVALID_DEVICE, DRV_ERROR_INVALID_VALUE,
    DRV_ERROR_NOT_EXIST, DRV_ERROR_NOT_SUPPORT, DRV_ERROR_OUT_OF_MEMORY, DRV_ERROR_PARA_ERROR,
    HUGE_PAGE, PAGE,
};

/// `halHostRegister` map type: device memory mapped for the host.
const DEV_SVM_MAP_HOST: c_uint = 2;
/// `halMemCtl` type: feature query.
const CTRL_TYPE_SUPPORT_FEATURE: c_int = 2;

/// `drvError_t halHostRegister(void *srcPtr, UINT64 size, UINT32 flag, UINT32 devid,
/// void **dstPtr)`. `srcPtr` must be page-aligned (2 MiB for huge-page memory) inside one live
/// allocation; the registration is keyed by `devid` (see `halHostUnregister`); past the BAR
/// budget it answers OUT_OF_MEMORY.
///
/// # Safety
/// `dst_ptr` must be null or valid for a pointer-sized write.
#[no_mangle]
pub unsafe extern "C" fn halHostRegister(
    src_ptr: *mut c_void,
    size: c_ulonglong,
    flag: c_uint,
    devid: c_uint,
    dst_ptr: *mut *mut c_void,
) -> c_int {
    const NAME: &str = "halHostRegister";
    with_state(|st| {
        let addr = src_ptr as u64;
        let args = format!("{addr:#x} {size} flag={flag} devid={devid}");
        if let Some(code) = st.injected(NAME, &args) {
            return code;
        }
        if dst_ptr.is_null() || size == 0 {
            return st.ret(NAME, &args, DRV_ERROR_PARA_ERROR);
        }
        if flag != DEV_SVM_MAP_HOST {
            return st.ret(NAME, &args, DRV_ERROR_NOT_SUPPORT);
        }
        let Some((_, host, block)) = st.heap.translate(addr, size) else {
            return st.ret(NAME, &args, DRV_ERROR_INVALID_VALUE);
        };
        let (block_size, huge) = (block.size, block.meta.huge);
        let align = if huge { HUGE_PAGE } else { PAGE };
        if !addr.is_multiple_of(align) {
            return st.ret(NAME, &format!("{args} unaligned"), DRV_ERROR_INVALID_VALUE);
        }
        let end = addr + size;
        let overlaps = st
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&s, m)| s + m.size > addr);
        if overlaps {
            return st.ret(NAME, &args, DRV_ERROR_PARA_ERROR);
        }
        let grant = match st.map_mode {
            MapMode::Always => true,
            MapMode::Never => false,
            MapMode::Min(n) => block_size >= n,
            MapMode::Pages => huge,
            MapMode::StubNull => return st.ret(NAME, &format!("{args} stub"), 0),
        };
        if !grant {
            return st.ret(NAME, &args, DRV_ERROR_NOT_SUPPORT);
        }
        if let Some(budget) = st.bar_budget {
            let mapped = st.mapped_bytes();
            if mapped.saturating_add(size) > budget {
                let why = format!("{args} bar-exhausted({mapped}+{size}>{budget})");
                return st.ret(NAME, &why, DRV_ERROR_OUT_OF_MEMORY);
            }
        }
        // SAFETY: `dst_ptr` is non-null and, per the caller, valid for this write.
        unsafe { *dst_ptr = host.cast() };
        st.mappings.insert(addr, Mapping { size, devid });
        st.ret(NAME, &format!("{args} host={:#x}", host as usize), 0)
    })
}

/// `drvError_t halHostUnregister(void *srcPtr, UINT32 devid)`: the device pointer a registration
/// was made with, looked up under `devid`: another id finds nothing (NOT_EXIST), and the
/// registration stays (leaked), as in the driver.
#[no_mangle]
pub extern "C" fn halHostUnregister(src_ptr: *mut c_void, devid: c_uint) -> c_int {
    const NAME: &str = "halHostUnregister";
    with_state(|st| {
        let addr = src_ptr as u64;
        let args = format!("{addr:#x} devid={devid}");
        if let Some(code) = st.injected(NAME, &args) {
            return code;
        }
        match st.mappings.get(&addr) {
            Some(m) if m.devid == devid => {}
            Some(m) => {
                let why = format!("{args} registered-under-devid={}", m.devid);
                return st.ret(NAME, &why, DRV_ERROR_NOT_EXIST);
            }
            None => return st.ret(NAME, &args, DRV_ERROR_NOT_EXIST),
        }
        st.mappings.remove(&addr);
        st.ret(NAME, &args, 0)
    })
}

/// `drvError_t halMemCtl(int type, void *param, size_t param_size, void *out, size_t *out_size)`.
/// Only `CTRL_TYPE_SUPPORT_FEATURE` (2) with `struct { UINT64 support_feature; UINT32 devid; }`
/// is emulated: bit 1<<1 = ordinary-page mapping, 1<<3 = huge-page mapping, per the map mode.
///
/// # Safety
/// `param` must be valid for reads of `param_size` bytes, `out` for writes of `*out_size` bytes,
/// `out_size` for a read and write (each may be null, which is an error).
#[no_mangle]
pub unsafe extern "C" fn halMemCtl(
    kind: c_int,
    param: *mut c_void,
    param_size: usize,
    out: *mut c_void,
    out_size: *mut usize,
) -> c_int {
    const NAME: &str = "halMemCtl";
    with_state(|st| {
        let args = format!("type={kind} param_size={param_size}");
        if let Some(code) = st.injected(NAME, &args) {
            return code;
        }
        if kind != CTRL_TYPE_SUPPORT_FEATURE {
            return st.ret(NAME, &args, DRV_ERROR_NOT_SUPPORT);
        }
        if param.is_null() || param_size < 12 || out.is_null() || out_size.is_null() {
            return st.ret(NAME, &args, DRV_ERROR_PARA_ERROR);
        }
        // SAFETY: `out_size` is non-null and valid per the caller.
        if unsafe { *out_size } < 8 {
            return st.ret(NAME, &args, DRV_ERROR_PARA_ERROR);
        }
        // SAFETY: `param` holds at least 12 bytes; the devid is the UINT32 at offset 8.
        let devid = unsafe { param.cast::<u8>().add(8).cast::<u32>().read_unaligned() };
        if devid >= st.devices {
            return st.ret(NAME, &args, DRV_ERROR_INVALID_DEVICE);
        }
        let features: u64 = match st.map_mode {
            MapMode::Always => (1 << 1) | (1 << 3),
            MapMode::Min(_) | MapMode::Pages => 1 << 3,
            MapMode::Never | MapMode::StubNull => 0,
        };
        // SAFETY: `out` holds at least 8 bytes (checked above); `support_feature` is first.
        unsafe { out.cast::<u64>().write_unaligned(features) };
        st.ret(
            NAME,
            &format!("{args} devid={devid} features={features:#x}"),
            0,
        )
    })
}
