//! Device execution of a run's batches of device code, natively (no host call per task).
//!
//! When execution reaches its first batch of device code, the run plans every such batch at
//! once: it writes one task row per task (the ABI in `crate::device_code`), uploads all rows
//! with one copy into a task-row region of their own, and decides each batch's launches:
//!
//! * a batch whose tasks are independent (no task writes a byte another task of the batch reads
//!   or writes) is one launch over all its rows: grid `(gx, gy, gz * n)`, the task being
//!   `blockIdx.z / gz`;
//! * a batch with dependences runs in *levels*: a task's level is one past the last earlier task
//!   of the batch it depends on, the rows are ordered by level, and each level is one launch, so
//!   every dependence is ordered by the stream. When tasks' footprints overlap other than
//!   exactly (two views sharing some bytes), each task is its own level.
//!
//! A launch covers at most `65535 / gz` tasks (the grid's z limit); longer levels are split.
//! Launches are enqueued in submission order on the worker's stream as execution reaches each
//! batch; the end of execute waits for the stream once.
//!
//! The plan is kept (`plan_cache.rs`): a later round that records exactly the same tasks over
//! exactly the same allocations reuses it, with no levels, no rows and no upload.

use std::collections::HashMap;
use std::time::Instant;

use crate::error::{Error, Phase, Result};
use crate::memory::{Memory, Owner};
use crate::run::plan::{LaunchPlan, PlannedLaunch};
use crate::run::plan_cache::{Binding, Region, Replay, PLANS_KEPT};
use crate::run::state::RunState;

/// Largest grid along z.
const MAX_GRID_Z: u32 = 65_535;

/// The bytes one task tensor touches: `[start, end)`, its task, and whether the task writes them.
type Footprint = (u64, u64, u32, bool);

/// Each task's level (see the module docs), or `None` when the tasks are independent. `prints`
/// lists every task's footprints, task by task in order.
fn levels(n: usize, prints: &[Footprint]) -> Option<Vec<u32>> {
    if n < 2 || !prints.iter().any(|f| f.3) {
        return None;
    }
    let mut sorted = prints.to_vec();
    sorted.sort_unstable_by_key(|f| (f.0, f.1));
    if !conflicts(&sorted) {
        return None;
    }
    // Exact footprints only: distinct intervals must not overlap.
    let mut max_end = 0u64;
    let mut prev: Option<(u64, u64)> = None;
    for &(s, e, _, _) in &sorted {
        if prev == Some((s, e)) {
            continue;
        }
        if s < max_end {
            return Some((0..n as u32).collect());
        }
        max_end = max_end.max(e);
        prev = Some((s, e));
    }
    // Per footprint: the last writer's level and the highest reader level (-1: none).
    let mut seen: HashMap<(u64, u64), (i64, i64)> = HashMap::new();
    let mut out = vec![0u32; n];
    for task in prints.chunk_by(|a, b| a.2 == b.2) {
        let mut level = 0i64;
        for &(s, e, _, w) in task {
            if let Some(&(lw, lr)) = seen.get(&(s, e)) {
                level = level.max(lw + 1);
                if w {
                    level = level.max(lr + 1);
                }
            }
        }
        for &(s, e, _, w) in task {
            let entry = seen.entry((s, e)).or_insert((-1, -1));
            if w {
                entry.0 = entry.0.max(level);
            } else {
                entry.1 = entry.1.max(level);
            }
        }
        out[task[0].2 as usize] = level as u32;
    }
    Some(out)
}

/// Whether two footprints of different tasks share a byte, one of them writing. `all` is
/// sorted by start. Keeps the two furthest-reaching footprints of distinct tasks, for all and
/// for writes.
fn conflicts(all: &[(u64, u64, u32, bool)]) -> bool {
    #[derive(Default, Clone, Copy)]
    struct Top2 {
        a: Option<(u64, u32)>,
        b: Option<(u64, u32)>,
    }
    impl Top2 {
        fn overlaps_other(&self, start: u64, task: u32) -> bool {
            let hit = |x: Option<(u64, u32)>| x.is_some_and(|(e, t)| e > start && t != task);
            hit(self.a) || hit(self.b)
        }
        fn add(&mut self, end: u64, task: u32) {
            match self.a {
                Some((ea, ta)) if ta == task => self.a = Some((ea.max(end), task)),
                Some((ea, _)) if end <= ea => {
                    if self.b.is_none_or(|(eb, _)| end > eb) {
                        self.b = Some((end, task));
                    }
                }
                _ => {
                    self.b = self.a;
                    self.a = Some((end, task));
                }
            }
            // Invariant: `a` reaches furthest; `b` is the furthest of another task.
        }
    }
    let (mut any, mut writes) = (Top2::default(), Top2::default());
    for &(s, e, t, w) in all {
        if writes.overlaps_other(s, t) || (w && any.overlaps_other(s, t)) {
            return true;
        }
        any.add(e, t);
        if w {
            writes.add(e, t);
        }
    }
    false
}

