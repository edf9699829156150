//! The CUDA backend's calls into the driver library: the one file of the backend that calls
//! through the function table ([`CudaFns`], the signatures in `sys`, `cuda.h`). Each driver
//! function the backend uses is one method here, taking typed arguments, making the call in an
//! `unsafe` block whose `// SAFETY:` comment says why it is sound, and turning a `CUresult` other
//! than `CUDA_SUCCESS` into a [`DeviceError`] (or, while opening, a [`LoadError`]) that names the
//! call. Where the caller says what the call was for (`what`), that is the error's detail; it is
//! formatted only when the call fails.
//!
//! * **Host memory is the caller's to vouch for.** A method that hands the driver host memory it
//!   keeps using after the call returns (an asynchronous copy, a page-lock) is an `unsafe fn`
//!   whose `# Safety` section says what the caller must guarantee. Everything else a method
//!   passes is a value, an out-parameter of its own, or memory alive across the call.
//! * **Handles.** The streams, events, modules, functions and graphs passed here are ones the
//!   driver gave this backend and that it has not destroyed (the backend destroys each once, at
//!   close or on `destroy_graph`, and forgets it; after close every call is refused), or streams
//!   of the caller's (`order_stream`, `wait_for_stream`), which the driver validates. Device
//!   addresses are the driver's to validate: the host never dereferences them.
//! * **The ledger** is written here too, once for the backend: [`call`] and [`call_named`] run one
//!   driver operation (`Device::alloc`, `Device::launch`, ...) through [`crate::traced`] (a
//!   pending injected fault fails it before any vendor call; its outcome is logged and counted)
//!   and note a sticky fault it reported on the device's session; [`untraced`] notes the sticky
//!   fault of calls that are no operation of the ledger.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::fmt::Display;

use super::loading::{CudaFns, CudaNames};
use super::sys::{
    self, status, CuContext, CuDevice, CuDevicePtr, CuEvent, CuFunction, CuGraph, CuGraphExec,
    CuModule, CuResult, CuStream,
};
use super::{CudaDevice, State};
use crate::device::LaunchDims;
use crate::ledger::Outcome;
use crate::loader::{LoadError, VendorLib};
use crate::{traced, DeviceError, Op};

const N: CudaNames = CudaFns::NAMES;

/// The first bytes of an ELF file (a cubin).
const ELF_MAGIC: &[u8] = b"\x7fELF";

/// One driver operation (see [`crate::traced`]); a sticky fault the vendor call reports poisons
/// the device.
pub(super) fn call<T: Outcome>(
    st: &mut State,
    op: Op,
    addr: u64,
    bytes: u64,
    body: impl FnOnce(&mut State) -> Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    call_named(st, op, CudaDevice::call_name(op), addr, bytes, body)
}

/// `call`, for an op whose vendor call is not the op's usual one (`call_name`): an injected
/// fault names `name`.
pub(super) fn call_named<T: Outcome>(
    st: &mut State,
    op: Op,
    name: &'static str,
    addr: u64,
    bytes: u64,
    body: impl FnOnce(&mut State) -> Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    let injected = move |code| status(code).error(op, name, "injected fault");
    traced(st, op, addr, bytes, injected, |st| untraced(st, body))
}

/// Driver calls that are not an operation of the ledger (binding the context for a group of
/// launches, timing events, destroying a graph, reading timings): neither logged nor
/// fault-injectable, but a sticky fault they report still poisons the device.
pub(super) fn untraced<T>(
    st: &mut State,
    body: impl FnOnce(&mut State) -> Result<T, DeviceError>,
) -> Result<T, DeviceError> {
    let r = body(st);
    if let Err(e) = &r {
        st.note_fault(e);
    }
    r
}

/// `Ok` for `CUDA_SUCCESS`, else the error of `op` that `call` returned, `what` its detail.
fn check(r: c_int, op: Op, call: &'static str, what: impl Display) -> Result<(), DeviceError> {
    CuResult(r)
        .result()
        .map_err(|s| s.error(op, call, what.to_string()))
}

/// [`check`] for an initialization call of `lib`.
fn check_init(r: c_int, lib: VendorLib, call: &str, what: String) -> Result<(), LoadError> {
    CuResult(r)
        .result()
        .map_err(|s| s.init_error(lib.name, call, what))
}

