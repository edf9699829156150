//! Pricing device execution: the work of a batch of tasks (bytes moved through device memory,
//! operations by precision) turned into time with a device's rates, plus the cost of getting
//! the tasks onto the device (a launch per dependence level on CUDA, a scheduler's pickup per
//! task on Ascend, in waves of as many tasks as there are cores, level after level).
//! `docs/cost-model.md` names the source of every rate.

use std::fmt;

/// The precision (and so the unit) an operation runs at: matrix units for the low-precision
/// kinds, vector units (CUDA cores, AIV) for `fp32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Bf16,
    Fp16,
    Fp8,
    Int8,
    Fp32,
}

impl Precision {
    /// Every precision, in the order of [`Flops`]' entries.
    pub const ALL: [Precision; 5] = [
        Precision::Bf16,
        Precision::Fp16,
        Precision::Fp8,
        Precision::Int8,
        Precision::Fp32,
    ];

    /// `"bf16"`, `"fp16"`, `"fp8"`, `"int8"` or `"fp32"`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8 => "fp8",
            Precision::Int8 => "int8",
            Precision::Fp32 => "fp32",
        }
    }

    /// Parses a [`name`](Precision::name).
    pub fn parse(s: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == s)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Operation counts by precision (a multiply-add is two).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flops(pub [u64; 5]);

impl Flops {
    /// The count at `p`.
    pub fn get(&self, p: Precision) -> u64 {
        self.0[p.index()]
    }

    /// Sets the count at `p`.
    pub fn set(&mut self, p: Precision, n: u64) {
        self.0[p.index()] = n;
    }

    /// `(precision, count)` for every non-zero count.
    pub fn entries(&self) -> impl Iterator<Item = (Precision, u64)> + '_ {
        Precision::ALL
            .into_iter()
            .map(|p| (p, self.get(p)))
            .filter(|(_, n)| *n > 0)
    }

    /// These counts times `k` (saturating: a count past `u64::MAX` prices as that).
    pub fn times(&self, k: u64) -> Flops {
        Flops(self.0.map(|n| n.saturating_mul(k)))
    }

    /// Adds `other`'s counts to these (saturating).
    pub fn add(&mut self, other: &Flops) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a = a.saturating_add(b);
        }
    }
}

/// The work of some tasks on the device: bytes read from and written to device memory, and
/// operations by precision.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flops: Flops,
}

impl Work {
    /// This work times `k` (saturating).
    pub fn times(&self, k: u64) -> Work {
        Work {
            bytes_read: self.bytes_read.saturating_mul(k),
            bytes_written: self.bytes_written.saturating_mul(k),
            flops: self.flops.times(k),
        }
    }

    /// Adds `other` to this work (saturating).
    pub fn add(&mut self, other: &Work) {
        self.bytes_read = self.bytes_read.saturating_add(other.bytes_read);
        self.bytes_written = self.bytes_written.saturating_add(other.bytes_written);
        self.flops.add(&other.flops);
    }
}

/// How tasks reach the device's cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dispatch {
    /// One launch per batch of independent tasks (CUDA: one per dependence level of a batched
    /// submit; `docs/device-kernels.md`), each costing `ns`.
    PerLaunch { ns: f64 },
    /// A scheduler hands every task to a core: `ns` per task on a core, `cores` cores picking
    /// tasks up at once (Ascend's AICPU scheduler and its AICores). A dependence level of `n`
    /// tasks takes `ceil(n / cores)` pickups in a row, and a level starts after the one it
    /// depends on: a chain of dependent tasks pays a whole pickup per task.
    PerTask { ns: f64, cores: u32 },
}

