//! Which NVRTC compiles for this driver and device, and for which target.
//!
//! A machine often has several NVRTC libraries: the CUDA 13 wheel, the CUDA 12 wheel torch
//! brings, a toolkit. Each makes code for the drivers of its major version and newer: a CUDA 13
//! NVRTC's cubins and PTX do not load on a CUDA 12 driver (below 580). So every candidate the
//! search finds ([`super::loading`]) is asked for its version and the architectures it can
//! target (`nvrtcGetSupportedArchs`), and [`select`] keeps:
//!
//! * only candidates whose major version is at most the driver's (minor version compatibility
//!   lets a cubin of a newer minor load on an older driver of the same major);
//! * the target: a cubin for the device's own architecture (`sm_XY`) when the candidate lists
//!   it, else a cubin for the newest architecture of the same major version below it (a cubin
//!   runs on later minor versions of its major: `sm_80` on 8.6), else PTX for the newest
//!   `compute_XY` it knows below the device's, which the driver compiles for the device when it
//!   loads it. PTX is read by the driver's own compiler, which
//!   refuses PTX of a newer toolkit than the driver's (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`),
//!   so a candidate that would need the PTX route must be no newer than the driver (major and
//!   minor); one that knows no architecture at or below the device's is not usable at all;
//! * the newest usable candidate (the search order breaks ties).
//!
//! Without a driver version (compiling with no device, in a test) every candidate is usable;
//! without a compute capability there is no target. [`choose`] caches the choice per search,
//! driver and capability (the libraries already loaded count as they were at that first
//! question), and says once, in one line, which NVRTC, driver and target it took
//! (a warning when it passed over a newer NVRTC or fell back to PTX, else at info level).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::loading::{self, Search, SearchEnv, LIBRARY};
use super::{Nvrtc, Target};
use crate::loader::{LoadAttempt, LoadError};

/// One NVRTC the search found, as the choice judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The path (or name) it was opened by, or `"<soname> (already loaded in this process)"`.
    pub path: String,
    /// `nvrtcVersion`.
    pub version: (i32, i32),
    /// The architectures it can target (`90` for `sm_90`), when it says.
    pub archs: Option<Vec<u32>>,
    /// Whether it could compile for this driver and device.
    pub usable: bool,
    /// Why it was (not) usable, in words.
    pub why: String,
    /// The target it would compile for (given a compute capability).
    pub target: Option<Target>,
}

/// What [`choose`] decided.
#[derive(Debug)]
pub struct Choice {
    /// The NVRTC that compiles.
    pub nvrtc: Arc<Nvrtc>,
    /// The index of that NVRTC in `candidates`.
    pub chosen: usize,
    /// What it compiles for the device (none without a compute capability).
    pub target: Option<Target>,
    /// The driver's CUDA version `(major, minor)`, when known.
    pub driver: Option<(u32, u32)>,
    /// The device's compute capability, when known.
    pub capability: Option<(u32, u32)>,
    /// Every NVRTC the search found, in search order.
    pub candidates: Vec<Candidate>,
}

impl Choice {
    /// One line: which NVRTC (path, version), which driver, which target, and what else was
    /// found and why it was not taken.
    pub fn summary(&self) -> String {
        let c = &self.candidates[self.chosen];
        let mut s = format!("NVRTC {}.{} ({})", c.version.0, c.version.1, c.path);
        match self.driver {
            Some((a, b)) => write!(s, " for CUDA driver {a}.{b}"),
            None => write!(s, " (driver version unknown)"),
        }
        .ok();
        if let Some((a, b)) = self.capability {
            write!(s, ", compute capability {a}.{b}").ok();
        }
        if let Some(t) = self.target {
            write!(s, ": {}", t.describe()).ok();
        }
        let others: Vec<String> = self
            .candidates
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.chosen)
            .map(|(_, c)| {
                format!(
                    "NVRTC {}.{} ({}): {}",
                    c.version.0, c.version.1, c.path, c.why
                )
            })
            .collect();
        if !others.is_empty() {
            write!(s, "; also found: {}", others.join("; ")).ok();
        }
        s
    }

    /// Whether the choice is worth a warning: a newer NVRTC was passed over, or the device
    /// gets PTX instead of its own cubin.
    pub fn notable(&self) -> bool {
        let newest = self.candidates.iter().map(|c| c.version).max();
        matches!(self.target, Some(Target::Ptx { .. }))
            || newest.is_some_and(|v| v > self.candidates[self.chosen].version)
    }
}