/// The refusal of a call to an optional entry point the library does not export.
pub(super) fn absent(op: Op, call: &'static str) -> DeviceError {
    status(sys::CUDA_ERROR_NOT_SUPPORTED)
        .error(op, call, format!("the driver library has no {call}"))
        .before_call()
}

impl CudaFns {
    /// `cuInit(0)`.
    pub(super) fn init(&self, lib: VendorLib) -> Result<(), LoadError> {
        // SAFETY: `CUresult cuInit(unsigned int Flags)`; Flags must be 0.
        let r = unsafe { (self.init)(0) };
        check_init(r, lib, N.init, format!("opened from {}", lib.path))
    }

    /// `cuDeviceGet`: the device of `ordinal`.
    pub(super) fn device_get(&self, lib: VendorLib, ordinal: c_int) -> Result<CuDevice, LoadError> {
        let mut dev: CuDevice = 0;
        // SAFETY: `&mut dev` is valid for the int the call writes.
        let r = unsafe { (self.device_get)(&mut dev, ordinal) };
        check_init(r, lib, N.device_get, format!("ordinal {ordinal}"))?;
        Ok(dev)
    }

    /// `cuDevicePrimaryCtxRetain`: one more reference to `dev`'s primary context (null when the
    /// driver answered success without one). `ordinal` names the device in errors.
    pub(super) fn primary_ctx_retain(
        &self,
        lib: VendorLib,
        dev: CuDevice,
        ordinal: c_int,
    ) -> Result<CuContext, LoadError> {
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: `&mut ctx` is valid for the pointer the call writes; `dev` is a device number,
        // which the driver validates.
        let r = unsafe { (self.primary_ctx_retain)(&mut ctx, dev) };
        check_init(r, lib, N.primary_ctx_retain, format!("device {ordinal}"))?;
        Ok(ctx)
    }

    /// `cuDevicePrimaryCtxRelease_v2`: one reference less to `dev`'s primary context.
    pub(super) fn primary_ctx_release(
        &self,
        dev: CuDevice,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        // SAFETY: `CUresult cuDevicePrimaryCtxRelease_v2(CUdevice)`; takes no pointer.
        let r = unsafe { (self.primary_ctx_release)(dev) };
        check(r, Op::Device, N.primary_ctx_release, what)
    }

    /// `cuCtxGetCurrent`: the calling thread's current context (null: none).
    pub(super) fn ctx_get_current(&self, op: Op) -> Result<CuContext, DeviceError> {
        let mut cur: CuContext = std::ptr::null_mut();
        // SAFETY: `&mut cur` is valid for the pointer the call writes.
        let r = unsafe { (self.ctx_get_current)(&mut cur) };
        check(r, op, N.ctx_get_current, "reading the thread's context")?;
        Ok(cur)
    }

    /// `cuCtxSetCurrent`: makes `ctx` current on the calling thread (null unbinds).
    pub(super) fn ctx_set_current(&self, op: Op, ctx: CuContext) -> Result<(), DeviceError> {
        // SAFETY: `CUresult cuCtxSetCurrent(CUcontext)` with the session's retained primary
        // context (not released while a call holds the session's context lock) or the context
        // the thread had before a call of ours (null included), as `cuCtxGetCurrent` gave it.
        let r = unsafe { (self.ctx_set_current)(ctx) };
        check(
            r,
            op,
            N.ctx_set_current,
            "making the primary context current",
        )
    }

    /// `cuCtxSynchronize`: waits for all work of the current context.
    pub(super) fn ctx_synchronize(&self) -> Result<(), DeviceError> {
        // SAFETY: `CUresult cuCtxSynchronize(void)`.
        let r = unsafe { (self.ctx_synchronize)() };
        let what = "waiting for all work of the device's context";
        check(r, Op::Sync, N.ctx_synchronize, what)
    }

    /// `cuDriverGetVersion` (`1000 * major + 10 * minor`); needs no context.
    pub(super) fn driver_get_version(&self) -> Result<c_int, DeviceError> {
        let name = N.driver_get_version;
        let get = self
            .driver_get_version
            .ok_or_else(|| absent(Op::Device, name))?;
        let mut v: c_int = 0;
        // SAFETY: `CUresult cuDriverGetVersion(int*)`; `&mut v` is valid for the write.
        let r = unsafe { get(&mut v) };
        check(r, Op::Device, name, "the driver's version")?;
        Ok(v)
    }

