//! Copy back and clean up.
//!
//! Copy back is skipped entirely when an earlier step failed; otherwise every staged tensor that
//! is not IN is copied into the caller's array (a non-dense one element by element, so the bytes
//! of the caller's array between its elements are never touched). Clean up always runs: fresh
//! staging buffers are released (view first; the arena and the scratch pool are kept), the run's
//! task list and hazard index are freed, and the report is completed. All of it is timed.

use simpler_driver::model::{per_model, PerModel};
use simpler_driver::DevPtr;

use crate::error::{Error, Phase, Result};
use crate::memory::Memory;
use crate::run::report::{ModeledRun, Phases, RunReport};
use crate::run::state::{ArgKind, Records, RunState, Stage};

impl RunState {
    /// Starts copy back: the staged arguments to copy into the caller's arrays, as (index among
    /// the staged arguments, argument index); none when an earlier step failed.
    pub(crate) fn begin_copy_back(&mut self) -> Result<Vec<(usize, u32)>> {
        self.expect(Stage::Executed, "copy_back: execution has not ended")?;
        self.stage = Stage::CopiedBack;
        if self.failed {
            return Ok(Vec::new());
        }
        Ok(self
            .args
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a.kind {
                ArgKind::Staged { host, .. } if a.dir.writes() && a.alloc.is_some() => {
                    Some((host, i as u32))
                }
                _ => None,
            })
            .collect())
    }

    /// Copies argument `arg`'s device bytes into `dst` (its host byte extent).
    pub(crate) fn copy_back_one(&mut self, mem: &Memory, arg: u32, dst: &mut [u8]) -> Result<()> {
        let r = self.copy_into(mem, arg, dst);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn copy_into(&mut self, mem: &Memory, arg: u32, dst: &mut [u8]) -> Result<()> {
        let a = self.arg(arg)?;
        let (start, len) = a.span().unwrap_or_default();
        if dst.len() as u64 != len {
            return Err(Error::Value(format!(
                "copy_back: tensor {}: host extent of {} bytes, device extent {len}",
                a.name,
                dst.len()
            )));
        }
        let r = if a.geometry.is_dense() {
            mem.dev.copy_d2h(dst, DevPtr(start))
        } else {
            let mut tmp = vec![0u8; len as usize];
            mem.dev
                .copy_d2h(&mut tmp, DevPtr(start))
                .map(|()| a.geometry.copy_elements(&tmp, dst))
        };
        r.map_err(|e| Error::device(Phase::CopyBack, Some(&a.name), e))?;
        self.report.counters.copied_back_bytes += len;
        Ok(())
    }

    /// Ends copy back (its timer).
    pub(crate) fn end_copy_back(&mut self) {
        self.report.phases.copy_back = self.lap();
    }

    /// Cleans up (always): releases fresh staging buffers, clears the run's records and completes
    /// the report. Returns the report, the first cleanup failure after everything was attempted,
    /// and the cleared records for the next run.
    pub(crate) fn finish(mut self, mem: &mut Memory) -> (RunReport, Option<Error>, Records) {
        if matches!(self.stage, Stage::Orchestrate | Stage::Execute) {
            self.failed = true;
            self.lap();
        }
        let mut first_err = None;
        for (name, p) in std::mem::take(&mut self.fresh).into_iter().rev() {
            let what = format_args!("cleanup of the staging buffer of tensor {name}");
            if let Err(e) = mem.release_or_orphan(p, &what) {
                first_err.get_or_insert(Error::device(Phase::Cleanup, Some(&name), e));
            }
        }
        // The run's own teardown is part of cleanup.
        let mut records = Records {
            tasks: std::mem::take(&mut self.tasks),
            hazards: std::mem::take(&mut self.hazards),
            plan: std::mem::take(&mut self.plan),
            args: std::mem::take(&mut self.args),
        };
        records.tasks.clear();
        records.hazards.clear();
        mem.plans.spare.extend(records.plan.take_unfinished());
        records.plan.clear();
        records.args.clear();
        self.report.phases.cleanup = self.lap();
        let after = mem.dev.stats();
        let c = &mut self.report.counters;
        c.device_mallocs = after.allocs - self.stats_before.allocs;
        c.device_frees = after.frees - self.stats_before.frees;
        c.views_mapped = self.events.mapped;
        c.views_mirrored = self.events.mirrored;
        c.mirror_refreshes = self.events.refreshes;
        c.mirror_refresh_bytes = self.events.refresh_bytes;
        c.views_cached = self.events.cached;
        c.cache_fills = self.events.cache_fills;
        c.cache_fill_bytes = self.events.cache_fill_bytes;
        let models = mem.dev.cost_models();
        if !models.is_empty() {
            let c = &self.report.counters;
            let host_side = per_model(models, |m| {
                m.mapped_access_ns(c.mapped_reads, c.mapped_writes)
                    + m.mapped_bulk_read_ns(c.cache_fill_bytes)
            });
            // The device's cumulative figure (`stats()["modeled_ns"]`) includes it too.
            mem.dev.charge_modeled(Phase::Orchestrate.name(), host_side);
            let after = mem.dev.modeled();
            let before = &self.modeled_before;
            self.report.modeled_by = models
                .iter()
                .enumerate()
                .map(|(k, m)| {
                    let at = |v: &[(&str, PerModel)], phase: &str| {
                        v.iter().find(|(p, _)| *p == phase).map_or(0, |x| x.1[k])
                    };
                    let delta = |phase: &str| at(&after, phase).saturating_sub(at(before, phase));
                    ModeledRun {
                        model: m.name,
                        phases: Phases {
                            bind: delta("bind"),
                            orchestrate: delta("orchestrate"),
                            execute: delta("execute"),
                            copy_back: delta("copy_back"),
                            cleanup: delta("cleanup"),
                        },
                    }
                })
                .collect();
            self.report.modeled = self.report.modeled_by.first().map(|m| m.phases);
        }
        self.report.ok = !self.failed && first_err.is_none();
        (self.report, first_err, records)
    }
}
