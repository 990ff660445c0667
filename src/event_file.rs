//! The kernel's event files: reading their fixed-size records, and the context's async event
//! file with the queue that lets a CQ check read ahead of the user without taking events away.
//!
//! A check for a CQ overrun ([`crate::Cq::try_poll`], [`crate::Cq::check`]) must read the
//! async events pending on the kernel's file to find a `CQ_ERR`, which consumes them. What it
//! reads is queued here, and `Context::get_async_event` returns the queue before the file. The
//! fd users poll ([`crate::Context::async_fd`]) is an epoll set of the kernel's file and an
//! eventfd that is readable while the queue holds events, so it is readable exactly when
//! `get_async_event` has something to return, wherever the event waits.

use crate::error::{Error, Result, Verb};
use crate::sys::abi::AsyncEventDesc;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// Waits up to `timeout` (forever with `None`) for `fd` to be readable; `false` when the time
/// ran out.
fn wait_readable(fd: BorrowedFd<'_>, verb: Verb, timeout: Option<Duration>) -> Result<bool> {
    let timeout = match timeout {
        None => PollTimeout::NONE,
        Some(t) => PollTimeout::try_from(t).unwrap_or(PollTimeout::MAX),
    };
    loop {
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(n) => return Ok(n > 0),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(Error::kernel(verb, e)),
        }
    }
}

/// Waits up to `timeout` (forever with `None`) for one event record on `fd` and reads it.
/// `Ok(None)` when the time ran out.
pub(crate) fn read_event<T: FromBytes + IntoBytes>(
    fd: BorrowedFd<'_>,
    verb: Verb,
    timeout: Option<Duration>,
) -> Result<Option<T>> {
    loop {
        if !wait_readable(fd, verb, timeout)? {
            return Ok(None);
        }
        let mut record = T::new_zeroed();
        return match nix::unistd::read(fd.as_raw_fd(), record.as_mut_bytes()) {
            Ok(n) if n == size_of::<T>() => Ok(Some(record)),
            Ok(n) => Err(Error::malformed(verb, format!("{n}-byte event record"))),
            // Another reader took it between poll and read.
            Err(Errno::EAGAIN) if timeout == Some(Duration::ZERO) => Ok(None),
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            Err(e) => Err(Error::kernel(verb, e)),
        };
    }
}

/// The context's async event file, the events read ahead of the user, and the fd that is
/// readable while either has one.
pub(crate) struct AsyncEventFile {
    /// The kernel's file (`ASYNC_EVENT_ALLOC`), which objects are created to report to.
    kernel: OwnedFd,
    /// Events read off `kernel` by a check, oldest first, for the user.
    queued: Mutex<VecDeque<AsyncEventDesc>>,
    /// Readable (a count of 1) while `queued` holds events.
    queued_signal: EventFd,
    /// An epoll set of `kernel` and `queued_signal`.
    ready: Epoll,
}

const VERB: Verb = "get_async_event";

