//! Which descriptors are the model's: the device file's and the event fds it made. Marked
//! by the interposer (device files) and by the runtime's host (event fds); read by the
//! interposer, which sends only these to the model.

use libc::c_int;
use std::sync::atomic::{AtomicU8, Ordering};

/// What a descriptor is to the model.
pub(crate) const FD_OTHER: u8 = 0;
pub(crate) const FD_DEVICE: u8 = 1;
pub(crate) const FD_EVENT: u8 = 2;
const FD_TABLE: usize = 1 << 16;
static FD_KIND: [AtomicU8; FD_TABLE] = [const { AtomicU8::new(FD_OTHER) }; FD_TABLE];

pub(crate) fn fd_kind(fd: c_int) -> u8 {
    usize::try_from(fd)
        .ok()
        .and_then(|i| FD_KIND.get(i))
        .map_or(FD_OTHER, |k| k.load(Ordering::Acquire))
}

/// Marks `fd` as one of the model's (event fds are marked by the host that makes them).
pub(crate) fn mark_fd(fd: c_int, kind: u8) {
    if let Some(k) = usize::try_from(fd).ok().and_then(|i| FD_KIND.get(i)) {
        k.store(kind, Ordering::Release);
    }
}

/// Marks a new event fd.
pub(crate) fn mark_event_fd(fd: c_int) {
    mark_fd(fd, FD_EVENT);
}

/// Forgets an event fd the model closes itself.
pub(crate) fn unmark_fd(fd: c_int) {
    mark_fd(fd, FD_OTHER);
}
