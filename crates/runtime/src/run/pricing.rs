//! Pricing a run's kernels with the device's cost models (sim with `model=`): every batch of
//! tasks costs what [`simpler_driver::model::DeviceRates::price`] says for its work, its task
//! count and the launches a device would make of it (`launch.rs` counts them the way it plans
//! them: one per dependence level). A task's work is what its kernel declares; bytes it leaves
//! undeclared are the extents of its views. The total is charged to the `execute` phase, and
//! the report keeps the work and cost of each kernel.

use simpler_driver::model::{ExecCost, Work, MODELS};

use crate::error::Phase;
use crate::memory::Memory;
use crate::run::report::{KernelCost, KernelModeled};
use crate::run::state::RunState;

impl RunState {
    /// The bytes one task of batch `i` reads and writes through its views: each view's extent,
    /// read when the kernel reads it, written when it writes it.
    fn derived_bytes(&self, i: usize) -> (u64, u64) {
        let b = self.tasks.batch(i);
        let (mut read, mut written) = (0u64, 0u64);
        for s in b.first_slot..b.first_slot + u32::from(b.slots) {
            let slot = self.tasks.slot(s);
            if self.args[slot.arg as usize].alloc.is_none() {
                continue;
            }
            let extent = slot.geometry.extent();
            if slot.dir.reads() {
                read = read.saturating_add(extent);
            }
            if slot.dir.writes() {
                written = written.saturating_add(extent);
            }
        }
        (read, written)
    }

    /// Prices every task of the run (see the module docs) and charges the total to `execute`.
    /// Nothing without a cost model.
    pub(crate) fn price_execute(&mut self, mem: &Memory) {
        let models = mem.dev.cost_models();
        if models.is_empty() {
            return;
        }
        let mut rows: Vec<KernelCost> = Vec::new();
        let mut total = [0u64; MODELS.len()];
        for i in 0..self.tasks.batch_count() {
            let b = self.tasks.batch(i);
            let count = u64::from(b.count);
            let (read, written) = self.derived_bytes(i);
            let declared = b.work.unwrap_or_default();
            let per_task = Work {
                bytes_read: declared.bytes_read.unwrap_or(read),
                bytes_written: declared.bytes_written.unwrap_or(written),
                flops: declared.flops,
            };
            let work = per_task.times(count);
            let launches = self.batch_launches(i);
            let name = self.tasks.name_of(b.kernel);
            let at = match rows.iter().position(|r| r.name == name) {
                Some(at) => at,
                None => {
                    rows.push(KernelCost {
                        name: name.to_owned(),
                        declared: b.work.is_some(),
                        per_task,
                        modeled: models
                            .iter()
                            .map(|m| KernelModeled {
                                model: m.name,
                                ..KernelModeled::default()
                            })
                            .collect(),
                        ..KernelCost::default()
                    });
                    rows.len() - 1
                }
            };
            let row = &mut rows[at];
            row.batches += 1;
            row.tasks += count;
            row.launches += launches;
            row.work.add(&work);
            for ((m, k), t) in models.iter().zip(&mut row.modeled).zip(&mut total) {
                let cost: ExecCost = m.exec.price(count, launches, &work);
                k.overhead_ns += cost.overhead_ns;
                k.memory_ns += cost.memory_ns;
                k.compute_ns += cost.compute_ns;
                k.ns += cost.ns();
                *t += cost.ns();
            }
        }
        mem.dev.charge_modeled(Phase::Execute.name(), total);
        self.report.kernels = rows;
    }
}
