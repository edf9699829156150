//! The run's task store: every submitted task, in submission order, without a heap allocation
//! per task.
//!
//! A submit is one *batch*: a kernel, a task count, a range of slots and a range of scalars. A
//! single `submit` is a batch of one task whose slots each hold one inline geometry. A batched
//! submit (`submit_many`) stores each slot once: either one tensor shared by every task, or a
//! view layout plus one start offset per task (struct-of-arrays: the per-task cost of a view slot
//! is one `u64`). Scalars are stored row by row, `per_task` values per task. Freeing the store
//! frees four vectors, however many tasks there were.

use std::fmt::Display;
use std::ops::Range;
use std::sync::Arc;

use simpler_driver::LaunchDims;

use crate::dtype::Value;
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::spec::{DeclaredWork, Direction, KernelRef};

/// One tensor position of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// The run argument the tensor views.
    pub arg: u32,
    pub dir: Direction,
    /// The view, relative to the argument's allocation. For a per-task slot, the layout; each
    /// task's start offset comes from `starts`.
    pub geometry: Geometry,
    /// Index into the store's start offsets of this slot's first task (per-task slots only).
    pub starts: Option<usize>,
    /// The index of its batch's first task.
    pub first_task: u64,
    /// Its batch's task count.
    pub count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Batch {
    kernel: u32,
    first_task: u64,
    count: u32,
    first_slot: u32,
    slots: u16,
    first_scalar: usize,
    per_task: u16,
    /// Index into the store's device launches: the batch runs as device code.
    device: Option<u32>,
    /// The kernel's host function takes device arrays.
    device_arrays: bool,
    /// Index into the store's pricing entries: the work one task declares and the threads of
    /// one task's launch (for a cost model). Kept beside the batches, so a batch (one per single
    /// submit) stays small to copy.
    work: Option<u32>,
}

/// How a batch of device code launches: the program (a worker's loaded-program key), the
/// per-task geometry and the launch constants (in the store's constants).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceBatch {
    pub key: u64,
    pub dims: LaunchDims,
    pub consts: Range<usize>,
}

/// One batch, as launch planning reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchInfo<'a> {
    pub first_task: u64,
    pub count: u32,
    /// Slot ids `first_slot..first_slot + slots`.
    pub first_slot: u32,
    pub slots: u16,
    pub per_task: u16,
    pub scalars: &'a [Value],
    pub device: Option<(&'a DeviceBatch, &'a [i64])>,
    pub kernel: u32,
    pub work: Option<DeclaredWork>,
    /// Threads of one task's launch, wherever its launch function ran (sim included).
    pub threads: Option<u64>,
}

/// The integer widths of a batch about to be recorded, checked by [`TaskStore::shape`]: the
/// store keeps a batch's tensor and scalar counts in 16 bits and its slot and device-launch
/// indices in 32, and every one of those narrowings is checked there, before anything is
/// recorded (a count that does not fit is refused, never wrapped).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchShape {
    count: u32,
    slots: u16,
    per_task: u16,
    first_slot: u32,
    scalars: usize,
}

/// The most tensors, and the most scalars, one task of the store may have (both are kept in
/// 16 bits).
pub const MAX_TASK_TENSORS: usize = u16::MAX as usize;

/// What the execution cursor found next.
#[derive(Debug)]
pub(crate) enum Next<'a> {
    /// A task that runs on the host: `(task index, kernel, scalars, takes device arrays)`.
    Task(u64, u32, &'a [Value], bool),
    /// A batch of device code (its index), whose tasks the cursor has stepped over.
    Device(usize),
}

/// See the module docs.
#[derive(Debug, Default, Clone)]
pub(crate) struct TaskStore {
    batches: Vec<Batch>,
    slots: Vec<Slot>,
    starts: Vec<u64>,
    scalars: Vec<Value>,
    devices: Vec<DeviceBatch>,
    consts: Vec<i64>,
    /// Pricing entries of the batches: the work one task declares, the threads of its launch.
    works: Vec<(Option<DeclaredWork>, Option<u64>)>,
    tasks: u64,
    /// Kernel names by the host's id (for messages); kept across runs, so a warm run adds none.
    names: Vec<(u32, Box<str>)>,
    /// The tasks of an earlier round this store is compared with as tasks are recorded
    /// ([`TaskStore::follow`]).
    shadow: Option<Shadow>,
}

