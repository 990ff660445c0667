//! The event channel: one open of `/dev/infiniband/rdma_cm`, the ids created on it, and the
//! events the kernel queues for them.

use super::event::CmEvent;
use super::id::CmId;
use crate::error::{Error, Result, Verb};
use crate::sys::ucma::{self, CreateId, EventResp, GetEvent, ABI_VERSIONS, PS_TCP};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zerocopy::FromZeros;

const DEVICE: &str = "/dev/infiniband/rdma_cm";
const ABI_VERSION: &str = "/sys/class/misc/rdma_cm/abi_version";
/// `IB_QPT_RC`.
const QPT_RC: u8 = 2;

/// Every id's uid: a number from this counter, unique in the process (ids migrate between
/// channels keeping theirs), never a pointer. 0 is the kernel's "not yet accepted".
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn new_uid() -> u64 {
    NEXT_UID.fetch_add(1, Ordering::Relaxed)
}

/// An RDMA CM event channel (`struct rdma_event_channel`): the fd the kernel queues the events
/// of the ids created on (or migrated to) it. The fd is non-blocking and polls readable while
/// events are queued, so it works in an event loop (`AsFd`).
#[derive(Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

pub(crate) struct ChannelInner {
    fd: OwnedFd,
    /// The ids on this channel: uid -> the kernel's id.
    registry: Mutex<Registry>,
}

/// uid -> the kernel's id. The uids are this crate's own counter ([`new_uid`]), never a
/// peer's input, so one multiplication spreads them over the table (SipHash, `HashMap`'s
/// default against chosen keys, cost more than the rest of an insert).
type Registry = HashMap<u64, u32, BuildHasherDefault<UidHasher>>;

#[derive(Default)]
struct UidHasher(u64);

impl Hasher for UidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 << 8 | u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl ChannelInner {
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic elsewhere cannot leave the map half-updated: every update is one call.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn register(&self, uid: u64, id: u32) {
        self.registry().insert(uid, id);
    }

    pub(crate) fn unregister(&self, uid: u64) {
        self.registry().remove(&uid);
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.inner.fd)
            .field("ids", &self.inner.registry().len())
            .finish()
    }
}

impl EventChannel {
    /// Opens a new channel (`rdma_create_event_channel`). Fails with a clear error where the
    /// `rdma_ucm` module is not loaded or speaks another ABI.
    pub fn open() -> Result<Self> {
        // The module's ABI cannot change while it is loaded and a channel is open: checked
        // once per process.
        static ABI_CHECKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !ABI_CHECKED.load(Ordering::Relaxed) {
            check_abi()?;
            ABI_CHECKED.store(true, Ordering::Relaxed);
        }
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
            .open(DEVICE)
            .map_err(|e| Error::io(DEVICE, e))?;
        Ok(Self {
            inner: Arc::new(ChannelInner {
                fd: file.into(),
                registry: Mutex::default(),
            }),
        })
    }

    /// Creates a reliable-connected id (`rdma_create_id` with `RDMA_PS_TCP`) on this channel.
    pub fn create_id(&self) -> Result<CmId> {
        let uid = new_uid();
        let req = CreateId {
            uid,
            ps: PS_TCP,
            qp_type: QPT_RC,
            ..Default::default()
        };
        let resp = ucma::call(self.inner.fd(), &req, Default::default())?;
        self.inner.register(uid, resp.id);
        Ok(CmId::new(self.inner.clone(), resp.id, uid))
    }

    /// The next queued event, or `None` at once if there is none (`EAGAIN`).
    #[inline]
    pub fn try_get_event(&self) -> Result<Option<CmEvent>> {
        let mut raw = EventResp::new_zeroed();
        if !self.read_event(&mut raw)? {
            return Ok(None);
        }
        Ok(Some(CmEvent::decode(&raw, Some(&self.inner))))
    }

    /// Waits for the next event, at most `timeout` (forever with `None`).
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<CmEvent> {
        let mut raw = EventResp::new_zeroed();
        // The clock is read only once there is something to wait for.
        let mut deadline = None;
        loop {
            if self.read_event(&mut raw)? {
                // Decoded straight into the value returned (no event is moved on the way).
                return Ok(CmEvent::decode(&raw, Some(&self.inner)));
            }
            let deadline = *deadline.get_or_insert_with(|| timeout.map(|t| Instant::now() + t));
            self.wait_readable("get_event", deadline, timeout.unwrap_or_default())?;
        }
    }

    /// Reads the next queued event into `raw`: false at once if there is none (`EAGAIN`).
    #[inline]
    fn read_event(&self, raw: &mut EventResp) -> Result<bool> {
        loop {
            match ucma::execute_into(self.inner.fd(), &GetEvent::default(), raw) {
                Ok(()) => return Ok(true),
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Ok(false),
                Err(e) => return Err(Error::kernel("GET_EVENT", e)),
            }
        }
    }

    /// Sleeps until the fd polls readable (or a signal), at most until `deadline` (forever
    /// with `None`); past it, [`Error::TimedOut`] for `verb` after `timeout`.
    pub(crate) fn wait_readable(&self, verb: Verb, deadline: Option<Instant>, timeout: Duration) -> Result<()> {
        let wait = match deadline {
            None => PollTimeout::NONE,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::TimedOut { verb, timeout });
                }
                // Rounded up, so a wait never ends just short of the deadline.
                let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = [PollFd::new(self.inner.fd(), PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, wait) {
            Ok(_) | Err(Errno::EINTR) => Ok(()),
            Err(e) => Err(Error::kernel("poll", e)),
        }
    }

    /// The kernel's id for `uid`, while that id is on this channel.
    pub fn kernel_id(&self, uid: u64) -> Option<u32> {
        self.inner.registry().get(&uid).copied()
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd()
    }
}

/// The `rdma_ucm` module is loaded and speaks an ABI this crate does.
fn check_abi() -> Result<()> {
    let version = crate::device::read_attr(std::path::Path::new(ABI_VERSION)).map_err(|_| Error::NoDevice {
        name: None,
        reason: format!("{ABI_VERSION} is missing: the rdma_ucm module is not loaded (`modprobe rdma_ucm`)"),
    })?;
    let found: u32 = version
        .parse()
        .map_err(|_| Error::malformed("rdma_cm", format!("{ABI_VERSION}: {version:?}")))?;
    if !ABI_VERSIONS.contains(&found) {
        return Err(Error::AbiVersion {
            what: "rdma_ucm",
            found,
            supported: "3 and 4",
        });
    }
    Ok(())
}
