//! What an orchestration records: tasks (`submit`, one at a time, and `submit_many`, many tasks
//! of one kernel in one call) and run-scoped scratch tensors.
//!
//! Single and batched submits share every rule: the kernel's signature fixes the tensor count,
//! the directions and (where it names one) each tensor's dtype; every task tensor must lie inside
//! the run argument it views. Everything is checked before anything is recorded, so a refused
//! submit leaves the run as it was.

use std::borrow::Borrow;
use std::fmt::Display;

use crate::dtype::{DType, Value};
use simpler_driver::DevPtr;

use crate::error::{Error, Phase, Result};
use crate::geometry::{span_contains, Geometry};
use crate::memory::Memory;
use crate::run::launch::batch_spans;
use crate::run::levels::batch_levels;
use crate::run::state::{ArgKind, RunArg, RunState, Stage};
use crate::run::tasks::Slot;
use crate::scratch::ScratchPool;
use crate::spec::{Direction, KernelRef};

/// One tensor position of a batched submit.
#[derive(Debug, Clone, Copy)]
pub enum BatchSlot<'a> {
    /// The same tensor (a view of argument `arg`) for every task.
    One { arg: u32, geometry: Geometry },
    /// One view per task: the layout `geometry` starting at element `starts[i]` of the argument's
    /// allocation for task `i`.
    Views {
        arg: u32,
        geometry: Geometry,
        starts: &'a [u64],
    },
}

/// One scalar position of a batched submit.
#[derive(Debug, Clone, Copy)]
pub enum BatchScalar<'a> {
    /// The same value for every task.
    One(Value),
    /// One value per task.
    PerTask(&'a [Value]),
}

/// Tasks a batched submit records at once: a larger batch is recorded in parts of this many,
/// so a host can answer an interrupt between them (`Orch::submit_many_checked`), and a host
/// converting per-task values checks for one as often.
pub const BATCH_PART: usize = 1 << 20;

impl<'a> BatchSlot<'a> {
    /// This position for tasks `lo..hi` of its batch.
    pub(crate) fn part(self, lo: usize, hi: usize) -> BatchSlot<'a> {
        match self {
            BatchSlot::Views {
                arg,
                geometry,
                starts,
            } => BatchSlot::Views {
                arg,
                geometry,
                starts: &starts[lo..hi],
            },
            one => one,
        }
    }
}

impl<'a> BatchScalar<'a> {
    /// This position for tasks `lo..hi` of its batch.
    pub(crate) fn part(self, lo: usize, hi: usize) -> BatchScalar<'a> {
        match self {
            BatchScalar::PerTask(v) => BatchScalar::PerTask(&v[lo..hi]),
            one => one,
        }
    }
}

/// The task count of a batched submit: `count`, or the length of its per-task positions, which
/// must all agree (and fit one batch).
pub(crate) fn batch_count(
    who: &dyn Display,
    slots: &[BatchSlot<'_>],
    scalars: &[BatchScalar<'_>],
    count: Option<u64>,
) -> Result<u32> {
    let mut n = count;
    let lens = slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            BatchSlot::Views { starts, .. } => Some(("tensor", i, starts.len())),
            BatchSlot::One { .. } => None,
        })
        .chain(scalars.iter().enumerate().filter_map(|(i, s)| match s {
            BatchScalar::PerTask(v) => Some(("scalar", i, v.len())),
            BatchScalar::One(_) => None,
        }));
    for (what, i, len) in lens {
        match n {
            None => n = Some(len as u64),
            Some(m) if m != len as u64 => {
                return Err(Error::Value(format!(
                    "{who}: {what} {i} has {len} rows, expected {m} (one per task)"
                )))
            }
            Some(_) => {}
        }
    }
    let n = n.ok_or_else(|| {
        Error::Value(format!(
            "{who}: no per-task tensor or scalar, so the task count must be given (count=...)"
        ))
    })?;
    u32::try_from(n)
        .map_err(|_| Error::Value(format!("{who}: {n} tasks in one call exceeds 2**32 - 1")))
}

fn run_past(who: &dyn Display, a: &RunArg, addr: u64, len: u64) -> Error {
    Error::NoHostView {
        addr,
        bytes: len,
        detail: format!("{who}: task tensor runs past argument {}", a.name),
    }
}

/// Checks that `geometry` (relative to `a`'s allocation) lies inside `a`.
fn check_contained(who: &dyn Display, a: &RunArg, geometry: &Geometry) -> Result<()> {
    if geometry.extent() == 0 {
        return Ok(());
    }
    let (Some((base, _)), Some((s, l))) = (a.alloc, a.span()) else {
        return Err(run_past(who, a, geometry.start_byte(), geometry.extent()));
    };
    let start = base
        .0
        .checked_add(geometry.start_byte())
        .ok_or_else(|| run_past(who, a, geometry.start_byte(), geometry.extent()))?;
    if !span_contains(s, l, start, geometry.extent()) {
        return Err(run_past(who, a, start, geometry.extent()));
    }
    Ok(())
}

