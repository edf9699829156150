//! The Ascend backend's calls into the CANN libraries: the one file of the backend that calls
//! through their function tables (`AclFns` or `RtFns` for the runtime, `HalFns` for the HAL;
//! the signatures in `sys`, from the CANN headers). Each vendor function the backend uses is one method here, of
//! [`Runtime`] (which dispatches to the `acl*` or the `rt*` family) or of [`Hal`], taking typed
//! arguments, making the call in an `unsafe` block whose `// SAFETY:` comment says why it is
//! sound, and turning a status other than success into a [`DeviceError`] (or, while opening, a
//! [`LoadError`]) that names the call. Where the caller says what the call was for (`what`), that
//! is the error's detail; it is formatted only when the call fails.
//!
//! * **Host memory.** The runtime's copies are synchronous: a method takes the host side as a
//!   slice, valid across the call. The one call that ends host access to memory other code may
//!   still hold, `halHostUnregister`, is an `unsafe fn` whose `# Safety` section says what the
//!   caller must guarantee.
//! * **Handles and addresses.** Contexts passed here are ones the runtime gave this process
//!   (`session`); device addresses are the runtime's or the HAL's to validate, never dereferenced
//!   by the host.
//! * **The ledger** is written here too, once for the backend: [`AscendDevice::traced`] runs one
//!   driver operation (`Device::alloc`, `Device::map_host`, ...) through [`crate::traced`] (a
//!   pending injected fault fails it before any vendor call; its outcome is logged and counted)
//!   and notes a device fault it reported on the process's session.

use std::ffi::{c_int, c_void};
use std::fmt::Display;
use std::ptr::NonNull;

use super::loading::{AclFns, Hal, HalFns, MallocPolicy, Runtime};
use super::sys::{
    self, acl_status, AclStatus, Context, DrvStatus, ACL_ERROR_API_NOT_SUPPORT,
    ACL_ERROR_INVALID_PARAM, ACL_ERROR_RT_CONTEXT_NULL, ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
};
use super::{AscendDevice, State};
use crate::ledger::Outcome;
use crate::{traced, DeviceError, LoadError, Op};

impl AscendDevice {
    /// One driver operation (see [`crate::traced`]); a device fault the vendor call reports
    /// poisons the process's session on the device.
    pub(super) fn traced<T: Outcome>(
        &self,
        st: &mut State,
        op: Op,
        addr: u64,
        bytes: u64,
        body: impl FnOnce(&mut State) -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        let injected =
            move |code| Self::own_status(op, code).error(op, self.call(op), "injected fault");
        traced(st, op, addr, bytes, injected, |st| {
            let r = body(st);
            if let Err(e) = &r {
                if e.called && sys::is_device_fault(e.code) && self.session.note_fault(e) {
                    log::error!(
                        "ascend device {} is unusable after {} ({}) from {}: close every worker \
                         on it",
                        self.user,
                        e.code,
                        e.code_name,
                        e.call
                    );
                }
            }
            r
        })
    }
}

/// `Ok` for `ACL_SUCCESS`, else the error of `op` that `call` returned, `what` its detail.
fn check(r: c_int, op: Op, call: &str, what: impl Display) -> Result<(), DeviceError> {
    AclStatus(r)
        .result()
        .map_err(|s| s.error(op, call, what.to_string()))
}

/// [`check`] for the HAL's `drvError_t`.
fn check_drv(r: c_int, op: Op, call: &str, what: impl Display) -> Result<(), DeviceError> {
    DrvStatus(r)
        .result()
        .map_err(|s| s.error(op, call, what.to_string()))
}

/// The status of a size that does not fit `size_t` (the `acl*` calls take `size_t`).
const TOO_LARGE: c_int = ACL_ERROR_INVALID_PARAM as c_int;

