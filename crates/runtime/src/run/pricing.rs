//! Pricing a run's kernels with the device's cost models (sim with `model=`): every batch of
//! tasks costs what [`simpler_driver::model::DeviceRates::price`] says for its work, its
//! dependence levels and the launches a device would make of it (`launch.rs` finds them the
//! way it plans them: one level per dependence, one launch per level). A task's work is what
//! its kernel declares; bytes it leaves undeclared are what its views hold (elements times
//! element size). The total is charged to the `execute` phase, and the report keeps the work
//! and cost of each kernel (one row per kernel, whatever its name).

use simpler_driver::model::{ExecCost, Work, MODELS};

use crate::error::Phase;
use crate::memory::Memory;
use crate::run::report::{KernelCost, KernelModeled};
use crate::run::state::RunState;

impl RunState {
    /// The bytes one task of batch `i` reads and writes through its views: the bytes each view
    /// holds (its elements times their size; a strided view's gaps are not moved), read when
    /// the kernel reads it, written when it writes it. A view whose elements share bytes (a
    /// zero stride) counts no more than the bytes it spans.
    fn derived_bytes(&self, i: usize) -> (u64, u64) {
        let b = self.tasks.batch(i);
        let (mut read, mut written) = (0u64, 0u64);
        for s in b.first_slot..b.first_slot + u32::from(b.slots) {
            let slot = self.tasks.slot(s);
            if self.args[slot.arg as usize].alloc.is_none() {
                continue;
            }
            let bytes = slot.geometry.nbytes().min(slot.geometry.extent());
            if slot.dir.reads() {
                read = read.saturating_add(bytes);
            }
            if slot.dir.writes() {
                written = written.saturating_add(bytes);
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
        // The kernel of each row: rows are keyed by the kernel, not its name (two kernels may
        // share one).
        let mut ids: Vec<u32> = Vec::new();
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
            let (levels, launches) = self.batch_shape(i);
            // Threads of one launch, where the kernel carries device code (its launch function
            // runs on sim too): the average tasks per launch times each task's threads.
            let threads = b
                .threads
                .map(|per_task| per_task.saturating_mul(count.div_ceil(launches.max(1))));
            let at = match ids.iter().position(|&k| k == b.kernel) {
                Some(at) => at,
                None => {
                    ids.push(b.kernel);
                    rows.push(KernelCost {
                        name: self.tasks.name_of(b.kernel).to_owned(),
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
                let efficiency = declared
                    .efficiency(m.name)
                    .unwrap_or(m.exec.kernel_efficiency);
                let rate = efficiency * threads.map_or(1.0, |n| m.exec.fill(n));
                let cost: ExecCost = m.exec.price_at(&levels, launches, &work, rate);
                let busy = cost.memory_ns.max(cost.compute_ns);
                k.busy_ns += busy;
                k.full_rate_ns += busy * rate.clamp(f64::MIN_POSITIVE, 1.0);
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