/// A device's execution rates. Bandwidth in GB/s (= bytes per ns), throughput in TFLOP/s (=
/// 1000 operations per ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceRates {
    /// Device memory bandwidth (what a device-to-device copy reaches).
    pub memory_gbps: f64,
    /// Throughput by precision, in [`Precision::ALL`] order; 0 for a precision the device
    /// has no units for (see [`DeviceRates::runs`]).
    pub tflops: [f64; 5],
    pub dispatch: Dispatch,
    /// The fraction of the memory bandwidth and throughput above that a kernel reaches when it
    /// declares none of its own (`KernelWork(efficiency=...)`).
    pub kernel_efficiency: f64,
    /// The threads a launch must keep resident to stream at the device's rates (its streaming
    /// multiprocessors times the threads each needs); a launch of fewer runs at that fraction
    /// of them. 0: not priced (a device whose tasks are handed to cores one by one).
    pub fill_threads: u64,
}

/// What a batch of tasks costs, and how: `overhead_ns` (launches or per-task dispatch),
/// `memory_ns` (bytes over the device's bandwidth) and `compute_ns` (operations over the
/// throughput of their precision). The batch takes `overhead + max(memory, compute)`: its
/// tasks stream memory and compute at once, and the overhead is not hidden behind either.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ExecCost {
    pub overhead_ns: f64,
    pub memory_ns: f64,
    pub compute_ns: f64,
}

impl ExecCost {
    /// The batch's modeled time, rounded to a nanosecond.
    pub fn ns(&self) -> u64 {
        (self.overhead_ns + self.memory_ns.max(self.compute_ns)).round() as u64
    }
}

impl fmt::Display for ExecCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.1} us overhead + max({:.1} us memory, {:.1} us compute)",
            self.overhead_ns / 1e3,
            self.memory_ns / 1e3,
            self.compute_ns / 1e3
        )
    }
}

impl DeviceRates {
    /// Whether the device has units for operations at `p` (work at a precision it lacks is
    /// refused where it is submitted, not priced).
    pub fn runs(&self, p: Precision) -> bool {
        self.tflops[p.index()] > 0.0
    }

    /// What a batch of tasks doing `work` in total costs at the device's full rates: `levels`
    /// holds the task count of each dependence level (one entry for independent tasks), and a
    /// launching device makes `launches` launches of it. Operations at a precision the device
    /// does not [`run`](DeviceRates::runs) price as infinite time: callers refuse them first.
    pub fn price(&self, levels: &[u64], launches: u64, work: &Work) -> ExecCost {
        self.price_at(levels, launches, work, 1.0)
    }

    /// The fraction of the device's rates a launch of `threads` threads can use: 1 when the
    /// device prices no fill ([`DeviceRates::fill_threads`] 0) or the launch fills it.
    pub fn fill(&self, threads: u64) -> f64 {
        if self.fill_threads == 0 || threads >= self.fill_threads {
            1.0
        } else {
            (threads.max(1) as f64 / self.fill_threads as f64).min(1.0)
        }
    }