/// Refuses a task whose writable tensors share a byte. On sim both writes would land in device
/// memory; on a driver where kernels run over host copies one copy would overwrite the other. One
/// rule for every platform: two outputs of one task never overlap.
/// The pairs `(i, j)`, `i < j`, of a task's `n` slots of which at least one is written, each
/// once: every written slot with every other slot (a pair of written slots from its first), so
/// a task of many read slots and few written ones costs what its written slots do.
fn written_pairs(
    n: usize,
    writes: impl Fn(usize) -> bool + Copy,
) -> impl Iterator<Item = (usize, usize)> {
    (0..n).filter(move |&w| writes(w)).flat_map(move |w| {
        (0..n)
            .filter(move |&o| o != w && !(o < w && writes(o)))
            .map(move |o| (w.min(o), w.max(o)))
    })
}

/// Refuses two views of one task that share bytes when one of them is written (`a.3`, `b.3`).
fn check_outputs_disjoint(
    who: &dyn Display,
    task: u64,
    a: (usize, &RunArg, &Geometry, bool),
    b: (usize, &RunArg, &Geometry, bool),
) -> Result<()> {
    let (Some((pa, _)), Some((pb, _))) = (a.1.alloc, b.1.alloc) else {
        return Ok(());
    };
    if pa != pb || !a.2.elements_intersect(pa.0, b.2, pb.0) {
        return Ok(());
    }
    let view = |(i, arg, g, _): (usize, &RunArg, &Geometry, bool)| {
        format!(
            "tensor {i} ({} shape {:?} at element {})",
            arg.name,
            g.shape(),
            g.offset()
        )
    };
    let (what, why) = if a.3 && b.3 {
        (
            "writes two views that share bytes",
            "the outputs of one task must not overlap (which write would win depends on the \
             platform)",
        )
    } else {
        (
            "reads a view that shares bytes with a view it writes",
            "a task's input must not overlap its output (whether it reads the old or the new \
             bytes depends on the platform; pass the tensor once, as INOUT)",
        )
    };
    Err(Error::Hazard(format!(
        "{who}: task {task} {what}: {} and {}; {why}",
        view(a),
        view(b)
    )))
}

impl RunState {
    fn check_submit(&self, kernel: &KernelRef<'_>, slots: usize) -> Result<()> {
        self.expect(
            Stage::Orchestrate,
            "submit is only valid during orchestration",
        )?;
        kernel
            .sig
            .check_count(&format_args!("submit {}", kernel.name), slots)
    }

    /// Checks slot `i`'s tensor (a view of `arg` of `dtype`) against the kernel's signature.
    fn check_slot(
        &self,
        kernel: &KernelRef<'_>,
        i: usize,
        arg: u32,
        dtype: DType,
    ) -> Result<&RunArg> {
        let a = self.arg(arg)?;
        kernel
            .sig
            .check_dtype(&format_args!("submit {}", kernel.name), i, &a.name, dtype)?;
        Ok(a)
    }

    /// `submit`: one task of `kernel` over views of this run's arguments (`(arg, view)` in the
    /// kernel's signature order) with `scalars`. Returns the task's index.
    pub(crate) fn submit<G: Borrow<Geometry>>(
        &mut self,
        kernel: &KernelRef<'_>,
        tensors: &[(u32, G)],
        scalars: &[Value],
    ) -> Result<u64> {
        self.check_submit(kernel, tensors.len())?;
        let who = format_args!("submit {}", kernel.name);
        let shape = self.tasks.shape(&who, 1, tensors.len(), scalars.len())?;
        if let Some(d) = &kernel.device {
            let cols: Vec<BatchScalar<'_>> = scalars.iter().map(|v| BatchScalar::One(*v)).collect();
            d.check(&who, &cols, tensors.iter().map(|(_, g)| g.borrow()))?;
        }
        for (i, (arg, g)) in tensors.iter().enumerate() {
            let g = g.borrow();
            let a = self.check_slot(kernel, i, *arg, g.dtype())?;
            check_contained(&who, a, g)?;
        }
        if tensors.len() > 1 {
            let writes = |i: usize| kernel.sig.params()[i].dir.writes();
            for (i, j) in written_pairs(tensors.len(), writes) {
                let (ai, aj) = (
                    &self.args[tensors[i].0 as usize],
                    &self.args[tensors[j].0 as usize],
                );
                check_outputs_disjoint(
                    &who,
                    self.tasks.len(),
                    (i, ai, tensors[i].1.borrow(), writes(i)),
                    (j, aj, tensors[j].1.borrow(), writes(j)),
                )?;
            }
        }
        let task = self.tasks.len();
        for (i, (arg, g)) in tensors.iter().enumerate() {
            self.tasks.push_slot(Slot {
                arg: *arg,
                dir: kernel.sig.params()[i].dir,
                geometry: *g.borrow(),
                starts: None,
                first_task: task,
                count: 1,
            });
        }
        self.tasks
            .push_batch(kernel, shape, scalars.iter().copied());
        self.report.counters.tasks += 1;
        self.report.counters.submits += 1;
        Ok(task)
    }

