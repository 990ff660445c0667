//! Fork detection. A forked child inherits the device fd, the rings and registered memory,
//! but the kernel objects stay the parent's: a child's ioctls would act on them (the kernel
//! refuses only `write()` commands from a child), and the rings are not mapped in a child
//! (`MADV_DONTFORK`). Each context records the fork generation it was made in; a child sees a
//! newer one and every verb on inherited handles becomes [`crate::Error::Forked`] (or, for
//! polling, no completions) instead of touching the parent's objects.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

static GENERATION: AtomicU32 = AtomicU32::new(0);
static HOOK: Once = Once::new();

extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The current generation, installing the fork hook on first use.
pub(crate) fn generation() -> u32 {
    HOOK.call_once(|| {
        // SAFETY: `in_child` is async-signal-safe (one atomic add) as `pthread_atfork`
        // requires of handlers run in the child.
        unsafe { nix::libc::pthread_atfork(None, None, Some(in_child)) };
    });
    GENERATION.load(Ordering::Relaxed)
}

/// Whether this process is a fork of the one in which `generation` was current. One relaxed
/// load: cheap enough for the data path.
#[inline]
pub(crate) fn forked_since(generation: u32) -> bool {
    GENERATION.load(Ordering::Relaxed) != generation
}
