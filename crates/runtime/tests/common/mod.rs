//! A Rust host for the run cycle: the same entry point the Python bindings use, with Rust
//! closures for the orchestration and the kernels.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Instant;

use simpler_driver::sim::{SimConfig, SimDevice, SvmPolicy};
use simpler_runtime::{
    run, ArgValue, DType, Direction, Geometry, KernelRef, Orch, Param, RunArgSpec, RunCall,
    RunError, RunHost, RunId, RunReport, Signature, Staging, TaskCall, Worker,
};

pub type Cell = Mutex<Worker>;

/// A worker over a fresh sim device.
pub fn sim(svm: SvmPolicy, staging: Staging) -> (Cell, Arc<SimDevice>) {
    let dev = Arc::new(SimDevice::new(SimConfig {
        svm,
        ..SimConfig::default()
    }));
    (Mutex::new(Worker::new(dev.clone(), staging, true)), dev)
}

pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn geo(dtype: DType, shape: &[u64]) -> Geometry {
    Geometry::contiguous(&"t", dtype, shape).unwrap()
}

pub fn sig(dirs: &[Direction]) -> Signature {
    Signature::new(dirs.iter().map(|&dir| Param { dir, dtype: None }).collect())
}

/// A signature whose parameters may require a dtype.
pub fn typed_sig(params: &[(Direction, Option<DType>)]) -> Signature {
    Signature::new(
        params
            .iter()
            .map(|&(dir, dtype)| Param { dir, dtype })
            .collect(),
    )
}

pub fn staged(name: &str, g: Geometry) -> RunArgSpec {
    RunArgSpec {
        name: name.into(),
        value: ArgValue::Staged {
            geometry: g,
            writable: true,
        },
    }
}

type OrchFn<'a> = Box<dyn FnMut(RunId) -> Result<(), String> + 'a>;
type KernelFn<'a> = Box<dyn FnMut(&TaskCall) -> Result<(), String> + 'a>;

/// The host: staged arrays as byte vectors, an orchestration closure, kernels by id.
pub struct Host<'a> {
    pub staged: Vec<Vec<u8>>,
    pub orchestrate: OrchFn<'a>,
    pub kernels: Vec<KernelFn<'a>>,
    /// Fail the n-th checkpoint (1-based) with "interrupted".
    pub interrupt_at: Option<u32>,
    checkpoints: u32,
}

impl<'a> Host<'a> {
    pub fn new(
        staged: Vec<Vec<u8>>,
        orchestrate: impl FnMut(RunId) -> Result<(), String> + 'a,
    ) -> Self {
        Host {
            staged,
            orchestrate: Box::new(orchestrate),
            kernels: Vec::new(),
            interrupt_at: None,
            checkpoints: 0,
        }
    }

    pub fn kernel(mut self, k: impl FnMut(&TaskCall) -> Result<(), String> + 'a) -> Self {
        self.kernels.push(Box::new(k));
        self
    }
}

impl RunHost for Host<'_> {
    type Error = String;

    fn lend_staged<R>(&mut self, f: impl FnOnce(&[&[u8]]) -> R) -> Result<R, String> {
        let v: Vec<&[u8]> = self.staged.iter().map(|b| b.as_slice()).collect();
        Ok(f(&v))
    }

    fn lend_output<R>(
        &mut self,
        staged: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, String> {
        Ok(f(&mut self.staged[staged]))
    }

    fn orchestrate(&mut self, run: RunId) -> Result<(), String> {
        (self.orchestrate)(run)
    }

    fn kernel(&mut self, call: &TaskCall) -> Result<(), String> {
        let k = self
            .kernels
            .get_mut(call.kernel as usize)
            .ok_or_else(|| format!("no kernel {}", call.kernel))?;
        k(call)
    }

    fn checkpoint(&mut self) -> Result<(), String> {
        self.checkpoints += 1;
        if self.interrupt_at == Some(self.checkpoints) {
            return Err("interrupted".into());
        }
        Ok(())
    }
}

/// Runs `call` on `cell` with `host`.
pub fn go(
    cell: &Cell,
    callable: &str,
    s: &Signature,
    args: &[RunArgSpec],
    host: &mut Host<'_>,
) -> Result<RunReport, RunError<String>> {
    run(
        cell,
        &RunCall {
            callable,
            sig: s,
            args,
        },
        host,
        Instant::now(),
    )
}

/// The orchestrator handle of `run` on `cell`.
pub fn orch(cell: &Cell, run: RunId) -> Orch<'_, Cell> {
    Orch { cell, run }
}

/// A kernel reference.
pub fn kernel<'a>(id: u32, name: &'a str, s: &'a Signature) -> KernelRef<'a> {
    KernelRef {
        id,
        name,
        sig: s,
        device: None,
        device_arrays: false,
        work: None,
        threads: None,
    }
}

/// Reads a window's bytes.
pub fn window_bytes(w: &simpler_runtime::HostWindow) -> Vec<u8> {
    let mut b = vec![0u8; w.len];
    w.mem.read(w.offset, &mut b).unwrap();
    b
}
