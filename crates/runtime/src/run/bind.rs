//! Bind: every argument of a run gets its place. A host-staged tensor gets a slice of the staging
//! arena (its byte extent, aligned) or, with `staging="fresh"`, an allocation of its own, and is
//! uploaded unless it is OUT. A device tensor becomes a lazy view entry: a vector push, no driver
//! call and no decision (its host view is established by the first orchestrator access).

use simpler_driver::DevPtr;

use crate::error::{Error, Phase, Result};
use crate::memory::{Memory, Owner};
use crate::run::state::{ArgKind, RunArg, RunState};
use crate::spec::{ArgValue, RunCall};
use crate::staging::{plan_slices, Arena, Staging};

impl RunState {
    /// Checks every argument, then stages and records them. `hosts` lends the byte extent of each
    /// staged argument, in order. On failure the caller releases `self.fresh`.
    pub(crate) fn bind(
        &mut self,
        mem: &mut Memory,
        arena: &mut Arena,
        staging: Staging,
        call: &RunCall<'_>,
        hosts: &[&[u8]],
    ) -> Result<()> {
        // Everything is validated before the first driver call.
        let mut staged = 0;
        // The allocation size of each device argument, in order.
        let mut device_bytes = Vec::with_capacity(call.args.len());
        for a in call.args {
            match &a.value {
                ArgValue::Device { buffer, geometry } => {
                    let info =
                        mem.check_tensor(*buffer, geometry, &format_args!("tensor {}", a.name))?;
                    device_bytes.push(info.bytes);
                }
                ArgValue::Staged { geometry, .. } => {
                    let host = hosts.get(staged).ok_or_else(|| {
                        Error::Value(format!("tensor {}: no host bytes were lent", a.name))
                    })?;
                    if host.len() as u64 != geometry.extent() || geometry.offset() != 0 {
                        return Err(Error::Value(format!(
                            "tensor {}: {} host bytes for an extent of {} bytes",
                            a.name,
                            host.len(),
                            geometry.extent()
                        )));
                    }
                    staged += 1;
                }
                ArgValue::Scalar => {}
            }
        }
        let extents = call.args.iter().filter_map(|a| match &a.value {
            ArgValue::Staged { geometry, .. } => Some((&*a.name, geometry.extent())),
            _ => None,
        });
        let (offsets, total) = plan_slices(extents)?;
        let arena_at = match staging {
            Staging::Arena if total > 0 => Some(arena.ensure(mem, total)?),
            _ => None,
        };
        self.args.reserve(call.args.len());
        let (mut si, mut di) = (0, 0);
        for a in call.args {
            match &a.value {
                ArgValue::Scalar => {}
                ArgValue::Device { buffer, geometry } => {
                    let bytes = device_bytes[di];
                    di += 1;
                    let alloc = (geometry.extent() > 0).then_some((buffer.ptr, bytes));
                    let region = if alloc.is_some() {
                        self.device_region(buffer.ptr)
                    } else {
                        u32::MAX
                    };
                    self.report.counters.resident_tensors += 1;
                    self.args.push(RunArg {
                        name: a.name.clone(),
                        dir: call.sig.params()[self.args.len()].dir,
                        geometry: *geometry,
                        alloc,
                        kind: ArgKind::Device,
                        region,
                        resolved: None,
                        span_copy: Default::default(),
                    });
                }
                ArgValue::Staged { geometry, .. } => {
                    let (host, off) = (hosts[si], offsets[si]);
                    let dir = call.sig.params()[self.args.len()].dir;
                    self.report.counters.staged_tensors += 1;
                    let mut arg = RunArg {
                        name: a.name.clone(),
                        dir,
                        geometry: *geometry,
                        alloc: None,
                        kind: ArgKind::Staged { host: si },
                        region: u32::MAX,
                        resolved: None,
                        span_copy: Default::default(),
                    };
                    si += 1;
                    let extent = geometry.extent();
                    if extent > 0 {
                        let (base, bytes, at) = match arena_at {
                            Some((p, cap)) => (p, cap, off),
                            None => {
                                let buf =
                                    mem.alloc(extent, Owner::Staging, Phase::Bind, Some(&a.name))?;
                                self.fresh.push((a.name.clone(), buf.ptr));
                                (buf.ptr, extent, 0)
                            }
                        };
                        // The slice was checked to hold the tensor when it was planned.
                        arg.geometry = geometry.at_offset(at / geometry.dtype().size());
                        arg.alloc = Some((base, bytes));
                        arg.region = self.hazards.add_region(base);
                        if dir.reads() {
                            mem.dev
                                .copy_h2d(DevPtr(base.0 + at), host)
                                .map_err(|e| Error::device(Phase::Bind, Some(&a.name), e))?;
                            self.report.counters.staged_bytes += extent;
                        } else if let Some(byte) = self.poison {
                            // An OUT tensor is not uploaded: its slice holds whatever the arena
                            // last held there, so a kernel that writes nothing would "produce" an
                            // earlier run's result. Poison makes never-written bytes show.
                            mem.dev
                                .fill(DevPtr(base.0 + at), extent, byte)
                                .map_err(|e| Error::device(Phase::Bind, Some(&a.name), e))?;
                            self.report.counters.poisoned_bytes += extent;
                        }
                    }
                    self.args.push(arg);
                }
            }
        }
        Ok(())
    }
}
