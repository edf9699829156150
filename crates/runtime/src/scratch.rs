//! The retained scratch pool that run-scoped tensors (`orch.scratch`) are carved from.
//!
//! A scratch tensor lives until its run's cleanup, so each run carves from the start of the pool
//! again. Chunks are allocated when a run needs more than the pool holds (each at least
//! [`SCRATCH_CHUNK`] and at least double the last) and kept, so a warm run with the same
//! footprint does no device malloc.

use simpler_driver::DevPtr;

use crate::error::{Error, Phase, Result};
use crate::geometry::align_up;
use crate::memory::{Memory, Owner};
use crate::staging::SLICE_ALIGN;

/// Smallest chunk.
pub const SCRATCH_CHUNK: u64 = 1 << 20;

/// Where the next carve of a run goes: (chunk index, byte offset in it).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Cursor {
    chunk: usize,
    offset: u64,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct ScratchPool {
    chunks: Vec<(DevPtr, u64)>,
}

impl ScratchPool {
    /// The pool's chunks (base, size).
    pub fn chunks(&self) -> &[(DevPtr, u64)] {
        &self.chunks
    }

    /// Carves `extent` bytes (aligned) at `cursor`, growing the pool when no chunk from the
    /// cursor on has room. Returns the chunk (base, size) and the byte offset in it.
    pub(crate) fn carve(
        &mut self,
        mem: &mut Memory,
        cursor: &mut Cursor,
        extent: u64,
        name: &str,
    ) -> Result<(DevPtr, u64, u64)> {
        let need = align_up(extent, SLICE_ALIGN)?;
        let (mut chunk, mut off) = (cursor.chunk, cursor.offset);
        loop {
            match self.chunks.get(chunk) {
                Some(&(_, cap)) if off.checked_add(need).is_some_and(|e| e <= cap) => break,
                Some(_) => {
                    chunk += 1;
                    off = 0;
                }
                None => {
                    let last = self.chunks.last().map_or(0, |c| c.1);
                    let cap = need.max(SCRATCH_CHUNK).max(last.saturating_mul(2));
                    let buf = mem.alloc(cap, Owner::Staging, Phase::Orchestrate, Some(name))?;
                    self.chunks.push((buf.ptr, cap));
                    chunk = self.chunks.len() - 1;
                    off = 0;
                    break;
                }
            }
        }
        let (base, cap) = self.chunks[chunk];
        *cursor = Cursor {
            chunk,
            offset: off + need,
        };
        Ok((base, cap, off))
    }

    /// Frees every chunk, newest first (views first). On a failure the rest stays, so a retry
    /// frees it.
    pub(crate) fn trim(&mut self, mem: &mut Memory) -> Result<()> {
        while let Some(&(p, cap)) = self.chunks.last() {
            mem.release(p).map_err(|e| {
                Error::device(
                    Phase::Buffer,
                    Some(&format!("<scratch pool chunk of {cap} bytes>")),
                    e,
                )
            })?;
            self.chunks.pop();
        }
        Ok(())
    }

    /// Forgets the chunks (the worker's close released every allocation).
    pub(crate) fn forget(&mut self) {
        self.chunks.clear();
    }
}
