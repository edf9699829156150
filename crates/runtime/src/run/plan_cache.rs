//! The launch plans of earlier rounds, kept for rounds that record the same tasks.
//!
//! A warm round usually records exactly the tasks of an earlier one: the same kernels, the same
//! views at the same device addresses, the same scalars and launch geometry. Planning such a
//! round again (dependence levels, task rows, their upload) would redo the same work, so the
//! worker keeps the plans of its last [`PLANS_KEPT`] distinct task lists and reuses one when a
//! round matches it.
//!
//! Equality is exact, never a hash: a round matches a plan when its task store equals the copy
//! the plan kept (every batch, slot, per-task start offset and scalar, scalars bit for bit; see
//! `TaskStore::same_tasks`) and every run argument is bound to the same allocation — the same
//! base address, size and allocation *generation*. The comparison with the plan used last is
//! made while the round records its tasks, submit by submit (`TaskStore::follow`), on bytes
//! just written, so that a replayed round finds its plan at once when execution starts; a round
//! that parted from it is compared with every kept plan then. The generation is what makes a buffer freed
//! and allocated again at the same address a different binding: the memory table gives every
//! allocation a new one. A plan is dropped when an allocation it binds is freed (so no plan
//! outlives its memory), when the worker trims its staging memory, and at close; a changed
//! kernel is another device program (its key), so a plan of the old one never matches.
//!
//! Each plan keeps its task rows in a device region of its own, never written by a later plan:
//! a replayed launch (and a captured graph) reads the rows when it runs. Under
//! [`Replay::Graphs`], on a device that captures graphs (CUDA), a plan's launches are captured
//! into a graph at its first reuse and each later reuse is one graph launch; dropping the plan
//! destroys its graph. Regions of dropped plans
//! are kept as spares for the next plan; the worker holds at most [`PLANS_KEPT`] regions (one
//! more while replay is off and every kept plan holds one).

use std::ops::Range;
use std::sync::Arc;

use simpler_driver::GraphId;

use crate::run::plan::{Binding, PlannedLaunch, Region};
use crate::run::tasks::TaskStore;

/// Plans (and task-row regions) a worker keeps: a scene or a decode loop alternates between a
/// few task lists (a prefill and a decode step, say); more would only cost memory and compares.
pub const PLANS_KEPT: usize = 4;

/// Whether a run reuses the plan of an earlier round that recorded the same tasks
/// (`Worker::set_replay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replay {
    /// Every round plans its launches; the plans kept stay as they are (turning replay back on
    /// finds them), and the round's own plan is not kept.
    Off,
    /// A round that matches a kept plan reuses it: no levels, no rows, no upload; the same
    /// launch calls.
    Plans,
    /// As `Plans`, and where the device captures graphs (CUDA), a reused plan's launches are
    /// captured into a graph once and replayed with one graph launch per round (when every
    /// task of the round is device code: a host task between batches needs their results).
    #[default]
    Graphs,
}

impl Replay {
    /// Every mode, in the order the docs list them.
    pub const ALL: [Replay; 3] = [Replay::Off, Replay::Plans, Replay::Graphs];

