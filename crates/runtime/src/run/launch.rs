//! Device execution of a run's batches of device code, natively (no host call per task).
//!
//! The run plans its batches of device code as execution reaches them. The first batch takes a
//! task-row region (device memory of its own, sized for every batch's rows) and a page-locked
//! row buffer; each batch then gets one task row per task (the ABI in `crate::device_code`),
//! written into the buffer, and its launches:
//!
//! * a batch whose tasks are independent (no task writes a byte another task of the batch reads
//!   or writes) is one launch over all its rows: grid `(gx, gy, gz * n)`, the task being
//!   `blockIdx.z / gz`;
//! * a batch with dependences runs in *levels* (`levels.rs`; computed when the batch was
//!   recorded, or here): the rows are ordered by level, and each level is one launch, so every
//!   dependence is ordered by the stream.
//!
//! Rows go up in chunks with asynchronous copies ordered on the worker's stream before the
//! launches that read them: the first chunk is the first batch alone, so the device starts on it
//! while the host plans the rest; each later chunk carries at least twice the rows of the one
//! before (and [`MIN_CHUNK`]).
//!
//! A launch covers at most `65535 / gz` tasks (the grid's z limit); longer levels are split.
//! Launches are enqueued in submission order on the worker's stream as execution reaches each
//! batch; the end of execute waits for the stream once.
//!
//! The plan is kept (`plan_cache.rs`): a later round that records exactly the same tasks over
//! exactly the same allocations reuses it, with no levels, no rows and no upload.

use std::time::Instant;

use simpler_driver::DevPtr;

use crate::error::{Error, Phase, Result};
use crate::memory::{Memory, Owner};
use crate::run::levels::{batch_levels, SlotSpan};
use crate::run::plan::{Binding, ColdPlan, PlannedLaunch, Region};
use crate::run::plan_cache::{Replay, PLANS_KEPT};
use crate::run::state::{RunArg, RunState};
use crate::run::tasks::TaskStore;

/// Largest grid along z.
const MAX_GRID_Z: u32 = 65_535;

/// The least bytes of task rows an upload after a cold plan's first carries.
const MIN_CHUNK: u64 = 64 << 10;

/// What a batch's rows are made of.
struct RowSource<'a> {
    spans: &'a [SlotSpan<'a>],
    scalars: &'a [crate::dtype::Value],
    per_task: usize,
    code: &'a crate::device_code::DeviceCode,
    consts: &'a [i64],
}

impl RowSource<'_> {
    /// The fields of one row: a device address per tensor, the scalars, the launch constants.
    fn fields(&self) -> usize {
        self.spans.len() + self.per_task + self.consts.len()
    }
}