impl Runtime {
    /// `aclInit(NULL)`: one ACL reference (an answer of REPEAT_INITIALIZE is one too). `false`
    /// on the `rt*` runtime, which has no such call.
    pub(super) fn init(&self) -> Result<bool, LoadError> {
        let Runtime::Acl(lib, f) = self else {
            return Ok(false);
        };
        // SAFETY: `aclError aclInit(const char *configPath)` accepts NULL (no config file).
        let code = i64::from(unsafe { (f.init)(std::ptr::null()) });
        match code {
            0 | sys::ACL_ERROR_REPEAT_INITIALIZE => Ok(true),
            _ => Err(acl_status(code).init_error(
                lib.name,
                AclFns::NAMES.init,
                format!("opened from {}", lib.path),
            )),
        }
    }

    /// `aclFinalizeReference`: gives back one ACL reference; the references left. `None` where
    /// the runtime does not export it (or is the `rt*` family).
    pub(super) fn finalize_reference(&self) -> Option<Result<u64, DeviceError>> {
        let Runtime::Acl(_, f) = self else {
            return None;
        };
        let fin = f.finalize_reference?;
        let mut left: u64 = 0;
        // SAFETY: `aclError aclFinalizeReference(uint64_t *refCount)`; `&mut left` is valid for
        // the write of the remaining count.
        let r = unsafe { fin(&mut left) };
        let (name, what) = (
            AclFns::NAMES.finalize_reference,
            "giving back the ACL reference",
        );
        Some(check(r, Op::Device, name, what).map(|()| left))
    }

    /// `aclrtSetDevice` / `rtSetDevice`: one more reference to the device's default context,
    /// which becomes the calling thread's current context.
    pub(super) fn set_device(&self, id: i32, what: impl Display) -> Result<(), DeviceError> {
        let f = match self {
            Runtime::Acl(_, f) => f.set_device,
            Runtime::Rt(_, f) => f.set_device,
        };
        // SAFETY: `int32_t (acl)rtSetDevice(int32_t)`; takes no pointers.
        let r = unsafe { f(id) };
        check(r, Op::Device, self.calls().set_device, what)
    }

    /// `aclrtResetDevice` / `rtDeviceReset`: drops one reference.
    pub(super) fn reset_device(&self, id: i32) -> Result<(), DeviceError> {
        let f = match self {
            Runtime::Acl(_, f) => f.reset_device,
            Runtime::Rt(_, f) => f.reset_device,
        };
        // SAFETY: `int32_t aclrtResetDevice(int32_t)` / `rtDeviceReset(int32_t)`; no pointers.
        let r = unsafe { f(id) };
        let what = format_args!("giving back the reference to device {id}");
        check(r, Op::Device, self.calls().reset_device, what)
    }

    /// The calling thread's current context; `None` when it has none (CONTEXT_NULL, or a null
    /// handle).
    pub(super) fn current_context(
        &self,
        op: Op,
        what: impl Display,
    ) -> Result<Option<Context>, DeviceError> {
        let f = match self {
            Runtime::Acl(_, f) => f.get_context,
            Runtime::Rt(_, f) => f.get_context,
        };
        let mut ctx: Context = std::ptr::null_mut();
        // SAFETY: `&mut ctx` is valid for the pointer-sized write of the out-parameter.
        let r = unsafe { f(&mut ctx) };
        match AclStatus(r).result() {
            Ok(()) => Ok((!ctx.is_null()).then_some(ctx)),
            Err(s) if s.code == ACL_ERROR_RT_CONTEXT_NULL => Ok(None),
            Err(s) => Err(s.error(op, self.calls().get_context, what.to_string())),
        }
    }

    /// Makes `ctx` the calling thread's current context (not reference-counted).
    pub(super) fn set_context(
        &self,
        op: Op,
        ctx: Context,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        let f = match self {
            Runtime::Acl(_, f) => f.set_context,
            Runtime::Rt(_, f) => f.set_context,
        };
        // SAFETY: `ctx` is a context handle the runtime gave us (the device's default context,
        // alive while we hold its device reference, or the caller's own current context).
        let r = unsafe { f(ctx) };
        check(r, op, self.calls().set_context, what)
    }

