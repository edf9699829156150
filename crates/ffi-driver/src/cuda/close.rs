//! Closing a CUDA device: the stream and what runs on it, the mirrors, then the allocations,
//! each released once; after a sticky fault, one summary of what the releasing calls could not
//! release.

use std::sync::{Arc, Mutex};

use super::sys::status;
use super::{CudaDevice, State};
use crate::{CloseReport, HostMem, Op};

/// Mirrors that a closed device could not unregister: kept alive (never freed) for the life of
/// the process, because the driver may still treat their pages as page-locked.
static STILL_REGISTERED: Mutex<Vec<Arc<HostMem>>> = Mutex::new(Vec::new());

impl CudaDevice {
    /// See `Device::close` for [`CudaDevice`].
    pub(super) fn do_close(&self) -> CloseReport {
        let mut report = CloseReport::default();
        if self.session.process().forked() {
            return report;
        }
        let mut st = self.lock();
        st.ledger.clear_faults();
        if st.closed {
            return report;
        }
        // After a sticky fault every call fails, but the releasing calls are still made (they
        // release what they can: a driver frees with the context); their errors are expected,
        // so one summary says what happened.
        let fault = crate::sessions::VendorSession::fault(&*self.session);
        st.releasing = fault.is_some();
        let mut errors = Vec::new();
        match self.enter(&st, Op::Device) {
            Ok(_bound) => self.close_exec(&mut st, &mut errors),
            Err(e) => errors.push(e),
        }
        let pinned: Vec<(usize, u64)> = st
            .pinned
            .iter()
            .map(|(&a, m)| (a, m.allocated() as u64))
            .collect();
        for (addr, len) in pinned {
            let r = self.do_unpin(&mut st, addr, len);
            if let Err(e) = st.ledger.logged(Op::Unpin, 0, len, r) {
                errors.push(e);
            }
        }
        for (ptr, size) in st.ledger.live_allocations() {
            report.leaked_allocations += 1;
            report.leaked_bytes += size;
            let r = self.do_free(&mut st, ptr);
            if let Err(e) = st.ledger.logged(Op::Free, ptr.0, size, r) {
                errors.push(e);
            }
        }
        match fault {
            Some((code, _)) => self.abandon(&mut st, code, errors.len(), &mut report),
            None => report.errors.extend(errors),
        }
        st.releasing = false;
        st.closed = true;
        // Mirrors whose unregister failed are still registered with the driver (the primary
        // context keeps the registration alive): their memory must never be freed or reused, so
        // it is kept for the life of the process, and `pinned_bytes` keeps counting it.
        let kept = std::mem::take(&mut st.pinned);
        if !kept.is_empty() {
            let mut q = STILL_REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
            q.extend(kept.into_values());
        }
        drop(st);
        report.errors.extend(crate::sessions::leave(&*self.session));
        if report.leaked_allocations > 0 {
            log::warn!(
                "cuda device {} closed with {} live allocation(s) ({} bytes); freed them",
                self.config.device_id,
                report.leaked_allocations,
                report.leaked_bytes
            );
        }
        report
    }

    /// The end of a close after a sticky fault: what the releasing calls could not release goes
    /// with the context (it is forgotten, never retried); one error says what happened.
    fn abandon(&self, st: &mut State, code: i64, failed: usize, report: &mut CloseReport) {
        let left = st.ledger.live_allocations();
        for (ptr, _) in &left {
            st.ledger.on_free(*ptr);
        }
        report.errors.push(status(code).error(
            Op::Device,
            "(the device's context, after a sticky fault)",
            format!(
                "closed device {} after a sticky fault: {failed} releasing call(s) failed with it; \
                 {} allocation(s) go with the context",
                self.config.device_id,
                left.len()
            ),
        ));
    }
}