impl AsyncEventFile {
    pub(crate) fn new(kernel: OwnedFd) -> Result<Self> {
        let queued_signal = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| Error::kernel("ASYNC_EVENT_ALLOC: eventfd", e))?;
        let ready =
            Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| Error::kernel("ASYNC_EVENT_ALLOC: epoll", e))?;
        for fd in [kernel.as_fd(), queued_signal.as_fd()] {
            ready
                .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, 0))
                .map_err(|e| Error::kernel("ASYNC_EVENT_ALLOC: epoll_ctl", e))?;
        }
        Ok(Self {
            kernel,
            queued: Mutex::new(VecDeque::new()),
            queued_signal,
            ready,
        })
    }

    /// The kernel's file.
    pub(crate) fn kernel(&self) -> BorrowedFd<'_> {
        self.kernel.as_fd()
    }

    /// The fd that is readable while an event waits, here or in the kernel's file.
    pub(crate) fn ready(&self) -> BorrowedFd<'_> {
        self.ready.0.as_fd()
    }

    fn queued(&self) -> MutexGuard<'_, VecDeque<AsyncEventDesc>> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next record pending on the kernel's file, without waiting. Called with the queue
    /// locked, so that no reader of this context finds the file empty between its poll and
    /// its read (which would block the read).
    fn read_kernel(&self, _queued: &mut VecDeque<AsyncEventDesc>) -> Result<Option<AsyncEventDesc>> {
        read_event(self.kernel(), VERB, Some(Duration::ZERO))
    }

    /// Moves every event pending on the kernel's file into the queue without waiting, calling
    /// `seen` on each. One `poll(2)` when none is pending.
    pub(crate) fn read_ahead(&self, seen: &mut dyn FnMut(&AsyncEventDesc)) -> Result<()> {
        if !wait_readable(self.kernel(), VERB, Some(Duration::ZERO))? {
            return Ok(());
        }
        let mut queued = self.queued();
        let was_empty = queued.is_empty();
        // A failed read still signals the events queued before it.
        let read = loop {
            match self.read_kernel(&mut queued) {
                Ok(Some(desc)) => {
                    seen(&desc);
                    queued.push_back(desc);
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        if was_empty && !queued.is_empty() {
            self.queued_signal
                .write(1)
                .map_err(|e| Error::kernel("get_async_event: eventfd", e))?;
        }
        read
    }

    /// The next event, the queued ones first, waiting up to `timeout` (forever with `None`);
    /// `seen` is called on one read from the kernel's file here.
    pub(crate) fn next(
        &self,
        timeout: Option<Duration>,
        seen: &mut dyn FnMut(&AsyncEventDesc),
    ) -> Result<Option<AsyncEventDesc>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            {
                let mut queued = self.queued();
                if let Some(desc) = queued.pop_front() {
                    if queued.is_empty() {
                        match self.queued_signal.read() {
                            Ok(_) | Err(Errno::EAGAIN) => {}
                            Err(e) => {
                                // Still the user's: back at the front for the next call.
                                queued.push_front(desc);
                                return Err(Error::kernel("get_async_event: eventfd", e));
                            }
                        }
                    }
                    return Ok(Some(desc));
                }
                if let Some(desc) = self.read_kernel(&mut queued)? {
                    seen(&desc);
                    return Ok(Some(desc));
                }
            }
            let left = match (timeout, deadline) {
                (None, _) => None,
                (Some(_), None) => Some(Duration::MAX),
                (Some(_), Some(d)) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(None),
                },
            };
            wait_readable(self.ready(), VERB, left)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(element: u64) -> AsyncEventDesc {
        AsyncEventDesc {
            element,
            event_type: 0,
            reserved: 0,
        }
    }

    fn readable(fd: BorrowedFd<'_>) -> bool {
        wait_readable(fd, VERB, Some(Duration::ZERO)).unwrap()
    }

    /// Records written into a pipe stand in for the kernel's: what a read-ahead takes is
    /// returned first, in order, and the pollable fd is readable exactly while an event waits
    /// in either place.
    #[test]
    fn read_ahead_events_are_kept_for_the_reader_and_keep_the_fd_readable() {
        let (rx, tx) = nix::unistd::pipe().unwrap();
        let file = AsyncEventFile::new(rx).unwrap();
        let mut seen = Vec::new();
        assert!(!readable(file.ready()));
        file.read_ahead(&mut |d| seen.push(d.element)).unwrap();
        assert!(seen.is_empty() && !readable(file.ready()), "nothing pending");

        for e in [1, 2] {
            nix::unistd::write(&tx, desc(e).as_bytes()).unwrap();
        }
        assert!(readable(file.ready()), "pending in the kernel's file");
        file.read_ahead(&mut |d| seen.push(d.element)).unwrap();
        assert_eq!(seen, [1, 2]);
        assert!(
            !readable(file.kernel()) && readable(file.ready()),
            "queued, still readable"
        );
        nix::unistd::write(&tx, desc(3).as_bytes()).unwrap();

        let mut next = || file.next(Some(Duration::ZERO), &mut |d| seen.push(d.element)).unwrap();
        assert_eq!(next().map(|d| d.element), Some(1));
        assert_eq!(next().map(|d| d.element), Some(2));
        assert_eq!(next().map(|d| d.element), Some(3), "then the kernel's");
        assert_eq!(next().map(|d| d.element), None);
        assert_eq!(seen, [1, 2, 3], "each seen once, when first read");
        assert!(!readable(file.ready()));

        // A waiter wakes for an event that arrives while it waits.
        let tx2 = tx.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            nix::unistd::write(&tx2, desc(4).as_bytes()).unwrap();
        });
        let got = file.next(Some(Duration::from_secs(10)), &mut |_| {}).unwrap();
        writer.join().unwrap();
        assert_eq!(got.map(|d| d.element), Some(4));
        assert_eq!(
            file.next(Some(Duration::from_millis(20)), &mut |_| {})
                .unwrap()
                .map(|d| d.element),
            None
        );
    }
}
