//! The sim driver through the shared conformance checks (its own unit tests are in
//! `src/sim/tests.rs`).

mod common;

use simpler_driver::sim::{SimConfig, SimDevice, SvmPolicy};
use simpler_driver::Device;

#[test]
fn sim_conforms() {
    for (what, config) in [
        ("sim", SimConfig::default()),
        (
            "sim reusing addresses",
            SimConfig {
                reuse_addresses: true,
                ..SimConfig::default()
            },
        ),
        (
            "sim mapping nothing",
            SimConfig {
                svm: SvmPolicy::Never,
                ..SimConfig::default()
            },
        ),
    ] {
        let d = SimDevice::new(config);
        assert_eq!(d.platform(), "sim");
        common::conformance(&d, what);
        assert!(!d.closed(), "{what}: sim stays usable after close");
        d.free(d.alloc(8).unwrap()).unwrap();
    }
}