/// What [`select`] needs of a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Probe {
    pub path: String,
    pub version: (i32, i32),
    pub archs: Option<Vec<u32>>,
}

/// The target a candidate compiles for a device of capability `cc`, or why it cannot (see the
/// module docs).
fn target_for(p: &Probe, cc: (u32, u32)) -> Result<Target, String> {
    let (major, minor) = cc;
    let want = major * 10 + minor;
    let Some(archs) = &p.archs else {
        return Ok(Target::Cubin { major, minor });
    };
    if archs.contains(&want) {
        return Ok(Target::Cubin { major, minor });
    }
    // A cubin of the same major architecture, older minor, runs on the device (sm_80 on 8.6).
    if let Some(a) = archs
        .iter()
        .copied()
        .filter(|&a| a / 10 == major && a <= want)
        .max()
    {
        return Ok(Target::Cubin {
            major: a / 10,
            minor: a % 10,
        });
    }
    match archs.iter().copied().filter(|&a| a <= want).max() {
        Some(a) => Ok(Target::Ptx {
            major: a / 10,
            minor: a % 10,
        }),
        None => Err(format!(
            "targets none of compute capability {major}.{minor} or older (its oldest is {})",
            archs
                .iter()
                .min()
                .map_or("none".to_string(), |a| format!("{}.{}", a / 10, a % 10))
        )),
    }
}

/// Judges every probe for `driver` and `cc` and picks the newest usable one (see the module
/// docs): the judged candidates, and the index of the chosen one.
pub(crate) fn select(
    probes: &[Probe],
    driver: Option<(u32, u32)>,
    cc: Option<(u32, u32)>,
) -> (Vec<Candidate>, Option<usize>) {
    let as_i = |(a, b): (u32, u32)| (a as i64, b as i64);
    let mut out = Vec::with_capacity(probes.len());
    for p in probes {
        let v = (i64::from(p.version.0), i64::from(p.version.1));
        let vmaj = p.version.0;
        let target = match cc.map(|cc| target_for(p, cc)) {
            Some(Err(why)) => {
                out.push(Candidate {
                    path: p.path.clone(),
                    version: p.version,
                    archs: p.archs.clone(),
                    usable: false,
                    why,
                    target: None,
                });
                continue;
            }
            Some(Ok(t)) => Some(t),
            None => None,
        };
        let (usable, why) = match driver.map(as_i) {
            Some((dmaj, dmin)) if v.0 > dmaj => (
                false,
                format!(
                    "makes code for CUDA {vmaj} drivers, and this driver is CUDA {dmaj}.{dmin}"
                ),
            ),
            Some((dmaj, dmin))
                if matches!(target, Some(Target::Ptx { .. })) && v > (dmaj, dmin) =>
            {
                (
                    false,
                    format!(
                        "cannot make a cubin for this device, and its PTX is newer than this CUDA \
                     {dmaj}.{dmin} driver's compiler reads"
                    ),
                )
            }
            _ => (true, "usable".to_string()),
        };
        out.push(Candidate {
            path: p.path.clone(),
            version: p.version,
            archs: p.archs.clone(),
            usable,
            why,
            target,
        });
    }
    let mut chosen: Option<usize> = None;
    for (i, c) in out.iter().enumerate() {
        if c.usable && chosen.is_none_or(|j| c.version > out[j].version) {
            chosen = Some(i);
        }
    }
    if let Some(j) = chosen {
        let v = out[j].version;
        for (i, c) in out.iter_mut().enumerate() {
            if i == j {
                c.why = "chosen".to_string();
            } else if c.usable {
                c.why = if c.version < v {
                    format!("usable, older than {}.{}", v.0, v.1)
                } else {
                    "usable, found later in the search".to_string()
                };
            }
        }
    }
    (out, chosen)
}

