//! Page-locked mirrors: `cuMemHostRegister_v2` / `cuMemHostUnregister` over mirror memory, so
//! refreshes run at pinned bandwidth. The driver holds an `Arc` of every registered block until it
//! is unregistered, so registered memory is never freed; a refused registration is an answer (the
//! mirror stays pageable).

use std::sync::Arc;

use super::{CudaDevice, State};
use crate::ledger::Pinned;
use crate::{DeviceError, HostMem, Op};

impl CudaDevice {
    /// Registers `mem` with the driver (page-locks it): every page it occupies
    /// ([`HostMem::allocated`], whole pages of the host's size, so no other block shares
    /// them); a refusal is an answer, logged as a warning (the mirror's refreshes then run at
    /// pageable bandwidth).
    pub(super) fn do_pin(&self, st: &mut State, mem: &Arc<HostMem>) -> Result<Pinned, DeviceError> {
        let Some(addr) = mem.owned_addr() else {
            return Ok(Pinned::No { code: 0 });
        };
        let len = mem.allocated();
        let bound = self.enter(st, Op::Pin).map_err(|e| e.sized(len as u64))?;
        // SAFETY: the `len` bytes (whole pages) at `addr` are the block `mem` owns; the driver
        // keeps an `Arc` to it (below) until it is unregistered, so the memory outlives the
        // registration.
        let r = unsafe { self.f.host_register(addr, len) };
        drop(bound);
        match r {
            Ok(()) => {
                st.pinned.insert(addr, mem.clone());
                st.ledger.on_pin(len as u64);
                Ok(Pinned::Yes)
            }
            Err(e) => {
                log::warn!(
                    "cuMemHostRegister_v2 refused the mirror at host {addr:#x} ({len} bytes) \
                     (code {} {}); it stays pageable, and its refreshes run at pageable bandwidth",
                    e.code,
                    e.code_name
                );
                Ok(Pinned::No { code: e.code })
            }
        }
    }

    /// Unregisters the mirror of `len` bytes at host address `addr`, which the caller found in
    /// `st.pinned`; on success forgets it.
    pub(super) fn do_unpin(
        &self,
        st: &mut State,
        addr: usize,
        len: u64,
    ) -> Result<(), DeviceError> {
        let op = Op::Unpin;
        let bound = self.enter(st, op).map_err(|e| e.sized(len))?;
        // The address a successful `cuMemHostRegister_v2` was given (the caller took it from
        // `pinned`); the memory is still alive (held in `pinned`).
        let what = format_args!(
            "the mirror at host {addr:#x} ({len} bytes) stays registered (and alive) until a retry"
        );
        self.f
            .host_unregister(addr, what)
            .map_err(|e| e.sized(len))?;
        drop(bound);
        st.pinned.remove(&addr);
        st.ledger.on_unpin(len);
        Ok(())
    }
}