    /// `cuDeviceGetAttribute`: attribute `attr` of `dev`.
    pub(super) fn device_get_attribute(
        &self,
        dev: CuDevice,
        attr: c_int,
        what: impl Display,
    ) -> Result<c_int, DeviceError> {
        let mut v: c_int = 0;
        // SAFETY: `&mut v` is valid for the int the call writes; `dev` came from `cuDeviceGet`.
        let r = unsafe { (self.device_get_attribute)(&mut v, attr, dev) };
        check(r, Op::Module, N.device_get_attribute, what)?;
        Ok(v)
    }

    /// `cuMemAlloc_v2`: `bytes` of device memory; a success without an address is an error too.
    pub(super) fn mem_alloc(&self, bytes: usize) -> Result<CuDevicePtr, DeviceError> {
        let (op, name) = (Op::Alloc, N.mem_alloc);
        let mut p: CuDevicePtr = 0;
        // SAFETY: `&mut p` is valid for the CUdeviceptr the call writes.
        let r = unsafe { (self.mem_alloc)(&mut p, bytes) };
        check(r, op, name, "device allocation")?;
        if p == 0 {
            return Err(status(0).error(op, name, "a null pointer"));
        }
        Ok(p)
    }

    /// `cuMemFree_v2`.
    pub(super) fn mem_free(&self, ptr: CuDevicePtr) -> Result<(), DeviceError> {
        // SAFETY: `CUresult cuMemFree_v2(CUdeviceptr)`: a device address (see the module docs).
        let r = unsafe { (self.mem_free)(ptr) };
        check(r, Op::Free, N.mem_free, "allocation left live")
    }

    /// `cuMemHostRegister_v2` (flags 0): page-locks the `len` bytes at host address `addr`.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be host memory the caller owns and keeps alive (never freed or
    /// reused) until a successful `cuMemHostUnregister` of `addr`: the driver reads and writes it
    /// for copies until then.
    pub(super) unsafe fn host_register(&self, addr: usize, len: usize) -> Result<(), DeviceError> {
        // SAFETY: the caller keeps the range alive for as long as it is registered.
        let r = unsafe { (self.host_register)(addr as *mut c_void, len, 0) };
        check(r, Op::Pin, N.host_register, "page-locking a mirror")
    }

    /// `cuMemHostUnregister` of the host range registered at `addr`.
    pub(super) fn host_unregister(
        &self,
        addr: usize,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        // SAFETY: `CUresult cuMemHostUnregister(void *p)`: the driver looks `p` up among its
        // registrations (an unknown address is an error) and unlocks the pages; the memory stays
        // alive, and is not read.
        let r = unsafe { (self.host_unregister)(addr as *mut c_void) };
        check(r, Op::Unpin, N.host_unregister, what)
    }

    /// `cuMemcpyHtoDAsync_v2`: enqueues a copy of `len` bytes from host `src` to device `dst` on
    /// `stream`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes until `stream` has been waited for: the
    /// driver may read them when the copy runs.
    pub(super) unsafe fn memcpy_htod_async(
        &self,
        dst: CuDevicePtr,
        src: *const u8,
        len: usize,
        stream: CuStream,
    ) -> Result<(), DeviceError> {
        // SAFETY: `src` per this function's contract; `stream` per the module docs.
        let r = unsafe { (self.memcpy_htod_async)(dst, src.cast(), len, stream) };
        check(r, Op::H2d, N.memcpy_htod_async, Op::H2d.transfer_what())
    }

