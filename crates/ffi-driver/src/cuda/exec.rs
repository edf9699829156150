//! Device execution on the worker's stream: modules, launches, synchronization and ordering
//! another stream after ours (an event). Every call is made with the primary context bound
//! ([`CudaDevice::enter`]).
//!
//! * **One stream.** The device creates one non-blocking stream (`cuStreamCreate` with
//!   `CU_STREAM_NON_BLOCKING`) when it opens; memsets, copies and launches are enqueued on it, in
//!   call order. Launches and memsets return at once; a copy waits for the stream
//!   (`cuStreamSynchronize`), because the host owns its bytes, so it also waits for every launch
//!   enqueued before it.
//! * **Faults are sticky.** A kernel that faults (CUDA 700 `ILLEGAL_ADDRESS`, 719
//!   `LAUNCH_FAILED`) reports at the next synchronizing call, and the context stays unusable:
//!   every later call fails with that code, which the errors show.
//! * **Modules live until close**, which unloads them after the stream has drained.

use std::collections::BTreeSet;
use std::ffi::{c_int, c_void, CString};

use super::loading::CudaFns;
use super::sys::{self, status, CuEvent, CuFunction, CuModule, CuResult, CuStream};
use super::{CudaDevice, State};
use crate::device::{FuncId, LaunchDims, ModuleId};
use crate::{DeviceError, Op};

/// What device execution keeps in the device's state.
#[derive(Debug)]
pub(super) struct Exec {
    /// The event that orders another stream after ours; made on first use.
    pub event: CuEvent,
    /// Loaded modules, unloaded at close.
    pub modules: Vec<CuModule>,
    /// Functions resolved from them (`CUfunction` handles), so a launch takes only those.
    pub funcs: BTreeSet<u64>,
}

impl Default for Exec {
    fn default() -> Self {
        Exec {
            event: std::ptr::null_mut(),
            modules: Vec::new(),
            funcs: BTreeSet::new(),
        }
    }
}

