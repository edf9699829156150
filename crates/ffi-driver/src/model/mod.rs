//! A cost model for the sim platform: what each driver operation, each access through a host
//! mapping and each batch of kernels would cost on a real card, from published figures, so that
//! a run on sim reports *modeled* time beside measured time (nothing sleeps).
//! `docs/cost-model.md` lists every figure with its source and marks the ones that are
//! assumptions; `tests.rs` holds one test per calibrated figure.
//!
//! Where a cost was measured at several sizes it is a [`Table`] read by interpolation, not a
//! line through two points: host registration is priced per mapped page, with the page size
//! the allocation gets.

mod exec;
mod table;
#[cfg(test)]
mod tests;

pub use exec::{DeviceRates, Dispatch, ExecCost, Flops, Precision, Work};
pub use table::Table;

use crate::Op;

/// The models `Worker("sim", model=...)` knows.
pub const MODELS: [&str; 2] = ["ascend-a3", "h200"];

/// Modeled nanoseconds, one entry per model of a device (its primary model first); a device
/// prices with at most one model of each name.
pub type PerModel = [u64; MODELS.len()];

/// Prices something with each of `models` (at most [`MODELS`]`.len()` of them, the primary
/// first): one entry per model, zero past the last.
pub fn per_model(models: &[CostModel], f: impl Fn(&CostModel) -> u64) -> PerModel {
    let mut out = PerModel::default();
    for (o, m) in out.iter_mut().zip(models) {
        *o = f(m);
    }
    out
}

/// How registering device memory for host access (`map` / `unmap`) costs: per page, with the
/// page size the allocation gets (`huge_page` for allocations over `huge_above` bytes, else
/// `page`), each call read from its table of pages -> nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MapCost {
    pub page: u64,
    pub huge_page: u64,
    pub huge_above: u64,
    pub register: Table,
    pub unregister: Table,
    pub register_huge: Table,
    pub unregister_huge: Table,
}

impl MapCost {
    /// The pages a mapping of `span` bytes of an allocation of `alloc` bytes covers, and
    /// whether they are huge pages.
    pub fn pages(&self, span: u64, alloc: u64) -> (u64, bool) {
        let huge = alloc > self.huge_above;
        let page = if huge { self.huge_page } else { self.page };
        (span.div_ceil(page).max(1), huge)
    }

    fn ns(&self, op: Op, span: u64, alloc: u64) -> f64 {
        let (pages, huge) = self.pages(span, alloc);
        let table = match (op, huge) {
            (Op::Map, false) => self.register,
            (Op::Map, true) => self.register_huge,
            (_, false) => self.unregister,
            (_, true) => self.unregister_huge,
        };
        table.at(pages as f64)
    }
}

/// Per-operation costs of one platform. Times in nanoseconds, bandwidths in GB/s (= bytes/ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// The name `Worker("sim", model=...)` takes.
    pub name: &'static str,
    /// Fixed cost of one host-to-device / device-to-host copy call, and of a device memset
    /// (whose bytes run at the device's memory bandwidth).
    pub h2d_call_ns: f64,
    pub d2h_call_ns: f64,
    pub memset_call_ns: f64,
    /// Copy bandwidth to and from page-locked and pageable host memory.
    pub pinned_gbps: f64,
    pub pageable_gbps: f64,
    /// A device allocation costs `malloc_ns` and its free `free_ns`, plus, together,
    /// `alloc_pair_ns_per_byte` per byte of the allocation (split evenly between the two).
    pub malloc_ns: f64,
    pub free_ns: f64,
    pub alloc_pair_ns_per_byte: f64,
    /// Registering device memory for host access and unregistering it.
    pub map: MapCost,
    /// Page-locking a mirror, per byte (`cuMemHostRegister`); 0 where mirrors stay pageable.
    pub pin_ns_per_byte: f64,
    /// One element read / written through a mapping (an uncached round trip over the bus).
    pub mapped_read_ns: f64,
    pub mapped_write_ns: f64,
    /// Bulk reads out of a mapping (streaming loads), for filling a host cache.
    pub mapped_bulk_read_gbps: f64,
    /// Whether the platform page-locks mirrors (their copies run at `pinned_gbps`).
    pub pins_mirrors: bool,
    /// Kernel execution on the device.
    pub exec: DeviceRates,
}

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// `halHostRegister` / `halHostUnregister` medians on a2a3 (CANN 9.0.0, 4 KiB host pages), in
/// pages of the allocation -> ns: the upstream runtime's investigation
/// `docs/investigations/2026-09-hbg-per-run-host-view-rebuild.md` (hw-native-sys/simpler).
/// One ordinary page is the mean of its 64 B and 4 KiB rows; 64 KiB = 16 pages, 256 KiB = 64;
/// 4 MiB, 16 MiB and 256 MiB are 2, 8 and 128 huge (2 MiB) pages.
const A3_REGISTER: Table = Table(&[(1.0, 1_595.0), (16.0, 4_140.0), (64.0, 11_340.0)]);
const A3_UNREGISTER: Table = Table(&[(1.0, 3_670.5), (16.0, 4_860.0), (64.0, 7_420.0)]);
const A3_REGISTER_HUGE: Table = Table(&[(2.0, 3_430.0), (8.0, 8_760.0), (128.0, 115_901.0)]);
const A3_UNREGISTER_HUGE: Table = Table(&[(2.0, 29_371.0), (8.0, 105_301.0), (128.0, 1_649_126.0)]);
/// The fraction of the A2/A3 device's rates upstream's paged-attention kernels reach:
/// calibrated so the model's execute of the unrolled graph's Case1 (256 sequences of 8,192
/// tokens, 1,024 tasks) is 1.300 ms, the middle of the device walls upstream published for it
/// (hw-native-sys/simpler pull request 1786: 1.334 ms tensormap-and-ringbuffer, 1.266 ms
/// host-build-graph). `tests.rs` holds the arithmetic.
pub const A3_KERNEL_EFFICIENCY: f64 =
    A3_CASE1_MEMORY_NS / (A3_CASE1_DEVICE_NS - A3_CASE1_OVERHEAD_NS);