    /// `cuMemcpyDtoHAsync_v2`: enqueues a copy of `len` bytes from device `src` to host `dst` on
    /// `stream`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, and not otherwise read or written, until
    /// `stream` has been waited for: the driver writes them when the copy runs.
    pub(super) unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: CuDevicePtr,
        len: usize,
        stream: CuStream,
    ) -> Result<(), DeviceError> {
        // SAFETY: `dst` per this function's contract; `stream` per the module docs.
        let r = unsafe { (self.memcpy_dtoh_async)(dst.cast(), src, len, stream) };
        check(r, Op::D2h, N.memcpy_dtoh_async, Op::D2h.transfer_what())
    }

    /// `cuMemsetD8Async`: enqueues setting `n` bytes at device `dst` to `value` on `stream`.
    ///
    /// # Safety
    /// `[dst, dst + n)` must lie inside a live device allocation of this context (the driver
    /// trusts the address: with unified addressing it may be host memory in use).
    pub(super) unsafe fn memset_d8_async(
        &self,
        dst: CuDevicePtr,
        value: u8,
        n: usize,
        stream: CuStream,
    ) -> Result<(), DeviceError> {
        // SAFETY: a live allocation's bytes (the caller's contract) on a stream handle (see the
        // module docs); no host memory is involved.
        let r = unsafe { (self.memset_d8_async)(dst, value, n, stream) };
        check(r, Op::Memset, N.memset_d8_async, Op::Memset.transfer_what())
    }

    /// `cuStreamCreate`: a stream with `flags`.
    pub(super) fn stream_create(&self, flags: c_uint) -> Result<CuStream, DeviceError> {
        let mut s: CuStream = std::ptr::null_mut();
        // SAFETY: `&mut s` is valid for the handle the call writes.
        let r = unsafe { (self.stream_create)(&mut s, flags) };
        check(r, Op::Sync, N.stream_create, "the worker's stream")?;
        Ok(s)
    }

    /// `cuStreamDestroy_v2`, at close.
    ///
    /// # Safety
    /// `stream` must be a live stream of this context, not used again after this call.
    pub(super) unsafe fn stream_destroy(&self, stream: CuStream) -> Result<(), DeviceError> {
        // SAFETY: a stream handle (see the module docs), destroyed once.
        let r = unsafe { (self.stream_destroy)(stream) };
        check(r, Op::Sync, N.stream_destroy, "at close")
    }

    /// `cuStreamSynchronize`: waits until `stream` has run its work.
    pub(super) fn stream_synchronize(
        &self,
        stream: CuStream,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        // SAFETY: a stream handle (see the module docs).
        let r = unsafe { (self.stream_synchronize)(stream) };
        check(r, Op::Sync, N.stream_synchronize, what)
    }

    /// `cuStreamWaitEvent` (flags 0): `stream`'s later work waits for `event`.
    pub(super) fn stream_wait_event(
        &self,
        stream: CuStream,
        event: CuEvent,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        // SAFETY: a stream and an event handle (see the module docs).
        let r = unsafe { (self.stream_wait_event)(stream, event, 0) };
        check(r, Op::Sync, N.stream_wait_event, what)
    }

    /// `cuEventCreate`: an event with `flags`.
    pub(super) fn event_create(
        &self,
        op: Op,
        flags: c_uint,
        what: impl Display,
    ) -> Result<CuEvent, DeviceError> {
        let mut e: CuEvent = std::ptr::null_mut();
        // SAFETY: `&mut e` is valid for the handle the call writes.
        let r = unsafe { (self.event_create)(&mut e, flags) };
        check(r, op, N.event_create, what)?;
        Ok(e)
    }

    /// `cuEventRecord`: records `event` at the end of `stream`'s work so far.
    pub(super) fn event_record(
        &self,
        op: Op,
        event: CuEvent,
        stream: CuStream,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        // SAFETY: an event and a stream handle (see the module docs).
        let r = unsafe { (self.event_record)(event, stream) };
        check(r, op, N.event_record, what)
    }

    /// `cuEventDestroy_v2`, at close.
    ///
    /// # Safety
    /// `event` must be a live event of this context, not used again after this call.
    pub(super) unsafe fn event_destroy(&self, event: CuEvent) -> Result<(), DeviceError> {
        // SAFETY: an event handle (see the module docs), destroyed once.
        let r = unsafe { (self.event_destroy)(event) };
        check(r, Op::Sync, N.event_destroy, "at close")
    }

    /// `cuEventElapsedTime`: milliseconds between two recorded timing events.
    pub(super) fn event_elapsed_time(
        &self,
        start: CuEvent,
        end: CuEvent,
    ) -> Result<f32, DeviceError> {
        let (op, name) = (Op::Sync, N.event_elapsed_time);
        let elapsed = self.event_elapsed_time.ok_or_else(|| absent(op, name))?;
        let mut ms: f32 = 0.0;
        // SAFETY: two event handles (see the module docs); `&mut ms` is valid for the float the
        // call writes.
        let r = unsafe { elapsed(&mut ms, start, end) };
        check(r, op, name, "a timed launch group")?;
        Ok(ms)
    }

    /// `cuModuleLoadData`: loads a device-code image, a cubin (an ELF file, which carries its own
    /// size) or PTX text (NUL-terminated here when it is not).
    pub(super) fn module_load_data(&self, image: &[u8]) -> Result<CuModule, DeviceError> {
        let owned;
        let bytes = if image.starts_with(ELF_MAGIC) || image.ends_with(&[0]) {
            image
        } else {
            owned = [image, &[0]].concat();
            &owned[..]
        };
        let mut m: CuModule = std::ptr::null_mut();
        // SAFETY: `&mut m` is valid for the handle the call writes; `bytes` is a NUL-terminated
        // PTX text or an ELF image, alive for the call (the driver copies what it keeps).
        let r = unsafe { (self.module_load_data)(&mut m, bytes.as_ptr().cast()) };
        let what = format_args!("loading a {}-byte device-code image", image.len());
        check(r, Op::Module, N.module_load_data, what).map_err(|e| e.sized(image.len() as u64))?;
        Ok(m)
    }

    /// `cuModuleUnload`, at close.
    ///
    /// # Safety
    /// `module` must be a loaded module of this context; neither it nor a function of it is used
    /// again after this call.
    pub(super) unsafe fn module_unload(&self, module: CuModule) -> Result<(), DeviceError> {
        // SAFETY: a module handle (see the module docs), unloaded once.
        let r = unsafe { (self.module_unload)(module) };
        check(r, Op::Module, N.module_unload, "at close")
    }

    /// `cuModuleGetFunction`: the entry point `entry` of `module`.
    pub(super) fn module_get_function(
        &self,
        module: CuModule,
        entry: &CStr,
    ) -> Result<CuFunction, DeviceError> {
        let mut f: CuFunction = std::ptr::null_mut();
        // SAFETY: `&mut f` is valid for the handle the call writes; a module handle (see the
        // module docs); `entry` is NUL-terminated.
        let r = unsafe { (self.module_get_function)(&mut f, module, entry.as_ptr()) };
        let what = format_args!("entry {:?}", entry.to_string_lossy());
        check(r, Op::Module, N.module_get_function, what)?;
        Ok(f)
    }

    /// `cuFuncGetAttribute`: attribute `attr` of `func`.
    pub(super) fn func_get_attribute(
        &self,
        func: CuFunction,
        attr: c_int,
        what: impl Display,
    ) -> Result<c_int, DeviceError> {
        let (op, name) = (Op::Module, N.func_get_attribute);
        let get = self.func_get_attribute.ok_or_else(|| absent(op, name))?;
        let mut v: c_int = 0;
        // SAFETY: `&mut v` is valid for the int the call writes; a function handle (see the
        // module docs).
        check(unsafe { get(&mut v, attr, func) }, op, name, what)?;
        Ok(v)
    }

    /// `cuFuncSetAttribute`: sets attribute `attr` of `func` to `value`.
    pub(super) fn func_set_attribute(
        &self,
        func: CuFunction,
        attr: c_int,
        value: c_int,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        let (op, name) = (Op::Module, N.func_set_attribute);
        let set = self.func_set_attribute.ok_or_else(|| absent(op, name))?;
        // SAFETY: a function handle (see the module docs); the value is plain.
        check(unsafe { set(func, attr, value) }, op, name, what)
    }

    /// `cuLaunchKernel`: enqueues `func` on `stream` with geometry `dims` and one 64-bit value
    /// per kernel parameter (no `extra`).
    ///
    /// # Safety
    /// `func` must be a function of a module loaded in this context and not unloaded, and what
    /// the kernel reaches through `params` (device addresses) must be live allocations it may
    /// read and write for as long as the launch runs.
    pub(super) unsafe fn launch_kernel(
        &self,
        func: CuFunction,
        dims: &LaunchDims,
        stream: CuStream,
        params: &[u64],
    ) -> Result<(), DeviceError> {
        let mut values: Vec<u64> = params.to_vec();
        let mut ptrs: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        let param_ptr = if ptrs.is_empty() {
            std::ptr::null_mut()
        } else {
            ptrs.as_mut_ptr()
        };
        let ([gx, gy, gz], [bx, by, bz]) = (dims.grid, dims.block);
        // SAFETY: a live function (the caller's contract) and a stream handle (see the module
        // docs); `param_ptr` is null or points at `params.len()` pointers, each to a live 64-bit
        // value, which the driver copies before returning; `extra` is null.
        let r = unsafe {
            (self.launch_kernel)(
                func,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                dims.shared_bytes,
                stream,
                param_ptr,
                std::ptr::null_mut(),
            )
        };
        let what = format_args!(
            "grid {:?}, block {:?}, {} shared bytes",
            dims.grid, dims.block, dims.shared_bytes
        );
        check(r, Op::Launch, N.launch_kernel, what)
    }

    /// The graph entry points, when the library exports them all.
    pub(super) fn graphs(&self) -> Option<Graphs> {
        Some(Graphs {
            begin: self.stream_begin_capture?,
            end: self.stream_end_capture?,
            instantiate: self.graph_instantiate?,
            launch: self.graph_launch?,
            exec_destroy: self.graph_exec_destroy?,
            destroy: self.graph_destroy?,
        })
    }
}

