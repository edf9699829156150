//! The run report: how long each phase took and what the run did, and its bytes (how a report
//! crosses to another process: a device group's children send theirs to the caller).

use simpler_driver::model::{Flops, Work, MODELS};

use crate::error::{Error, Result};

/// Phase durations in nanoseconds. Together they cover the whole native run, from the call's
/// entry (argument conversion is part of `bind`) to the end of `cleanup` (which includes freeing
/// the run's task list).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Phases {
    pub bind: u64,
    pub orchestrate: u64,
    pub execute: u64,
    pub copy_back: u64,
    pub cleanup: u64,
}

impl Phases {
    /// The phase names, in phase order: the keys of a report's phases everywhere.
    pub const NAMES: [&'static str; 5] = ["bind", "orchestrate", "execute", "copy_back", "cleanup"];

    /// `(name, nanoseconds)` pairs, in phase order.
    pub fn entries(&self) -> [(&'static str, u64); 5] {
        let [b, o, e, c, u] = Self::NAMES;
        [
            (b, self.bind),
            (o, self.orchestrate),
            (e, self.execute),
            (c, self.copy_back),
            (u, self.cleanup),
        ]
    }

    /// Every phase but execute: the cost of getting arguments to and from the device.
    pub fn dispatch(&self) -> u64 {
        self.bind + self.orchestrate + self.copy_back + self.cleanup
    }

    /// The whole round: the dispatch path plus execute.
    pub fn round(&self) -> u64 {
        self.dispatch() + self.execute
    }
}

/// Per-run counters (documented in `docs/concepts.md`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub staged_tensors: u64,
    pub staged_bytes: u64,
    pub copied_back_bytes: u64,
    pub device_mallocs: u64,
    pub device_frees: u64,
    pub resident_tensors: u64,
    pub views_mapped: u64,
    pub views_mirrored: u64,
    pub mirror_refreshes: u64,
    pub mirror_refresh_bytes: u64,
    pub orch_reads: u64,
    pub orch_writes: u64,
    pub tasks: u64,
    pub submits: u64,
    pub staged_view_copies: u64,
    pub scratch_tensors: u64,
    pub scratch_bytes: u64,
    pub poisoned_bytes: u64,
    pub views_cached: u64,
    pub cache_fills: u64,
    pub cache_fill_bytes: u64,
    pub mapped_reads: u64,
    pub mapped_writes: u64,
    /// Launches of device code, the tasks they ran, and tasks that ran on the host over copies
    /// on a device whose memory the host cannot reach (kernels without device code there).
    pub device_launches: u64,
    pub device_tasks: u64,
    pub host_path_tasks: u64,
    /// Device time of the run's launches, from events recorded around each batch's launches
    /// (0 unless the worker times the device: `device_timing`).
    pub device_ns: u64,
    /// How long execute waited for the device at its end (the rest of execute is the host's:
    /// planning, row upload, launch calls, host-path tasks).
    pub execute_wait_ns: u64,
    /// The host's parts of execute, as measured: planning the launches (comparing with the kept
    /// plans, dependence levels, writing task rows), uploading the rows, and the launch calls
    /// (enqueueing, not running). With `execute_wait_ns` they add up to at most `execute`; the
    /// rest is host-path tasks and the cursor's walk over the tasks.
    pub plan_ns: u64,
    pub row_upload_ns: u64,
    pub launch_ns: u64,
    /// Whether the run's launches came from the kept plan of an earlier round that recorded
    /// the same tasks (1) or were planned (0; see `plan_cache.rs`), and the bytes of task rows
    /// the run uploaded (0 when it reused a plan).
    pub plan_reuses: u64,
    pub task_row_bytes: u64,
    /// Graph launches (1 when the run's launches were one replay of a captured graph: CUDA
    /// under `Replay::Graphs`), and captures made (1 on the run that captured its plan).
    pub graph_launches: u64,
    pub graph_captures: u64,
}

impl Counters {
    /// `(name, value)` pairs, in the documented order.
    pub fn entries(&self) -> [(&'static str, u64); 35] {
        let mut c = *self;
        c.slots().map(|(k, v)| (k, *v))
    }

    /// `(name, field)` pairs, in the documented order: the one list of the counters.
    fn slots(&mut self) -> [(&'static str, &mut u64); 35] {
        [
            ("staged_tensors", &mut self.staged_tensors),
            ("staged_bytes", &mut self.staged_bytes),
            ("copied_back_bytes", &mut self.copied_back_bytes),
            ("device_mallocs", &mut self.device_mallocs),
            ("device_frees", &mut self.device_frees),
            ("resident_tensors", &mut self.resident_tensors),
            ("views_mapped", &mut self.views_mapped),
            ("views_mirrored", &mut self.views_mirrored),
            ("mirror_refreshes", &mut self.mirror_refreshes),
            ("mirror_refresh_bytes", &mut self.mirror_refresh_bytes),
            ("orch_reads", &mut self.orch_reads),
            ("orch_writes", &mut self.orch_writes),
            ("tasks", &mut self.tasks),
            ("submits", &mut self.submits),
            ("staged_view_copies", &mut self.staged_view_copies),
            ("scratch_tensors", &mut self.scratch_tensors),
            ("scratch_bytes", &mut self.scratch_bytes),
            ("poisoned_bytes", &mut self.poisoned_bytes),
            ("views_cached", &mut self.views_cached),
            ("cache_fills", &mut self.cache_fills),
            ("cache_fill_bytes", &mut self.cache_fill_bytes),
            ("mapped_reads", &mut self.mapped_reads),
            ("mapped_writes", &mut self.mapped_writes),
            ("device_launches", &mut self.device_launches),
            ("device_tasks", &mut self.device_tasks),
            ("host_path_tasks", &mut self.host_path_tasks),
            ("device_ns", &mut self.device_ns),
            ("execute_wait_ns", &mut self.execute_wait_ns),
            ("plan_ns", &mut self.plan_ns),
            ("row_upload_ns", &mut self.row_upload_ns),
            ("launch_ns", &mut self.launch_ns),
            ("plan_reuses", &mut self.plan_reuses),
            ("task_row_bytes", &mut self.task_row_bytes),
            ("graph_launches", &mut self.graph_launches),
            ("graph_captures", &mut self.graph_captures),
        ]
    }
}

/// One cost model's price of a kernel over a run (the sums over its batches; each batch costs
/// `overhead + max(memory, compute)`, so `ns` is at most the sum of the three).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelModeled {
    pub model: &'static str,
    pub overhead_ns: f64,
    pub memory_ns: f64,
    pub compute_ns: f64,
    pub ns: u64,
    /// The batches' time streaming or computing (`max(memory, compute)`, summed), and what it
    /// would have been at the device's full rates: their ratio is [`KernelModeled::rate`].
    pub busy_ns: f64,
    pub full_rate_ns: f64,
}

impl KernelModeled {
    /// The fraction of the device's rates the kernel's batches ran at (its efficiency times
    /// its launches' fill, weighted by time); 1 when they ran at full rates or did nothing.
    pub fn rate(&self) -> f64 {
        if self.busy_ns > 0.0 {
            self.full_rate_ns / self.busy_ns
        } else {
            1.0
        }
    }
}

/// The work of one kernel over a run, and its price under each cost model.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelCost {
    pub name: String,
    /// Whether the kernel declares its work (else bytes come from its views, and it does no
    /// priced operations).
    pub declared: bool,
    pub batches: u64,
    pub tasks: u64,
    /// Launches a device would make of its batches (one per dependence level).
    pub launches: u64,
    /// The work of one task (of its first batch) and of all its tasks.
    pub per_task: simpler_driver::model::Work,
    pub work: simpler_driver::model::Work,
    pub modeled: Vec<KernelModeled>,
}

/// One cost model's modeled phases of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeledRun {
    pub model: &'static str,
    pub phases: Phases,
}

