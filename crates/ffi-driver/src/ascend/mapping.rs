//! Host mappings of device memory through the HAL: `halHostRegister(DEV_SVM_MAP_HOST)` and
//! `halHostUnregister`, with the rules of the module docs (only a capability answer is a
//! refusal; the host side is revoked only after a successful unregister).

use std::sync::Arc;

use super::{AscendDevice, MapEntry, State};
use crate::error::codes;
use crate::{DevPtr, DeviceError, HostMem, MapGrant, Op};

/// Whether a `halHostRegister` code says the host ran out of mapping resources (a refusal the
/// caller serves with a mirror), not that the call was wrong.
fn is_resource_refusal(code: i64) -> bool {
    [
        codes::OUT_OF_MEMORY,
        codes::NO_RESOURCES,
        codes::OVER_LIMIT,
        codes::MALLOC_FAIL,
    ]
    .contains(&code)
}

impl AscendDevice {
    /// Refuses a HAL call on a closed device, or in a forked child.
    pub(super) fn check_open(&self, st: &State, op: Op) -> Result<(), DeviceError> {
        if st.closed {
            return Err(self.refused(op, codes::UNINIT, "the device is closed"));
        }
        self.session.check_process(op, self.call(op))
    }

    pub(super) fn do_map(
        &self,
        st: &mut State,
        ptr: DevPtr,
        bytes: u64,
    ) -> Result<MapGrant, DeviceError> {
        let op = Op::Map;
        self.check_open(st, op).map_err(|e| e.at(ptr.0))?;
        if bytes == 0 {
            return Err(self
                .refused(op, codes::INVALID_VALUE, "zero-byte mapping")
                .at(ptr.0));
        }
        self.containing(st, op, ptr.0, bytes)?;
        let end = ptr.0 + bytes;
        let overlaps = st
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&s, m)| s + m.bytes > ptr.0);
        if overlaps {
            let e = self.refused(
                op,
                codes::PARA_ERROR,
                "range is already mapped (a mapping leaked?)",
            );
            return Err(e.at(ptr.0).sized(bytes));
        }
        let len = usize::try_from(bytes).map_err(|_| {
            self.refused(op, codes::INVALID_VALUE, "size exceeds the address space")
                .at(ptr.0)
                .sized(bytes)
        })?;
        let _held = self
            .session
            .hold(op, self.call(op))
            .map_err(|e| e.at(ptr.0).sized(bytes))?;
        // `ptr` is a device address inside a live allocation (checked above).
        let host = match self.hal.host_register(ptr.0, bytes, self.logical) {
            Ok(host) => host,
            Err(e) if is_resource_refusal(e.code) => {
                st.ledger.on_map(false);
                let reason = format!(
                    "halHostRegister answered {} (code {}) for the allocation at {ptr} of {bytes} \
                     bytes on logical device {}: the host's mapping resources are exhausted; this \
                     allocation is mirrored instead",
                    e.code_name, e.code, self.logical
                );
                log::warn!("{reason}");
                return Ok(MapGrant::Refused {
                    code: e.code,
                    reason,
                });
            }
            Err(e) if e.code == codes::NOT_SUPPORT => {
                st.ledger.on_map(false);
                return Ok(MapGrant::Refused {
                    code: e.code,
                    reason: format!(
                        "halHostRegister answered {} for {bytes} bytes at {ptr} on logical \
                         device {} (this allocation's pages cannot be mapped on this host)",
                        e.code_name, self.logical
                    ),
                });
            }
            Err(e) => return Err(e.at(ptr.0).sized(bytes)),
        };
        let Some(host) = host else {
            st.ledger.on_map(false);
            return Ok(MapGrant::Refused {
                code: 0,
                reason: format!(
                    "halHostRegister reported success but returned no host pointer (a stub HAL? \
                     loaded from {}); treated as a refusal",
                    self.hal.lib.path
                ),
            });
        };
        // SAFETY: the HAL keeps the mapping valid for `len` bytes until `halHostUnregister`,
        // and this driver revokes the `HostMem` when that call succeeds (blocking accesses
        // while it runs), or at `close`, whichever comes first; the session (whose release
        // resets the device) is never released while this device is open
        // (`crate::sessions`).
        let mem = Arc::new(unsafe { HostMem::foreign(host, len) });
        st.mappings.insert(
            ptr.0,
            MapEntry {
                bytes,
                mem: mem.clone(),
            },
        );
        st.ledger.on_map(true);
        Ok(MapGrant::Mapped { mem, offset: 0 })
    }

    /// Unregisters the mapping at `start` and revokes its host side; on success forgets it.
    pub(super) fn do_unmap(&self, st: &mut State, start: u64) -> Result<(), DeviceError> {
        let op = Op::Unmap;
        self.check_open(st, op).map_err(|e| e.at(start))?;
        let Some(entry) = st.mappings.get(&start) else {
            return Err(self
                .refused(
                    op,
                    codes::NOT_EXIST,
                    "no host mapping starts at this address",
                )
                .at(start));
        };
        let bytes = entry.bytes;
        let _held = self
            .session
            .hold(op, self.call(op))
            .map_err(|e| e.at(start).sized(bytes))?;
        // Accesses are blocked while the HAL tears the mapping down; the host side is revoked
        // only when it did. A refused unregister leaves a mapping the HAL still holds: it stays
        // usable, and its allocation stays live until a retry unregisters it.
        let (hal, logical) = (&self.hal, self.logical);
        let r = entry.mem.revoke_with(|| {
            // SAFETY: the device address a successful `halHostRegister` was given; no access
            // through the mapping runs while the call does (`revoke_with` blocks them), and the
            // host side is revoked when it succeeds.
            unsafe { hal.host_unregister(start, logical) }
        });
        r.map_err(|e| e.at(start).sized(bytes))?;
        st.mappings.remove(&start);
        st.ledger.on_unmap();
        Ok(())
    }
}