/// The graph entry points (optional in the table), when the driver has them all.
#[derive(Clone, Copy)]
pub(super) struct Graphs {
    begin: sys::CuStreamBeginCaptureFn,
    end: sys::CuStreamEndCaptureFn,
    instantiate: sys::CuGraphInstantiateWithFlagsFn,
    launch: sys::CuGraphLaunchFn,
    exec_destroy: sys::CuGraphExecDestroyFn,
    destroy: sys::CuGraphDestroyFn,
}

impl Graphs {
    /// `cuStreamBeginCapture_v2`, thread-local mode: `stream` records instead of running.
    pub(super) fn stream_begin_capture(&self, stream: CuStream) -> Result<(), DeviceError> {
        let mode = sys::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a stream handle (see the module docs).
        let r = unsafe { (self.begin)(stream, mode) };
        check(r, Op::Launch, N.stream_begin_capture, "the worker's stream")
    }

    /// `cuStreamEndCapture`: the graph the capture made (null when none, which a failure may
    /// still return) and the call's outcome.
    pub(super) fn stream_end_capture(
        &self,
        stream: CuStream,
        what: impl Display,
    ) -> (CuGraph, Result<(), DeviceError>) {
        let mut graph: CuGraph = std::ptr::null_mut();
        // SAFETY: a stream handle (see the module docs); `&mut graph` is valid for the write.
        let r = unsafe { (self.end)(stream, &mut graph) };
        (graph, check(r, Op::Launch, N.stream_end_capture, what))
    }