/// The first bytes of an ELF file (a cubin).
const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Largest grid along y and z, and threads per block (`cuda.h` device limits for every
/// architecture the driver supports; the driver rechecks against the device).
const MAX_GRID_YZ: u32 = 65_535;
const MAX_GRID_X: u32 = i32::MAX as u32;
const MAX_BLOCK_THREADS: u64 = 1024;

impl CudaDevice {
    /// Creates the worker's stream (called once, from `open`, before the device is shared).
    pub(super) fn create_stream(&self, st: &mut State) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let _bound = self.enter(st, op)?;
        let mut s: CuStream = std::ptr::null_mut();
        // SAFETY: `&mut s` is valid for the handle the call writes; the primary context is
        // current (bound above).
        CuResult(unsafe { (self.f.stream_create)(&mut s, sys::CU_STREAM_NON_BLOCKING) })
            .result()
            .map_err(|e| e.error(op, CudaFns::NAMES.stream_create, "the worker's stream"))?;
        self.stream
            .store(s as u64, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The worker's stream (null before open created it and after close destroyed it).
    pub(super) fn stream_ptr(&self) -> CuStream {
        self.stream.load(std::sync::atomic::Ordering::Acquire) as CuStream
    }

    /// Waits for the worker's stream (context bound by the caller's `enter`).
    pub(super) fn wait_stream(&self, why: &str) -> Result<(), DeviceError> {
        // SAFETY: `CUresult cuStreamSynchronize(CUstream)` with the stream created at open,
        // destroyed only at close (after which `enter` refuses every call).
        CuResult(unsafe { (self.f.stream_synchronize)(self.stream_ptr()) })
            .result()
            .map_err(|s| s.error(Op::Sync, CudaFns::NAMES.stream_synchronize, why))
    }

    pub(super) fn do_synchronize(&self, st: &mut State) -> Result<(), DeviceError> {
        let _bound = self.enter(st, Op::Sync)?;
        self.wait_stream(
            "waiting for the worker's stream (a fault here comes from device work enqueued since \
             the last synchronization)",
        )
    }

    pub(super) fn do_synchronize_device(&self, st: &mut State) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let _bound = self.enter_as(st, op, CudaFns::NAMES.ctx_synchronize)?;
        // SAFETY: `CUresult cuCtxSynchronize(void)`, with the primary context current (bound).
        CuResult(unsafe { (self.f.ctx_synchronize)() })
            .result()
            .map_err(|s| {
                s.error(
                    op,
                    CudaFns::NAMES.ctx_synchronize,
                    "waiting for all work of the device's context",
                )
            })
    }

    pub(super) fn do_compute_capability(&self, st: &State) -> Result<(u32, u32), DeviceError> {
        let op = Op::Module;
        let _bound = self.enter(st, op)?;
        let attr = |which: c_int, what: &str| -> Result<u32, DeviceError> {
            let mut v: c_int = 0;
            // SAFETY: `&mut v` is valid for the int the call writes; `self.dev` came from
            // `cuDeviceGet`.
            CuResult(unsafe { (self.f.device_get_attribute)(&mut v, which, self.session.dev) })
                .result()
                .map_err(|s| s.error(op, CudaFns::NAMES.device_get_attribute, what))?;
            u32::try_from(v).map_err(|_| {
                status(0).error(
                    op,
                    CudaFns::NAMES.device_get_attribute,
                    format!("{what}: a negative answer {v}"),
                )
            })
        };
        Ok((
            attr(
                sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                "compute capability (major)",
            )?,
            attr(
                sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                "compute capability (minor)",
            )?,
        ))
    }

    pub(super) fn do_load_module(
        &self,
        st: &mut State,
        image: &[u8],
    ) -> Result<ModuleId, DeviceError> {
        let op = Op::Module;
        let name = CudaFns::NAMES.module_load_data;
        if image.is_empty() {
            return Err(Self::refused(
                op,
                sys::CUDA_ERROR_INVALID_VALUE,
                "an empty image",
            ));
        }
        // PTX is text the driver reads up to its NUL; a cubin is an ELF file that carries its
        // own size.
        let owned;
        let bytes = if image.starts_with(ELF_MAGIC) || image.ends_with(&[0]) {
            image
        } else {
            owned = [image, &[0]].concat();
            &owned[..]
        };
        let _bound = self.enter(st, op)?;
        let mut m: CuModule = std::ptr::null_mut();
        // SAFETY: `&mut m` is valid for the handle the call writes; `bytes` is a NUL-terminated
        // PTX text or an ELF image, alive for the call (the driver copies what it keeps).
        CuResult(unsafe { (self.f.module_load_data)(&mut m, bytes.as_ptr().cast()) })
            .result()
            .map_err(|s| {
                s.error(
                    op,
                    name,
                    format!("loading a {}-byte device-code image", image.len()),
                )
                .sized(image.len() as u64)
            })?;
        st.exec.modules.push(m);
        st.ledger.on_module_load();
        Ok(ModuleId(m as u64))
    }

    pub(super) fn do_function(
        &self,
        st: &mut State,
        module: ModuleId,
        entry: &str,
    ) -> Result<FuncId, DeviceError> {
        let op = Op::Module;
        let name = CudaFns::NAMES.module_get_function;
        let Some(&m) = st.exec.modules.iter().find(|m| **m as u64 == module.0) else {
            return Err(Self::refused_at(
                op,
                name,
                sys::CUDA_ERROR_INVALID_HANDLE,
                format!("module {:#x} is not loaded on this device", module.0),
            ));
        };
        let c_entry = CString::new(entry).map_err(|_| {
            Self::refused_at(
                op,
                name,
                sys::CUDA_ERROR_INVALID_VALUE,
                format!("entry name {entry:?} contains a NUL byte"),
            )
        })?;
        let _bound = self.enter_as(st, op, name)?;
        let mut f: CuFunction = std::ptr::null_mut();
        // SAFETY: `&mut f` is valid for the handle the call writes; `m` is a module loaded on
        // this device and not unloaded (close empties the list); `c_entry` is NUL-terminated.
        CuResult(unsafe { (self.f.module_get_function)(&mut f, m, c_entry.as_ptr()) })
            .result()
            .map_err(|s| s.error(op, name, format!("entry {entry:?}")))?;
        st.exec.funcs.insert(f as u64);
        Ok(FuncId(f as u64))
    }

    pub(super) fn do_launch(
        &self,
        st: &mut State,
        func: FuncId,
        dims: LaunchDims,
        params: &[u64],
    ) -> Result<(), DeviceError> {
        let op = Op::Launch;
        let invalid = |why: String| Self::refused(op, sys::CUDA_ERROR_INVALID_VALUE, why);
        if !st.exec.funcs.contains(&func.0) {
            return Err(Self::refused(
                op,
                sys::CUDA_ERROR_INVALID_HANDLE,
                format!("function {:#x} was not resolved on this device", func.0),
            ));
        }
        let [gx, gy, gz] = dims.grid;
        let [bx, by, bz] = dims.block;
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        if dims.grid.contains(&0) || dims.block.contains(&0) {
            return Err(invalid(format!(
                "grid {:?} and block {:?} need every dimension >= 1",
                dims.grid, dims.block
            )));
        }
        if gx > MAX_GRID_X || gy > MAX_GRID_YZ || gz > MAX_GRID_YZ || threads > MAX_BLOCK_THREADS {
            return Err(invalid(format!(
                "grid {:?} / block {:?} past the device limits (grid x <= {MAX_GRID_X}, y and z \
                 <= {MAX_GRID_YZ}, {MAX_BLOCK_THREADS} threads per block)",
                dims.grid, dims.block
            )));
        }
        let _bound = self.enter(st, op)?;
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
        // SAFETY: `func.0` is a `CUfunction` resolved on this device (checked against
        // `funcs`); `param_ptr` is null or points at `params.len()` pointers, each to a live
        // 64-bit value, which the driver copies before returning; `extra` is null; the stream
        // was created at open and is destroyed only at close.
        CuResult(unsafe {
            (self.f.launch_kernel)(
                func.0 as CuFunction,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                dims.shared_bytes,
                self.stream_ptr(),
                param_ptr,
                std::ptr::null_mut(),
            )
        })
        .result()
        .map_err(|s| {
            s.error(
                op,
                CudaFns::NAMES.launch_kernel,
                format!(
                    "grid {:?}, block {:?}, {} shared bytes",
                    dims.grid, dims.block, dims.shared_bytes
                ),
            )
        })
    }

    pub(super) fn do_order_stream(&self, st: &mut State, consumer: u64) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let names = CudaFns::NAMES;
        if consumer == 0 {
            return Err(Self::refused_at(
                op,
                names.stream_wait_event,
                sys::CUDA_ERROR_INVALID_VALUE,
                "stream 0 is ambiguous; pass 1 (legacy default), 2 (per-thread default) or a \
                 stream handle",
            ));
        }
        let _bound = self.enter_as(st, op, names.stream_wait_event)?;
        if st.exec.event.is_null() {
            let mut e: CuEvent = std::ptr::null_mut();
            // SAFETY: `&mut e` is valid for the handle the call writes.
            CuResult(unsafe { (self.f.event_create)(&mut e, sys::CU_EVENT_DISABLE_TIMING) })
                .result()
                .map_err(|s| s.error(op, names.event_create, "the ordering event"))?;
            st.exec.event = e;
        }
        // SAFETY: the event was created above on this context; the stream at open.
        CuResult(unsafe { (self.f.event_record)(st.exec.event, self.stream_ptr()) })
            .result()
            .map_err(|s| s.error(op, names.event_record, "on the worker's stream"))?;
        // SAFETY: `consumer` is a stream handle of the caller's (or 1/2, the default streams);
        // the driver validates it and answers an error for a bad one.
        CuResult(unsafe { (self.f.stream_wait_event)(consumer as CuStream, st.exec.event, 0) })
            .result()
            .map_err(|s| {
                s.error(
                    op,
                    names.stream_wait_event,
                    format!("ordering stream {consumer:#x} after the worker's stream"),
                )
            })
    }

    /// Close's part: drains the stream, then unloads modules and destroys the event and the
    /// stream. Errors are collected; the context is bound by the caller.
    pub(super) fn close_exec(&self, st: &mut State, errors: &mut Vec<DeviceError>) {
        if self.stream_ptr().is_null() {
            return;
        }
        let names = CudaFns::NAMES;
        if let Err(e) = self.wait_stream("draining the worker's stream at close") {
            errors.push(e);
        }
        for m in std::mem::take(&mut st.exec.modules) {
            // SAFETY: a module this device loaded, unloaded once (the list is emptied).
            let r = CuResult(unsafe { (self.f.module_unload)(m) }).result();
            if let Err(s) = r {
                errors.push(s.error(Op::Module, names.module_unload, "at close"));
            }
        }
        st.exec.funcs.clear();
        if !st.exec.event.is_null() {
            // SAFETY: the event this device created, destroyed once (nulled below).
            let r = CuResult(unsafe { (self.f.event_destroy)(st.exec.event) }).result();
            if let Err(s) = r {
                errors.push(s.error(Op::Sync, names.event_destroy, "at close"));
            }
            st.exec.event = std::ptr::null_mut();
        }
        let stream = self.stream.swap(0, std::sync::atomic::Ordering::AcqRel) as CuStream;
        // SAFETY: the stream created at open, destroyed once (its handle was cleared above).
        let r = CuResult(unsafe { (self.f.stream_destroy)(stream) }).result();
        if let Err(s) = r {
            errors.push(s.error(Op::Sync, names.stream_destroy, "at close"));
        }
    }
}