/// Writes the rows of tasks `order` (in that order) into `dst`, one after another: each
/// tensor's first-element address (0 for an empty view), its scalars in their declared kinds,
/// then the launch constants, each a little-endian `u64`. Column by column: each field is one
/// tight loop over the rows.
fn write_rows(src: &RowSource<'_>, order: &[u32], dst: &mut [u8]) -> Result<()> {
    let row = src.fields() * 8;
    // Field `col` of every row: `value(task)`.
    fn put(dst: &mut [u8], row: usize, order: &[u32], col: usize, value: impl Fn(u32) -> u64) {
        let at = col * 8;
        for (r, &t) in dst.chunks_exact_mut(row).zip(order) {
            r[at..at + 8].copy_from_slice(&value(t).to_le_bytes());
        }
    }
    for (col, s) in src.spans.iter().enumerate() {
        match (s.base.filter(|_| s.extent > 0), s.elems) {
            (Some(p), [e]) => {
                let a = p + e * s.item;
                put(dst, row, order, col, |_| a);
            }
            (Some(p), elems) => put(dst, row, order, col, |t| p + elems[t as usize] * s.item),
            (None, _) => put(dst, row, order, col, |_| 0),
        }
    }
    let per = src.per_task;
    for j in 0..per {
        let col = src.spans.len() + j;
        let at = col * 8;
        for (r, &t) in dst.chunks_exact_mut(row).zip(order) {
            let v = src
                .code
                .encode_scalar(j, src.scalars[t as usize * per + j])?;
            r[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
    for (k, &c) in src.consts.iter().enumerate() {
        put(dst, row, order, src.spans.len() + per + k, |_| c as u64);
    }
    Ok(())
}

/// Tasks one launch covers at most, for a launch geometry of `gz` blocks along z per task.
fn tasks_per_launch(gz: u32) -> u64 {
    u64::from((MAX_GRID_Z / gz.max(1)).max(1))
}

impl RunState {
    /// Runs a planning step, timed: its time less the row uploads' goes to `plan_ns`.
    fn timed_plan(
        &mut self,
        mem: &mut Memory,
        step: impl FnOnce(&mut Self, &mut Memory) -> Result<()>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let uploading = self.report.counters.row_upload_ns;
        let r = step(self, mem);
        let upload = self.report.counters.row_upload_ns - uploading;
        self.report.counters.plan_ns += elapsed_ns(t0).saturating_sub(upload);
        r
    }

    /// Takes the kept plan of an earlier round that recorded exactly these tasks over exactly
    /// these allocations (`plan_cache.rs`), or starts a cold plan: a task-row region and a
    /// page-locked row buffer large enough for every batch's rows, filled batch by batch as
    /// execution reaches them ([`RunState::plan_ahead`]).
    fn start_plan(&mut self, mem: &mut Memory) -> Result<()> {
        self.plan.clear();
        self.plan.planned = true;
        let bindings = self.bindings(mem);
        let replay = mem.plans.replay;
        if replay != Replay::Off {
            if let Some(kept) = mem.plans.find(&self.tasks, &bindings) {
                self.plan.launches.clone_from(&kept.launches);
                self.plan.batches.clone_from(&kept.batches);
                let graphs = replay == Replay::Graphs && mem.dev.captures_graphs();
                if graphs && !kept.graph_failed && self.tasks.all_device() {
                    self.plan.graph_of = Some(kept.id);
                }
                self.report.counters.plan_reuses += 1;
                return Ok(());
            }
            mem.plans.make_room(&self.tasks, &bindings);
            mem.bury_graphs();
        }
        let need = self.row_bytes()?;
        let region = take_region(mem, need)?;
        let rows = match mem.launcher.row_buffer(&*mem.dev, need) {
            Ok(rows) => rows,
            Err(e) => {
                mem.plans.spare.push(region);
                return Err(Error::Value(format!(
                    "execute: a page-locked task-row buffer of {need} bytes: {e}"
                )));
            }
        };
        let end = (0..self.tasks.batch_count())
            .rev()
            .find(|&i| self.tasks.batch(i).device.is_some())
            .map_or(0, |i| i + 1);
        self.plan.cold = Some(ColdPlan {
            region,
            rows,
            bindings,
            written: 0,
            next_batch: 0,
            end,
            chunk: 0,
        });
        Ok(())
    }

    /// The bytes of every batch's task rows (refused when they do not fit a `u64`).
    fn row_bytes(&self) -> Result<u64> {
        let mut total = 0u64;
        for i in 0..self.tasks.batch_count() {
            let b = self.tasks.batch(i);
            let Some((_, consts)) = b.device else {
                continue;
            };
            let fields = u64::from(b.slots) + u64::from(b.per_task) + consts.len() as u64;
            total = fields
                .checked_mul(8 * u64::from(b.count))
                .and_then(|n| n.checked_add(total))
                .ok_or_else(|| {
                    Error::Value(format!(
                        "execute: the task rows of batch {i} ({} tasks of {fields} fields) \
                         overflow the task-row buffer",
                        b.count
                    ))
                })?;
        }
        Ok(total)
    }

    /// Plans batches of device code from where the cold plan stands: the next one execution
    /// reaches, and on until the rows not yet uploaded make a chunk (the first chunk is that
    /// batch alone, so the device starts on it while the host plans the rest; each later one
    /// carries at least twice the bytes of the one before, and [`MIN_CHUNK`]); uploads them
    /// with one asynchronous copy ordered on the stream before the launches that read them.
    /// When every batch is planned, the plan is kept (`plan_cache.rs`).
    fn plan_ahead(&mut self, mem: &mut Memory) -> Result<()> {
        let Some(mut cold) = self.plan.cold.take() else {
            return Ok(());
        };
        if let Err(e) = self.plan_chunk(mem, &mut cold) {
            // Launches already enqueued read rows of the region: it is free again once the
            // end of execute waited for them, before any later plan takes it.
            mem.plans.spare.push(cold.region);
            return Err(e);
        }
        if cold.next_batch < cold.end {
            self.plan.cold = Some(cold);
            return Ok(());
        }
        self.report.counters.task_row_bytes += cold.written;
        if mem.plans.replay == Replay::Off {
            // Not kept: the kept plans stay as they are.
            mem.plans.spare.push(cold.region);
        } else {
            mem.plans.insert(
                &self.tasks,
                cold.bindings,
                &self.plan.launches,
                &self.plan.batches,
                cold.region,
            );
        }
        Ok(())
    }

    /// [`RunState::plan_ahead`]'s planning and upload of one chunk.
    fn plan_chunk(&mut self, mem: &mut Memory, cold: &mut ColdPlan) -> Result<()> {
        let from = cold.written;
        let mut planned = false;
        while cold.next_batch < cold.end && !(planned && cold.written - from >= cold.chunk) {
            let i = cold.next_batch;
            cold.next_batch += 1;
            if self.tasks.batch(i).device.is_some() {
                self.plan_batch(mem, cold, i)?;
                planned = true;
            }
        }
        let len = cold.written - from;
        cold.chunk = len.saturating_mul(2).max(MIN_CHUNK);
        if len == 0 {
            return Ok(());
        }
        let t = Instant::now();
        let dst = DevPtr(cold.region.0 .0 + from);
        // The row buffer is `usize`-sized host memory holding `written` bytes: both fit.
        let (at, n) = (from as usize, len as usize);
        let up = mem.dev.copy_h2d_async(dst, &cold.rows, at, n);
        self.report.counters.row_upload_ns += elapsed_ns(t);
        up.map_err(|e| Error::device(Phase::Execute, Some("<task rows>"), e))
    }

    /// Plans batch `i`: its levels and launches, its rows written into the row buffer.
    fn plan_batch(&mut self, mem: &Memory, cold: &mut ColdPlan, i: usize) -> Result<()> {
        let b = self.tasks.batch(i);
        let Some((db, consts)) = b.device else {
            return Ok(());
        };
        let (func, code) = mem.launcher.get(db.key).ok_or_else(|| {
            Error::State(format!(
                "execute: the device code of batch {i} is not loaded on this worker"
            ))
        })?;
        let n = b.count as usize;
        let spans = batch_spans(&self.tasks, &self.args, i);
        let level = match self.levels.take(i) {
            Some(recorded) => recorded,
            None => batch_levels(&spans, b.count),
        };
        let src = RowSource {
            spans: &spans,
            scalars: b.scalars,
            per_task: b.per_task as usize,
            code,
            consts,
        };
        let row = src.fields() * 8;
        let mut order: Vec<u32> = (0..b.count).collect();
        if let Some(l) = &level {
            order.sort_by_key(|&t| l[t as usize]);
        }
        let gz = db.dims.grid[2].max(1);
        let per_launch = tasks_per_launch(gz) as usize;
        let mut launches = std::mem::take(&mut self.plan.launches);
        let first = launches.len();
        let base = cold.region.0 .0 + cold.written;
        let mut at = 0usize;
        while at < n {
            let lvl = level.as_ref().map(|l| l[order[at] as usize]);
            let mut end = at + 1;
            while end < n
                && end - at < per_launch
                && level.as_ref().map(|l| l[order[end] as usize]) == lvl
            {
                end += 1;
            }
            let mut dims = db.dims;
            dims.grid[2] = gz * (end - at) as u32;
            launches.push(PlannedLaunch {
                func,
                dims,
                row_offset: base + (at * row) as u64,
            });
            at = end;
        }
        // `row_bytes` sized the buffer for every batch's rows, so these lie inside it.
        let bytes = n * row;
        let written = cold
            .rows
            .with_slice_mut(cold.written as usize, bytes, |dst| {
                write_rows(&src, &order, dst)
            })
            .map_err(|e| Error::host("<task rows>", e));
        let last = launches.len();
        self.plan.launches = launches;
        self.plan.batches.push((i, first..last));
        written??;
        cold.written += bytes as u64;
        Ok(())
    }

    /// How each run argument is bound: its allocation's base, size and generation.
    fn bindings(&self, mem: &Memory) -> Vec<Binding> {
        self.args
            .iter()
            .map(|a| {
                a.alloc
                    .map(|(p, bytes)| (p.0, bytes, mem.gen_of(p).unwrap_or(0)))
            })
            .collect()
    }

    /// The slots of batch `i` as planning reads them.
    fn batch_spans(&self, i: usize) -> Vec<SlotSpan<'_>> {
        batch_spans(&self.tasks, &self.args, i)
    }

    /// Batch `i`'s dependence levels and the launches it takes as device code: the task count
    /// of each level, in level order (one entry for independent tasks), and one launch per
    /// level, each split at the grid's z limit. The levels and launches planning makes, for
    /// any batch, so a cost model prices the batch as a device would run it.
    pub(crate) fn batch_shape(&self, i: usize) -> (Vec<u64>, u64) {
        let b = self.tasks.batch(i);
        let gz = b.device.map_or(1, |(db, _)| db.dims.grid[2]);
        let per = tasks_per_launch(gz);
        let sizes = match batch_levels(&self.batch_spans(i), b.count) {
            None => vec![u64::from(b.count)],
            Some(level) => {
                let top = level.iter().copied().max().unwrap_or(0) as usize;
                let mut sizes = vec![0u64; top + 1];
                for l in level {
                    sizes[l as usize] += 1;
                }
                sizes
            }
        };
        let launches = sizes.iter().map(|n| n.div_ceil(per)).sum();
        (sizes, launches)
    }

    /// Enqueues the launches of device batch `batch` (execution reached it), planning it first
    /// when it is not planned yet.
    pub(crate) fn launch_batch(&mut self, mem: &mut Memory, batch: usize) -> Result<()> {
        if !self.plan.planned {
            self.timed_plan(mem, Self::start_plan)?;
        }
        if self.plan.graph_launched {
            return Ok(()); // the graph launched every batch
        }
        if let Some(id) = self.plan.graph_of {
            if self.launch_graph(mem, id)? {
                return Ok(());
            }
        }
        if self.plan.next >= self.plan.batches.len() {
            self.timed_plan(mem, Self::plan_ahead)?;
        }
        let Some((b, range)) = self.plan.batches.get(self.plan.next).cloned() else {
            return Err(Error::State(format!(
                "execute: batch {batch} of device code was not planned"
            )));
        };
        debug_assert_eq!(b, batch);
        self.plan.next += 1;
        let info = self.tasks.batch(batch);
        let launches = &self.plan.launches[range];
        let params = PlannedLaunch::params(launches);
        let calls = PlannedLaunch::calls(launches, &params);
        let t = Instant::now();
        let r = mem.dev.launch_all(&calls, self.time_device);
        self.report.counters.launch_ns += elapsed_ns(t);
        let enqueued = match &r {
            Ok(()) => calls.len(),
            Err((i, _)) => (*i).min(calls.len()),
        };
        self.report.counters.device_launches += enqueued as u64;
        r.map_err(|(_, mut e)| {
            e.detail = format!(
                "{} (kernel {}, tasks {}..{})",
                e.detail,
                self.tasks.kernel_name(info.first_task),
                info.first_task,
                info.first_task + u64::from(info.count)
            );
            Error::device(Phase::Execute, None, e)
        })?;
        self.report.counters.device_tasks += u64::from(info.count);
        Ok(())
    }
}

impl RunState {
    /// Launches every batch of the run as the graph of kept plan `id`, capturing it first when
    /// the plan has none (the capture's time counts as planning). Returns false when the plan's
    /// launches cannot be captured (then it replays with plain launches, this round and the
    /// next; a warning says why): a capture that fails on a faulted device is the run's error.
    fn launch_graph(&mut self, mem: &mut Memory, id: u64) -> Result<bool> {
        let Some(kept) = mem.plans.by_id(id) else {
            return Ok(false);
        };
        let graph = match kept.graph {
            Some(g) => g,
            None => {
                let t = Instant::now();
                let params = PlannedLaunch::params(&kept.launches);
                let calls = PlannedLaunch::calls(&kept.launches, &params);
                let made = mem.dev.capture(&calls);
                self.report.counters.plan_ns += elapsed_ns(t);
                match made {
                    Ok(g) => {
                        kept.graph = Some(g);
                        self.report.counters.graph_captures += 1;
                        g
                    }
                    Err(e) if mem.dev.fault().is_some() => {
                        return Err(Error::device(Phase::Execute, None, e));
                    }
                    Err(e) => {
                        log::warn!(
                            "capturing a kept launch plan into a graph: {e}; it replays with \
                             plain launches"
                        );
                        kept.graph_failed = true;
                        self.plan.graph_of = None;
                        return Ok(false);
                    }
                }
            }
        };
        let launches = self.plan.launches.len() as u64;
        let t = Instant::now();
        let r = mem.dev.launch_graph(graph, self.time_device);
        self.report.counters.launch_ns += elapsed_ns(t);
        r.map_err(|mut e| {
            e.detail = format!("{} (the graph of {launches} launch(es))", e.detail);
            Error::device(Phase::Execute, None, e)
        })?;
        self.plan.graph_launched = true;
        self.plan.next = self.plan.batches.len();
        self.report.counters.device_launches += launches;
        self.report.counters.graph_launches += 1;
        self.report.counters.device_tasks += self
            .plan
            .batches
            .iter()
            .map(|&(b, _)| u64::from(self.tasks.batch(b).count))
            .sum::<u64>();
        Ok(true)
    }
}

/// The slots of batch `i` of `tasks` over `args` as planning reads them.
pub(crate) fn batch_spans<'a>(
    tasks: &'a TaskStore,
    args: &[RunArg],
    i: usize,
) -> Vec<SlotSpan<'a>> {
    let b = tasks.batch(i);
    (b.first_slot..b.first_slot + u32::from(b.slots))
        .map(|s| {
            let slot = tasks.slot(s);
            let a = &args[slot.arg as usize];
            SlotSpan {
                base: a.alloc.map(|(p, _)| p.0),
                within: a.span().unwrap_or_default(),
                item: slot.geometry.dtype().size(),
                extent: slot.geometry.extent(),
                elems: tasks.slot_elems(s),
                writes: slot.dir.writes(),
            }
        })
        .collect()
}

/// Nanoseconds since `t`.
fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A task-row region of at least `need` bytes: a spare one large enough, else a new one (at
/// most `PLANS_KEPT` regions are held, so a full set gives up a spare that is too small).
fn take_region(mem: &mut Memory, need: u64) -> Result<Region> {
    if let Some(r) = mem.plans.take_spare(need) {
        return Ok(r);
    }
    let mut grow = 0;
    if mem.plans.regions() >= PLANS_KEPT {
        // Every region is too small (the plans kept hold at most `PLANS_KEPT - 1`).
        if let Some(i) = (0..mem.plans.spare.len()).max_by_key(|&i| mem.plans.spare[i].1) {
            let (p, cap) = mem.plans.spare.swap_remove(i);
            grow = cap.saturating_mul(2);
            mem.release_or_orphan(p, &"a task-row region")
                .map_err(|e| Error::device(Phase::Execute, None, e))?;
        }
    }
    let cap = need.max(grow).max(4096);
    let buf = mem.alloc(cap, Owner::Staging, Phase::Execute, Some("<task rows>"))?;
    Ok((buf.ptr, cap))
}