/// Case1's modeled execute at full rates on `ascend-a3`: its 1,622,409,216 bytes at 1,800 GB/s,
/// and 48 pickups of 0.8 us (4 kernels x 4 waves of 64 tasks, `ceil(64 / 24)` = 3 pickups
/// each).
pub const A3_CASE1_MEMORY_NS: f64 = 1_622_409_216.0 / 1_800.0;
pub const A3_CASE1_OVERHEAD_NS: f64 = 48.0 * 800.0;
/// The calibration target: the middle of upstream's published Case1 device walls.
pub const A3_CASE1_DEVICE_NS: f64 = (1_334_000.0 + 1_266_000.0) / 2.0;
/// H200: 132 streaming multiprocessors x 1,024 threads.
pub const H200_FILL_THREADS: u64 = 132 * 1_024;

/// GDRCopy's README: pinning GPU memory takes "10 us - 1 ms depending on size"; the low end,
/// split between the two calls.
const H200_MAP_HALF: Table = Table(&[(1.0, 5_000.0)]);

impl CostModel {
    /// The model named `name` (see [`MODELS`]).
    pub fn named(name: &str) -> Option<CostModel> {
        match name {
            "ascend-a3" => Some(CostModel {
                name: "ascend-a3",
                h2d_call_ns: 9_500.0,
                d2h_call_ns: 9_500.0,
                memset_call_ns: 9_500.0,
                pinned_gbps: 55.0,
                pageable_gbps: 41.0,
                malloc_ns: 10_000.0,
                free_ns: 5_000.0,
                alloc_pair_ns_per_byte: 150e6 / 32e9,
                map: MapCost {
                    page: 4 * KIB,
                    huge_page: 2 * MIB,
                    huge_above: MIB,
                    register: A3_REGISTER,
                    unregister: A3_UNREGISTER,
                    register_huge: A3_REGISTER_HUGE,
                    unregister_huge: A3_UNREGISTER_HUGE,
                },
                pin_ns_per_byte: 0.0,
                mapped_read_ns: 1_700.0,
                mapped_write_ns: 90.0,
                mapped_bulk_read_gbps: 0.3,
                pins_mirrors: false,
                exec: DeviceRates {
                    // The least bandwidth consistent with upstream's measured warm paged
                    // attention round (docs/cost-model.md).
                    memory_gbps: 1_800.0,
                    // bf16, fp16 and int8 on the cube units (910B-class cube units have no
                    // fp8: refused); fp32 on the vector units, scaled from the H200's
                    // vector-to-matrix ratio (67 x 320 / 790 = 27.14).
                    tflops: [320.0, 320.0, 0.0, 640.0, 67.0 * 320.0 / 790.0],
                    dispatch: Dispatch::PerTask {
                        ns: 800.0,
                        cores: 24,
                    },
                    // Calibrated on one published figure, upstream's unrolled paged attention
                    // Case1 (docs/cost-model.md, "Calibrated on Case1"): what its kernels reach
                    // of the rates above.
                    kernel_efficiency: A3_KERNEL_EFFICIENCY,
                    fill_threads: 0,
                },
            }),
            "h200" => Some(CostModel {
                name: "h200",
                h2d_call_ns: 6_500.0,
                d2h_call_ns: 6_500.0,
                memset_call_ns: 6_500.0,
                pinned_gbps: 54.0,
                pageable_gbps: 13.5,
                malloc_ns: 10_000.0,
                free_ns: 5_000.0,
                alloc_pair_ns_per_byte: 150e6 / 32e9,
                map: MapCost {
                    page: 64 * KIB,
                    huge_page: 64 * KIB,
                    huge_above: u64::MAX,
                    register: H200_MAP_HALF,
                    unregister: H200_MAP_HALF,
                    register_huge: H200_MAP_HALF,
                    unregister_huge: H200_MAP_HALF,
                },
                pin_ns_per_byte: 0.1,
                mapped_read_ns: 1_700.0,
                mapped_write_ns: 90.0,
                mapped_bulk_read_gbps: 0.3,
                pins_mirrors: true,
                exec: DeviceRates {
                    memory_gbps: 4_300.0,
                    tflops: [790.0, 790.0, 1_580.0, 1_580.0, 67.0],
                    dispatch: Dispatch::PerLaunch { ns: 1_300.0 },
                    // Kernels that declare no efficiency of their own are priced at the rates
                    // above (a kernel whose structure cannot reach them says so).
                    kernel_efficiency: 1.0,
                    // 132 streaming multiprocessors, each needing half of its 2,048 resident
                    // threads to keep its share of the bandwidth in flight (assumed).
                    fill_threads: H200_FILL_THREADS,
                },
            }),
            _ => None,
        }
    }

