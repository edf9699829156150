//! A fake Ascend vendor library, for tests: the `acl*` runtime, the older `rt*` runtime and the
//! HAL's `halHostRegister`/`halHostUnregister`/`halMemCtl`, with their exact C signatures
//! (the CANN headers `acl/acl_rt.h`, `runtime/rt.h` and the driver's `ascend_hal.h`), backed by host memory.
//!
//! Tests symlink `libascendcl.so`, `libruntime.so` and `libascend_hal.so` to this one file, so the
//! three "libraries" share one instance and one state (the dynamic loader identifies a file by its
//! inode). A directory without `libascendcl.so` exercises a driver's `rt*` fallback.
//!
//! Like the sim backend, device addresses are handed out from a distinct, non-canonical range
//! (`DEV_BASE` upward) and translated here, so a caller that dereferences a device address
//! crashes instead of silently working. Mapped host pointers point into the backing memory.
//!
//! Configuration, read from the environment on first use (so a whole pytest run can be
//! configured) and changeable through exported control functions:
//! * `FAKE_ASCEND_MAP` / `fake_ascend_set_map`: which `halHostRegister` calls succeed —
//!   `always` (default), `never` (NOT_SUPPORT), `min:<bytes>` (allocations smaller than that are
//!   refused with NOT_SUPPORT), `pages` (ordinary-page allocations are refused, huge-page ones
//!   granted, as on a 64 KiB-page host; an allocation is huge-page when its policy is huge-only,
//!   or huge-first and larger than 1 MiB), `stubnull` (return 0 and leave the out pointer
//!   untouched, like the toolkit's stub library).
//! * `FAKE_ASCEND_DEVICES` / `fake_ascend_set_devices`: number of physical devices (default 8);
//!   device ids at or past it are invalid for both the runtime and the HAL.
//! * `FAKE_ASCEND_INJECT=name:nth:code[,name:nth:code...]` / `fake_ascend_inject`: the `nth`
//!   next call of the named function returns `code` without doing anything.
//!
//! Observation: `fake_ascend_call_log` (one text line per call: `name args -> code`, the device
//! address as the second word where there is one), `fake_ascend_live_allocations`,
//! `fake_ascend_live_mappings` and `fake_ascend_violations` (frees of still-mapped allocations;
//! such a free is logged with `STILL-MAPPED`, succeeds, and keeps the memory alive so the stale
//! host pointer stays harmless). `fake_ascend_reset` clears the log, the injections and the
//! violation count and re-reads the environment; it keeps live allocations and mappings.

use std::alloc::{self, Layout};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::sync::{Mutex, MutexGuard};

/// First device address handed out: non-canonical on x86-64 and outside aarch64 user space.
const DEV_BASE: u64 = 0xa5c0_0000_0000_0000;
/// Device address alignment and the unmapped gap after each allocation.
const PAGE: u64 = 4096;
/// Huge-page-first allocations larger than this get huge pages (as the CANN runtime does).
const HUGE_THRESHOLD: u64 = 1 << 20;
/// Byte written into fresh allocations (device memory is not zeroed).
const FILL: u8 = 0xCD;

const ACL_SUCCESS: c_int = 0;
const ACL_ERROR_INVALID_PARAM: c_int = 100_000;
const ACL_ERROR_UNINITIALIZE: c_int = 100_001;
const ACL_ERROR_REPEAT_INITIALIZE: c_int = 100_002;
const ACL_ERROR_REPEAT_FINALIZE: c_int = 100_037;
const ACL_ERROR_INVALID_DEVICE: c_int = 200_002;
const ACL_ERROR_RT_CONTEXT_NULL: c_int = 107_002;
const ACL_ERROR_RT_MEMORY_ALLOCATION: c_int = 207_001;

