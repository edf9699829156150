//! Opening a device by platform name, with the options the Python `Worker` accepts.

use std::sync::Arc;

use crate::ascend::{AscendConfig, AscendDevice, MallocPolicy};
use crate::cuda::{CudaConfig, CudaDevice};
use crate::sim::{SimConfig, SimDevice, SvmPolicy, POISON};
use crate::Device;

/// The platforms [`open_device`] knows.
pub const PLATFORMS: [&str; 3] = ["sim", "ascend", "cuda"];

/// Options for [`open_device`]. Options that do not apply to a platform are rejected there.
#[derive(Debug, Clone, Default)]
pub struct DeviceSpec {
    /// `"sim"`, `"ascend"` or `"cuda"`.
    pub platform: String,
    /// sim: which allocations `map_host` grants.
    pub svm: Option<SvmPolicy>,
    /// Poison never-written memory (default true). On sim this also fills every fresh
    /// allocation; the runtime poisons staged outputs and scratch tensors on every platform.
    pub poison: Option<bool>,
    /// sim: simulated device capacity in bytes.
    pub capacity: Option<u64>,
    /// sim: hand freed device addresses out again, as real drivers do.
    pub reuse_addresses: Option<bool>,
    /// sim: price every operation with a named cost model (`"ascend-a3"`, `"h200"`).
    pub model: Option<String>,
    /// ascend / cuda: the (logical) device id.
    pub device_id: Option<u32>,
    /// ascend: `"huge_first"` (default), `"huge_only"` or `"normal_only"`.
    pub malloc_policy: Option<String>,
}

/// Why a device could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// An unknown platform or an option the platform does not take.
    #[error("{0}")]
    Invalid(String),
    /// The vendor library could not be loaded or initialized.
    #[error("{0}")]
    Unavailable(String),
}

/// Opens the device `spec` names.
pub fn open_device(spec: &DeviceSpec) -> Result<Arc<dyn Device>, OpenError> {
    match spec.platform.as_str() {
        "sim" => {
            if spec.malloc_policy.is_some() {
                return Err(OpenError::Invalid(
                    "malloc_policy is an ascend option".into(),
                ));
            }
            if spec.device_id.is_some_and(|d| d != 0) {
                return Err(OpenError::Invalid(
                    "sim has a single device (device_id=0)".into(),
                ));
            }
            let mut cfg = SimConfig::default();
            if let Some(s) = spec.svm {
                cfg.svm = s;
            }
            if let Some(p) = spec.poison {
                cfg.poison = p.then_some(POISON);
            }
            if let Some(c) = spec.capacity {
                cfg.capacity = c;
            }
            if let Some(r) = spec.reuse_addresses {
                cfg.reuse_addresses = r;
            }
            if let Some(name) = &spec.model {
                cfg.model = Some(crate::CostModel::named(name).ok_or_else(|| {
                    OpenError::Invalid(format!(
                        "model must be one of {}, not '{name}'",
                        crate::model::MODELS.join(", ")
                    ))
                })?);
            }
            Ok(Arc::new(SimDevice::new(cfg)))
        }
        other => {
            if spec.svm.is_some()
                || spec.capacity.is_some()
                || spec.reuse_addresses.is_some()
                || spec.model.is_some()
            {
                return Err(OpenError::Invalid(format!(
                    "svm / capacity / reuse_addresses / model are sim options; platform '{other}' \
                     does not take them (its driver reuses addresses by itself, and it is \
                     measured, not modeled)"
                )));
            }
            open_vendor(other, spec)
        }
    }
}

fn open_vendor(platform: &str, spec: &DeviceSpec) -> Result<Arc<dyn Device>, OpenError> {
    let unavailable =
        |e: crate::LoadError| OpenError::Unavailable(format!("platform '{platform}': {e}"));
    match platform {
        "ascend" => {
            let mut cfg = AscendConfig {
                device_id: spec.device_id.unwrap_or(0),
                ..AscendConfig::default()
            };
            if let Some(p) = &spec.malloc_policy {
                cfg.malloc_policy = MallocPolicy::parse(p).ok_or_else(|| {
                    OpenError::Invalid(format!(
                        "malloc_policy must be huge_first, huge_only or normal_only, not '{p}'"
                    ))
                })?;
            }
            Ok(Arc::new(AscendDevice::open(cfg).map_err(unavailable)?))
        }
        "cuda" => {
            if spec.malloc_policy.is_some() {
                return Err(OpenError::Invalid(
                    "malloc_policy is an ascend option".into(),
                ));
            }
            let cfg = CudaConfig {
                device_id: spec.device_id.unwrap_or(0),
                ..CudaConfig::default()
            };
            Ok(Arc::new(CudaDevice::open(cfg).map_err(unavailable)?))
        }
        _ => Err(OpenError::Invalid(format!(
            "unknown platform '{platform}' (known: {})",
            PLATFORMS.join(", ")
        ))),
    }
}