    /// `submit_many`: `count` tasks of `kernel` (when `None`, the length of the per-task slots
    /// and scalars, which must agree). Returns the first task's index; the tasks run in order,
    /// after every task submitted before them.
    /// `new_call == false`: a further part of a call recorded in parts, which does not count as
    /// another submit.
    pub(crate) fn submit_batch(
        &mut self,
        kernel: &KernelRef<'_>,
        slots: &[BatchSlot<'_>],
        scalars: &[BatchScalar<'_>],
        count: Option<u64>,
        new_call: bool,
    ) -> Result<u64> {
        self.check_submit(kernel, slots.len())?;
        let who = format_args!("submit_many {}", kernel.name);
        let count = batch_count(&who, slots, scalars, count)?;
        let shape = self.tasks.shape(&who, count, slots.len(), scalars.len())?;
        if let Some(d) = &kernel.device {
            let layouts = slots.iter().map(|s| match s {
                BatchSlot::One { geometry, .. } | BatchSlot::Views { geometry, .. } => geometry,
            });
            d.check(&who, scalars, layouts)?;
        }
        let n = u64::from(count);
        for (i, s) in slots.iter().enumerate() {
            match s {
                BatchSlot::One { arg, geometry } => {
                    let a = self.check_slot(kernel, i, *arg, geometry.dtype())?;
                    check_contained(&who, a, geometry)?;
                }
                BatchSlot::Views {
                    arg,
                    geometry,
                    starts,
                } => {
                    let a = self.check_slot(kernel, i, *arg, geometry.dtype())?;
                    check_views(&who, a, geometry, starts)?;
                }
            }
        }
        // A task's written views overlap none of its other views: checked per task for every
        // pair of slots of one allocation of which one is written.
        let first = self.tasks.len();
        let writes = |i: usize| kernel.sig.params()[i].dir.writes();
        let at = |s: &BatchSlot<'_>, t: usize| match s {
            BatchSlot::One { geometry, .. } => *geometry,
            BatchSlot::Views {
                geometry, starts, ..
            } => geometry.at_offset(starts[t]),
        };
        let arg_of = |s: &BatchSlot<'_>| match s {
            BatchSlot::One { arg, .. } | BatchSlot::Views { arg, .. } => *arg,
        };
        for (i, j) in written_pairs(slots.len(), writes) {
            let (ai, aj) = (
                &self.args[arg_of(&slots[i]) as usize],
                &self.args[arg_of(&slots[j]) as usize],
            );
            if ai.alloc.map(|a| a.0) != aj.alloc.map(|a| a.0) {
                continue;
            }
            for t in 0..count as usize {
                check_outputs_disjoint(
                    &who,
                    first + t as u64,
                    (i, ai, &at(&slots[i], t), writes(i)),
                    (j, aj, &at(&slots[j], t), writes(j)),
                )?;
            }
        }
        if count == 0 {
            // Checked like any batch; nothing to record (no slot may name a task that is not
            // there).
            self.report.counters.submits += u64::from(new_call);
            return Ok(first);
        }
        // Record.
        for (i, s) in slots.iter().enumerate() {
            let dir = kernel.sig.params()[i].dir;
            let (arg, geometry, starts) = match s {
                BatchSlot::One { arg, geometry } => (*arg, *geometry, None),
                BatchSlot::Views {
                    arg,
                    geometry,
                    starts,
                } => (*arg, *geometry, Some(self.tasks.push_starts(starts))),
            };
            self.tasks.push_slot(Slot {
                arg,
                dir,
                geometry,
                starts,
                first_task: first,
                count,
            });
        }
        // Row-major, straight into the task store.
        let rows = (0..count as usize).flat_map(|t| {
            scalars.iter().map(move |s| match s {
                BatchScalar::One(v) => *v,
                BatchScalar::PerTask(v) => v[t],
            })
        });
        self.tasks.push_batch(kernel, shape, rows);
        // Device code's dependence levels, computed now while the views are at hand, unless the
        // round still records exactly the tasks of a kept plan (which it will reuse).
        if kernel.device.is_some() && count > 1 && !self.tasks.still_following() {
            let i = self.tasks.batch_count() - 1;
            let levels = batch_levels(&batch_spans(&self.tasks, &self.args, i), count);
            self.levels.set(i, levels);
        }
        self.report.counters.tasks += n;
        self.report.counters.submits += u64::from(new_call);
        Ok(first)
    }