/// An earlier round's tasks, and how far the tasks recorded since agree with them: the length of
/// each vector compared so far, or `None` once they differ.
#[derive(Debug, Clone)]
struct Shadow {
    tasks: Arc<TaskStore>,
    compared: Option<[usize; 7]>,
}

/// Where execution stands: the next task to run.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Cursor {
    batch: usize,
    index: u32,
    task: u64,
}

impl TaskStore {
    /// Tasks recorded so far.
    pub fn len(&self) -> u64 {
        self.tasks
    }

    /// Slots recorded so far (slot ids are `u32`: [`TaskStore::shape`] refuses a batch whose
    /// slots would pass `u32::MAX`, so the count always fits).
    pub fn slot_count(&self) -> u32 {
        u32::try_from(self.slots.len()).unwrap_or(u32::MAX)
    }

    /// The slot with id `i`.
    pub fn slot(&self, i: u32) -> &Slot {
        &self.slots[i as usize]
    }

    /// The element offset of slot `i`'s view for each task of its batch (one entry for a slot
    /// shared by every task).
    pub fn slot_elems(&self, i: u32) -> &[u64] {
        let s = &self.slots[i as usize];
        match s.starts {
            Some(at) => &self.starts[at..at + s.count as usize],
            None => std::slice::from_ref(s.geometry.offset_ref()),
        }
    }

