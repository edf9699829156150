//! The device model behind the runtime exports (see the crate docs): device references and
//! their contexts, and memory calls checked against the calling thread's current device.

use std::ffi::c_int;

use crate::{
    ctx_of, current_ctx, set_current_ctx, HugePolicy, Meta, State, ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_RT_CONTEXT_NULL, ACL_ERROR_RT_INVALID_DEVICEID, ACL_ERROR_RT_MEMORY_ALLOCATION,
    ACL_ERROR_RT_PARAM_INVALID, ACL_SUCCESS, FILL, HUGE_PAGE, HUGE_THRESHOLD, PAGE,
};

impl State {
    pub(crate) fn set_device(&mut self, name: &str, user: i32) -> c_int {
        let args = user.to_string();
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        let Some(dev) = self.logical(user) else {
            return self.ret(name, &args, ACL_ERROR_RT_INVALID_DEVICEID);
        };
        let refs = self.device_refs.entry(dev).or_insert(0);
        *refs += 1;
        let refs = *refs;
        if refs == 1 {
            self.lifecycle.device_opens += 1;
        }
        set_current_ctx(ctx_of(dev));
        self.ret(
            name,
            &format!("{args} logical={dev} refs={refs}"),
            ACL_SUCCESS,
        )
    }

    pub(crate) fn reset_device(&mut self, name: &str, user: i32) -> c_int {
        let args = user.to_string();
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        let Some(dev) = self.logical(user) else {
            return self.ret(name, &args, ACL_ERROR_RT_INVALID_DEVICEID);
        };
        let Some(refs) = self.device_refs.get_mut(&dev).filter(|r| **r > 0) else {
            return self.ret(
                name,
                &format!("{args} logical={dev} not set"),
                ACL_ERROR_RT_INVALID_DEVICEID,
            );
        };
        *refs -= 1;
        let left = *refs;
        if left == 0 {
            self.device_refs.remove(&dev);
            self.lifecycle.device_resets += 1;
            if current_ctx() == ctx_of(dev) {
                set_current_ctx(0);
            }
            self.poisoned.remove(&dev);
            self.release_device_memory(dev);
        }
        self.ret(
            name,
            &format!("{args} logical={dev} refs={left}"),
            ACL_SUCCESS,
        )
    }

    /// The last reference to `dev` was given back: the runtime destroys its context and frees
    /// the memory still allocated on it. A mapping that outlives its memory is a violation (its
    /// backing stays alive, so the stale host pointer stays harmless).
    pub(crate) fn release_device_memory(&mut self, dev: u32) {
        let live: Vec<(u64, u64, bool)> = self
            .heap
            .blocks()
            .filter(|(_, b)| b.meta.device == dev)
            .map(|(a, b)| (a, b.size, b.meta.huge))
            .collect();
        for (addr, size, huge) in live {
            self.reset_freed += 1;
            let align = if huge { HUGE_PAGE } else { PAGE };
            let mapped: Vec<u64> = self
                .mappings
                .range(addr..addr + size)
                .map(|(&a, _)| a)
                .collect();
            let block = self
                .heap
                .remove(addr, align, !mapped.is_empty())
                .expect("live");
            if !mapped.is_empty() {
                self.violations += 1;
                self.leaked.push(block.mem);
                for a in mapped {
                    self.mappings.remove(&a);
                }
            }
        }
    }

    /// `aclrtGetCurrentContext` / `rtCtxGetCurrent`.
    ///
    /// # Safety
    /// `out` must be null or valid for a pointer-sized write.
    pub(crate) unsafe fn get_context(
        &mut self,
        name: &str,
        out: *mut *mut std::ffi::c_void,
    ) -> c_int {
        if let Some(code) = self.injected(name, "-") {
            return code;
        }
        if out.is_null() {
            return self.ret(name, "-", ACL_ERROR_INVALID_PARAM);
        }
        let ctx = current_ctx();
        if ctx == 0 {
            return self.ret(name, "-", ACL_ERROR_RT_CONTEXT_NULL);
        }
        // SAFETY: `out` is non-null and, per the caller, valid for this write.
        unsafe { *out = ctx as *mut std::ffi::c_void };
        self.ret(name, &format!("{ctx:#x}"), ACL_SUCCESS)
    }

    /// `aclrtSetCurrentContext` / `rtCtxSetCurrent`: binds a live context, not counted.
    pub(crate) fn set_context(&mut self, name: &str, ctx: usize) -> c_int {
        let args = format!("{ctx:#x}");
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        if ctx == 0 {
            return self.ret(name, &args, ACL_ERROR_RT_CONTEXT_NULL);
        }
        if self.live_context(ctx).is_none() {
            return self.ret(name, &args, ACL_ERROR_RT_PARAM_INVALID);
        }
        set_current_ctx(ctx);
        self.ret(name, &args, ACL_SUCCESS)
    }