/// The choice cache's key: the search's inputs, the driver and the capability.
type Key = (
    SearchEnv,
    Vec<PathBuf>,
    Option<(u32, u32)>,
    Option<(u32, u32)>,
);
/// The choices made so far (a few per process: a list, searched in order).
static CHOICES: Mutex<Vec<(Key, Arc<Choice>)>> = Mutex::new(Vec::new());

/// The NVRTC (and target) for a driver of CUDA version `driver` and a device of capability
/// `cc`, from the search over the process environment and `extra_dirs` (see the module docs).
/// Cached: the search runs once per distinct question; a failure is not remembered, so the
/// next call searches again (after the user installed a wheel, say). The error lists every
/// library tried, its version and why it was not usable, and how to fix it.
pub fn choose(
    extra_dirs: &[PathBuf],
    driver: Option<(u32, u32)>,
    cc: Option<(u32, u32)>,
) -> Result<Arc<Choice>, LoadError> {
    let env = SearchEnv::from_process();
    choose_in(env, extra_dirs, driver, cc, true)
}

pub(crate) fn choose_in(
    env: SearchEnv,
    extra_dirs: &[PathBuf],
    driver: Option<(u32, u32)>,
    cc: Option<(u32, u32)>,
    reuse_resident: bool,
) -> Result<Arc<Choice>, LoadError> {
    let key: Key = (env.clone(), extra_dirs.to_vec(), driver, cc);
    let mut made = CHOICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, c)) = made.iter().find(|(k, _)| *k == key) {
        return Ok(Arc::clone(c));
    }
    let search = loading::search(&env, extra_dirs);
    let choice = Arc::new(decide(&search, driver, cc, reuse_resident)?);
    let line = choice.summary();
    if choice.notable() {
        log::warn!("device code: {line}");
    } else {
        log::info!("device code: {line}");
    }
    made.push((key, Arc::clone(&choice)));
    Ok(choice)
}