    /// Takes back the tasks submitted from task `first` on, as one call (a batch recorded in
    /// parts whose later part was refused: the whole call is undone, as one batch would be).
    pub(crate) fn discard_tasks(&mut self, first: u64) -> Result<()> {
        self.expect(
            Stage::Orchestrate,
            "tasks can be taken back only during orchestration",
        )?;
        let before = self.tasks.len();
        if first >= before {
            return Ok(());
        }
        self.tasks.truncate(first);
        self.levels.truncate(self.tasks.batch_count());
        self.hazards.reindex();
        self.report.counters.tasks -= before - self.tasks.len();
        self.report.counters.submits = self.report.counters.submits.saturating_sub(1);
        Ok(())
    }

    /// `orch.scratch`: a run-scoped contiguous tensor of `shape` and `dtype`, carved from the
    /// worker's scratch pool; returns its argument index. It lives until the run's cleanup.
    pub(crate) fn scratch(
        &mut self,
        mem: &mut Memory,
        pool: &mut ScratchPool,
        name: Option<&str>,
        dtype: DType,
        shape: &[u64],
    ) -> Result<u32> {
        self.expect(
            Stage::Orchestrate,
            "scratch tensors are created during orchestration",
        )?;
        let name: std::sync::Arc<str> = match name {
            Some(n) => n.into(),
            None => format!("scratch{}", self.report.counters.scratch_tensors).into(),
        };
        let what = format_args!("scratch tensor {name}");
        let geometry = Geometry::contiguous(&what, dtype, shape)?;
        let mut arg = RunArg {
            name: name.clone(),
            dir: Direction::InOut,
            geometry,
            alloc: None,
            kind: ArgKind::Scratch,
            region: u32::MAX,
            resolved: None,
            span_copy: Default::default(),
        };
        let extent = geometry.extent();
        if extent > 0 {
            let (base, cap, off) = pool.carve(mem, &mut self.scratch_at, extent, &name)?;
            if let Some(byte) = self.poison {
                // The pool is reused run after run: poison hides an earlier run's values.
                mem.dev
                    .fill(DevPtr(base.0 + off), extent, byte)
                    .map_err(|e| Error::device(Phase::Orchestrate, Some(&name), e))?;
                self.report.counters.poisoned_bytes += extent;
            }
            // The carve was checked to hold the tensor.
            arg.geometry = geometry.at_offset(off / dtype.size());
            arg.alloc = Some((base, cap));
            arg.region = self.hazards.add_region(base);
            self.report.counters.scratch_bytes += extent;
        }
        self.report.counters.scratch_tensors += 1;
        self.args.push(arg);
        Ok((self.args.len() - 1) as u32)
    }
}

/// Checks every task view of a per-task slot: layout `geometry` at element `starts[i]` must lie
/// inside argument `a`.
fn check_views(who: &dyn Display, a: &RunArg, geometry: &Geometry, starts: &[u64]) -> Result<()> {
    if geometry.extent() == 0 {
        return Ok(());
    }
    let es = geometry.dtype().size();
    let Some((base, _)) = a.alloc else {
        return Err(run_past(who, a, 0, geometry.extent()));
    };
    let (s, l) = a.span().unwrap_or_default();
    for (t, &e) in starts.iter().enumerate() {
        let start = e.checked_mul(es).and_then(|b| b.checked_add(base.0));
        match start {
            Some(st) if span_contains(s, l, st, geometry.extent()) => {}
            _ => {
                return Err(Error::NoHostView {
                    addr: start.unwrap_or(u64::MAX),
                    bytes: geometry.extent(),
                    detail: format!("{who}: the view of task {t} runs past argument {}", a.name),
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::written_pairs;

    #[test]
    fn written_pairs_are_every_pair_with_a_written_slot_once() {
        for n in 0..7usize {
            for mask in 0u32..(1 << n) {
                let writes = move |i: usize| mask & (1 << i) != 0;
                let mut got: Vec<(usize, usize)> = written_pairs(n, writes).collect();
                got.sort_unstable();
                let want: Vec<(usize, usize)> = (0..n)
                    .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
                    .filter(|&(i, j)| writes(i) || writes(j))
                    .collect();
                assert_eq!(got, want, "n {n}, written {mask:b}");
            }
        }
    }
}
