//! The [`Device`] trait over the CUDA driver's rooms: memory and transfers (`mod.rs`), mirrors
//! (`pinning`), device code (`exec`, `graph`) and closing (`close`).

use std::sync::Arc;

use super::calls::{call, call_named, untraced};
use super::loading::CudaFns;
use super::sys::{self, CUDA_ERROR_INVALID_VALUE};
use super::{CudaDevice, State};
use crate::device::{CloseReport, DevPtr, Device, FuncId, LaunchDims, MapGrant, ModuleId};
use crate::{DeviceError, HostMem, HostMemError, Ledger, Op};

impl Device for CudaDevice {
    fn platform(&self) -> &'static str {
        "cuda"
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr, DeviceError> {
        let op = Op::Alloc;
        call(&mut *self.lock_for(op)?, op, 0, bytes, |st| {
            self.do_alloc(st, bytes)
        })
    }

    fn free(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Free;
        let mut st = self.lock_for(op)?;
        let size = st.ledger.live_size(ptr).unwrap_or(0);
        call(&mut st, op, ptr.0, size, |st| self.do_free(st, ptr))
    }

    fn copy_h2d(&self, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::H2d, src.len() as u64);
        call(&mut *self.lock_for(op)?, op, dst.0, bytes, |st| {
            self.transfer(st, op, (dst.0, bytes), true, |stream| {
                // SAFETY: `src` is valid for `src.len()` reads until `transfer` has waited for
                // the stream (it waits before returning; `src` is borrowed until then).
                unsafe {
                    self.f
                        .memcpy_htod_async(dst.0, src.as_ptr(), src.len(), stream)
                }
            })
        })
    }

    fn copy_h2d_async(
        &self,
        dst: DevPtr,
        src: &Arc<HostMem>,
        offset: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        // Only memory this process owns outlives the call for certain (a foreign mapping can be
        // revoked): the rest is copied at once.
        if src.owned_addr().is_none() {
            return crate::device::copy_at_once(self, dst, src, offset, len);
        }
        // The range is checked (and the block's address taken) under the block's lock.
        let from = src
            .with_slice(offset, len, |s| s.as_ptr() as usize)
            .map_err(|e| crate::device::host_source_error(dst, len, e))?;
        let (op, bytes) = (Op::H2d, len as u64);
        call(&mut *self.lock_for(op)?, op, dst.0, bytes, |st| {
            self.transfer(st, op, (dst.0, bytes), false, |stream| {
                // SAFETY: `[from, from + len)` lies inside `src` (checked above), a block this
                // process owns, which `in_flight` keeps alive until the stream is next waited
                // for, so it stays valid for the copy's reads.
                unsafe {
                    self.f
                        .memcpy_htod_async(dst.0, from as *const u8, len, stream)
                }
            })?;
            st.exec.in_flight.push(src.clone());
            Ok(())
        })
    }

    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError> {
        let (op, bytes) = (Op::D2h, dst.len() as u64);
        let (out, len) = (dst.as_mut_ptr(), dst.len());
        call(&mut *self.lock_for(op)?, op, src.0, bytes, |st| {
            self.transfer(st, op, (src.0, bytes), true, |stream| {
                // SAFETY: `out` is valid for `len` writes (the whole of `dst`, borrowed
                // mutably) until `transfer` has waited for the stream (it waits before
                // returning).
                unsafe { self.f.memcpy_dtoh_async(out, src.0, len, stream) }
            })
        })
    }

    fn fill(&self, dst: DevPtr, bytes: u64, value: u8) -> Result<(), DeviceError> {
        let op = Op::Memset;
        call(&mut *self.lock_for(op)?, op, dst.0, bytes, |st| {
            self.transfer(st, op, (dst.0, bytes), true, |stream| {
                // SAFETY: `[dst, dst + bytes)` lies inside a live allocation (checked by
                // `transfer`), so `bytes` is at most that allocation's size, which fit `size_t`
                // when `do_alloc` passed it to `cuMemAlloc_v2`: the cast is lossless.
                unsafe { self.f.memset_d8_async(dst.0, value, bytes as usize, stream) }
            })
        })
    }

    fn map_host(&self, ptr: DevPtr, bytes: u64) -> Result<MapGrant, DeviceError> {
        let op = Op::Map;
        call(&mut *self.lock_for(op)?, op, ptr.0, bytes, |st| {
            Self::containing(st, op, ptr.0, bytes.max(1))?;
            st.ledger.on_map(false);
            Ok(MapGrant::Refused {
                code: sys::CUDA_ERROR_NOT_SUPPORTED,
                reason:
                    "cuMemAlloc memory has no host mapping on CUDA; every host view is a mirror"
                        .to_string(),
            })
        })
    }

    fn unmap_host(&self, ptr: DevPtr) -> Result<(), DeviceError> {
        let op = Op::Unmap;
        call(&mut *self.lock_for(op)?, op, ptr.0, 0, |_| {
            Err(Self::refused(
                op,
                CUDA_ERROR_INVALID_VALUE,
                "no host mapping starts at this address (CUDA never maps device memory)",
            )
            .at(ptr.0))
        })
    }

    fn alloc_mirror(&self, len: usize) -> Result<Arc<HostMem>, HostMemError> {
        let mem = Arc::new(HostMem::with_page(len, 0, self.host_page)?);
        if !self.pin_mirrors {
            return Ok(mem);
        }
        let op = Op::Pin;
        let Ok(mut st) = self.lock_for(op) else {
            return Ok(mem);
        };
        let bytes = mem.allocated() as u64;
        let r = call(&mut st, op, 0, bytes, |st| self.do_pin(st, &mem));
        if let Err(e) = r {
            let addr = mem.owned_addr().unwrap_or_default();
            log::debug!("mirror at host {addr:#x} ({len} bytes) stays pageable: {e}");
        }
        Ok(mem)
    }

    fn free_mirror(&self, mem: &Arc<HostMem>) -> Result<(), DeviceError> {
        let Some(addr) = mem.owned_addr() else {
            return Ok(());
        };
        let mut st = self.lock_for(Op::Unpin)?;
        if !st.pinned.contains_key(&addr) {
            return Ok(());
        }
        let (op, bytes) = (Op::Unpin, mem.allocated() as u64);
        call(&mut st, op, 0, bytes, |st| self.do_unpin(st, addr, bytes))
    }

    fn runs_device_code(&self) -> bool {
        true
    }

    fn compute_capability(&self) -> Result<(u32, u32), DeviceError> {
        self.do_compute_capability(&self.lock())
    }

    fn load_module(&self, image: &[u8]) -> Result<ModuleId, DeviceError> {
        let op = Op::Module;
        let bytes = image.len() as u64;
        call(&mut *self.lock_for(op)?, op, 0, bytes, |st| {
            self.do_load_module(st, image)
        })
    }

    fn function(&self, module: ModuleId, entry: &str) -> Result<FuncId, DeviceError> {
        let op = Op::Module;
        let name = CudaFns::NAMES.module_get_function;
        call_named(&mut *self.lock_for(op)?, op, name, 0, 0, |st| {
            self.do_function(st, module, entry)
        })
    }

    fn launch(&self, func: FuncId, dims: LaunchDims, params: &[u64]) -> Result<(), DeviceError> {
        let op = Op::Launch;
        call(&mut *self.lock_for(op)?, op, 0, 0, |st| {
            self.do_launch(st, func, dims, params)
        })
    }

    #[allow(clippy::result_large_err)] // the failing launch's index beside the driver's error
    fn launch_all(
        &self,
        launches: &[crate::LaunchCall<'_>],
        timed: bool,
    ) -> Result<(), (usize, DeviceError)> {
        let op = Op::Launch;
        let mut st = self.lock_for(op).map_err(|e| (0, e))?;
        // One context bind for the whole group.
        let _bound = untraced(&mut st, |st| self.enter(st, op)).map_err(|e| (0, e))?;
        // Timing is diagnostics: an event that cannot be recorded costs the group its time, not
        // the run (a sticky fault is still noted, and shows at the next call).
        let timing = |st: &mut State| match untraced(st, |st| self.record_timing(st)) {
            Ok(e) => Some(e),
            Err(e) => {
                log::warn!("timing a batch of launches: {e}");
                None
            }
        };
        let start = if timed { timing(&mut st) } else { None };
        let mut r = Ok(());
        for (i, l) in launches.iter().enumerate() {
            let done = call(&mut st, op, 0, 0, |st| {
                self.launch_bound(st, l.func, l.dims, l.params)
            });
            if let Err(e) = done {
                r = Err((i, e));
                break;
            }
        }
        if let Some(start) = start {
            match (&r, timing(&mut st)) {
                (Ok(()), Some(end)) => st.exec.timed.push((start, end)),
                (_, end) => st.exec.spare.extend(std::iter::once(start).chain(end)),
            }
        }
        r
    }

    fn captures_graphs(&self) -> bool {
        self.has_graphs()
    }

    fn capture(&self, launches: &[crate::LaunchCall<'_>]) -> Result<crate::GraphId, DeviceError> {
        let op = Op::Launch;
        let mut st = self.lock_for(op)?;
        self.do_capture(&mut st, launches)
    }

    fn launch_graph(&self, graph: crate::GraphId, timed: bool) -> Result<(), DeviceError> {
        let op = Op::Launch;
        let mut st = self.lock_for(op)?;
        let name = CudaFns::NAMES.graph_launch;
        let _bound = untraced(&mut st, |st| self.enter_as(st, op, name))?;
        let timing = |st: &mut State| match untraced(st, |st| self.record_timing(st)) {
            Ok(e) => Some(e),
            Err(e) => {
                log::warn!("timing a graph launch: {e}");
                None
            }
        };
        let start = if timed { timing(&mut st) } else { None };
        let r = call_named(&mut st, op, name, 0, 0, |st| {
            self.launch_graph_bound(st, graph)
        });
        if let Some(start) = start {
            match (&r, timing(&mut st)) {
                (Ok(()), Some(end)) => st.exec.timed.push((start, end)),
                (_, end) => st.exec.spare.extend(std::iter::once(start).chain(end)),
            }
        }
        r
    }

    fn destroy_graph(&self, graph: crate::GraphId) -> Result<(), DeviceError> {
        let op = Op::Launch;
        let mut st = self.lock_for(op)?;
        untraced(&mut st, |st| self.do_destroy_graph(st, graph))
    }

    fn take_device_time(&self) -> Result<Option<u64>, DeviceError> {
        let op = Op::Sync;
        let mut st = self.lock_for(op)?;
        untraced(&mut st, |st| self.do_take_device_time(st))
    }

    fn function_limits(&self, func: FuncId) -> Result<crate::FuncLimits, DeviceError> {
        let op = Op::Module;
        call_named(
            &mut *self.lock_for(op)?,
            op,
            "cuFuncGetAttribute",
            0,
            0,
            |st| self.do_function_limits(st, func),
        )
    }

    fn allow_dynamic_shared(&self, func: FuncId, bytes: u32) -> Result<(), DeviceError> {
        let op = Op::Module;
        let name = "cuFuncSetAttribute";
        call_named(
            &mut *self.lock_for(op)?,
            op,
            name,
            0,
            u64::from(bytes),
            |st| self.do_allow_dynamic_shared(st, func, bytes),
        )
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        let op = Op::Sync;
        call(&mut *self.lock_for(op)?, op, 0, 0, |st| {
            self.do_synchronize(st)
        })
    }

    fn synchronize_device(&self) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let name = CudaFns::NAMES.ctx_synchronize;
        call_named(&mut *self.lock_for(op)?, op, name, 0, 0, |st| {
            self.do_synchronize_device(st)
        })
    }

    fn stream_handle(&self) -> Option<u64> {
        match self.stream.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            s => Some(s),
        }
    }

    fn fault(&self) -> Option<i64> {
        crate::sessions::VendorSession::fault(&*self.session).map(|(code, _)| code)
    }

    fn driver_version(&self) -> Option<(u32, u32)> {
        let v = self.f.driver_get_version().ok()?;
        let v = u32::try_from(v).ok()?;
        Some((v / 1000, v % 1000 / 10))
    }

    fn wait_for_stream(&self, producer: u64) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let name = CudaFns::NAMES.stream_wait_event;
        call_named(&mut *self.lock_for(op)?, op, name, 0, 0, |st| {
            self.do_wait_for_stream(st, producer)
        })
    }

    fn order_stream(&self, consumer: u64) -> Result<(), DeviceError> {
        let op = Op::Sync;
        let name = CudaFns::NAMES.stream_wait_event;
        call_named(&mut *self.lock_for(op)?, op, name, 0, 0, |st| {
            self.do_order_stream(st, consumer)
        })
    }

    fn with_ledger(&self, f: &mut dyn FnMut(&mut Ledger)) {
        f(&mut self.lock().ledger);
    }

    /// `CUDA_ERROR_ILLEGAL_ADDRESS`, a sticky error on real hardware.
    fn default_fault_code(&self, _op: Op) -> i64 {
        sys::CUDA_ERROR_ILLEGAL_ADDRESS
    }

    /// Drains the stream, unregisters every mirror and frees every allocation of this device;
    /// the process's session (the primary-context retain) stays for the next worker, until exit
    /// (or, after a sticky fault, until the last worker on the device closes). The device is
    /// unusable afterwards. In a forked child nothing is done, not even a lock taken (a parent
    /// thread may have held it when it forked).
    fn close(&self) -> CloseReport {
        self.do_close()
    }

    fn closed(&self) -> bool {
        self.lock().closed
    }
}