/// What a run did and how long each phase took.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RunReport {
    pub phases: Phases,
    pub counters: Counters,
    /// Whether every phase succeeded.
    pub ok: bool,
    /// Modeled nanoseconds per phase, when the device prices its operations with cost models
    /// (sim with `model=`), under the primary model: its driver calls, element accesses
    /// through mappings and cache fills out of them during orchestration, and the kernels
    /// (`execute`).
    pub modeled: Option<Phases>,
    /// The modeled phases under every cost model of the device, the primary one first.
    pub modeled_by: Vec<ModeledRun>,
    /// Per kernel, the work the run's tasks did and its price (with a cost model).
    pub kernels: Vec<KernelCost>,
}

impl RunReport {
    /// The report as bytes, every field in declaration order (little-endian integers and
    /// floats, counted lists, length-prefixed names); [`RunReport::from_bytes`] reads them
    /// back. The bytes are this build's own, for another process of the same build.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(512));
        w.phases(&self.phases);
        for (_, v) in self.counters.entries() {
            w.u64(v);
        }
        w.u64(u64::from(self.ok));
        w.u64(u64::from(self.modeled.is_some()));
        w.phases(&self.modeled.unwrap_or_default());
        w.u64(self.modeled_by.len() as u64);
        for m in &self.modeled_by {
            w.str(m.model);
            w.phases(&m.phases);
        }
        w.u64(self.kernels.len() as u64);
        for k in &self.kernels {
            w.str(&k.name);
            w.u64(u64::from(k.declared));
            w.u64(k.batches);
            w.u64(k.tasks);
            w.u64(k.launches);
            w.work(&k.per_task);
            w.work(&k.work);
            w.u64(k.modeled.len() as u64);
            for m in &k.modeled {
                w.str(m.model);
                for x in [m.overhead_ns, m.memory_ns, m.compute_ns] {
                    w.u64(x.to_bits());
                }
                w.u64(m.ns);
                w.u64(m.busy_ns.to_bits());
                w.u64(m.full_rate_ns.to_bits());
            }
        }
        w.0
    }

    /// The report [`RunReport::to_bytes`] wrote; `Error::Value` for bytes it did not write.
    pub fn from_bytes(bytes: &[u8]) -> Result<RunReport> {
        let mut r = Reader(bytes);
        let phases = r.phases()?;
        let mut counters = Counters::default();
        for (_, v) in counters.slots() {
            *v = r.u64()?;
        }
        let ok = r.flag()?;
        let has_modeled = r.flag()?;
        let modeled = r.phases()?;
        let modeled_by = (0..r.count()?)
            .map(|_| {
                Ok(ModeledRun {
                    model: r.model()?,
                    phases: r.phases()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let kernels = (0..r.count()?)
            .map(|_| {
                Ok(KernelCost {
                    name: r.str()?.to_owned(),
                    declared: r.flag()?,
                    batches: r.u64()?,
                    tasks: r.u64()?,
                    launches: r.u64()?,
                    per_task: r.work()?,
                    work: r.work()?,
                    modeled: (0..r.count()?)
                        .map(|_| {
                            Ok(KernelModeled {
                                model: r.model()?,
                                overhead_ns: r.f64()?,
                                memory_ns: r.f64()?,
                                compute_ns: r.f64()?,
                                ns: r.u64()?,
                                busy_ns: r.f64()?,
                                full_rate_ns: r.f64()?,
                            })
                        })
                        .collect::<Result<Vec<_>>>()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if !r.0.is_empty() {
            return Err(Reader::bad("bytes left over"));
        }
        Ok(RunReport {
            phases,
            counters,
            ok,
            modeled: has_modeled.then_some(modeled),
            modeled_by,
            kernels,
        })
    }
}

struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }

    fn phases(&mut self, p: &Phases) {
        for (_, v) in p.entries() {
            self.u64(v);
        }
    }

    fn work(&mut self, w: &Work) {
        self.u64(w.bytes_read);
        self.u64(w.bytes_written);
        for n in w.flops.0 {
            self.u64(n);
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bad(what: &str) -> Error {
        Error::Value(format!("not the bytes of a run report: {what}"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Self::bad("too short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(
            b.try_into().map_err(|_| Self::bad("too short"))?,
        ))
    }

    fn f64(&mut self) -> Result<f64> {
        Ok(f64::from_bits(self.u64()?))
    }

    fn flag(&mut self) -> Result<bool> {
        match self.u64()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Self::bad("a flag that is neither 0 nor 1")),
        }
    }

    /// A list's length, at most the bytes left (each entry takes at least one).
    fn count(&mut self) -> Result<usize> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.0.len())
            .ok_or_else(|| Self::bad("a list longer than the bytes left"))
    }

    fn str(&mut self) -> Result<&'a str> {
        let n = self.count()?;
        std::str::from_utf8(self.take(n)?).map_err(|_| Self::bad("a name that is not UTF-8"))
    }

    /// A cost model's name, as the driver spells it.
    fn model(&mut self) -> Result<&'static str> {
        let name = self.str()?;
        MODELS
            .into_iter()
            .find(|m| *m == name)
            .ok_or_else(|| Self::bad("an unknown cost model"))
    }

    fn phases(&mut self) -> Result<Phases> {
        Ok(Phases {
            bind: self.u64()?,
            orchestrate: self.u64()?,
            execute: self.u64()?,
            copy_back: self.u64()?,
            cleanup: self.u64()?,
        })
    }

    fn work(&mut self) -> Result<Work> {
        let bytes_read = self.u64()?;
        let bytes_written = self.u64()?;
        let mut flops = Flops::default();
        for n in &mut flops.0 {
            *n = self.u64()?;
        }
        Ok(Work {
            bytes_read,
            bytes_written,
            flops,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use simpler_driver::model::Precision;

    /// A report with every field set to a value of its own.
    fn full() -> RunReport {
        let mut counters = Counters::default();
        for (i, (_, v)) in counters.slots().into_iter().enumerate() {
            *v = 1000 + i as u64;
        }
        let phases = |k: u64| Phases {
            bind: k,
            orchestrate: k + 1,
            execute: k + 2,
            copy_back: k + 3,
            cleanup: k + 4,
        };
        let mut flops = Flops::default();
        flops.set(Precision::Bf16, 7);
        flops.set(Precision::Fp32, 9);
        let work = Work {
            bytes_read: 11,
            bytes_written: 12,
            flops,
        };
        RunReport {
            phases: phases(1),
            counters,
            ok: true,
            modeled: Some(phases(10)),
            modeled_by: vec![
                ModeledRun {
                    model: MODELS[0],
                    phases: phases(10),
                },
                ModeledRun {
                    model: MODELS[1],
                    phases: phases(20),
                },
            ],
            kernels: vec![KernelCost {
                name: "qk_matmul".into(),
                declared: true,
                batches: 2,
                tasks: 64,
                launches: 3,
                per_task: work,
                work: work.times(64),
                modeled: vec![KernelModeled {
                    model: MODELS[1],
                    overhead_ns: 0.1,
                    memory_ns: 1.5e3,
                    compute_ns: 2.25e2,
                    ns: 1600,
                    busy_ns: 1.5e3,
                    full_rate_ns: 1.0e3 / 3.0,
                }],
            }],
        }
    }

    #[test]
    fn a_report_reads_back_from_its_bytes_field_for_field() {
        for r in [full(), RunReport::default()] {
            assert_eq!(RunReport::from_bytes(&r.to_bytes()).unwrap(), r);
        }
    }

    #[test]
    fn the_counters_list_names_every_counter_once_in_the_documented_order() {
        let mut c = full().counters;
        let names: Vec<_> = c.slots().iter().map(|(k, _)| *k).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        assert_eq!(names.first(), Some(&"staged_tensors"));
        assert_eq!(names.last(), Some(&"graph_captures"));
        assert!(c
            .entries()
            .iter()
            .enumerate()
            .all(|(i, (_, v))| *v == 1000 + i as u64));
    }

    #[test]
    fn bytes_it_did_not_write_are_refused() {
        let bytes = full().to_bytes();
        for cut in [0, 7, 8, bytes.len() - 1] {
            assert!(
                RunReport::from_bytes(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(RunReport::from_bytes(&longer).is_err());
        let mut bad_flag = bytes;
        bad_flag[8 * 40] = 2; // `ok`: after 5 phases and 35 counters
        assert!(RunReport::from_bytes(&bad_flag).is_err());
    }
}