    /// The runtime's logical id of user device `user`, where it exports the translation:
    /// `None` when it does not (or answers that it is not supported).
    pub(super) fn logic_id(&self, user: i32) -> Option<Result<i32, DeviceError>> {
        let f = match self {
            Runtime::Acl(_, f) => f.logic_id,
            Runtime::Rt(_, f) => f.logic_id,
        }?;
        let mut logic: i32 = -1;
        // SAFETY: `&mut logic` is valid for the `int32_t` the call writes.
        let r = unsafe { f(user, &mut logic) };
        match AclStatus(r).result() {
            Ok(()) => Some(Ok(logic)),
            Err(s)
                if s.code == ACL_ERROR_API_NOT_SUPPORT
                    || s.code == ACL_ERROR_RT_FEATURE_NOT_SUPPORT =>
            {
                None
            }
            Err(s) => {
                let what = format!("translating user device {user}");
                Some(Err(s.error(Op::Device, self.calls().logic_id, what)))
            }
        }
    }

    /// Allocates `bytes` (> 0, fits `usize`) with `policy`; a success without a pointer is an
    /// error too.
    pub(super) fn malloc(
        &self,
        bytes: u64,
        policy: MallocPolicy,
    ) -> Result<NonNull<c_void>, DeviceError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        let r = match self {
            Runtime::Acl(_, f) => {
                let size = usize::try_from(bytes).unwrap_or(usize::MAX);
                // SAFETY: `&mut p` is valid for the pointer-sized write the call makes; the
                // size and policy are plain values.
                unsafe { (f.malloc)(&mut p, size, policy.acl()) }
            }
            Runtime::Rt(_, f) => {
                // SAFETY: as above; module id 0 (the application).
                unsafe { (f.malloc)(&mut p, bytes, policy.rt_mem_type(), 0) }
            }
        };
        let (op, name) = (Op::Alloc, self.calls().malloc);
        check(r, op, name, format_args!("policy {policy:?}"))?;
        NonNull::new(p).ok_or_else(|| acl_status(0).error(op, name, "a null pointer"))
    }

    /// Frees the allocation at device address `ptr`.
    pub(super) fn free(&self, ptr: u64) -> Result<(), DeviceError> {
        let f = match self {
            Runtime::Acl(_, f) => f.free,
            Runtime::Rt(_, f) => f.free,
        };
        // SAFETY: `ptr` is a device address (see the module docs): the runtime looks it up
        // among its allocations and does not dereference it on the host.
        let r = unsafe { f(ptr as *mut c_void) };
        check(r, Op::Free, self.calls().free, "allocation left live")
    }

    /// `aclrtMemcpy` / `rtMemcpy` of `src` to device address `dst`, which has `dest_max` bytes
    /// of its allocation from there.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` must lie inside a live device allocation of this runtime with
    /// `dest_max` bytes from `dst`: the runtime trusts the address (with shared virtual memory it
    /// may be host memory someone else uses).
    pub(super) unsafe fn memcpy_h2d(
        &self,
        dst: u64,
        dest_max: u64,
        src: &[u8],
    ) -> Result<(), DeviceError> {
        let (dst, from) = (dst as *mut c_void, src.as_ptr().cast::<c_void>());
        let kind = sys::MEMCPY_HOST_TO_DEVICE;
        let r = match self {
            Runtime::Acl(_, f) => match usize::try_from(dest_max) {
                // SAFETY: the copy is synchronous and reads `src.len()` bytes of `src`, valid
                // across it; the device range is a live allocation's (the caller's contract).
                Ok(max) => unsafe { (f.memcpy)(dst, max, from, src.len(), kind) },
                Err(_) => TOO_LARGE,
            },
            // SAFETY: as above.
            Runtime::Rt(_, f) => unsafe { (f.memcpy)(dst, dest_max, from, src.len() as u64, kind) },
        };
        let op = Op::H2d;
        check(r, op, self.calls().memcpy, op.transfer_what())
    }

    /// `aclrtMemcpy` / `rtMemcpy` of `dst.len()` bytes at device address `src` into `dst`.
    ///
    /// # Safety
    /// `[src, src + dst.len())` must lie inside a live device allocation of this runtime.
    pub(super) unsafe fn memcpy_d2h(&self, dst: &mut [u8], src: u64) -> Result<(), DeviceError> {
        let (len, to, src) = (
            dst.len(),
            dst.as_mut_ptr().cast::<c_void>(),
            src as *const c_void,
        );
        let kind = sys::MEMCPY_DEVICE_TO_HOST;
        let r = match self {
            // SAFETY: the copy is synchronous and writes at most `len` bytes (`destMax`) of
            // `dst`, borrowed mutably across it; the device range is a live allocation's (the
            // caller's contract).
            Runtime::Acl(_, f) => unsafe { (f.memcpy)(to, len, src, len, kind) },
            Runtime::Rt(_, f) => {
                let n = len as u64;
                // SAFETY: as above.
                unsafe { (f.memcpy)(to, n, src, n, kind) }
            }
        };
        let op = Op::D2h;
        check(r, op, self.calls().memcpy, op.transfer_what())
    }

    /// `aclrtMemset` / `rtMemset` of `count` bytes at device address `dst` to `value`; `dst`
    /// has `dest_max` bytes of its allocation from there.
    ///
    /// # Safety
    /// `[dst, dst + count)` must lie inside a live device allocation of this runtime with
    /// `dest_max` bytes from `dst`.
    pub(super) unsafe fn memset(
        &self,
        dst: u64,
        dest_max: u64,
        value: u8,
        count: u64,
    ) -> Result<(), DeviceError> {
        let dst = dst as *mut c_void;
        let r = match self {
            Runtime::Acl(_, f) => match (usize::try_from(dest_max), usize::try_from(count)) {
                // SAFETY: a live allocation's bytes within `dest_max` (the caller's contract); no
                // host memory is involved.
                (Ok(max), Ok(n)) => unsafe { (f.memset)(dst, max, i32::from(value), n) },
                _ => TOO_LARGE,
            },
            Runtime::Rt(_, f) => {
                // SAFETY: as above.
                unsafe { (f.memset)(dst, dest_max, u32::from(value), count) }
            }
        };
        let op = Op::Memset;
        check(r, op, self.calls().memset, op.transfer_what())
    }
}

