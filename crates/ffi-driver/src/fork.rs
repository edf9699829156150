//! Which process a handle was opened in, and whether this is a forked child of it.
//!
//! A child made by `fork` inherits the parent's device handles, but not the right to use them:
//! CUDA documents `fork` after initialization as undefined behaviour, and on Ascend the child
//! also inherits the shared host mapping of device memory, so a child's write through it would
//! land in the parent's device memory. Every vendor device records a [`Stamp`] when it opens;
//! in a child, every use of it is refused before any vendor call and its foreign host mappings
//! refuse every access ([`crate::HostMem`]), so the child can neither call the driver nor write
//! through the parent's mappings, and its destructors give nothing back on the parent's behalf.
//!
//! A fork is detected with a `pthread_atfork` child handler (registered once, on the first
//! stamp) that counts forks: checking a stamp is one atomic load, no system call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// How many times this process image went through `fork` on the child's side: 0 in the process
/// that started, incremented in each child.
static FORKS: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn on_fork_child() {
    // Async-signal-safe: one atomic add, nothing else.
    FORKS.fetch_add(1, Ordering::AcqRel);
}

/// The process a handle belongs to (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The process id at open.
    pub pid: u32,
    generation: u64,
}

impl Stamp {
    /// The calling process, now. Registers the fork handler on first use.
    pub fn now() -> Stamp {
        REGISTER.call_once(|| {
            // SAFETY: `pthread_atfork(prepare, parent, child)` with null prepare and parent
            // handlers and a child handler that only touches an atomic; the function pointer
            // stays valid for the life of the process (it is a plain function of this crate,
            // which is never unloaded while the process runs: the extension stays loaded).
            let rc = unsafe { libc::pthread_atfork(None, None, Some(on_fork_child)) };
            if rc != 0 {
                log::warn!("pthread_atfork failed ({rc}): a forked child cannot be detected");
            }
        });
        Stamp {
            pid: std::process::id(),
            generation: FORKS.load(Ordering::Acquire),
        }
    }

    /// Whether the calling process is a forked child of the one this stamp was taken in.
    pub fn forked(&self) -> bool {
        FORKS.load(Ordering::Acquire) != self.generation
    }

    /// The refusal every use of a handle meets in a forked child.
    pub fn refusal(&self) -> String {
        format!(
            "worker opened in process {} used in a forked child (process {}): its device handles \
             are inert here (no vendor call is made, host mappings are revoked); a process that \
             initialized a device cannot hand it to a forked child: start worker processes with \
             the 'spawn' or 'forkserver' method (multiprocessing.get_context(\"spawn\"))",
            self.pid,
            std::process::id()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `answer` in a forked child and returns the byte it answered (9 when none came back).
    /// The answer comes back through a pipe (the child's exit status is not ours to read: a
    /// checker such as valgrind replaces it). `answer` may only make async-signal-safe calls
    /// (atomic loads, `getpid`, and `fork`, `read`, `write`, `waitpid`, `_exit` through this
    /// function): the test harness has other threads.
    fn in_child(answer: impl FnOnce() -> u8) -> u8 {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is valid for the two descriptors `pipe` writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only runs `answer`, which makes async-signal-safe calls (see above),
        // then writes and exits; the parent waits for it.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            let byte = [answer()];
            // SAFETY: `byte` is valid for the one byte written; `_exit` ends the child at once,
            // running nothing of the parent's.
            unsafe {
                libc::write(fds[1], byte.as_ptr().cast(), 1);
                libc::_exit(0)
            };
        }
        let mut byte = [9u8];
        // SAFETY: `byte` is valid for the one byte read; the descriptors are ours, closed once.
        let read = unsafe {
            libc::close(fds[1]);
            let n = libc::read(fds[0], byte.as_mut_ptr().cast(), 1);
            libc::close(fds[0]);
            n
        };
        let mut status: libc::c_int = 0;
        // SAFETY: `child` is our child; `&mut status` is valid for the write.
        let waited = unsafe { libc::waitpid(child, &mut status, 0) };
        if read == 1 && waited == child {
            byte[0]
        } else {
            9
        }
    }

    #[test]
    fn a_stamp_is_current_here_and_forked_in_a_child() {
        let s = Stamp::now();
        assert!(!s.forked());
        assert_eq!(s.pid, std::process::id());
        let ok = in_child(|| u8::from(s.forked() && !Stamp::now().forked()));
        assert_eq!(ok, 1, "the child saw itself as the process that opened");
        assert!(!s.forked(), "the parent is not a child");
        assert!(s
            .refusal()
            .contains(&format!("worker opened in process {}", s.pid)));
    }

    #[test]
    fn a_stamp_taken_in_a_child_is_forked_in_the_childs_child() {
        // Every fork counts: a stamp a child takes is current in that child and forked in its
        // own child, as the parent's stamp is forked in both.
        let s = Stamp::now();
        let answer = in_child(|| {
            let child = Stamp::now();
            if !s.forked() || child.forked() {
                return 2;
            }
            // 1 when the grandchild sees both stamps as forked and its own as current.
            in_child(|| u8::from(s.forked() && child.forked() && !Stamp::now().forked()))
        });
        assert_eq!(
            answer, 1,
            "2: the child misread the stamps; 0: the grandchild read the child's stamp as its own"
        );
        assert!(!s.forked());
    }
}