    /// The models named in `spec`, comma-separated (`"ascend-a3,h200"`), the first being the
    /// primary one; an error names an unknown or repeated model.
    pub fn parse_list(spec: &str) -> Result<Vec<CostModel>, String> {
        let mut out: Vec<CostModel> = Vec::new();
        for name in spec.split(',').map(str::trim) {
            let m = CostModel::named(name).ok_or_else(|| {
                format!("model must be one of {}, not '{name}'", MODELS.join(", "))
            })?;
            if out.iter().any(|o| o.name == m.name) {
                return Err(format!("model '{name}' is named twice"));
            }
            out.push(m);
        }
        Ok(out)
    }

    /// The model whose figures stand for `platform` where a worker has no model of its own
    /// (the `auto` view policy's threshold): `h200` for `cuda`, `ascend-a3` otherwise.
    pub fn for_platform(platform: &str) -> CostModel {
        let name = if platform == "cuda" {
            "h200"
        } else {
            "ascend-a3"
        };
        CostModel::named(name).expect("a known model")
    }

    /// The first precision `flops` counts operations at that this model's device has no units
    /// for (fp8 on `ascend-a3`), or `None` when it runs them all.
    pub fn lacks(&self, flops: &Flops) -> Option<Precision> {
        flops
            .entries()
            .map(|(p, _)| p)
            .find(|&p| !self.exec.runs(p))
    }

    /// What one successful driver operation of `bytes` costs; `pinned`: its host side is
    /// page-locked memory; `alloc`: the size of the allocation it works on (host registration
    /// is per page of the allocation's page size).
    pub fn op_ns(&self, op: Op, bytes: u64, pinned: bool, alloc: u64) -> u64 {
        let b = bytes as f64;
        let bw = if pinned {
            self.pinned_gbps
        } else {
            self.pageable_gbps
        };
        let ns = match op {
            Op::H2d => self.h2d_call_ns + b / bw,
            Op::D2h => self.d2h_call_ns + b / bw,
            Op::Memset => self.memset_call_ns + b / self.exec.memory_gbps,
            Op::Alloc => self.malloc_ns + self.alloc_pair_ns_per_byte * b / 2.0,
            Op::Free => self.free_ns + self.alloc_pair_ns_per_byte * b / 2.0,
            Op::Map | Op::Unmap => self.map.ns(op, bytes, alloc),
            Op::Pin => self.pin_ns_per_byte * b,
            Op::Unpin | Op::Device | Op::Module | Op::Launch | Op::Sync => 0.0,
        };
        ns.round() as u64
    }

    /// `reads` element reads and `writes` element writes through a mapping.
    pub fn mapped_access_ns(&self, reads: u64, writes: u64) -> u64 {
        (reads as f64 * self.mapped_read_ns + writes as f64 * self.mapped_write_ns).round() as u64
    }

    /// Copying `bytes` out of a mapping into host memory (filling a host cache).
    pub fn mapped_bulk_read_ns(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.mapped_bulk_read_gbps).round() as u64
    }

    /// How many element reads through a mapping of `bytes` cost as much as one bulk copy of
    /// it out of the mapping: past that count, reading from a host copy is the cheaper. One
    /// read per `mapped_read_ns * mapped_bulk_read_gbps` bytes (~510 bytes on both models).
    pub fn reads_worth_a_copy(&self, bytes: u64) -> u64 {
        (self.mapped_bulk_read_ns(bytes) as f64 / self.mapped_read_ns).ceil() as u64
    }
}
