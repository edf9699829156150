//! The hazard index: which bytes the tasks submitted so far read and write.
//!
//! Tasks execute after orchestration, so an orchestrator read of bytes a submitted task writes
//! would see stale data, and an orchestrator write of bytes a submitted task reads or writes would
//! change what the task sees. Both are refused with a `HazardError`, exactly: only when an
//! element of the access shares a byte with an element of a task tensor.
//!
//! The index is built from the task store, lazily: submitting records nothing here, and the
//! first access after some submits indexes the tasks recorded since the previous access (an
//! orchestration that reads its control tensors first and then submits never pays for it).
//! Spans are kept per *region*: a staged argument's slice of the arena, a scratch tensor's carve
//! (each disjoint from every other), or a device allocation (shared by the device arguments over
//! it). An access consults only its own region, so reading a control tensor that no task touches
//! costs one empty check however many tasks were submitted. A batched submit's per-task views
//! that ascend in memory (the common case: rows, blocks) stay one *run*, searched in place in the
//! task store's start offsets, so indexing it costs nothing per task. Other task tensors become
//! spans, appended in task order (a dense span equal to the previous one is kept once) and sorted
//! once, when a query needs them. A query is a binary search per run and over the spans, plus
//! the few candidates around the accessed bytes.

use simpler_driver::DevPtr;

use crate::geometry::Geometry;
use crate::run::tasks::TaskStore;

/// The bytes one task tensor touches (32 bytes: a query touches few cache lines).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    /// Absolute device addresses `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// The task store slot, and the task within its batch: they give the exact layout (for
    /// non-dense spans) and the task's index (for messages).
    pub slot: u32,
    pub index: u32,
    pub writes: bool,
    /// Every byte of `[start, end)` belongs to an element (no exact check needed).
    pub dense: bool,
}

/// A per-task slot of a batched submit whose views ascend in memory: kept as one entry and
/// searched in the task store's start offsets, instead of one span per task.
#[derive(Debug, Clone, Copy)]
struct Run {
    slot: u32,
    /// Bytes `[lo, hi)` that the run's views lie in.
    lo: u64,
    hi: u64,
    writes: bool,
    dense: bool,
}

#[derive(Debug)]
struct Region {
    base: DevPtr,
    spans: Vec<Span>,
    sorted: bool,
    max_len: u64,
    runs: Vec<Run>,
    written: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct HazardIndex {
    regions: Vec<Region>,
    /// The regions of device allocations, by base address (a compact table: a bind of many
    /// device arguments looks each one up).
    devices: Vec<(u64, u32)>,
    /// Task store slots indexed so far.
    indexed: u32,
}

/// Where a run argument's tensors live, for indexing: its region and allocation base.
pub(crate) type Placement = Option<(u32, u64)>;

/// A conflicting task: its index and whether it writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Conflict {
    pub task: u64,
    pub writes: bool,
}

impl HazardIndex {
    /// A new region over the allocation at `base`; returns its id.
    pub fn add_region(&mut self, base: DevPtr) -> u32 {
        self.regions.push(Region {
            base,
            spans: Vec::new(),
            sorted: true,
            max_len: 0,
            runs: Vec::new(),
            written: false,
        });
        (self.regions.len() - 1) as u32
    }

    /// The region of the device allocation at `base`: the one made for an earlier device
    /// argument over it (device arguments over one allocation share it), or a new one.
    pub fn device_region(&mut self, base: DevPtr) -> u32 {
        if let Some(&(_, r)) = self.devices.iter().find(|(b, _)| *b == base.0) {
            return r;
        }
        let r = self.add_region(base);
        self.devices.push((base.0, r));
        r
    }

    /// Forgets what was indexed (the regions stay): the next access indexes the task store
    /// again from its first slot (after tasks were taken back).
    pub fn reindex(&mut self) {
        for r in &mut self.regions {
            r.spans.clear();
            r.runs.clear();
            r.sorted = true;
            r.max_len = 0;
            r.written = false;
        }
        self.indexed = 0;
    }

    /// Forgets everything, keeping the region table's memory for the next run.
    pub fn clear(&mut self) {
        self.regions.clear();
        self.devices.clear();
        self.indexed = 0;
    }