const DRV_ERROR_INVALID_DEVICE: c_int = 2;
const DRV_ERROR_INVALID_VALUE: c_int = 3;
const DRV_ERROR_PARA_ERROR: c_int = 8;
const DRV_ERROR_NOT_EXIST: c_int = 11;
const DRV_ERROR_NOT_SUPPORT: c_int = 0xfffe;

const DEV_SVM_MAP_HOST: c_uint = 2;
const CTRL_TYPE_SUPPORT_FEATURE: c_int = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MapMode {
    Always,
    Never,
    Min(u64),
    Pages,
    StubNull,
}

fn parse_map(s: &str) -> Option<MapMode> {
    match s.trim() {
        "always" => Some(MapMode::Always),
        "never" => Some(MapMode::Never),
        "pages" => Some(MapMode::Pages),
        "stubnull" => Some(MapMode::StubNull),
        other => other
            .strip_prefix("min:")
            .and_then(|n| n.trim().parse().ok())
            .map(MapMode::Min),
    }
}

/// Host memory standing in for one device allocation.
struct Backing {
    ptr: *mut u8,
    layout: Layout,
}

// SAFETY: `Backing` owns its block exclusively; it is only touched under the state mutex (or by
// callers through a mapping, as a device's memory would be).
unsafe impl Send for Backing {}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc::alloc` with exactly `layout` and is freed once, here.
        unsafe { alloc::dealloc(self.ptr, self.layout) };
    }
}

struct Allocation {
    size: u64,
    huge: bool,
    mem: Backing,
}

struct Mapping {
    size: u64,
    devid: u32,
}

struct Injection {
    name: String,
    remaining: u32,
    code: c_int,
}

struct State {
    map_mode: MapMode,
    devices: u32,
    next: u64,
    allocs: BTreeMap<u64, Allocation>,
    mappings: BTreeMap<u64, Mapping>,
    /// Memory of allocations freed while still mapped: kept so the stale host pointer stays valid.
    leaked: Vec<Backing>,
    injections: Vec<Injection>,
    log: String,
    violations: u64,
    acl_initialized: bool,
    /// Devices set through `aclrtSetDevice`/`rtSetDevice`, with how many sets are not yet
    /// balanced by a reset (the runtime reference-counts them).
    devices_set: BTreeMap<i32, u32>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

impl State {
    fn from_env() -> State {
        let mut st = State {
            map_mode: MapMode::Always,
            devices: 8,
            next: DEV_BASE,
            allocs: BTreeMap::new(),
            mappings: BTreeMap::new(),
            leaked: Vec::new(),
            injections: Vec::new(),
            log: String::new(),
            violations: 0,
            acl_initialized: false,
            devices_set: BTreeMap::new(),
        };
        st.apply_env();
        st
    }

    fn apply_env(&mut self) {
        self.map_mode = MapMode::Always;
        self.devices = 8;
        if let Ok(v) = std::env::var("FAKE_ASCEND_MAP") {
            match parse_map(&v) {
                Some(m) => self.map_mode = m,
                None => self.config_error(&format!("FAKE_ASCEND_MAP={v:?}")),
            }
        }
        if let Ok(v) = std::env::var("FAKE_ASCEND_DEVICES") {
            match v.trim().parse() {
                Ok(n) => self.devices = n,
                Err(_) => self.config_error(&format!("FAKE_ASCEND_DEVICES={v:?}")),
            }
        }
        if let Ok(v) = std::env::var("FAKE_ASCEND_INJECT") {
            for item in v.split(',').filter(|s| !s.trim().is_empty()) {
                let parts: Vec<&str> = item.trim().split(':').collect();
                let parsed = match parts.as_slice() {
                    [name, nth, code] => nth
                        .parse::<u32>()
                        .ok()
                        .filter(|&n| n > 0)
                        .zip(code.parse::<c_int>().ok())
                        .map(|(n, c)| (name.to_string(), n, c)),
                    _ => None,
                };
                match parsed {
                    Some((name, remaining, code)) => self.injections.push(Injection {
                        name,
                        remaining,
                        code,
                    }),
                    None => self.config_error(&format!("FAKE_ASCEND_INJECT item {item:?}")),
                }
            }
        }
    }

    fn config_error(&mut self, what: &str) {
        eprintln!("fake-ascend: ignoring invalid {what}");
        self.line(format!("fake_ascend config error: {what}"));
    }

    fn line(&mut self, s: String) {
        self.log.push_str(&s);
        self.log.push('\n');
    }

    /// Logs a call and returns its code.
    fn ret(&mut self, name: &str, args: String, code: c_int) -> c_int {
        self.line(format!("{name} {args} -> {code}"));
        code
    }

    /// An injected failure for this call of `name`, if one is due (logged).
    fn injected(&mut self, name: &str, args: &str) -> Option<c_int> {
        let mut fired = None;
        for inj in self.injections.iter_mut().filter(|i| i.name == name) {
            inj.remaining -= 1;
            if inj.remaining == 0 && fired.is_none() {
                fired = Some(inj.code);
            }
        }
        self.injections.retain(|i| i.remaining > 0);
        if let Some(code) = fired {
            self.line(format!("{name} {args} -> {code} (injected)"));
        }
        fired
    }

    /// The allocation containing `[addr, addr + len)`: its base and the host address of `addr`.
    fn translate(&self, addr: u64, len: u64) -> Option<(u64, *mut u8)> {
        let (&base, a) = self.allocs.range(..=addr).next_back()?;
        let end = addr.checked_add(len)?;
        if addr >= base + a.size || end > base + a.size {
            return None;
        }
        // SAFETY: `addr - base < a.size`, so the offset stays inside the backing block.
        Some((base, unsafe { a.mem.ptr.add((addr - base) as usize) }))
    }

    fn alloc(&mut self, size: u64, huge: bool) -> Result<u64, c_int> {
        let len = usize::try_from(size).map_err(|_| ACL_ERROR_RT_MEMORY_ALLOCATION)?;
        let layout = Layout::from_size_align(len, PAGE as usize)
            .map_err(|_| ACL_ERROR_RT_MEMORY_ALLOCATION)?;
        // SAFETY: callers reject `size == 0`, so the layout is non-zero-sized.
        let ptr = unsafe { alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(ACL_ERROR_RT_MEMORY_ALLOCATION);
        }
        // SAFETY: `ptr` is a fresh block of `len` bytes.
        unsafe { std::ptr::write_bytes(ptr, FILL, len) };
        let mem = Backing { ptr, layout };
        let addr = self.next;
        let span = size.div_ceil(PAGE) * PAGE + PAGE;
        self.next = addr
            .checked_add(span)
            .ok_or(ACL_ERROR_RT_MEMORY_ALLOCATION)?;
        self.allocs.insert(addr, Allocation { size, huge, mem });
        Ok(addr)
    }

    fn free(&mut self, name: &str, addr: u64) -> c_int {
        let args = format!("{addr:#x}");
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        let Some(a) = self.allocs.remove(&addr) else {
            return self.ret(name, args, ACL_ERROR_INVALID_PARAM);
        };
        let end = addr + a.size;
        let mapped = self.mappings.range(addr..end).count();
        if mapped > 0 {
            self.violations += 1;
            self.leaked.push(a.mem);
            return self.ret(name, format!("{args} STILL-MAPPED({mapped})"), ACL_SUCCESS);
        }
        self.ret(name, args, ACL_SUCCESS)
    }

    fn set_device(&mut self, name: &str, id: i32) -> c_int {
        let args = id.to_string();
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        if id < 0 || id as u32 >= self.devices {
            return self.ret(name, args, ACL_ERROR_INVALID_DEVICE);
        }
        *self.devices_set.entry(id).or_insert(0) += 1;
        self.ret(name, args, ACL_SUCCESS)
    }

    fn reset_device(&mut self, name: &str, id: i32) -> c_int {
        let args = id.to_string();
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        let Some(count) = self.devices_set.get_mut(&id) else {
            return self.ret(name, args, ACL_ERROR_INVALID_DEVICE);
        };
        *count -= 1;
        if *count == 0 {
            self.devices_set.remove(&id);
        }
        self.ret(name, args, ACL_SUCCESS)
    }

    /// Common body of `aclrtMalloc` and `rtMalloc`.
    ///
    /// # Safety
    /// `dev_ptr` must be null or valid for a pointer-sized write.
    unsafe fn malloc(
        &mut self,
        name: &str,
        dev_ptr: *mut *mut c_void,
        size: u64,
        huge_policy: HugePolicy,
    ) -> c_int {
        let args = format!("- {size} {huge_policy:?}");
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        if self.devices_set.is_empty() {
            return self.ret(name, args, ACL_ERROR_RT_CONTEXT_NULL);
        }
        if dev_ptr.is_null() || size == 0 {
            return self.ret(name, args, ACL_ERROR_INVALID_PARAM);
        }
        let huge = match huge_policy {
            HugePolicy::HugeFirst => size > HUGE_THRESHOLD,
            HugePolicy::HugeOnly => true,
            HugePolicy::NormalOnly => false,
        };
        match self.alloc(size, huge) {
            Ok(addr) => {
                // SAFETY: `dev_ptr` is non-null and, per the caller, valid for this write.
                unsafe { *dev_ptr = addr as *mut c_void };
                let pages = if huge { "huge" } else { "normal" };
                self.ret(
                    name,
                    format!("{addr:#x} {size} {huge_policy:?} {pages}"),
                    ACL_SUCCESS,
                )
            }
            Err(code) => self.ret(name, args, code),
        }
    }

    /// Common body of `aclrtMemcpy` and `rtMemcpy`.
    ///
    /// # Safety
    /// Host-side pointers must be valid for `count` bytes (reads of `src`, writes of `dst`).
    unsafe fn memcpy(
        &mut self,
        name: &str,
        dst: *mut c_void,
        dest_max: u64,
        src: *const c_void,
        count: u64,
        kind: c_int,
    ) -> c_int {
        let (dst_a, src_a) = (dst as u64, src as u64);
        let args = match kind {
            2 => format!("{src_a:#x} {count} kind=2 dst={dst_a:#x}"),
            _ => format!("{dst_a:#x} {count} kind={kind} src={src_a:#x}"),
        };
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        if self.devices_set.is_empty() && kind != 0 {
            return self.ret(name, args, ACL_ERROR_RT_CONTEXT_NULL);
        }
        if count > dest_max || dst.is_null() || src.is_null() {
            return self.ret(name, args, ACL_ERROR_INVALID_PARAM);
        }
        let host = |p: u64| Some(p as *mut u8);
        let (to, from) = match kind {
            0 => (host(dst_a), host(src_a)),
            1 => (self.translate(dst_a, count).map(|t| t.1), host(src_a)),
            2 => (host(dst_a), self.translate(src_a, count).map(|t| t.1)),
            3 => (
                self.translate(dst_a, count).map(|t| t.1),
                self.translate(src_a, count).map(|t| t.1),
            ),
            _ => (None, None),
        };
        let (Some(to), Some(from)) = (to, from) else {
            return self.ret(name, args, ACL_ERROR_INVALID_PARAM);
        };
        // SAFETY: device sides were translated into live backing blocks with `count` bytes to
        // spare; host sides are valid for `count` bytes per the caller. `copy` allows overlap
        // (device-to-device within one allocation).
        unsafe { std::ptr::copy(from, to, count as usize) };
        self.ret(name, args, ACL_SUCCESS)
    }
}

impl State {
    /// `aclrtMemset` / `rtMemset`: `count` bytes at device address `dst` set to `value`.
    fn memset(
        &mut self,
        name: &str,
        dst: *mut c_void,
        dest_max: u64,
        value: u8,
        count: u64,
    ) -> c_int {
        let dst_a = dst as u64;
        let args = format!("{dst_a:#x} {count} value={value}");
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        if self.devices_set.is_empty() {
            return self.ret(name, args, ACL_ERROR_RT_CONTEXT_NULL);
        }
        if count > dest_max || dst.is_null() {
            return self.ret(name, args, ACL_ERROR_INVALID_PARAM);
        }
        let Some((_, to)) = self.translate(dst_a, count) else {
            return self.ret(name, args, ACL_ERROR_INVALID_PARAM);
        };
        // SAFETY: `dst` was translated into a live backing block with `count` bytes to spare.
        unsafe { std::ptr::write_bytes(to, value, count as usize) };
        self.ret(name, args, ACL_SUCCESS)
    }
}

#[derive(Debug, Clone, Copy)]
enum HugePolicy {
    HugeFirst,
    HugeOnly,
    NormalOnly,
}

fn lock() -> MutexGuard<'static, Option<State>> {
    // A panic while holding the lock cannot happen across the C boundary (it would abort); treat
    // a poisoned lock as usable anyway.
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut guard = lock();
    f(guard.get_or_insert_with(State::from_env))
}

// ---------------------------------------------------------------------------------------------
// acl* runtime (libascendcl.so)
// ---------------------------------------------------------------------------------------------

/// `aclError aclInit(const char *configPath)`.
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
        if st.acl_initialized {
            return st.ret("aclInit", args, ACL_ERROR_REPEAT_INITIALIZE);
        }
        st.acl_initialized = true;
        st.ret("aclInit", args, ACL_SUCCESS)
    })
}

/// `aclError aclFinalize(void)`.
#[no_mangle]
pub extern "C" fn aclFinalize() -> c_int {
    with_state(|st| {
        if let Some(code) = st.injected("aclFinalize", "-") {
            return code;
        }
        if !st.acl_initialized {
            return st.ret("aclFinalize", "-".into(), ACL_ERROR_REPEAT_FINALIZE);
        }
        st.acl_initialized = false;
        st.ret("aclFinalize", "-".into(), ACL_SUCCESS)
    })
}

/// `aclError aclrtSetDevice(int32_t deviceId)`.
#[no_mangle]
pub extern "C" fn aclrtSetDevice(device_id: i32) -> c_int {
    with_state(|st| {
        if !st.acl_initialized {
            return st.ret(
                "aclrtSetDevice",
                device_id.to_string(),
                ACL_ERROR_UNINITIALIZE,
            );
        }
        st.set_device("aclrtSetDevice", device_id)
    })
}

/// `aclError aclrtResetDevice(int32_t deviceId)`.
#[no_mangle]
pub extern "C" fn aclrtResetDevice(device_id: i32) -> c_int {
    with_state(|st| st.reset_device("aclrtResetDevice", device_id))
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
    with_state(|st| {
        let p = match policy {
            0 => HugePolicy::HugeFirst,
            1 => HugePolicy::HugeOnly,
            2 => HugePolicy::NormalOnly,
            _ => {
                return st.ret(
                    "aclrtMalloc",
                    format!("- {size} policy={policy}"),
                    ACL_ERROR_INVALID_PARAM,
                )
            }
        };
        // SAFETY: forwarded caller guarantee on `dev_ptr`.
        unsafe { st.malloc("aclrtMalloc", dev_ptr, size as u64, p) }
    })
}

/// `aclError aclrtFree(void *devPtr)`.
#[no_mangle]
pub extern "C" fn aclrtFree(dev_ptr: *mut c_void) -> c_int {
    with_state(|st| st.free("aclrtFree", dev_ptr as u64))
}

/// `aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)`.
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
    with_state(|st| unsafe {
        st.memcpy("aclrtMemcpy", dst, dest_max as u64, src, count as u64, kind)
    })
}

/// `aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)`.
#[no_mangle]
pub extern "C" fn aclrtMemset(
    dev_ptr: *mut c_void,
    max_count: usize,
    value: i32,
    count: usize,
) -> c_int {
    with_state(|st| {
        st.memset(
            "aclrtMemset",
            dev_ptr,
            max_count as u64,
            value as u8,
            count as u64,
        )
    })
}

// ---------------------------------------------------------------------------------------------
// rt* runtime (libruntime.so)
// ---------------------------------------------------------------------------------------------

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

/// `rtError_t rtMemcpy(void *dst, uint64_t destMax, const void *src, uint64_t cnt, rtMemcpyKind_t kind)`.
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
    with_state(|st| st.memset("rtMemset", dev_ptr, dest_max, value as u8, count))
}

// ---------------------------------------------------------------------------------------------
// HAL (libascend_hal.so)
// ---------------------------------------------------------------------------------------------

/// `drvError_t halHostRegister(void *srcPtr, UINT64 size, UINT32 flag, UINT32 devid, void **dstPtr)`.
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
    with_state(|st| {
        let addr = src_ptr as u64;
        let args = format!("{addr:#x} {size} flag={flag} devid={devid}");
        if let Some(code) = st.injected("halHostRegister", &args) {
            return code;
        }
        if dst_ptr.is_null() || size == 0 {
            return st.ret("halHostRegister", args, DRV_ERROR_PARA_ERROR);
        }
        if flag != DEV_SVM_MAP_HOST {
            return st.ret("halHostRegister", args, DRV_ERROR_NOT_SUPPORT);
        }
        if devid >= st.devices {
            return st.ret("halHostRegister", args, DRV_ERROR_INVALID_DEVICE);
        }
        let Some((base, host)) = st.translate(addr, size) else {
            return st.ret("halHostRegister", args, DRV_ERROR_INVALID_VALUE);
        };
        let end = addr + size;
        let overlaps = st
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&s, m)| s + m.size > addr);
        if overlaps {
            return st.ret("halHostRegister", args, DRV_ERROR_PARA_ERROR);
        }
        let a = &st.allocs[&base];
        let grant = match st.map_mode {
            MapMode::Always => true,
            MapMode::Never => false,
            MapMode::Min(n) => a.size >= n,
            MapMode::Pages => a.huge,
            MapMode::StubNull => {
                return st.ret("halHostRegister", format!("{args} stub"), 0);
            }
        };
        if !grant {
            return st.ret("halHostRegister", args, DRV_ERROR_NOT_SUPPORT);
        }
        // SAFETY: `dst_ptr` is non-null and, per the caller, valid for this write.
        unsafe { *dst_ptr = host.cast() };
        st.mappings.insert(addr, Mapping { size, devid });
        st.ret(
            "halHostRegister",
            format!("{args} host={:#x}", host as usize),
            0,
        )
    })
}

/// `drvError_t halHostUnregister(void *srcPtr, UINT32 devid)`.
#[no_mangle]
pub extern "C" fn halHostUnregister(src_ptr: *mut c_void, devid: c_uint) -> c_int {
    with_state(|st| {
        let addr = src_ptr as u64;
        let args = format!("{addr:#x} devid={devid}");
        if let Some(code) = st.injected("halHostUnregister", &args) {
            return code;
        }
        match st.mappings.get(&addr) {
            None => st.ret("halHostUnregister", args, DRV_ERROR_NOT_EXIST),
            Some(m) if m.devid != devid => {
                st.ret("halHostUnregister", args, DRV_ERROR_INVALID_DEVICE)
            }
            Some(_) => {
                st.mappings.remove(&addr);
                st.ret("halHostUnregister", args, 0)
            }
        }
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
    with_state(|st| {
        let args = format!("type={kind} param_size={param_size}");
        if let Some(code) = st.injected("halMemCtl", &args) {
            return code;
        }
        if kind != CTRL_TYPE_SUPPORT_FEATURE {
            return st.ret("halMemCtl", args, DRV_ERROR_NOT_SUPPORT);
        }
        if param.is_null() || param_size < 12 || out.is_null() || out_size.is_null() {
            return st.ret("halMemCtl", args, DRV_ERROR_PARA_ERROR);
        }
        // SAFETY: `out_size` is non-null and valid per the caller.
        let out_len = unsafe { *out_size };
        if out_len < 8 {
            return st.ret("halMemCtl", args, DRV_ERROR_PARA_ERROR);
        }
        // SAFETY: `param` holds at least 12 bytes; the devid is the UINT32 at offset 8.
        let devid = unsafe { param.cast::<u8>().add(8).cast::<u32>().read_unaligned() };
        if devid >= st.devices {
            return st.ret("halMemCtl", args, DRV_ERROR_INVALID_DEVICE);
        }
        let features: u64 = match st.map_mode {
            MapMode::Always => (1 << 1) | (1 << 3),
            MapMode::Min(_) | MapMode::Pages => 1 << 3,
            MapMode::Never | MapMode::StubNull => 0,
        };
        // SAFETY: `out` holds at least 8 bytes (checked above); `support_feature` is first.
        unsafe { out.cast::<u64>().write_unaligned(features) };
        st.ret(
            "halMemCtl",
            format!("{args} devid={devid} features={features:#x}"),
            0,
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Control functions for tests
// ---------------------------------------------------------------------------------------------

/// Clears the call log, pending injections and the violation count, and re-reads the
/// environment (map mode, device count, injections). Live allocations and mappings are kept.
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
    if spec.is_null() {
        return -1;
    }
    // SAFETY: non-null and NUL-terminated per the caller.
    let s = unsafe { CStr::from_ptr(spec) }
        .to_string_lossy()
        .into_owned();
    match parse_map(&s) {
        Some(m) => with_state(|st| {
            st.map_mode = m;
            0
        }),
        None => -1,
    }
}

/// Sets the number of physical devices.
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
    if name.is_null() || nth == 0 {
        return -1;
    }
    // SAFETY: non-null and NUL-terminated per the caller.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    with_state(|st| {
        st.injections.push(Injection {
            name,
            remaining: nth,
            code,
        })
    });
    0
}

/// Copies up to `cap` bytes of the call log (UTF-8 text, one line per call, not NUL-terminated)
/// into `buf` and returns the log's full length; call again with a larger buffer when it
/// exceeds `cap`.
///
/// # Safety
/// `buf` must be valid for writes of `cap` bytes (or null with `cap` 0).
#[no_mangle]
pub unsafe extern "C" fn fake_ascend_call_log(buf: *mut c_char, cap: usize) -> usize {
    with_state(|st| {
        let n = st.log.len().min(cap);
        if n > 0 && !buf.is_null() {
            // SAFETY: `buf` holds `cap >= n` bytes per the caller; the log holds `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(st.log.as_ptr(), buf.cast::<u8>(), n) };
        }
        st.log.len()
    })
}

/// Number of live (not freed) allocations.
#[no_mangle]
pub extern "C" fn fake_ascend_live_allocations() -> u64 {
    with_state(|st| st.allocs.len() as u64)
}

/// Number of live host registrations.
#[no_mangle]
pub extern "C" fn fake_ascend_live_mappings() -> u64 {
    with_state(|st| st.mappings.len() as u64)
}

/// Number of frees of allocations that were still mapped (must stay 0).
#[no_mangle]
pub extern "C" fn fake_ascend_violations() -> u64 {
    with_state(|st| st.violations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_specs_parse() {
        assert_eq!(parse_map("always"), Some(MapMode::Always));
        assert_eq!(parse_map("min:4096"), Some(MapMode::Min(4096)));
        assert_eq!(parse_map("stubnull"), Some(MapMode::StubNull));
        assert_eq!(parse_map("pages"), Some(MapMode::Pages));
        assert_eq!(parse_map("min:x"), None);
        assert_eq!(parse_map("sometimes"), None);
    }
}
