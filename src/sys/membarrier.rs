//! `membarrier(2)`: a full memory barrier on every running thread of this process at once.
//! With it a lock's hot side can order its accesses with a compiler-only fence and leave
//! the instruction fence to the rare side (the asymmetric fence of liburcu and folly).

use std::sync::OnceLock;

/// `MEMBARRIER_CMD_QUERY`: the commands this kernel supports, as a mask.
const CMD_QUERY: i32 = 0;
/// `MEMBARRIER_CMD_GLOBAL`: every running thread of every process (slow, no registration).
const CMD_GLOBAL: i32 = 1 << 0;
/// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`: the running threads of this process, by IPI.
const CMD_PRIVATE_EXPEDITED: i32 = 1 << 3;
/// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`: needed once before the former.
const CMD_REGISTER_PRIVATE_EXPEDITED: i32 = 1 << 4;

/// Whether [`barrier`] works in this process: registers for the expedited command on the
/// first call and remembers the answer. `false` under Miri, which has no such system call.
pub(crate) fn available() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let needed = CMD_PRIVATE_EXPEDITED | CMD_REGISTER_PRIVATE_EXPEDITED;
        !cfg!(miri)
            && call(CMD_QUERY).is_some_and(|mask| mask & needed == needed)
            && call(CMD_REGISTER_PRIVATE_EXPEDITED).is_some()
    })
}

/// A full memory barrier on every thread of this process: those running now execute one
/// before this returns, and the others pass one when they are next scheduled. Only after
/// [`available`] said `true`.
///
/// The kernel refuses the expedited command only to a process that has not registered
/// (`EPERM`: a forked child may find itself so), so a refusal registers and tries again; the
/// global command gives the same guarantee more slowly. When all fail no barrier can be
/// promised and the process aborts: the callers' other side has ordered nothing, and going
/// on could let two threads into one lock.
pub(crate) fn barrier() {
    if call(CMD_PRIVATE_EXPEDITED).is_some()
        || (call(CMD_REGISTER_PRIVATE_EXPEDITED).is_some() && call(CMD_PRIVATE_EXPEDITED).is_some())
        || call(CMD_GLOBAL).is_some()
    {
        return;
    }
    eprintln!("uverbs: membarrier(2) failed after registering; aborting (no lock can be kept)");
    std::process::abort();
}

/// `membarrier(cmd, 0, 0)`: its result, `None` on failure.
fn call(cmd: i32) -> Option<i32> {
    // SAFETY: membarrier takes three integers and touches no memory of ours.
    let rc = unsafe { nix::libc::syscall(nix::libc::SYS_membarrier, cmd, 0, 0) };
    i32::try_from(rc).ok().filter(|&rc| rc >= 0)
}

#[cfg(test)]
super::layout_check::kernel_layouts! {
    headers: ["linux/membarrier.h"],
    values: {
        CMD_QUERY => "MEMBARRIER_CMD_QUERY",
        CMD_GLOBAL => "MEMBARRIER_CMD_GLOBAL",
        CMD_PRIVATE_EXPEDITED => "MEMBARRIER_CMD_PRIVATE_EXPEDITED",
        CMD_REGISTER_PRIVATE_EXPEDITED => "MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED",
    },
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    /// Linux has had the expedited command since 4.14; the barrier returns.
    #[test]
    fn registers_and_runs_on_this_kernel() {
        assert!(available());
        barrier();
    }
}
