//! Fork detection. A forked child inherits the device fd and the handles, but the kernel
//! objects stay the parent's: a child's ioctls would act on them (the kernel refuses only
//! `write()` commands from a child), the memory the library allocated is zeroed pages of the
//! child's own there and the device's rings are not mapped at all ([`super::mapping`]). Each context records the [`Owner`] (fork generation) it was made in, and
//! the data-path handles copy it; a child sees a newer generation and every verb on inherited
//! handles becomes [`crate::Error::Forked`] (or, for polling, no completions) instead of
//! touching the parent's objects.

use crate::error::{Error, Result, Verb};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

static GENERATION: AtomicU32 = AtomicU32::new(0);
static HOOK: Once = Once::new();

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The process a handle belongs to: the fork generation current when it was made. Handles
/// on the data path keep a copy next to their ring, so the check is two loads and a compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owner(u32);

impl Owner {
    /// This process, installing the fork hook on first use.
    pub(crate) fn current() -> Self {
        HOOK.call_once(|| {
            // SAFETY: `in_child` is async-signal-safe (one atomic add) as `pthread_atfork`
            // requires of handlers run in the child.
            unsafe { nix::libc::pthread_atfork(None, None, Some(in_child)) };
        });
        Self(GENERATION.load(Ordering::Relaxed))
    }

    /// Whether this process is a fork of the owner.
    #[inline(always)]
    pub(crate) fn forked(self) -> bool {
        GENERATION.load(Ordering::Relaxed) != self.0
    }

    /// [`Error::Forked`] in a fork of the owner.
    #[inline(always)]
    pub(crate) fn check(self, verb: Verb) -> Result<()> {
        if self.forked() {
            return Err(Error::Forked { verb });
        }
        Ok(())
    }
}