/// One slot of a batch as planning reads it: every task's view has the same layout, so the same
/// extent; only its start element differs.
#[derive(Debug, Clone, Copy)]
struct SlotSpan<'a> {
    /// The allocation's base address (`None`: no allocation).
    base: Option<u64>,
    item: u64,
    extent: u64,
    /// Each task's start element (one entry for a slot every task shares).
    elems: &'a [u64],
    writes: bool,
}

impl SlotSpan<'_> {
    /// The first byte of task `t`'s view, or `None` for an empty view or no allocation.
    fn start(&self, t: u32) -> Option<u64> {
        let p = self.base.filter(|_| self.extent > 0)?;
        let e = self.elems[if self.elems.len() == 1 { 0 } else { t as usize }];
        Some(p + e * self.item)
    }
}

/// What a batch's rows are made of.
struct RowSource<'a> {
    spans: &'a [SlotSpan<'a>],
    scalars: &'a [crate::dtype::Value],
    per_task: usize,
    code: &'a crate::device_code::DeviceCode,
    consts: &'a [i64],
}

/// Appends task `t`'s row: each tensor's first-element address (0 for an empty view), its
/// scalars in their declared kinds, then the launch constants.
fn write_row(src: &RowSource<'_>, t: u32, fields: &mut Vec<u64>, rows: &mut Vec<u8>) -> Result<()> {
    fields.clear();
    fields.extend(src.spans.iter().map(|s| s.start(t).unwrap_or(0)));
    let per = src.per_task;
    let t = t as usize;
    src.code
        .encode_scalars(&src.scalars[t * per..(t + 1) * per], fields)?;
    fields.extend(src.consts.iter().map(|&c| c as u64));
    for f in fields.iter() {
        rows.extend_from_slice(&f.to_le_bytes());
    }
    Ok(())
}

/// Tasks one launch covers at most, for a launch geometry of `gz` blocks along z per task.
fn tasks_per_launch(gz: u32) -> u64 {
    u64::from((MAX_GRID_Z / gz.max(1)).max(1))
}

