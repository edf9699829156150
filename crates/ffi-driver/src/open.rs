//! Opening a device by platform name, with the options the Python `Worker` accepts.

use std::sync::Arc;

use crate::ascend::{AscendConfig, AscendDevice, MallocPolicy};
use crate::cuda::{CudaConfig, CudaDevice};
use crate::sim::{SimConfig, SimDevice, SvmPolicy};
use crate::Device;
use crate::POISON;

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
    /// sim: price every operation with named cost models (`"ascend-a3"`, `"h200"`, or both,
    /// comma-separated: `"ascend-a3,h200"`, the first being the primary model).
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

impl DeviceSpec {
    /// Checks the options against the platform without opening anything (front ends check
    /// before they run, so a bad combination is one usage error, not a failure per case): an
    /// unknown platform, a sim option on a vendor platform, an ascend option elsewhere, an
    /// unknown model or malloc policy, a second sim device.
    pub fn validate(&self) -> Result<(), OpenError> {
        let platform = self.platform.as_str();
        if !PLATFORMS.contains(&platform) {
            return Err(OpenError::Invalid(format!(
                "unknown platform '{platform}' (expected one of {})",
                PLATFORMS.join(", ")
            )));
        }
        if platform != "ascend" && self.malloc_policy.is_some() {
            return Err(OpenError::Invalid(
                "malloc_policy is an ascend option".into(),
            ));
        }
        if platform == "sim" {
            if self.device_id.is_some_and(|d| d != 0) {
                return Err(OpenError::Invalid(
                    "sim has a single device (device_id=0)".into(),
                ));
            }
            if let Some(names) = &self.model {
                crate::CostModel::parse_list(names).map_err(OpenError::Invalid)?;
            }
        } else if self.svm.is_some()
            || self.capacity.is_some()
            || self.reuse_addresses.is_some()
            || self.model.is_some()
        {
            return Err(OpenError::Invalid(format!(
                "svm / capacity / reuse_addresses / model are sim options; platform '{platform}' \
                 does not take them (its driver reuses addresses by itself, and it is measured, \
                 not modeled)"
            )));
        }
        if let Some(p) = &self.malloc_policy {
            if MallocPolicy::parse(p).is_none() {
                return Err(OpenError::Invalid(format!(
                    "malloc_policy must be huge_first, huge_only or normal_only, not '{p}'"
                )));
            }
        }
        Ok(())
    }
}

/// Opens the device `spec` names (after [`DeviceSpec::validate`]).
pub fn open_device(spec: &DeviceSpec) -> Result<Arc<dyn Device>, OpenError> {
    spec.validate()?;
    if spec.platform != "sim" {
        return open_vendor(&spec.platform, spec);
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
    if let Some(names) = &spec.model {
        cfg.models = crate::CostModel::parse_list(names).map_err(OpenError::Invalid)?;
    }
    Ok(Arc::new(SimDevice::new(cfg)))
}

/// Opens a vendor device; `spec` is valid (checked by [`DeviceSpec::validate`]).
fn open_vendor(platform: &str, spec: &DeviceSpec) -> Result<Arc<dyn Device>, OpenError> {
    let unavailable =
        |e: crate::LoadError| OpenError::Unavailable(format!("platform '{platform}': {e}"));
    let device_id = spec.device_id.unwrap_or(0);
    if platform == "ascend" {
        let mut cfg = AscendConfig {
            device_id,
            ..AscendConfig::default()
        };
        if let Some(p) = spec.malloc_policy.as_deref().and_then(MallocPolicy::parse) {
            cfg.malloc_policy = p;
        }
        let dev = AscendDevice::open(cfg).map_err(unavailable)?;
        let key = dev.session_key();
        let dev: Arc<dyn Device> = Arc::new(dev);
        crate::sessions::track(key, &dev);
        Ok(dev)
    } else {
        let cfg = CudaConfig {
            device_id,
            ..CudaConfig::default()
        };
        let dev = CudaDevice::open(cfg).map_err(unavailable)?;
        let key = dev.session_key();
        let dev: Arc<dyn Device> = Arc::new(dev);
        crate::sessions::track(key, &dev);
        Ok(dev)
    }
}
