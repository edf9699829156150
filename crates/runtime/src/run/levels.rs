//! Dependence levels of a batch of device code: which of its tasks may run in one launch.
//!
//! A batch's tasks run as launches in submission order on one stream. Tasks that share no byte
//! that one of them writes are independent and run in one launch; otherwise the batch runs in
//! *levels*: a task's level is one past the last earlier task of the batch it depends on (a
//! read after a write of the same bytes, a write after a read or a write of them), and each
//! level is one launch, so the stream orders every dependence. When two views of a batch
//! share some bytes without being the same bytes, each task is its own level.
//!
//! Deciding is linear in the batch's tasks in the common cases: views that ascend without
//! overlapping are independent at a glance (`plainly_independent`), and views that are whole
//! multiples of one extent apart in each allocation some view writes index a table
//! (`aligned_levels`). Anything else goes through the general path, which sorts every
//! footprint (`levels`).

use std::collections::HashMap;

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
pub(crate) struct SlotSpan<'a> {
    /// The allocation's base address (`None`: no allocation), and the bytes of the run argument
    /// its views lie in, `(start, len)` (absolute).
    pub base: Option<u64>,
    pub within: (u64, u64),
    pub item: u64,
    pub extent: u64,
    /// Each task's start element (one entry for a slot every task shares).
    pub elems: &'a [u64],
    pub writes: bool,
}

impl SlotSpan<'_> {
    /// The first byte of task `t`'s view, or `None` for an empty view or no allocation.
    pub fn start(&self, t: u32) -> Option<u64> {
        let p = self.base.filter(|_| self.extent > 0)?;
        let e = self.elems[if self.elems.len() == 1 { 0 } else { t as usize }];
        Some(p + e * self.item)
    }
}

