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
use std::ffi::{c_int, CString};

use super::calls::absent;
use super::loading::CudaFns;
use super::sys::{self, status, CuEvent, CuFunction, CuModule, CuStream};
use super::{CudaDevice, State};
use crate::device::{FuncId, LaunchDims, ModuleId};
use crate::{DeviceError, Op};

/// What device execution keeps in the device's state.
#[derive(Debug)]
pub(super) struct Exec {
    /// The event that orders another stream after ours; made on first use.
    pub event: CuEvent,
    /// The event that orders our stream after another one; made on first use.
    pub wait_event: CuEvent,
    /// Loaded modules, unloaded at close.
    pub modules: Vec<CuModule>,
    /// Functions resolved from them (`CUfunction` handles), so a launch takes only those.
    pub funcs: BTreeSet<u64>,
    /// Timing events recorded around launch groups, `(start, end)`, not yet read.
    pub timed: Vec<(CuEvent, CuEvent)>,
    /// Timing events read and free for the next group.
    pub spare: Vec<CuEvent>,
    /// Executable graphs instantiated and not yet destroyed (`graph.rs`), destroyed at close.
    pub graphs: BTreeSet<u64>,
    /// Host sources of asynchronous copies queued since the stream was last waited for: kept
    /// alive until then (`Device::copy_h2d_async`).
    pub in_flight: Vec<std::sync::Arc<crate::HostMem>>,
}