/// Runs the search and the selection (no cache).
pub(crate) fn decide(
    search: &Search,
    driver: Option<(u32, u32)>,
    cc: Option<(u32, u32)>,
    reuse_resident: bool,
) -> Result<Choice, LoadError> {
    let (found, mut failed) = loading::find_all(search, reuse_resident);
    let mut libs: Vec<Nvrtc> = Vec::new();
    for f in found {
        match Nvrtc::from_found(f) {
            Ok(n) => libs.push(n),
            Err(e) => failed.push(LoadAttempt {
                path: f.lib.path.to_string(),
                error: e.to_string(),
            }),
        }
    }
    if libs.is_empty() {
        return Err(loading::none_opened(search, failed));
    }
    let probes: Vec<Probe> = libs
        .iter()
        .map(|n| Probe {
            path: n.library().to_string(),
            version: n.version(),
            archs: n.archs().map(<[u32]>::to_vec),
        })
        .collect();
    let (candidates, chosen) = select(&probes, driver, cc);
    let Some(chosen) = chosen else {
        let tried = candidates
            .iter()
            .map(|c| LoadAttempt {
                path: c.path.clone(),
                error: format!("NVRTC {}.{}: {}", c.version.0, c.version.1, c.why),
            })
            .chain(failed)
            .collect();
        let hint = match driver {
            Some((d, _)) => format!(
                "install the NVRTC of CUDA {d} (`pip install nvidia-cuda-nvrtc-cu{d}` for CUDA \
                 12; `pip install nvidia-cuda-nvrtc` for CUDA 13) or a CUDA {d} toolkit, or \
                 point SIMPLER_NVRTC_LIB at one; or update the GPU driver"
            ),
            None => search.hint.clone(),
        };
        return Err(LoadError::Library {
            library: LIBRARY.to_string(),
            tried,
            hint,
        });
    };
    let target = candidates[chosen].target;
    let nvrtc = Arc::new(libs.swap_remove(chosen));
    Ok(Choice {
        nvrtc,
        chosen,
        target,
        driver,
        capability: cc,
        candidates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(path: &str, version: (i32, i32), archs: Option<&[u32]>) -> Probe {
        Probe {
            path: path.to_string(),
            version,
            archs: archs.map(<[u32]>::to_vec),
        }
    }

    const A12: &[u32] = &[50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
    const A13: &[u32] = &[75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];

    #[test]
    fn a_cuda_12_driver_takes_the_cuda_12_nvrtc_though_a_13_comes_first() {
        let probes = [
            probe("cu13/libnvrtc.so.13", (13, 0), Some(A13)),
            probe("cuda_nvrtc/libnvrtc.so.12", (12, 8), Some(A12)),
        ];
        let (c, chosen) = select(&probes, Some((12, 4)), Some((9, 0)));
        assert_eq!(chosen, Some(1));
        assert!(!c[0].usable);
        assert!(
            c[0].why
                .contains("makes code for CUDA 13 drivers, and this driver is CUDA 12.4"),
            "{}",
            c[0].why
        );
        assert_eq!(c[1].target, Some(Target::Cubin { major: 9, minor: 0 }));
        assert_eq!(c[1].why, "chosen");
        // A CUDA 13 driver takes the newest.
        let (c, chosen) = select(&probes, Some((13, 0)), Some((9, 0)));
        assert_eq!(chosen, Some(0));
        assert_eq!(c[1].why, "usable, older than 13.0");
    }

    #[test]
    fn the_version_rule_same_major_newer_minor_is_accepted_newer_major_refused() {
        let p = [probe("n", (12, 8), Some(A12))];
        assert_eq!(select(&p, Some((12, 2)), Some((9, 0))).1, Some(0));
        assert_eq!(select(&p, Some((12, 8)), Some((9, 0))).1, Some(0));
        assert_eq!(select(&p, Some((11, 8)), Some((9, 0))).1, None);
        let p = [probe("n", (13, 0), Some(A13))];
        assert_eq!(select(&p, Some((12, 9)), Some((9, 0))).1, None);
        assert_eq!(select(&p, Some((13, 0)), Some((9, 0))).1, Some(0));
        // No driver version: anything goes.
        assert_eq!(select(&p, None, Some((9, 0))).1, Some(0));
    }

    #[test]
    fn a_device_newer_than_nvrtc_gets_ptx_for_the_newest_architecture_it_knows() {
        let p = [probe("n", (12, 4), Some(A12))];
        let (c, chosen) = select(&p, Some((12, 8)), Some((12, 0)));
        assert_eq!(chosen, Some(0));
        assert_eq!(c[0].target, Some(Target::Ptx { major: 9, minor: 0 }));
        // The PTX route needs a driver at least as new as the NVRTC.
        let (c, chosen) = select(&p, Some((12, 2)), Some((12, 0)));
        assert_eq!(chosen, None);
        assert!(c[0].why.contains("PTX is newer"), "{}", c[0].why);
        // A device older than every architecture NVRTC knows.
        let p = [probe("n", (13, 0), Some(A13))];
        let (c, chosen) = select(&p, Some((13, 0)), Some((7, 0)));
        assert_eq!(chosen, None);
        assert!(c[0].why.contains("its oldest is 7.5"), "{}", c[0].why);
        // An older minor of the same major: its cubin runs on the device, no PTX needed.
        let p = [probe("n", (12, 8), Some(&[75, 80, 90]))];
        let (c, _) = select(&p, Some((12, 2)), Some((8, 6)));
        assert_eq!(c[0].target, Some(Target::Cubin { major: 8, minor: 0 }));
        // Without the query, the device's own cubin is asked for.
        let p = [probe("n", (11, 0), None)];
        let (c, _) = select(&p, Some((12, 0)), Some((8, 6)));
        assert_eq!(c[0].target, Some(Target::Cubin { major: 8, minor: 6 }));
    }

    #[test]
    fn ties_go_to_the_first_found_and_the_summary_says_what_else_was_there() {
        let probes = [
            probe("a/libnvrtc.so.12", (12, 8), Some(A12)),
            probe("b/libnvrtc.so.12", (12, 8), Some(A12)),
            probe("c/libnvrtc.so.13", (13, 1), Some(A13)),
        ];
        let (c, chosen) = select(&probes, Some((12, 9)), Some((9, 0)));
        assert_eq!(chosen, Some(0));
        assert_eq!(c[1].why, "usable, found later in the search");
    }
}