/// Each task's level in a batch of `count` tasks over `spans`, or `None` when they are
/// independent (see the module docs).
fn batch_levels(spans: &[SlotSpan<'_>], count: u32) -> Option<Vec<u32>> {
    if count < 2 || plainly_independent(spans, count) {
        None
    } else {
        levels(count as usize, &footprints(spans, count))
    }
}

/// Every task's footprints, task by task.
fn footprints(spans: &[SlotSpan<'_>], count: u32) -> Vec<Footprint> {
    let mut out = Vec::with_capacity(count as usize * spans.len());
    for t in 0..count {
        for s in spans {
            if let Some(start) = s.start(t) {
                out.push((start, start + s.extent, t, s.writes));
            }
        }
    }
    out
}

/// The common case, checked without sorting anything: every written slot's views ascend without
/// overlapping from task to task, and no other slot of the batch reaches into the bytes a
/// written slot spans.
fn plainly_independent(spans: &[SlotSpan<'_>], count: u32) -> bool {
    // Per slot: whether it writes, and the bytes all its views span.
    let mut ranges: Vec<(bool, u64, u64)> = Vec::with_capacity(spans.len());
    for s in spans {
        let Some(p) = s.base.filter(|_| s.extent > 0) else {
            continue;
        };
        if s.writes && s.elems.len() == 1 && count > 1 {
            return false; // one view every task writes
        }
        let (mut prev_end, mut lo, mut hi) = (0u64, u64::MAX, 0u64);
        for &e in s.elems {
            let start = p + e * s.item;
            if s.writes && start < prev_end {
                return false;
            }
            prev_end = start + s.extent;
            lo = lo.min(start);
            hi = hi.max(prev_end);
        }
        ranges.push((s.writes, lo, hi));
    }
    ranges.iter().enumerate().all(|(i, &(w, lo, hi))| {
        !w || ranges
            .iter()
            .enumerate()
            .all(|(j, &(_, l2, h2))| i == j || h2 <= lo || hi <= l2)
    })
}

impl RunState {
    /// Plans and uploads every batch of device code of the run (see the module docs), or reuses
    /// the kept plan of an earlier round that recorded exactly these tasks over exactly these
    /// allocations (`plan_cache.rs`).
    pub(crate) fn plan_launches(&mut self, mem: &mut Memory) -> Result<()> {
        let t0 = Instant::now();
        let uploading = self.report.counters.row_upload_ns;
        let r = self.plan_and_upload(mem);
        let upload = self.report.counters.row_upload_ns - uploading;
        self.report.counters.plan_ns += elapsed_ns(t0).saturating_sub(upload);
        r
    }

    /// [`RunState::plan_launches`]; the upload's time goes to `row_upload_ns`.
    fn plan_and_upload(&mut self, mem: &mut Memory) -> Result<()> {
        let mut plan = std::mem::take(&mut self.plan);
        plan.clear();
        let bindings = self.bindings(mem);
        let replay = mem.plans.replay;
        if replay != Replay::Off {
            if let Some(kept) = mem.plans.find(&self.tasks, &bindings) {
                plan.launches.clone_from(&kept.launches);
                plan.batches.clone_from(&kept.batches);
                let graphs = replay == Replay::Graphs && mem.dev.captures_graphs();
                if graphs && !kept.graph_failed && self.tasks.all_device() {
                    plan.graph_of = Some(kept.id);
                }
                plan.planned = true;
                self.report.counters.plan_reuses += 1;
                self.plan = plan;
                return Ok(());
            }
        }
        if replay != Replay::Off {
            mem.plans.make_room(&self.tasks, &bindings);
            mem.bury_graphs();
        }
        let mut rows = std::mem::take(&mut mem.launcher.rows);
        rows.clear();
        let r = self.write_rows(mem, &mut plan, &mut rows);
        let r = r.and_then(|()| {
            let t = Instant::now();
            let up = upload(mem, &rows);
            self.report.counters.row_upload_ns += elapsed_ns(t);
            up
        });
        let r = r.map(|region| {
            for l in &mut plan.launches {
                l.row_offset += region.0 .0;
            }
            self.report.counters.task_row_bytes += rows.len() as u64;
            if replay == Replay::Off {
                // Not kept: the kept plans stay as they are. The region is free again once this
                // run's launches ran, which the end of execute waits for before any later plan.
                mem.plans.spare.push(region);
            } else {
                mem.plans
                    .insert(&self.tasks, bindings, &plan.launches, &plan.batches, region);
            }
        });
        plan.planned = true;
        mem.launcher.rows = rows;
        self.plan = plan;
        r
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

    fn write_rows(&self, mem: &Memory, plan: &mut LaunchPlan, rows: &mut Vec<u8>) -> Result<()> {
        let mut fields: Vec<u64> = Vec::new();
        for i in 0..self.tasks.batch_count() {
            let b = self.tasks.batch(i);
            let Some((db, consts)) = b.device else {
                continue;
            };
            let (func, code) = mem.launcher.get(db.key).ok_or_else(|| {
                Error::State(format!(
                    "execute: the device code of batch {i} is not loaded on this worker"
                ))
            })?;
            let n = b.count as usize;
            let spans = self.batch_spans(i);
            let level = batch_levels(&spans, b.count);
            rows.reserve(n * 8 * (spans.len() + b.per_task as usize + consts.len()));
            let src = RowSource {
                spans: &spans,
                scalars: b.scalars,
                per_task: b.per_task as usize,
                code,
                consts,
            };
            let mut order: Vec<u32> = (0..b.count).collect();
            if let Some(l) = &level {
                order.sort_by_key(|&t| l[t as usize]);
            }
            let gz = db.dims.grid[2].max(1);
            let per_launch = tasks_per_launch(gz) as usize;
            let first = plan.launches.len();
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
                plan.launches.push(PlannedLaunch {
                    func,
                    dims,
                    row_offset: rows.len() as u64,
                });
                for &t in &order[at..end] {
                    write_row(&src, t, &mut fields, rows)?;
                }
                at = end;
            }
            plan.batches.push((i, first..plan.launches.len()));
        }
        Ok(())
    }

    /// The slots of batch `i` as planning reads them.
    fn batch_spans(&self, i: usize) -> Vec<SlotSpan<'_>> {
        let b = self.tasks.batch(i);
        (b.first_slot..b.first_slot + u32::from(b.slots))
            .map(|s| self.slot_span(s))
            .collect()
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

    /// Slot `s`'s bytes as planning reads them.
    fn slot_span(&self, s: u32) -> SlotSpan<'_> {
        let slot = self.tasks.slot(s);
        SlotSpan {
            base: self.args[slot.arg as usize].alloc.map(|(p, _)| p.0),
            item: slot.geometry.dtype().size(),
            extent: slot.geometry.extent(),
            elems: self.tasks.slot_elems(s),
            writes: slot.dir.writes(),
        }
    }

    /// Enqueues the launches of device batch `batch` (execution reached it).
    pub(crate) fn launch_batch(&mut self, mem: &mut Memory, batch: usize) -> Result<()> {
        if !self.plan.planned {
            self.plan_launches(mem)?;
        }
        if self.plan.graph_launched {
            return Ok(()); // the graph launched every batch
        }
        if let Some(id) = self.plan.graph_of {
            if self.launch_graph(mem, id)? {
                return Ok(());
            }
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

/// Nanoseconds since `t`.
fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Uploads `rows` into a task-row region of their own (a spare one large enough, else a new
/// one; at most `PLANS_KEPT` regions are held, so a full set gives up a spare that is too
/// small); returns it. A region whose upload failed stays a spare.
fn upload(mem: &mut Memory, rows: &[u8]) -> Result<Region> {
    let need = rows.len() as u64;
    let region = match mem.plans.take_spare(need) {
        Some(r) => r,
        None => {
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
            (buf.ptr, cap)
        }
    };
    if !rows.is_empty() {
        if let Err(e) = mem.dev.copy_h2d(region.0, rows) {
            mem.plans.spare.push(region);
            return Err(Error::device(Phase::Execute, Some("<task rows>"), e));
        }
    }
    Ok(region)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flat footprints from per-task lists of `(start, end, writes)`.
    fn flat(tasks: &[&[(u64, u64, bool)]]) -> Vec<Footprint> {
        tasks
            .iter()
            .enumerate()
            .flat_map(|(t, fs)| fs.iter().map(move |&(s, e, w)| (s, e, t as u32, w)))
            .collect()
    }

    #[test]
    fn disjoint_writes_are_independent() {
        let prints = flat(&[
            &[(0, 8, false), (100, 108, true)],
            &[(0, 8, false), (108, 116, true)],
            &[(0, 8, false), (116, 124, true)],
        ]);
        assert_eq!(levels(3, &prints), None);
    }

    #[test]
    fn a_shared_accumulator_makes_a_chain_and_other_tasks_run_beside_it() {
        // Tasks 0, 1, 3 update [0, 8); task 2 updates [8, 16).
        let prints = flat(&[
            &[(0, 8, true)],
            &[(0, 8, true)],
            &[(8, 16, true)],
            &[(0, 8, true)],
        ]);
        assert_eq!(levels(4, &prints), Some(vec![0, 1, 0, 2]));
    }

    #[test]
    fn a_reader_after_a_writer_waits_and_readers_share_a_level() {
        let prints = flat(&[
            &[(0, 8, true)],
            &[(0, 8, false), (16, 24, true)],
            &[(0, 8, false), (24, 32, true)],
            &[(0, 8, true)],
        ]);
        assert_eq!(levels(4, &prints), Some(vec![0, 1, 1, 2]));
    }

    #[test]
    fn partial_overlaps_run_one_task_per_level() {
        let prints = flat(&[&[(0, 8, true)], &[(4, 12, true)], &[(100, 108, true)]]);
        assert_eq!(levels(3, &prints), Some(vec![0, 1, 2]));
    }

    #[test]
    fn a_task_without_footprints_keeps_level_zero() {
        let prints = flat(&[&[(0, 8, true)], &[], &[(0, 8, true)]]);
        assert_eq!(levels(3, &prints), Some(vec![0, 0, 1]));
    }

    #[test]
    fn conflicts_finds_an_overlap_hidden_behind_a_longer_span_of_the_same_task() {
        // Task 0 spans [0, 100) read-only; task 1 writes [10, 20); task 0 also reads [50, 60).
        let mut all = vec![(0, 100, 0, false), (10, 20, 1, true), (50, 60, 0, false)];
        all.sort_unstable_by_key(|f| (f.0, f.1));
        assert!(conflicts(&all));
        let mut none = vec![(0, 10, 0, true), (10, 20, 1, true), (20, 30, 2, false)];
        none.sort_unstable_by_key(|f| (f.0, f.1));
        assert!(!conflicts(&none));
    }

    /// Whether some byte is shared by two tasks, one of them writing: by brute force.
    fn brute_conflict(prints: &[Footprint]) -> bool {
        prints.iter().any(|a| {
            prints
                .iter()
                .any(|b| a.2 != b.2 && (a.3 || b.3) && a.0 < b.1 && b.0 < a.1)
        })
    }

    /// The first two tasks of one level that race: they share a byte and one of them writes it.
    /// A level is one launch, whose tasks a device runs concurrently and in any order, so no
    /// order of them (the snapshot below included) stands for what it does: any race is wrong.
    fn race_in_a_level(prints: &[Footprint], lv: &[u32]) -> Option<(u32, u32)> {
        prints.iter().find_map(|a| {
            prints
                .iter()
                .find(|b| {
                    a.2 < b.2
                        && lv[a.2 as usize] == lv[b.2 as usize]
                        && (a.3 || b.3)
                        && a.0 < b.1
                        && b.0 < a.1
                })
                .map(|b| (a.2, b.2))
        })
    }

    #[test]
    fn a_writer_after_readers_of_its_bytes_waits_for_them() {
        // Task 1 reads what task 0 writes; task 2 writes what task 1 read: three levels, and
        // task 2 never shares a launch with task 1.
        let prints = flat(&[&[(0, 8, true)], &[(0, 8, false)], &[(0, 8, true)]]);
        let lv = levels(3, &prints).unwrap();
        assert_eq!(lv, vec![0, 1, 2]);
        assert_eq!(race_in_a_level(&prints, &lv), None);
        // Readers of bytes nobody wrote before them share level 0; the writer after them waits.
        let prints = flat(&[&[(0, 8, false)], &[(0, 8, false)], &[(0, 8, true)]]);
        assert_eq!(levels(3, &prints), Some(vec![0, 0, 1]));
    }

    /// Runs the levels in order, each level's tasks all at once against a snapshot, and checks
    /// the outcome equals running the tasks one by one (each task adds its index + 1 to every
    /// byte it writes, after reading the bytes it reads).
    fn same_as_sequential(n: usize, prints: &[Footprint], lv: &[u32]) -> bool {
        let mem_size = 64usize;
        let run = |order: &[Vec<u32>]| {
            let mut mem = vec![0u64; mem_size];
            for group in order {
                let snapshot = mem.clone();
                for &t in group {
                    let fs: Vec<_> = prints.iter().filter(|f| f.2 == t).collect();
                    let read: u64 = fs
                        .iter()
                        .flat_map(|f| f.0..f.1)
                        .map(|i| snapshot[i as usize])
                        .sum();
                    for f in fs.iter().filter(|f| f.3) {
                        for i in f.0..f.1 {
                            mem[i as usize] = mem[i as usize]
                                .wrapping_mul(31)
                                .wrapping_add(read + u64::from(t) + 1);
                        }
                    }
                }
            }
            mem
        };
        let sequential: Vec<Vec<u32>> = (0..n as u32).map(|t| vec![t]).collect();
        let top = lv.iter().copied().max().unwrap_or(0);
        let leveled: Vec<Vec<u32>> = (0..=top)
            .map(|l| (0..n as u32).filter(|&t| lv[t as usize] == l).collect())
            .collect();
        run(&sequential) == run(&leveled)
    }

    proptest::proptest! {
        #[test]
        fn levels_order_every_dependence(
            tasks in proptest::collection::vec(
                proptest::collection::vec((0u64..8, 1u64..4, proptest::bool::ANY), 0..3),
                1..12,
            ),
        ) {
            // Footprints on a grid of 8-byte cells, so overlaps are either exact or partial.
            let prints: Vec<Footprint> = tasks
                .iter()
                .enumerate()
                .flat_map(|(t, fs)| {
                    fs.iter().map(move |&(cell, len, w)| (cell * 4, cell * 4 + len * 4, t as u32, w))
                })
                .collect();
            let mut sorted = prints.clone();
            sorted.sort_unstable_by_key(|f| (f.0, f.1));
            proptest::prop_assert_eq!(conflicts(&sorted), brute_conflict(&prints));
            let n = tasks.len();
            match levels(n, &prints) {
                None => proptest::prop_assert!(!brute_conflict(&prints)),
                Some(lv) => {
                    // No two tasks of a level race (a launch runs them concurrently), and the
                    // levels run in order give the sequential result.
                    proptest::prop_assert_eq!(race_in_a_level(&prints, &lv), None, "levels {:?}", lv);
                    proptest::prop_assert!(same_as_sequential(n, &prints, &lv));
                }
            }
        }
    }
}
