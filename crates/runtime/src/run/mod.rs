//! The run cycle's state and phases: `bind -> orchestrate -> execute -> copy back -> clean up`.
//!
//! One room per concern: `state` (the run in progress), `bind`, `access` (orchestrator data
//! access), `submit` (tasks and scratch tensors), `tasks` (the compact task store),
//! `hazards` (the hazard index), `execute`, `launch` (device code), `levels` (which tasks of a batch share a launch), `plan` (what a run
//! launches), `plan_cache` (plans kept for warm rounds), `pricing` (kernels under a cost model),
//! `copy_back` (copy back and clean up) and `report`. The order of the phases lives in `cycle.rs`, which drives them through the
//! worker.

mod access;
mod bind;
mod copy_back;
mod execute;
mod hazards;
pub(crate) mod launch;
mod levels;
mod plan;
mod plan_cache;
mod pricing;
mod report;
mod state;
pub(crate) mod submit;
mod tasks;

pub(crate) use plan_cache::PlanCache;
pub use plan_cache::{Replay, PLANS_KEPT};
pub use report::{Counters, KernelCost, KernelModeled, ModeledRun, Phases, RunReport};
pub use state::{HostWindow, Records, RunId, RunState, TaskCall, TensorInfo};
pub use submit::{BatchScalar, BatchSlot, BATCH_PART};
