//! Resident sets: the case-owned device buffers of `ResidentTaskArgs`.
//!
//! A set is opened empty; `add` validates a fixture completely before allocating, uploads it
//! unless it is OUT, and frees what it allocated when the upload fails. `release` frees in LIFO
//! order, attempting every free even when one fails, and is idempotent.

use std::collections::BTreeMap;

use crate::error::{Error, Phase, Result};
use crate::geometry::Geometry;
use crate::memory::{Memory, Owner};
use crate::spec::{BufferRef, Direction};

#[derive(Debug)]
struct Entry {
    name: String,
    /// `None` for a fixture without bytes (it stays host-staged).
    buf: Option<BufferRef>,
}

/// The worker's resident sets, by id.
#[derive(Debug)]
pub struct ResidentSets {
    sets: BTreeMap<u64, Vec<Entry>>,
    next: u64,
}

impl Default for ResidentSets {
    fn default() -> Self {
        ResidentSets {
            sets: BTreeMap::new(),
            next: 1,
        }
    }
}

impl ResidentSets {
    /// Opens an empty set; returns its id.
    pub(crate) fn open(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        self.sets.insert(id, Vec::new());
        id
    }

    /// Ids of the open sets, newest first.
    pub(crate) fn ids_newest_first(&self) -> Vec<u64> {
        self.sets.keys().rev().copied().collect()
    }

    /// The buffers of `set`, in add order.
    pub(crate) fn buffers(&self, set: u64) -> impl Iterator<Item = (&str, BufferRef)> {
        self.sets
            .get(&set)
            .into_iter()
            .flatten()
            .filter_map(|e| e.buf.map(|b| (e.name.as_str(), b)))
    }

    /// Makes a host fixture resident in `set` under `name`. Everything is checked before the
    /// allocation: the set is open, the name is new, the fixture is contiguous from its first
    /// byte and `host` holds exactly its bytes. A fixture without bytes is not made resident:
    /// it stays host-staged, and `Ok(None)` says so. On a failure after the allocation nothing
    /// this call allocated stays live.
    pub(crate) fn add(
        &mut self,
        mem: &mut Memory,
        set: u64,
        name: &str,
        geometry: &Geometry,
        dir: Direction,
        host: &[u8],
    ) -> Result<Option<BufferRef>> {
        let what = format!("resident tensor '{name}'");
        let entries = self
            .sets
            .get(&set)
            .ok_or_else(|| Error::State(format!("{what}: its resident set was released")))?;
        if entries.iter().any(|e| e.name == name) {
            return Err(Error::Value(format!("{what} was already added")));
        }
        geometry.require_contiguous(&what)?;
        let bytes = geometry.nbytes();
        if bytes == 0 {
            log::debug!("{what} has no bytes: it stays host-staged");
            if let Some(entries) = self.sets.get_mut(&set) {
                entries.push(Entry {
                    name: name.to_owned(),
                    buf: None,
                });
            }
            return Ok(None);
        }
        if host.len() as u64 != bytes {
            return Err(Error::Value(format!(
                "{what}: {} host bytes for a {bytes}-byte tensor",
                host.len()
            )));
        }
        let buf = mem.alloc(bytes, Owner::Resident(set), Phase::ResidentAdd, Some(name))?;
        if dir.reads() {
            if let Err(e) = mem.dev.copy_h2d(buf.ptr, host) {
                let err = Error::device(Phase::ResidentAdd, Some(name), e);
                let _ = mem.release_or_orphan(
                    buf.ptr,
                    &format_args!("resident add '{name}' after a failed upload"),
                );
                return Err(err);
            }
        }
        if let Some(entries) = self.sets.get_mut(&set) {
            entries.push(Entry {
                name: name.to_owned(),
                buf: Some(buf),
            });
        }
        Ok(Some(buf))
    }

    /// Takes back the newest entry of `set`, `name` (an add whose later steps failed): its
    /// allocation is released (or orphaned for `close`, logged) and the name is free again.
    pub(crate) fn roll_back(&mut self, mem: &mut Memory, set: u64, name: &str) -> Result<()> {
        let entries = self
            .sets
            .get_mut(&set)
            .filter(|e| e.last().is_some_and(|e| e.name == name))
            .ok_or_else(|| {
                Error::State(format!(
                    "resident tensor '{name}': not the newest entry of its set, cannot roll back"
                ))
            })?;
        let Some(Entry { buf, .. }) = entries.pop() else {
            return Ok(());
        };
        if let Some(b) = buf {
            mem.release_or_orphan(b.ptr, &format_args!("rollback of resident tensor '{name}'"))
                .map_err(|e| Error::device(Phase::ResidentAdd, Some(name), e))?;
        }
        Ok(())
    }

    /// Releases `set` in LIFO order, attempting every free even when one fails (each failure is
    /// logged and returned; the allocation stays as an orphan that `close` retries). Releasing
    /// a released set does nothing.
    pub(crate) fn release(&mut self, mem: &mut Memory, set: u64) -> Vec<Error> {
        let entries = self.sets.remove(&set).unwrap_or_default();
        let mut errors = Vec::new();
        for e in entries.into_iter().rev() {
            let Some(buf) = e.buf else { continue };
            let what = format_args!("release of resident tensor '{}'", e.name);
            if let Err(err) = mem.release_or_orphan(buf.ptr, &what) {
                errors.push(Error::device(Phase::Release, Some(&e.name), err));
            }
        }
        errors
    }

    /// Forgets `set` without freeing anything (the device's context is gone: its memory went
    /// with it).
    pub(crate) fn forget(&mut self, set: u64) {
        self.sets.remove(&set);
    }
}