    /// Common body of `aclrtMalloc` and `rtMalloc`.
    ///
    /// # Safety
    /// `dev_ptr` must be null or valid for a pointer-sized write.
    pub(crate) unsafe fn malloc(
        &mut self,
        name: &str,
        dev_ptr: *mut *mut std::ffi::c_void,
        size: u64,
        policy: HugePolicy,
    ) -> c_int {
        let args = format!("- {size} {policy:?}");
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        let device = match self.usable_device() {
            Ok(d) => d,
            Err(code) => return self.ret(name, &args, code),
        };
        if dev_ptr.is_null() || size == 0 {
            return self.ret(name, &args, ACL_ERROR_INVALID_PARAM);
        }
        let huge = match policy {
            HugePolicy::HugeFirst => size > HUGE_THRESHOLD,
            HugePolicy::HugeOnly => true,
            HugePolicy::NormalOnly => false,
        };
        let align = if huge { HUGE_PAGE } else { PAGE };
        let Some(addr) = self.heap.alloc(size, align, FILL, Meta { device, huge }) else {
            return self.ret(name, &args, ACL_ERROR_RT_MEMORY_ALLOCATION);
        };
        // SAFETY: `dev_ptr` is non-null and, per the caller, valid for this write.
        unsafe { *dev_ptr = addr as *mut std::ffi::c_void };
        let pages = if huge { "huge" } else { "normal" };
        let line = format!("{addr:#x} {size} {policy:?} {pages} dev={device}");
        self.ret(name, &line, ACL_SUCCESS)
    }

    pub(crate) fn free(&mut self, name: &str, addr: u64) -> c_int {
        let args = format!("{addr:#x}");
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        let device = match self.usable_device() {
            Ok(d) => d,
            Err(code) => return self.ret(name, &args, code),
        };
        let Some(block) = self.heap.get(addr) else {
            return self.ret(name, &args, ACL_ERROR_INVALID_PARAM);
        };
        let (size, huge) = (block.size, block.meta.huge);
        if let Err(why) = self.device_range(addr, size, device) {
            return self.ret(name, &format!("{args}{why}"), ACL_ERROR_RT_PARAM_INVALID);
        }
        let align = if huge { HUGE_PAGE } else { PAGE };
        let mapped = self.mappings.range(addr..addr + size).count();
        if mapped > 0 {
            self.violations += 1;
            let b = self.heap.remove(addr, align, true).expect("live");
            self.leaked.push(b.mem);
            return self.ret(name, &format!("{args} STILL-MAPPED({mapped})"), ACL_SUCCESS);
        }
        self.heap.remove(addr, align, false);
        self.ret(name, &args, ACL_SUCCESS)
    }

    /// Common body of `aclrtMemcpy` and `rtMemcpy`.
    ///
    /// # Safety
    /// Host-side pointers must be valid for `count` bytes (reads of `src`, writes of `dst`).
    pub(crate) unsafe fn memcpy(
        &mut self,
        name: &str,
        dst: *mut std::ffi::c_void,
        dest_max: u64,
        src: *const std::ffi::c_void,
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
        let device = match self.usable_device() {
            Ok(d) => d,
            Err(code) => return self.ret(name, &args, code),
        };
        if count > dest_max || dst.is_null() || src.is_null() {
            return self.ret(name, &args, ACL_ERROR_INVALID_PARAM);
        }
        let (to, from) = match kind {
            0 => (Ok(dst_a as *mut u8), Ok(src_a as *mut u8)),
            1 => (
                self.device_range(dst_a, count, device),
                Ok(src_a as *mut u8),
            ),
            2 => (
                Ok(dst_a as *mut u8),
                self.device_range(src_a, count, device),
            ),
            3 => (
                self.device_range(dst_a, count, device),
                self.device_range(src_a, count, device),
            ),
            _ => (Err(String::new()), Err(String::new())),
        };
        let (to, from) = match (to, from) {
            (Ok(t), Ok(f)) => (t, f),
            (Err(why), _) | (_, Err(why)) => {
                return self.ret(name, &format!("{args}{why}"), ACL_ERROR_INVALID_PARAM)
            }
        };
        // SAFETY: device sides were translated into live backing blocks with `count` bytes to
        // spare; host sides are valid for `count` bytes per the caller. `copy` allows overlap
        // (device-to-device within one allocation).
        unsafe { std::ptr::copy(from, to, count as usize) };
        self.ret(name, &args, ACL_SUCCESS)
    }

    /// `aclrtMemset` / `rtMemset`: `count` bytes at device address `dst` set to `value`.
    pub(crate) fn memset(
        &mut self,
        name: &str,
        dst: u64,
        dest_max: u64,
        value: u8,
        count: u64,
    ) -> c_int {
        let args = format!("{dst:#x} {count} value={value}");
        if let Some(code) = self.injected(name, &args) {
            return code;
        }
        let device = match self.usable_device() {
            Ok(d) => d,
            Err(code) => return self.ret(name, &args, code),
        };
        if count > dest_max || dst == 0 {
            return self.ret(name, &args, ACL_ERROR_INVALID_PARAM);
        }
        match self.device_range(dst, count, device) {
            Ok(to) => {
                // SAFETY: `dst` was translated into a live backing block with `count` bytes to
                // spare.
                unsafe { std::ptr::write_bytes(to, value, count as usize) };
                self.ret(name, &args, ACL_SUCCESS)
            }
            Err(why) => self.ret(name, &format!("{args}{why}"), ACL_ERROR_INVALID_PARAM),
        }
    }
}