    /// The run arguments some task writes, each once.
    pub fn written_args(&self) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for s in self.slots.iter().filter(|s| s.dir.writes()) {
            if !out.contains(&s.arg) {
                out.push(s.arg);
            }
        }
        out
    }

    /// Forgets every task, keeping the memory for the next run (a warm run allocates nothing
    /// here).
    pub fn clear(&mut self) {
        self.batches.clear();
        self.slots.clear();
        self.starts.clear();
        self.scalars.clear();
        self.devices.clear();
        self.consts.clear();
        self.works.clear();
        self.tasks = 0;
        self.shadow = None;
    }

    /// Compares the tasks recorded from now on with `earlier` (a kept plan's tasks) as they are
    /// recorded, so that whether they are the same is known when recording ends
    /// ([`TaskStore::same_as_followed`]) without comparing everything then. Each submit compares
    /// what it recorded while those bytes are still in the cache; a store that differs stops
    /// comparing.
    pub fn follow(&mut self, earlier: Option<Arc<TaskStore>>) {
        self.shadow = earlier.map(|tasks| Shadow {
            tasks,
            compared: Some([0; 7]),
        });
        self.compare_shadow();
    }

    /// The tasks followed ([`TaskStore::follow`]), when every task recorded equals them exactly
    /// (as [`TaskStore::same_tasks`] decides) and there are no more of either.
    pub fn same_as_followed(&self) -> Option<&Arc<TaskStore>> {
        let s = self.shadow.as_ref()?;
        let done = s.compared? == self.lens() && s.tasks.lens() == self.lens();
        (done && s.tasks.tasks == self.tasks).then_some(&s.tasks)
    }

    /// Whether tasks are being compared with a kept plan's ([`TaskStore::follow`]) and every
    /// one recorded so far equals them.
    pub fn still_following(&self) -> bool {
        self.shadow.as_ref().is_some_and(|s| s.compared.is_some())
    }

    /// The lengths of the vectors that make the tasks.
    fn lens(&self) -> [usize; 7] {
        [
            self.batches.len(),
            self.slots.len(),
            self.starts.len(),
            self.scalars.len(),
            self.devices.len(),
            self.consts.len(),
            self.works.len(),
        ]
    }

    /// Compares what was recorded since the last comparison with the followed tasks.
    fn compare_shadow(&mut self) {
        let to = self.lens();
        let Some(shadow) = &self.shadow else {
            return;
        };
        let Some(from) = shadow.compared else {
            return;
        };
        // Lengths first: the parts compared then lie inside both stores.
        let e = &shadow.tasks;
        let same = to.iter().zip(e.lens()).all(|(&t, n)| t <= n) && self.same_parts(e, from, to);
        if let Some(shadow) = &mut self.shadow {
            shadow.compared = same.then_some(to);
        }
    }

    /// Whether the parts `from..to` of each vector (in [`TaskStore::lens`] order) equal
    /// `other`'s, scalars bit for bit; both stores hold at least `to`.
    fn same_parts(&self, other: &TaskStore, from: [usize; 7], to: [usize; 7]) -> bool {
        let r = |i: usize| from[i]..to[i];
        self.batches[r(0)] == other.batches[r(0)]
            && self.slots[r(1)] == other.slots[r(1)]
            && self.starts[r(2)] == other.starts[r(2)]
            && self.scalars[r(3)]
                .iter()
                .zip(&other.scalars[r(3)])
                .all(|(a, b)| same_value(a, b))
            && self.devices[r(4)] == other.devices[r(4)]
            && self.consts[r(5)] == other.consts[r(5)]
            && self.works[r(6)] == other.works[r(6)]
    }

    /// Whether `other` holds exactly the tasks recorded here: the same batches (kernels, task
    /// counts, device code and launch geometry, launch constants), the same slots (arguments,
    /// directions and view layouts), the same per-task start offsets and the same scalars, bit
    /// for bit (`0.0` and `-0.0` differ, and a NaN equals itself: what a task row would hold).
    /// Lengths first, so two different task lists usually part at once.
    pub fn same_tasks(&self, other: &TaskStore) -> bool {
        self.tasks == other.tasks
            && self.lens() == other.lens()
            && self.same_parts(other, [0; 7], self.lens())
    }

    /// Makes this store a copy of `other`'s tasks, reusing this store's memory.
    pub fn copy_from(&mut self, other: &TaskStore) {
        self.batches.clone_from(&other.batches);
        self.slots.clone_from(&other.slots);
        self.starts.clone_from(&other.starts);
        self.scalars.clone_from(&other.scalars);
        self.devices.clone_from(&other.devices);
        self.consts.clone_from(&other.consts);
        self.works.clone_from(&other.works);
        self.tasks = other.tasks;
    }

    /// Whether every task recorded runs as device code (no host task between the batches).
    pub fn all_device(&self) -> bool {
        self.batches
            .iter()
            .all(|b| b.count == 0 || b.device.is_some())
    }

    /// Batches recorded so far.
    pub fn batch_count(&self) -> usize {
        self.batches.len()
    }

    /// Batch `i`.
    pub fn batch(&self, i: usize) -> BatchInfo<'_> {
        let b = &self.batches[i];
        let n = b.count as usize * b.per_task as usize;
        BatchInfo {
            first_task: b.first_task,
            count: b.count,
            first_slot: b.first_slot,
            slots: b.slots,
            per_task: b.per_task,
            scalars: &self.scalars[b.first_scalar..b.first_scalar + n],
            device: b.device.map(|d| {
                let d = &self.devices[d as usize];
                (d, &self.consts[d.consts.clone()])
            }),
            kernel: b.kernel,
            work: b.work.and_then(|w| self.works[w as usize].0),
            threads: b.work.and_then(|w| self.works[w as usize].1),
        }
    }

    /// Takes back every task from `first` on (`first` starts a batch): the batches, their
    /// slots, start offsets and scalars.
    pub fn truncate(&mut self, first: u64) {
        let keep = self
            .batches
            .iter()
            .scan(0u64, |task, b| {
                let at = *task;
                *task += u64::from(b.count);
                Some(at)
            })
            .take_while(|&at| at < first)
            .count();
        if let Some(b) = self.batches.get(keep) {
            let first_slot = b.first_slot as usize;
            let first_start = self.slots[first_slot..]
                .iter()
                .filter_map(|s| s.starts)
                .min()
                .unwrap_or(self.starts.len());
            self.starts.truncate(first_start);
            self.scalars.truncate(b.first_scalar);
            self.slots.truncate(first_slot);
            self.batches.truncate(keep);
            let devices = self.batches.iter().filter(|b| b.device.is_some()).count();
            if let Some(d) = self.devices.get(devices) {
                self.consts.truncate(d.consts.start);
            }
            self.devices.truncate(devices);
            let works = self.batches.iter().filter_map(|b| b.work).max();
            self.works.truncate(works.map_or(0, |w| w as usize + 1));
        }
        self.tasks = self.tasks.min(first);
        // What remains was compared already; what follows is compared when recorded.
        let now = self.lens();
        if let Some(shadow) = &mut self.shadow {
            shadow.compared = shadow
                .compared
                .map(|c| std::array::from_fn(|i| c[i].min(now[i])));
        }
    }

    /// The geometry of slot `i` for the `index`-th task of its batch.
    pub fn task_geometry(&self, i: u32, index: u32) -> Geometry {
        let s = &self.slots[i as usize];
        match s.starts {
            Some(at) => s.geometry.at_offset(self.starts[at + index as usize]),
            None => s.geometry,
        }
    }

    /// The index of the `index`-th task of slot `i`'s batch.
    pub fn task_of(&self, i: u32, index: u32) -> u64 {
        self.slots[i as usize].first_task + u64::from(index)
    }

    /// Appends per-task start offsets; returns the index of the first.
    pub fn push_starts(&mut self, starts: &[u64]) -> usize {
        let at = self.starts.len();
        self.starts.extend_from_slice(starts);
        at
    }

    /// Checks that a batch of `count` tasks of `slots` tensors and `per_task` scalars each fits
    /// the store's integer widths (`who` names the submit in the error): at most 65,535 tensors
    /// and 65,535 scalars per task, slot ids and device-launch indices within `u32`, and a task
    /// and scalar count that do not overflow. Nothing is recorded; the shape it returns is what
    /// [`TaskStore::push_batch`] takes, after exactly `slots` [`TaskStore::push_slot`] calls.
    pub fn shape(
        &self,
        who: &dyn Display,
        count: u32,
        slots: usize,
        per_task: usize,
    ) -> Result<BatchShape> {
        let too_many = |what: &str, n: usize| {
            Error::Value(format!(
                "{who}: {n} {what} per task exceeds the limit of {MAX_TASK_TENSORS} (the task \
                 store keeps the count in 16 bits)"
            ))
        };
        let narrow_slots = u16::try_from(slots).map_err(|_| too_many("tensors", slots))?;
        let narrow_scalars = u16::try_from(per_task).map_err(|_| too_many("scalars", per_task))?;
        let first_slot = u32::try_from(self.slots.len())
            .ok()
            .filter(|f| f.checked_add(u32::from(narrow_slots)).is_some())
            .ok_or_else(|| {
                Error::Value(format!(
                    "{who}: the run's tasks already hold {} tensor positions; {slots} more \
                     exceed the limit of {} per run",
                    self.slots.len(),
                    u32::MAX
                ))
            })?;
        if u32::try_from(self.devices.len()).is_err() {
            return Err(Error::Value(format!(
                "{who}: the run already holds {} device launches, the limit is {}",
                self.devices.len(),
                u32::MAX
            )));
        }
        let scalars = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(per_task))
            .and_then(|n| n.checked_add(self.scalars.len()).map(|_| n))
            .ok_or_else(|| {
                Error::Value(format!(
                    "{who}: {count} tasks of {per_task} scalars overflow the scalar store"
                ))
            })?;
        if self.tasks.checked_add(u64::from(count)).is_none() {
            return Err(Error::Value(format!(
                "{who}: {count} more tasks after {} overflow the task count",
                self.tasks
            )));
        }
        Ok(BatchShape {
            count,
            slots: narrow_slots,
            per_task: narrow_scalars,
            first_slot,
            scalars,
        })
    }

    /// Appends a slot (its id is the slot count before the call).
    pub fn push_slot(&mut self, slot: Slot) {
        self.slots.push(slot);
    }

    /// Records a batch of `shape`'s tasks of `kernel` over the last `shape.slots` slots pushed,
    /// with `scalars` (row-major, `shape.per_task` values per task). Returns the first task's
    /// index.
    pub fn push_batch(
        &mut self,
        kernel: &KernelRef<'_>,
        shape: BatchShape,
        scalars: impl IntoIterator<Item = Value>,
    ) -> u64 {
        debug_assert_eq!(
            self.slots.len(),
            shape.first_slot as usize + usize::from(shape.slots)
        );
        let first = self.tasks;
        match self.names.iter_mut().find(|(id, _)| *id == kernel.id) {
            Some((_, name)) if **name == *kernel.name => {}
            Some((_, name)) => *name = kernel.name.into(),
            None => self.names.push((kernel.id, kernel.name.into())),
        }
        let device = kernel.device.map(|d| {
            // `shape` checked that the index fits.
            let index = u32::try_from(self.devices.len()).unwrap_or(u32::MAX);
            let at = self.consts.len();
            self.consts.extend_from_slice(d.consts);
            self.devices.push(DeviceBatch {
                key: d.code.key,
                dims: d.dims,
                consts: at..self.consts.len(),
            });
            index
        });
        self.batches.push(Batch {
            kernel: kernel.id,
            first_task: first,
            count: shape.count,
            first_slot: shape.first_slot,
            slots: shape.slots,
            first_scalar: self.scalars.len(),
            per_task: shape.per_task,
            device,
            device_arrays: kernel.device_arrays,
            work: (kernel.work.is_some() || kernel.threads.is_some()).then(|| {
                let entry = (kernel.work.copied(), kernel.threads);
                // A kernel submitted again reuses its last entry.
                if self.works.last() != Some(&entry) {
                    self.works.push(entry);
                }
                // At most one entry per batch, and `shape` checked the batch index fits.
                u32::try_from(self.works.len() - 1).unwrap_or(u32::MAX)
            }),
        });
        let before = self.scalars.len();
        self.scalars.extend(scalars);
        debug_assert_eq!(self.scalars.len() - before, shape.scalars);
        // `shape` checked that the sum does not overflow.
        self.tasks += u64::from(shape.count);
        self.compare_shadow();
        first
    }

    /// The name of kernel `id` (`"?"` for one never submitted).
    pub fn name_of(&self, id: u32) -> &str {
        self.names
            .iter()
            .find(|(k, _)| *k == id)
            .map_or("?", |(_, n)| n)
    }

    /// The name of the kernel task `task` runs (`"?"` past the last task).
    pub fn kernel_name(&self, task: u64) -> &str {
        let mut first = 0u64;
        for b in &self.batches {
            if task < first + u64::from(b.count) {
                return self
                    .names
                    .iter()
                    .find(|(id, _)| *id == b.kernel)
                    .map_or("?", |(_, n)| n);
            }
            first += u64::from(b.count);
        }
        "?"
    }

    /// What comes next at `cursor`, advancing it: a batch of device code (stepped over whole),
    /// or a host task, for which `tensors` is filled with each slot and the element offset of
    /// the task's view; `None` after the last task.
    pub fn next(&self, cursor: &mut Cursor, tensors: &mut Vec<(Slot, u64)>) -> Option<Next<'_>> {
        loop {
            let b = self.batches.get(cursor.batch)?;
            if cursor.index >= b.count {
                cursor.batch += 1;
                cursor.index = 0;
                continue;
            }
            if b.device.is_some() {
                let at = cursor.batch;
                cursor.task += u64::from(b.count - cursor.index);
                cursor.batch += 1;
                cursor.index = 0;
                return Some(Next::Device(at));
            }
            let i = cursor.index as usize;
            let first = b.first_slot as usize;
            tensors.clear();
            tensors.extend(self.slots[first..first + b.slots as usize].iter().map(
                |s| match s.starts {
                    Some(at) => (*s, self.starts[at + i]),
                    None => (*s, s.geometry.offset()),
                },
            ));
            let per = b.per_task as usize;
            let scalars = &self.scalars[b.first_scalar + i * per..b.first_scalar + (i + 1) * per];
            let task = cursor.task;
            cursor.index += 1;
            cursor.task += 1;
            return Some(Next::Task(task, b.kernel, scalars, b.device_arrays));
        }
    }
}

/// Whether two scalars are the same value of the same kind, bit for bit.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::UInt(x), Value::UInt(y)) => x == y,
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::Bool(x), Value::Bool(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_whose_counts_do_not_fit_the_store_is_refused_where_they_narrow() {
        let store = TaskStore::default();
        let who = format_args!("submit wide");
        let s = store
            .shape(&who, 1, MAX_TASK_TENSORS, MAX_TASK_TENSORS)
            .unwrap();
        assert_eq!((s.slots, s.per_task), (u16::MAX, u16::MAX));
        for (slots, per_task, what) in [
            (65_536, 0, "65536 tensors"),
            (65_537, 0, "65537 tensors"),
            (0, 65_536, "65536 scalars"),
        ] {
            let e = store
                .shape(&who, 1, slots, per_task)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "submit wide: {what} per task exceeds the limit of 65535"
                )),
                "{e}"
            );
        }
    }
}
