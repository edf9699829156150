//! A cost model for the sim platform: what each driver operation and each access through a host
//! mapping would cost on a real card, from published figures, so that a run on sim reports
//! *modeled* time beside measured time (nothing sleeps). `docs/cost-model.md` lists every figure
//! with its source and marks the ones that are assumptions.

use crate::Op;

/// Per-operation costs of one platform. Times in nanoseconds, bandwidths in GB/s (= bytes/ns).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// The name `Worker("sim", model=...)` takes.
    pub name: &'static str,
    /// Fixed cost of one host-to-device / device-to-host copy call, and of a device memset.
    pub h2d_call_ns: f64,
    pub d2h_call_ns: f64,
    pub memset_call_ns: f64,
    /// Copy bandwidth to and from page-locked and pageable host memory.
    pub pinned_gbps: f64,
    pub pageable_gbps: f64,
    /// Device memset bandwidth.
    pub memset_gbps: f64,
    pub malloc_ns: f64,
    pub free_ns: f64,
    /// A host registration (`map_host`) plus its unregistration costs
    /// `map_pair_ns + map_pair_ns_per_byte * bytes`, split evenly between the two calls.
    pub map_pair_ns: f64,
    pub map_pair_ns_per_byte: f64,
    /// Page-locking a mirror, per byte (`cuMemHostRegister`); 0 where mirrors stay pageable.
    pub pin_ns_per_byte: f64,
    /// One element read / written through a mapping (an uncached round trip over the bus).
    pub mapped_read_ns: f64,
    pub mapped_write_ns: f64,
    /// Bulk reads out of a mapping (streaming loads), for filling a host cache.
    pub mapped_bulk_read_gbps: f64,
    /// Whether the platform page-locks mirrors (their copies run at `pinned_gbps`).
    pub pins_mirrors: bool,
}

/// The models `Worker("sim", model=...)` knows.
pub const MODELS: [&str; 2] = ["ascend-a3", "h200"];

impl CostModel {
    /// The model named `name` (see [`MODELS`]).
    pub fn named(name: &str) -> Option<CostModel> {
        match name {
            "ascend-a3" => Some(CostModel {
                name: "ascend-a3",
                h2d_call_ns: 9_500.0,
                d2h_call_ns: 9_500.0,
                memset_call_ns: 9_500.0,
                pinned_gbps: 25.0,
                pageable_gbps: 12.0,
                memset_gbps: 800.0,
                malloc_ns: 10_000.0,
                free_ns: 5_000.0,
                // 5.2 us for 1 KiB, 18.8 us for 256 KiB: a line through both points.
                map_pair_ns_per_byte: (18_800.0 - 5_200.0) / (262_144.0 - 1_024.0),
                map_pair_ns: 5_200.0 - 1_024.0 * (18_800.0 - 5_200.0) / (262_144.0 - 1_024.0),
                pin_ns_per_byte: 0.0,
                mapped_read_ns: 1_700.0,
                mapped_write_ns: 90.0,
                mapped_bulk_read_gbps: 0.3,
                pins_mirrors: false,
            }),
            "h200" => Some(CostModel {
                name: "h200",
                h2d_call_ns: 6_500.0,
                d2h_call_ns: 6_500.0,
                memset_call_ns: 6_500.0,
                pinned_gbps: 54.0,
                pageable_gbps: 13.5,
                memset_gbps: 2_000.0,
                malloc_ns: 10_000.0,
                free_ns: 5_000.0,
                map_pair_ns: 10_000.0,
                map_pair_ns_per_byte: 0.0,
                pin_ns_per_byte: 0.1,
                mapped_read_ns: 1_700.0,
                mapped_write_ns: 90.0,
                mapped_bulk_read_gbps: 0.3,
                pins_mirrors: true,
            }),
            _ => None,
        }
    }

    /// What one successful driver operation of `bytes` costs; `pinned`: its host side is
    /// page-locked memory.
    pub fn op_ns(&self, op: Op, bytes: u64, pinned: bool) -> u64 {
        let b = bytes as f64;
        let bw = if pinned {
            self.pinned_gbps
        } else {
            self.pageable_gbps
        };
        let ns = match op {
            Op::H2d => self.h2d_call_ns + b / bw,
            Op::D2h => self.d2h_call_ns + b / bw,
            Op::Memset => self.memset_call_ns + b / self.memset_gbps,
            Op::Alloc => self.malloc_ns,
            Op::Free => self.free_ns,
            Op::Map | Op::Unmap => (self.map_pair_ns + self.map_pair_ns_per_byte * b) / 2.0,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(ns: u64) -> f64 {
        ns as f64 / 1_000.0
    }

    #[test]
    fn the_models_reproduce_the_reference_figures_they_come_from() {
        let a3 = CostModel::named("ascend-a3").unwrap();
        // A small aclrtMemcpy D2H: ~9.5 us.
        assert!((us(a3.op_ns(Op::D2h, 64, false)) - 9.5).abs() < 0.01);
        // A halHostRegister + halHostUnregister pair: 5.2 us at 1 KiB, 18.8 us at 256 KiB.
        let pair = |b| us(a3.op_ns(Op::Map, b, false) + a3.op_ns(Op::Unmap, b, false));
        assert!((pair(1 << 10) - 5.2).abs() < 0.01, "{}", pair(1 << 10));
        assert!((pair(256 << 10) - 18.8).abs() < 0.01, "{}", pair(256 << 10));
        let h200 = CostModel::named("h200").unwrap();
        // 256 MiB H2D at 53-55 GB/s pinned, 10-17 GB/s pageable.
        let gbps = |ns: u64| (256u64 << 20) as f64 / ns as f64;
        let pinned = gbps(h200.op_ns(Op::H2d, 256 << 20, true));
        let pageable = gbps(h200.op_ns(Op::H2d, 256 << 20, false));
        assert!((53.0..=55.0).contains(&pinned), "{pinned}");
        assert!((10.0..=17.0).contains(&pageable), "{pageable}");
        // cudaMemcpy fixed overhead 6-7 us.
        assert!((6.0..=7.0).contains(&us(h200.op_ns(Op::D2h, 4, true))));
        // A mapped 4-byte read 1.7 us, write 0.09 us (GDRCopy).
        assert_eq!(h200.mapped_access_ns(1, 0), 1_700);
        assert_eq!(h200.mapped_access_ns(0, 1), 90);
        // cudaHostRegister ~0.1 s/GB.
        assert_eq!(h200.op_ns(Op::Pin, 1_000_000_000, false), 100_000_000);
        assert!(CostModel::named("tpu").is_none());
    }
}