    /// `cuGraphInstantiateWithFlags` (flags 0): an executable graph of `graph`.
    pub(super) fn graph_instantiate(&self, graph: CuGraph) -> Result<CuGraphExec, DeviceError> {
        let mut exec: CuGraphExec = std::ptr::null_mut();
        // SAFETY: a graph handle (see the module docs); `&mut exec` is valid for the write.
        let r = unsafe { (self.instantiate)(&mut exec, graph, 0) };
        check(r, Op::Launch, N.graph_instantiate, "a captured graph")?;
        Ok(exec)
    }

    /// `cuGraphLaunch`: enqueues `exec`'s launches on `stream`.
    pub(super) fn graph_launch(
        &self,
        exec: CuGraphExec,
        stream: CuStream,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        // SAFETY: an executable graph and a stream handle (see the module docs).
        let r = unsafe { (self.launch)(exec, stream) };
        check(r, Op::Launch, N.graph_launch, what)
    }

    /// `cuGraphExecDestroy`.
    ///
    /// # Safety
    /// `exec` must be a live executable graph of this context, not launched again after this
    /// call.
    pub(super) unsafe fn graph_exec_destroy(
        &self,
        exec: CuGraphExec,
        what: impl Display,
    ) -> Result<(), DeviceError> {
        // SAFETY: an executable graph handle (see the module docs), destroyed once.
        let r = unsafe { (self.exec_destroy)(exec) };
        check(r, Op::Launch, N.graph_exec_destroy, what)
    }

    /// `cuGraphDestroy`.
    ///
    /// # Safety
    /// `graph` must be a live graph of this context, not used again after this call.
    pub(super) unsafe fn graph_destroy(&self, graph: CuGraph) -> Result<(), DeviceError> {
        // SAFETY: a graph handle (see the module docs), destroyed once.
        let r = unsafe { (self.destroy)(graph) };
        check(r, Op::Launch, N.graph_destroy, "a captured graph")
    }
}