impl Default for Exec {
    fn default() -> Self {
        Exec {
            event: std::ptr::null_mut(),
            wait_event: std::ptr::null_mut(),
            modules: Vec::new(),
            funcs: BTreeSet::new(),
            timed: Vec::new(),
            spare: Vec::new(),
            graphs: BTreeSet::new(),
            in_flight: Vec::new(),
        }
    }
}

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
        let s = self.f.stream_create(sys::CU_STREAM_NON_BLOCKING)?;
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
        // The stream created at open, destroyed only at close (after which `enter` refuses
        // every call).
        self.f.stream_synchronize(self.stream_ptr(), why)
    }

    pub(super) fn do_synchronize(&self, st: &mut State) -> Result<(), DeviceError> {
        let _bound = self.enter(st, Op::Sync)?;
        self.wait_stream(
            "waiting for the worker's stream (a fault here comes from device work enqueued since \
             the last synchronization)",
        )?;
        st.exec.in_flight.clear();
        Ok(())
    }

    pub(super) fn do_synchronize_device(&self, st: &mut State) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let _bound = self.enter_as(st, op, CudaFns::NAMES.ctx_synchronize)?;
        self.f.ctx_synchronize()?;
        st.exec.in_flight.clear();
        Ok(())
    }

    pub(super) fn do_compute_capability(&self, st: &State) -> Result<(u32, u32), DeviceError> {
        let op = Op::Module;
        let _bound = self.enter(st, op)?;
        let attr = |which: c_int, what: &str| -> Result<u32, DeviceError> {
            let v = self.f.device_get_attribute(self.session.dev, which, what)?;
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
        if image.is_empty() {
            return Err(Self::refused(
                op,
                sys::CUDA_ERROR_INVALID_VALUE,
                "an empty image",
            ));
        }
        let _bound = self.enter(st, op)?;
        let m = self.f.module_load_data(image)?;
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
        // `m` is a module loaded on this device and not unloaded (close empties the list).
        let f = self.f.module_get_function(m, &c_entry)?;
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
        let _bound = self.enter(st, Op::Launch)?;
        self.launch_bound(st, func, dims, params)
    }

    /// One launch, checked, with the primary context already bound by the caller.
    pub(super) fn launch_bound(
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
        // SAFETY: `func` is a `CUfunction` resolved on this device (checked against `funcs`),
        // whose module stays loaded until close; its parameters are the task rows and views the
        // runtime placed in live allocations of this device.
        unsafe {
            self.f
                .launch_kernel(func.0 as CuFunction, &dims, self.stream_ptr(), params)
        }
    }

    /// Records a timing event on the worker's stream (one from the spare ones, or a new one);
    /// the context is bound by the caller.
    pub(super) fn record_timing(&self, st: &mut State) -> Result<CuEvent, DeviceError> {
        let (op, what) = (Op::Launch, "a timing event");
        let e = match st.exec.spare.pop() {
            Some(e) => e,
            None => self.f.event_create(op, sys::CU_EVENT_DEFAULT, what)?,
        };
        // An event of this context (created above or kept spare).
        if let Err(err) = self.f.event_record(op, e, self.stream_ptr(), what) {
            st.exec.spare.push(e);
            return Err(err);
        }
        Ok(e)
    }

    /// [`crate::Device::take_device_time`]: reads and recycles every timed group's events.
    pub(super) fn do_take_device_time(&self, st: &mut State) -> Result<Option<u64>, DeviceError> {
        if st.exec.timed.is_empty() {
            return Ok(None);
        }
        let name = CudaFns::NAMES.event_elapsed_time;
        if self.f.event_elapsed_time.is_none() {
            let pairs = std::mem::take(&mut st.exec.timed);
            st.exec
                .spare
                .extend(pairs.into_iter().flat_map(|(a, b)| [a, b]));
            return Ok(None);
        }
        // The pairs are read once, or discarded when they cannot be.
        let pairs = std::mem::take(&mut st.exec.timed);
        let _bound = match self.enter_as(st, Op::Sync, name) {
            Ok(b) => b,
            Err(e) => {
                st.exec
                    .spare
                    .extend(pairs.into_iter().flat_map(|(a, b)| [a, b]));
                return Err(e);
            }
        };
        let mut ns = 0u64;
        let mut first_err = None;
        for (a, b) in pairs {
            // Two timing events of this context, both recorded on the worker's stream.
            match self.f.event_elapsed_time(a, b) {
                Ok(ms) => ns += (f64::from(ms.max(0.0)) * 1e6).round() as u64,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
            st.exec.spare.extend([a, b]);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(Some(ns)),
        }
    }

    /// [`crate::Device::function_limits`].
    pub(super) fn do_function_limits(
        &self,
        st: &State,
        func: FuncId,
    ) -> Result<crate::FuncLimits, DeviceError> {
        let op = Op::Module;
        if self.f.func_get_attribute.is_none() {
            return Ok(crate::FuncLimits::default());
        }
        let name = CudaFns::NAMES.func_get_attribute;
        if !st.exec.funcs.contains(&func.0) {
            return Err(Self::refused_at(
                op,
                name,
                sys::CUDA_ERROR_INVALID_HANDLE,
                format!("function {:#x} was not resolved on this device", func.0),
            ));
        }
        let _bound = self.enter_as(st, op, name)?;
        // `func` is a function resolved on this device (checked above).
        let attr = |which: c_int, what: &str| -> Result<u32, DeviceError> {
            let v = self
                .f
                .func_get_attribute(func.0 as CuFunction, which, what)?;
            Ok(u32::try_from(v).unwrap_or(0))
        };
        let static_shared = attr(
            sys::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            "static shared memory",
        )?;
        let optin = self.f.device_get_attribute(
            self.session.dev,
            sys::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "shared memory per block (opt-in)",
        );
        let optin = match optin {
            Ok(v) => u32::try_from(v).unwrap_or(0),
            Err(_) => 48 * 1024, // a device without the opt-in keeps the default
        };
        Ok(crate::FuncLimits {
            max_threads: attr(
                sys::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                "threads per block",
            )?,
            static_shared,
            dynamic_shared: attr(
                sys::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                "dynamic shared memory",
            )?,
            dynamic_shared_optin: optin.saturating_sub(static_shared),
            registers: attr(sys::CU_FUNC_ATTRIBUTE_NUM_REGS, "registers")?,
            local_bytes: attr(sys::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "local memory")?,
        })
    }

    /// [`crate::Device::allow_dynamic_shared`].
    pub(super) fn do_allow_dynamic_shared(
        &self,
        st: &State,
        func: FuncId,
        bytes: u32,
    ) -> Result<(), DeviceError> {
        let op = Op::Module;
        let name = CudaFns::NAMES.func_set_attribute;
        if self.f.func_set_attribute.is_none() {
            return Err(absent(op, name));
        }
        let value = c_int::try_from(bytes).map_err(|_| {
            Self::refused_at(
                op,
                name,
                sys::CUDA_ERROR_INVALID_VALUE,
                format!("{bytes} bytes"),
            )
        })?;
        if !st.exec.funcs.contains(&func.0) {
            return Err(Self::refused_at(
                op,
                name,
                sys::CUDA_ERROR_INVALID_HANDLE,
                format!("function {:#x} was not resolved on this device", func.0),
            ));
        }
        let _bound = self.enter_as(st, op, name)?;
        // `func` is a function resolved on this device (checked above).
        self.f.func_set_attribute(
            func.0 as CuFunction,
            sys::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            value,
            format_args!("allowing {bytes} bytes of dynamic shared memory"),
        )
    }

    /// An event of this device's (no timing), made on first use into `slot`.
    fn ordering_event(&self, slot: &mut CuEvent, what: &str) -> Result<CuEvent, DeviceError> {
        if slot.is_null() {
            // The context is bound by the caller.
            *slot = self
                .f
                .event_create(Op::Sync, sys::CU_EVENT_DISABLE_TIMING, what)?;
        }
        Ok(*slot)
    }

    /// Refuses stream 0, which means the legacy or the per-thread default stream depending on
    /// how the caller was compiled.
    fn check_stream_arg(call: &'static str, s: u64) -> Result<(), DeviceError> {
        if s == 0 {
            return Err(Self::refused_at(
                Op::Sync,
                call,
                sys::CUDA_ERROR_INVALID_VALUE,
                "stream 0 is ambiguous; pass 1 (legacy default), 2 (per-thread default) or a \
                 stream handle",
            ));
        }
        Ok(())
    }

    pub(super) fn do_order_stream(&self, st: &mut State, consumer: u64) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let names = CudaFns::NAMES;
        Self::check_stream_arg(names.stream_wait_event, consumer)?;
        let _bound = self.enter_as(st, op, names.stream_wait_event)?;
        let event = self.ordering_event(&mut st.exec.event, "the ordering event")?;
        let what = "on the worker's stream";
        self.f.event_record(op, event, self.stream_ptr(), what)?;
        // `consumer` is a stream handle of the caller's (or 1/2, the default streams); the
        // driver validates it and answers an error for a bad one.
        self.f.stream_wait_event(
            consumer as CuStream,
            event,
            format_args!("ordering stream {consumer:#x} after the worker's stream"),
        )
    }

    pub(super) fn do_wait_for_stream(
        &self,
        st: &mut State,
        producer: u64,
    ) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let names = CudaFns::NAMES;
        Self::check_stream_arg(names.event_record, producer)?;
        let _bound = self.enter_as(st, op, names.stream_wait_event)?;
        let event = self.ordering_event(&mut st.exec.wait_event, "the waiting event")?;
        // `producer` is a stream handle of the caller's (or 1/2, the default streams), which
        // the driver validates.
        let what = format_args!("on stream {producer:#x}, to order the worker's stream after it");
        self.f.event_record(op, event, producer as CuStream, what)?;
        self.f.stream_wait_event(
            self.stream_ptr(),
            event,
            format_args!("ordering the worker's stream after stream {producer:#x}"),
        )
    }

    /// Close's part: drains the stream, then unloads modules and destroys the event and the
    /// stream. Errors are collected; the context is bound by the caller.
    pub(super) fn close_exec(&self, st: &mut State, errors: &mut Vec<DeviceError>) {
        if self.stream_ptr().is_null() {
            return;
        }
        if let Err(e) = self.wait_stream("draining the worker's stream at close") {
            errors.push(e);
        }
        self.close_graphs(st, errors);
        // Each module, event and the stream this device made, released once (the lists are
        // emptied, the stream's handle cleared).
        for m in std::mem::take(&mut st.exec.modules) {
            // SAFETY: a module this device loaded, unloaded once (the list is emptied), its
            // functions forgotten just below; the stream drained above.
            errors.extend(unsafe { self.f.module_unload(m) }.err());
        }
        st.exec.funcs.clear();
        let timing: Vec<CuEvent> = std::mem::take(&mut st.exec.timed)
            .into_iter()
            .flat_map(|(a, b)| [a, b])
            .chain(std::mem::take(&mut st.exec.spare))
            .collect();
        for e in timing {
            // SAFETY: an event this device made, destroyed once (the lists are emptied).
            errors.extend(unsafe { self.f.event_destroy(e) }.err());
        }
        for slot in [&mut st.exec.event, &mut st.exec.wait_event] {
            if !slot.is_null() {
                // SAFETY: an event this device made, destroyed once (the slot is cleared).
                errors.extend(unsafe { self.f.event_destroy(*slot) }.err());
                *slot = std::ptr::null_mut();
            }
        }
        let stream = self.stream.swap(0, std::sync::atomic::Ordering::AcqRel) as CuStream;
        // SAFETY: the stream this device made (not null: checked at the top), destroyed once
        // (its handle cleared), after it drained.
        errors.extend(unsafe { self.f.stream_destroy(stream) }.err());
    }
}
