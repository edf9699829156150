//! Closing an Ascend device: its mappings, then its allocations, each released once; after a
//! device fault, one summary of what the releasing calls could not release.

use super::sys::acl_status;
use super::AscendDevice;
use crate::{CloseReport, Op};

impl AscendDevice {
    /// See `Device::close` for [`AscendDevice`].
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
        // After a device fault the releasing calls are still made (they fail with it; the
        // device's teardown frees what they could not), and one summary says so.
        let fault = crate::sessions::VendorSession::fault(&*self.session);
        st.releasing = fault.is_some();
        let mut errors = Vec::new();
        // 1. Every mapping goes first: unregister before free, always.
        let mappings: Vec<(u64, u64)> = st.mappings.iter().map(|(&a, m)| (a, m.bytes)).collect();
        for (start, bytes) in mappings {
            report.leaked_mappings += 1;
            let r = self.do_unmap(&mut st, start);
            if let Err(e) = st.ledger.logged(Op::Unmap, start, bytes, r) {
                errors.push(e);
            }
        }
        // 2. Then every allocation whose mappings are gone.
        for (ptr, size) in st.ledger.live_allocations() {
            report.leaked_allocations += 1;
            report.leaked_bytes += size;
            let r = self.do_free(&mut st, ptr);
            if let Err(e) = st.ledger.logged(Op::Free, ptr.0, size, r) {
                errors.push(e);
            }
        }
        match fault {
            Some((code, first)) if !errors.is_empty() => {
                for e in &errors {
                    log::debug!(
                        "ascend device {} close after a device fault: {e}",
                        self.user
                    );
                }
                let left = st.ledger.live_allocations();
                for (ptr, _) in &left {
                    st.ledger.on_free(*ptr);
                }
                report.errors.push(acl_status(code).error(
                    Op::Device,
                    first.as_str(),
                    format!(
                        "closed device {} after the device fault {first} reported: {} releasing \
                         call(s) failed with it; {} allocation(s) go with the device's teardown",
                        self.user,
                        errors.len(),
                        left.len()
                    ),
                ));
            }
            _ => report.errors.extend(errors),
        }
        st.releasing = false;
        // 3. A mapping whose unregister failed above is still registered with the HAL, and its
        // allocation stays live; the host side is revoked before the device is given up.
        for entry in st.mappings.values() {
            entry.mem.revoke();
        }
        st.closed = true;
        drop(st);
        report.errors.extend(crate::sessions::leave(&*self.session));
        if report.leaked_allocations > 0 || report.leaked_mappings > 0 {
            log::warn!(
                "ascend device {} closed with {} live allocation(s) ({} bytes) and {} mapping(s); \
                 released them ({} error(s))",
                self.user,
                report.leaked_allocations,
                report.leaked_bytes,
                report.leaked_mappings,
                report.errors.len()
            );
        }
        report
    }
}