impl Hal {
    /// `halHostRegister(DEV_SVM_MAP_HOST)`: maps the `bytes` at device address `ptr` for the
    /// host, on logical device `devid`. The host address, or `None` for a "success" that left
    /// it null (the toolkit's stub HAL).
    pub(super) fn host_register(
        &self,
        ptr: u64,
        bytes: u64,
        devid: u32,
    ) -> Result<Option<NonNull<u8>>, DeviceError> {
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: `halHostRegister(void *srcPtr, UINT64 size, UINT32 flag, UINT32 devid,
        // void **dstPtr)`: `ptr` is a device address, which the HAL does not dereference on the
        // host; `&mut host` is valid for the pointer-sized write of the out-parameter.
        let r = unsafe {
            (self.f.register)(
                ptr as *mut c_void,
                bytes,
                sys::DEV_SVM_MAP_HOST,
                devid,
                &mut host,
            )
        };
        let what = format_args!(
            "mapping {bytes} bytes for the host on logical device {devid} (not a capability \
             answer: an unaligned pointer, a bad range or a bad device)"
        );
        check_drv(r, Op::Map, HalFns::NAMES.register, what)?;
        Ok(NonNull::new(host.cast::<u8>()))
    }

    /// `halHostUnregister`: removes the host mapping of device address `ptr` on logical device
    /// `devid`.
    ///
    /// # Safety
    /// No host access through the mapping may run while the call does, nor after it succeeded
    /// (the HAL tears the host side down).
    pub(super) unsafe fn host_unregister(&self, ptr: u64, devid: u32) -> Result<(), DeviceError> {
        // SAFETY: `halHostUnregister(void *srcPtr, UINT32 devid)` with a device address; the
        // host side of the mapping is the caller's to keep unused, per this function's contract.
        let r = unsafe { (self.f.unregister)(ptr as *mut c_void, devid) };
        let what =
            "mapping kept (still usable); its allocation stays live until it is unregistered";
        check_drv(r, Op::Unmap, HalFns::NAMES.unregister, what)
    }
}