    /// The mode's name (`"off"`, `"plans"`, `"graphs"`).
    pub fn name(self) -> &'static str {
        match self {
            Replay::Off => "off",
            Replay::Plans => "plans",
            Replay::Graphs => "graphs",
        }
    }

    /// The mode named `name`.
    pub fn parse(name: &str) -> Option<Replay> {
        Replay::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// One kept plan.
#[derive(Debug)]
pub(crate) struct CachedPlan {
    /// Identifies the plan while it is kept (a run names the plan it replays by it).
    pub id: u64,
    tasks: Arc<TaskStore>,
    bindings: Vec<Binding>,
    /// The launches, their row offsets absolute (inside `region`).
    pub launches: Vec<PlannedLaunch>,
    /// Per batch of device code: its index and its range of `launches`.
    pub batches: Vec<(usize, Range<usize>)>,
    pub region: Region,
    /// Its launches captured into a graph (made at its first replay under `Replay::Graphs`),
    /// and whether capturing them failed (then it replays with plain launches).
    pub graph: Option<GraphId>,
    pub graph_failed: bool,
    /// When it was last made or reused (the least recently used plan goes first).
    used: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    plans: Vec<CachedPlan>,
    /// Regions no plan uses (their plans were dropped), for the next plan.
    pub spare: Vec<Region>,
    /// Graphs of dropped plans, to destroy (`Memory::bury_graphs`).
    pub dead_graphs: Vec<GraphId>,
    clock: u64,
    next_id: u64,
    pub replay: Replay,
}

impl PlanCache {
    /// The tasks of the plan used last, for a new run to compare its tasks with as they are
    /// recorded (`TaskStore::follow`): a warm round usually repeats the round before it.
    pub fn latest(&self) -> Option<Arc<TaskStore>> {
        if self.replay == Replay::Off {
            return None;
        }
        let p = self.plans.iter().max_by_key(|p| p.used)?;
        Some(p.tasks.clone())
    }

    /// The kept plan of exactly these tasks over exactly these bindings, marked used. When the
    /// tasks were compared with a kept plan's as they were recorded and equal them, that plan is
    /// the one (its bindings still compared); otherwise every kept plan is compared.
    pub fn find(&mut self, tasks: &TaskStore, bindings: &[Binding]) -> Option<&CachedPlan> {
        let followed = tasks.same_as_followed();
        let i =
            match followed.and_then(|f| self.plans.iter().position(|p| Arc::ptr_eq(&p.tasks, f))) {
                Some(i) if self.plans[i].bindings == bindings => i,
                _ => self
                    .plans
                    .iter()
                    .position(|p| p.bindings == bindings && p.tasks.same_tasks(tasks))?,
            };
        self.clock += 1;
        self.plans[i].used = self.clock;
        Some(&self.plans[i])
    }

    /// Makes room for a new plan of `tasks` over `bindings`: drops a kept plan of the same tasks
    /// (the new one replaces it) and, when [`PLANS_KEPT`] are kept, the least recently used.
    pub fn make_room(&mut self, tasks: &TaskStore, bindings: &[Binding]) {
        if let Some(i) = self
            .plans
            .iter()
            .position(|p| p.bindings == bindings && p.tasks.same_tasks(tasks))
        {
            self.drop_at(i);
        }
        if self.plans.len() >= PLANS_KEPT {
            if let Some(i) = (0..self.plans.len()).min_by_key(|&i| self.plans[i].used) {
                self.drop_at(i);
            }
        }
    }

    /// Regions in use or spare.
    pub fn regions(&self) -> usize {
        self.plans.len() + self.spare.len()
    }

    /// A spare region of at least `need` bytes (the smallest such), taken out of the spares.
    pub fn take_spare(&mut self, need: u64) -> Option<Region> {
        let i = (0..self.spare.len())
            .filter(|&i| self.spare[i].1 >= need)
            .min_by_key(|&i| self.spare[i].1)?;
        Some(self.spare.swap_remove(i))
    }

    /// The kept plan `id`.
    pub fn by_id(&mut self, id: u64) -> Option<&mut CachedPlan> {
        self.plans.iter_mut().find(|p| p.id == id)
    }

    /// Keeps a new plan of `tasks` over `bindings` (room was made).
    pub fn insert(
        &mut self,
        tasks: &TaskStore,
        bindings: Vec<Binding>,
        launches: &[PlannedLaunch],
        batches: &[(usize, Range<usize>)],
        region: Region,
    ) {
        self.clock += 1;
        self.next_id += 1;
        let mut copy = TaskStore::default();
        copy.copy_from(tasks);
        self.plans.push(CachedPlan {
            id: self.next_id,
            tasks: Arc::new(copy),
            bindings,
            launches: launches.to_vec(),
            batches: batches.to_vec(),
            region,
            graph: None,
            graph_failed: false,
            used: self.clock,
        });
    }

    /// Drops every plan that binds the allocation at `ptr` (it was freed); their regions become
    /// spares.
    pub fn forget_alloc(&mut self, ptr: u64) {
        let mut i = 0;
        while i < self.plans.len() {
            if self.plans[i]
                .bindings
                .iter()
                .any(|b| b.is_some_and(|(p, _, _)| p == ptr))
            {
                self.drop_at(i);
            } else {
                i += 1;
            }
        }
    }

    /// Drops every plan; returns every region (the plans' and the spares').
    pub fn drain(&mut self) -> Vec<Region> {
        while !self.plans.is_empty() {
            self.drop_at(self.plans.len() - 1);
        }
        std::mem::take(&mut self.spare)
    }

    /// Plans kept.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    fn drop_at(&mut self, i: usize) {
        let p = self.plans.swap_remove(i);
        self.spare.push(p.region);
        self.dead_graphs.extend(p.graph);
    }
}