    /// Indexes the slots the task store recorded since the last call; `place(arg)` says where
    /// argument `arg`'s tensors live (`None`: no bytes).
    fn catch_up(&mut self, store: &TaskStore, place: &dyn Fn(u32) -> Placement) {
        let total = store.slot_count();
        for slot in self.indexed..total {
            let s = store.slot(slot);
            let Some((region, base)) = place(s.arg) else {
                continue;
            };
            let extent = s.geometry.extent();
            if extent == 0 {
                continue;
            }
            let es = s.geometry.dtype().size();
            let (writes, dense) = (s.dir.writes(), s.geometry.is_dense());
            let elems = store.slot_elems(slot);
            if elems.len() > 1 && elems.windows(2).all(|w| w[0] <= w[1]) {
                let r = &mut self.regions[region as usize];
                r.written |= writes;
                r.runs.push(Run {
                    slot,
                    lo: base + elems[0] * es,
                    hi: base + elems[elems.len() - 1] * es + extent,
                    writes,
                    dense,
                });
                continue;
            }
            self.regions[region as usize].spans.reserve(elems.len());
            for (index, &elem) in elems.iter().enumerate() {
                let start = base + elem * es;
                self.record(
                    region,
                    Span {
                        start,
                        end: start + extent,
                        slot,
                        index: index as u32,
                        writes,
                        dense,
                    },
                );
            }
        }
        self.indexed = total;
    }

    /// Records a task span in `region`.
    #[inline]
    fn record(&mut self, region: u32, span: Span) {
        let r = &mut self.regions[region as usize];
        r.written |= span.writes;
        if let Some(last) = r.spans.last() {
            // A tensor used by task after task (a scratch buffer, a shared input): one span, the
            // first task's, which does touch every byte of it.
            let same = last.start == span.start
                && last.end == span.end
                && last.writes == span.writes
                && last.dense
                && span.dense;
            if same {
                return;
            }
            if span.start < last.start {
                r.sorted = false;
            }
        }
        r.max_len = r.max_len.max(span.end - span.start);
        r.spans.push(span);
    }

    /// The first recorded task tensor in `region` that an access of `access` (relative to the
    /// region's allocation) conflicts with: one that writes, for a read (`write == false`); any,
    /// for a write.
    pub fn conflict(
        &mut self,
        region: u32,
        access: &Geometry,
        write: bool,
        store: &TaskStore,
        place: &dyn Fn(u32) -> Placement,
    ) -> Option<Conflict> {
        if self.indexed < store.slot_count() {
            self.catch_up(store, place);
        }
        let r = &mut self.regions[region as usize];
        if (r.spans.is_empty() && r.runs.is_empty())
            || (!write && !r.written)
            || access.extent() == 0
        {
            return None;
        }
        if !r.sorted {
            r.spans.sort_by_key(|s| s.start);
            r.sorted = true;
        }
        let base = r.base.0;
        let (lo, hi) = (
            base + access.start_byte(),
            base + access.start_byte() + access.extent(),
        );
        let access_dense = access.is_dense();
        // Does the task tensor at `[start, end)` (slot `slot`, task `index`) share a byte with
        // the access?
        let hit = |start: u64, end: u64, dense: bool, slot: u32, index: u32| {
            if dense && access_dense {
                true
            } else if dense {
                access.elements_overlap(start.saturating_sub(lo), end - lo)
            } else {
                let g = store.task_geometry(slot, index);
                access.elements_intersect(base, &g, base)
            }
        };
        let max_len = r.max_len;
        let first = r
            .spans
            .partition_point(|s| s.start.saturating_add(max_len) <= lo);
        for s in r.spans[first..].iter().take_while(|s| s.start < hi) {
            if s.end > lo && (write || s.writes) && hit(s.start, s.end, s.dense, s.slot, s.index) {
                return Some(Conflict {
                    task: store.task_of(s.slot, s.index),
                    writes: s.writes,
                });
            }
        }
        for run in r
            .runs
            .iter()
            .filter(|run| run.lo < hi && lo < run.hi && (write || run.writes))
        {
            let s = store.slot(run.slot);
            let (es, extent) = (s.geometry.dtype().size(), s.geometry.extent());
            let elems = store.slot_elems(run.slot);
            // Views ascend, so their ends do too: skip those that end before the access.
            let from = elems.partition_point(|&e| base + e * es + extent <= lo);
            for (i, &e) in elems.iter().enumerate().skip(from) {
                let start = base + e * es;
                if start >= hi {
                    break;
                }
                if hit(start, start + extent, run.dense, run.slot, i as u32) {
                    return Some(Conflict {
                        task: store.task_of(run.slot, i as u32),
                        writes: run.writes,
                    });
                }
            }
        }
        None
    }
}