    /// [`DeviceRates::price`] with the memory and compute time of the batch at `rate` (in
    /// (0, 1]) of the device's rates: a kernel's efficiency times its launches' fill.
    pub fn price_at(&self, levels: &[u64], launches: u64, work: &Work, rate: f64) -> ExecCost {
        let rate = if rate > 0.0 { rate.min(1.0) } else { 1.0 };
        let overhead_ns = match self.dispatch {
            Dispatch::PerLaunch { ns } => launches as f64 * ns,
            Dispatch::PerTask { ns, cores } => {
                let waves: u64 = levels
                    .iter()
                    .map(|n| n.div_ceil(u64::from(cores.max(1))))
                    .sum();
                waves as f64 * ns
            }
        };
        let bytes = work.bytes_read as f64 + work.bytes_written as f64;
        let compute_ns: f64 = work
            .flops
            .entries()
            .map(|(p, n)| n as f64 / (self.tflops[p.index()] * 1e3))
            .sum();
        ExecCost {
            overhead_ns,
            memory_ns: bytes / (self.memory_gbps * rate),
            compute_ns: compute_ns / rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATES: DeviceRates = DeviceRates {
        memory_gbps: 1_000.0,
        tflops: [100.0, 100.0, 200.0, 200.0, 10.0],
        dispatch: Dispatch::PerLaunch { ns: 2_000.0 },
        kernel_efficiency: 1.0,
        fill_threads: 0,
    };

    #[test]
    fn a_batch_costs_its_overhead_plus_the_slower_of_memory_and_compute() {
        let mut flops = Flops::default();
        flops.set(Precision::Bf16, 1_000_000_000); // 10 us at 100 TFLOP/s
        flops.set(Precision::Fp32, 50_000_000); // 5 us at 10 TFLOP/s
        let work = Work {
            bytes_read: 4_000_000,
            bytes_written: 1_000_000, // 5 us at 1000 GB/s
            flops,
        };
        let c = RATES.price(&[100], 3, &work);
        assert_eq!(
            (c.overhead_ns, c.memory_ns, c.compute_ns),
            (6_000.0, 5_000.0, 15_000.0)
        );
        assert_eq!(c.ns(), 21_000);
        let per_task = DeviceRates {
            dispatch: Dispatch::PerTask {
                ns: 800.0,
                cores: 24,
            },
            ..RATES
        };
        let none = Work::default();
        // 240 independent tasks on 24 cores: 10 pickups in a row, 8 us.
        assert_eq!(per_task.price(&[240], 1, &none).ns(), 8_000);
        // One task pays a whole pickup; 25 need a second wave.
        assert_eq!(per_task.price(&[1], 1, &none).ns(), 800);
        assert_eq!(per_task.price(&[25], 1, &none).ns(), 1_600);
        // A chain of 10 dependent tasks: 10 levels of one task, 10 pickups.
        assert_eq!(per_task.price(&[1; 10], 10, &none).ns(), 8_000);
        // Levels of 24, 1 and 30 tasks: 1 + 1 + 2 waves.
        assert_eq!(per_task.price(&[24, 1, 30], 3, &none).ns(), 3_200);
    }

    #[test]
    fn a_rate_below_one_stretches_memory_and_compute_not_overhead() {
        let mut flops = Flops::default();
        flops.set(Precision::Fp32, 50_000_000); // 5 us at 10 TFLOP/s
        let work = Work {
            bytes_read: 2_000_000, // 2 us at 1000 GB/s
            bytes_written: 0,
            flops,
        };
        let c = RATES.price_at(&[8], 1, &work, 0.5);
        assert_eq!(
            (c.overhead_ns, c.memory_ns, c.compute_ns),
            (2_000.0, 4_000.0, 10_000.0)
        );
        assert_eq!(
            RATES.price_at(&[8], 1, &work, 0.0),
            RATES.price(&[8], 1, &work)
        );
        // Fill: none priced without fill_threads; a launch of a quarter of them runs at 0.25.
        assert_eq!(RATES.fill(1), 1.0);
        let filled = DeviceRates {
            fill_threads: 1_000,
            ..RATES
        };
        assert_eq!(
            (filled.fill(250), filled.fill(1_000), filled.fill(5_000)),
            (0.25, 1.0, 1.0)
        );
    }

    #[test]
    fn a_precision_without_units_is_not_run() {
        let no_fp8 = DeviceRates {
            tflops: [100.0, 100.0, 0.0, 200.0, 10.0],
            ..RATES
        };
        assert!(!no_fp8.runs(Precision::Fp8));
        assert!(no_fp8.runs(Precision::Int8) && RATES.runs(Precision::Fp8));
    }

    #[test]
    fn precisions_parse_by_name_and_work_scales() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(p.name()), Some(p));
        }
        assert_eq!(Precision::parse("tf32"), None);
        let mut w = Work {
            bytes_read: 3,
            bytes_written: 1,
            flops: Flops([1, 0, 0, 0, 2]),
        };
        assert_eq!(w.times(4).flops, Flops([4, 0, 0, 0, 8]));
        w.add(&w.times(u64::MAX));
        assert_eq!(w.bytes_read, u64::MAX);
    }
}