/// Each task's level in a batch of `count` tasks over `spans`, or `None` when they are
/// independent (see the module docs).
pub(crate) fn batch_levels(spans: &[SlotSpan<'_>], count: u32) -> Option<Vec<u32>> {
    if count < 2 || plainly_independent(spans, count) {
        return None;
    }
    match aligned_levels(spans, count) {
        Some(levels) => levels,
        None => levels(count as usize, &footprints(spans, count)),
    }
}

/// The most entries a written allocation's table may have per task of the batch (beyond a
/// floor of 65,536): a larger one is left to the general path rather than allocated.
const TABLE_PER_TASK: u64 = 8;

/// The levels of the common case, in one pass over the tasks with no sorting and no hashing, or
/// `None` (outer) when the batch is not that case and the general path decides. The case: the
/// run arguments the batch's views lie in are identical or disjoint (so views of different ones
/// never share a byte), and in each argument some view writes, every view has the same extent
/// `E` and starts a whole number of `E`s from the argument's first byte. Then two views of one
/// argument are either the same bytes or disjoint, and view `(start - first byte) / E` indexes a
/// table of the last writer's level and the highest reader's level.
fn aligned_levels(spans: &[SlotSpan<'_>], count: u32) -> Option<Option<Vec<u32>>> {
    // The arguments the views lie in: `(start, len, extent, written)`, each once.
    let mut allocs: Vec<(u64, u64, u64, bool)> = Vec::with_capacity(spans.len());
    for s in spans {
        if s.base.is_none() || s.extent == 0 {
            continue;
        }
        let (start, len) = s.within;
        match allocs.iter_mut().find(|a| (a.0, a.1) == (start, len)) {
            Some(a) if a.2 != s.extent => return None,
            Some(a) => a.3 |= s.writes,
            None => allocs.push((start, len, s.extent, s.writes)),
        }
    }
    allocs.sort_unstable_by_key(|a| a.0);
    if allocs
        .windows(2)
        .any(|w| w[0].0.saturating_add(w[0].1) > w[1].0)
    {
        return None;
    }
    // The slots over a written allocation, with the allocation's table: per view, the last
    // writer's level and the highest reader's level (`-1`: none yet).
    let cap = u64::from(count).saturating_mul(TABLE_PER_TASK).max(1 << 16);
    let mut tables: Vec<Vec<(i64, i64)>> = vec![Vec::new(); allocs.len()];
    // Per watched slot: its index, its argument's, and its argument's first byte relative to
    // the allocation (views' offsets count from the allocation).
    let mut watched: Vec<(usize, usize, u64)> = Vec::with_capacity(spans.len());
    for (si, s) in spans.iter().enumerate() {
        let Some(base) = s.base.filter(|_| s.extent > 0) else {
            continue;
        };
        let ai = allocs.iter().position(|a| (a.0, a.1) == s.within)?;
        if !allocs[ai].3 {
            continue; // only read in this batch: no view of it waits for another
        }
        let skip = s.within.0.checked_sub(base)?;
        let entries = s.within.1.div_ceil(s.extent);
        let aligned = |&e: &u64| {
            (e * s.item)
                .checked_sub(skip)
                .is_some_and(|r| r % s.extent == 0)
        };
        if entries > cap || !s.elems.iter().all(aligned) {
            return None;
        }
        if tables[ai].is_empty() {
            tables[ai] = vec![(-1, -1); entries as usize];
        }
        watched.push((si, ai, skip));
    }
    let mut out = vec![0u32; count as usize];
    let mut any = false;
    let mut slots: Vec<usize> = Vec::with_capacity(watched.len());
    for t in 0..count {
        let mut level = 0i64;
        slots.clear();
        for &(si, ai, skip) in &watched {
            let s = &spans[si];
            let e = s.elems[if s.elems.len() == 1 { 0 } else { t as usize }];
            // Checked aligned above.
            let at = ((e * s.item - skip) / s.extent) as usize;
            slots.push(at);
            let (lw, lr) = *tables[ai].get(at)?;
            level = level.max(lw + 1);
            if s.writes {
                level = level.max(lr + 1);
            }
        }
        for (&(si, ai, _), &at) in watched.iter().zip(&slots) {
            let entry = &mut tables[ai][at];
            if spans[si].writes {
                entry.0 = entry.0.max(level);
            } else {
                entry.1 = entry.1.max(level);
            }
        }
        any |= level > 0;
        out[t as usize] = level as u32;
    }
    Some(any.then_some(out))
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

    #[test]
    fn aligned_views_of_a_shared_accumulator_chain_in_one_pass() {
        // Four tasks: read rows 0..4 of one tensor, update rows [0, 1, 0, 2] of an accumulator.
        let (ins, acc) = ([0u64, 4, 8, 12], [0u64, 4, 0, 8]);
        let spans = [
            SlotSpan {
                base: Some(0x1000),
                within: (0x1000, 64),
                item: 4,
                extent: 16,
                elems: &ins,
                writes: false,
            },
            SlotSpan {
                base: Some(0x2000),
                within: (0x2000, 48),
                item: 4,
                extent: 16,
                elems: &acc,
                writes: true,
            },
        ];
        assert_eq!(aligned_levels(&spans, 4), Some(Some(vec![0, 0, 1, 0])));
        assert_eq!(batch_levels(&spans, 4), Some(vec![0, 0, 1, 0]));
        // A view half a row off is not the common case: the general path decides.
        let odd = [0u64, 2, 0, 8];
        let spans = [SlotSpan {
            base: Some(0x2000),
            within: (0x2000, 48),
            item: 4,
            extent: 16,
            elems: &odd,
            writes: true,
        }];
        assert_eq!(aligned_levels(&spans, 4), None);
        assert_eq!(batch_levels(&spans, 4), Some(vec![0, 1, 2, 3]));
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

        #[test]
        fn the_one_pass_levels_equal_the_general_ones(
            allocs in proptest::collection::vec((0u64..4, 1u64..5), 1..4),
            slots in proptest::collection::vec(
                (0usize..4, 1u64..3, proptest::bool::ANY, proptest::bool::ANY,
                 proptest::collection::vec(0u64..6, 6)),
                1..4,
            ),
            count in 2u32..7,
        ) {
            // Run arguments of `len` 8-byte cells at cell `at` of one allocation at 0 (so some
            // overlap partially); slots of views `cells` cells long, per task or shared, at
            // cell offsets within their argument.
            let owned: Vec<Vec<u64>> = slots
                .iter()
                .map(|(a, _, _, _, elems)| elems.iter().map(|e| allocs[a % allocs.len()].0 + e).collect())
                .collect();
            let mut spans = Vec::new();
            for ((a, cells, per_task, writes, _), elems) in slots.iter().zip(&owned) {
                let (at, len) = allocs[a % allocs.len()];
                let elems: &[u64] = if *per_task { &elems[..count as usize] } else { &elems[..1] };
                spans.push(SlotSpan {
                    base: Some(0),
                    within: (at * 8, len * 8 + 48),
                    item: 8,
                    extent: cells * 8,
                    elems,
                    writes: *writes,
                });
            }
            let general = levels(count as usize, &footprints(&spans, count));
            if let Some(fast) = aligned_levels(&spans, count) {
                proptest::prop_assert_eq!(fast, general.clone());
            }
            proptest::prop_assert_eq!(batch_levels(&spans, count), general);
        }
    }
}
