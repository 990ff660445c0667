//! The model running inside a process: its port on the fabric, the device thread, the
//! responder threads and the event fds.
//!
//! Each process binds `<dir>/lid-<LID>.sock` (the first free LID from one derived from its
//! pid: bind is atomic, so two processes never share one) and serves the requests other
//! processes send its QPs; a QP's packets go to the process whose LID its RTR address vector
//! names. QPNs are `LID << 8 | n`, so they differ between processes.

use crate::device::Device;
use crate::kernel::{Errno, Host, Model};
use crate::mem::ProcessMemory;
use crate::objects::EventSink;
use crate::port::DropReason;
use crate::wire::{read_frame, write_frame, Request, Response};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The model of this process.
pub struct Runtime {
    model: Mutex<Model>,
    dir: PathBuf,
    lid: u16,
}

static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();

/// The directory shared by the processes of one test (`UVERBS_MLX5_MODEL_DIR`).
pub fn model_dir() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::var_os("UVERBS_MLX5_MODEL_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    })
    .as_ref()
}

/// The runtime, started on first use (the first open of the device file).
pub fn runtime() -> Option<&'static Runtime> {
    RUNTIME
        .get_or_init(|| model_dir().and_then(|dir| Runtime::start(dir.clone())))
        .as_ref()
}

impl Runtime {
    fn start(dir: PathBuf) -> Option<Self> {
        let pid = std::process::id();
        let first = (pid % 0xbff0) as u16 + 1;
        let (lid, listener) = (0..0xbff0u16).find_map(|k| {
            let lid = (first.wrapping_add(k) % 0xbff0).max(1);
            UnixListener::bind(dir.join(format!("lid-{lid}.sock")))
                .ok()
                .map(|l| (lid, l))
        })?;
        crate::log!("pid {pid} has LID {lid}");
        let mut model = Model::new(lid);
        model.port.publish(dir.join("neigh"));
        let port_dir = dir.join(format!("port-{lid}"));
        for (rel, text) in model.port.sysfs_files() {
            let path = port_dir.join(rel);
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = std::fs::write(&path, format!("{text}\n"));
        }
        let rt = Self {
            model: Mutex::new(model),
            dir,
            lid,
        };
        std::thread::Builder::new()
            .name("mlx5-model-listen".into())
            .spawn(move || listen(listener))
            .ok()?;
        std::thread::Builder::new()
            .name("mlx5-model-device".into())
            .spawn(device_loop)
            .ok()?;
        // SAFETY: registers two `extern "C" fn()` handlers that only lock and unlock the
        // model; it can fail only for want of memory, and then forks are as before.
        unsafe { libc::pthread_atfork(Some(lock_for_fork), Some(unlock_after_fork), Some(unlock_after_fork)) };
        yield_to_the_device();
        Some(rt)
    }

    /// This process's port files (`ports/1/lid`, `gids/`, `gid_attrs/`), where the
    /// interposer sends their sysfs paths.
    pub fn port_dir(&self) -> PathBuf {
        self.dir.join(format!("port-{}", self.lid))
    }

    /// Writes `<dir>/drops-<LID>` (one `reason count` line per reason) when the model's
    /// drop counters moved: what the test harness reads after a run.
    fn note_drops(&self, m: &Model) {
        static WRITTEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let total = m.drops.total();
        if WRITTEN.swap(total, std::sync::atomic::Ordering::Relaxed) != total {
            let _ = std::fs::write(self.dir.join(format!("drops-{}", self.lid)), m.drops.report());
        }
    }

    /// The model, locked (a panic while it was held leaves it usable: every handler
    /// leaves the tables consistent between statements that can fail).
    pub fn lock(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }
}

thread_local! {
    /// The model's lock, held by the forking thread across `fork`.
    static HELD_FOR_FORK: std::cell::RefCell<Option<MutexGuard<'static, Model>>> =
        const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork` prepare handler: the forking thread takes the model's lock, so the child
/// never starts with it held by a thread it does not have (the device thread locks it every
/// few microseconds; a child closing the device file would then wait forever).
extern "C" fn lock_for_fork() {
    if let Some(Some(rt)) = RUNTIME.get() {
        let guard = rt.lock();
        HELD_FOR_FORK.with(|held| *held.borrow_mut() = Some(guard));
    }
}

/// `pthread_atfork` parent and child handler: lets the lock go again, in each process.
extern "C" fn unlock_after_fork() {
    let _ = HELD_FOR_FORK.try_with(|held| held.borrow_mut().take());
}

/// Lowers the calling client thread's priority by `UVERBS_MLX5_MODEL_CLIENT_NICE` (default
/// 10; 0 leaves it), after the model's threads were started at its old one (responders
/// start from the listener, so at that one too). A real device works beside the host's CPUs;
/// the model's device thread and responders need a CPU for every message, and clients that
/// busy-poll their CQs (ibv_*_pingpong without `-e`) otherwise keep them waiting for the
/// scheduler on a machine with few cores: a UC pingpong pair on 2 cores took 2.3 times as
/// long (median of 8) without this. Raising one's own nice value needs no privilege; the
/// threads the client starts later inherit it.
fn yield_to_the_device() {
    let by = std::env::var("UVERBS_MLX5_MODEL_CLIENT_NICE")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(10)
        .clamp(0, 19);
    if by == 0 {
        return;
    }
    // SAFETY: getpriority and setpriority of the calling thread (`who` 0), integers only;
    // errno is cleared first, since -1 is both a nice value and getpriority's error.
    unsafe {
        *libc::__errno_location() = 0;
        let now = libc::getpriority(libc::PRIO_PROCESS, 0);
        if now == -1 && *libc::__errno_location() != 0 {
            return;
        }
        libc::setpriority(libc::PRIO_PROCESS, 0, (now + by).min(19));
    }
}

/// Accepts connections from peers; one responder thread each.
fn listen(listener: UnixListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let _ = std::thread::Builder::new()
            .name("mlx5-model-responder".into())
            .spawn(move || serve(stream));
    }
}

/// Answers one peer's requests until it hangs up.
fn serve(mut stream: UnixStream) {
    let Some(rt) = runtime() else { return };
    while let Ok(frame) = read_frame(&mut stream) {
        let Some(req) = Request::decode(&frame) else {
            if write_frame(&mut stream, &Response::Dropped.encode()).is_err() {
                return;
            }
            continue;
        };
        // The answer goes out before the model's lock is let go: the receive CQE is already
        // visible, and a client that then destroys its QP and exits (its destroy waits for
        // the lock) must not take the acknowledgement with it, which a device sends whatever
        // the host does next. (Seen as RETRY_EXC_ERR at the server of an `ibv_rc_pingpong
        // -e` pair whose client had finished.)
        let mut m = rt.lock();
        let answer = Device::respond(&mut m, &req, &ProcessMemory);
        rt.note_drops(&m);
        let sent = write_frame(&mut stream, &answer.encode());
        drop(m);
        if sent.is_err() {
            return;
        }
    }
}

/// Polls doorbells and runs send WQEs, forever. It runs on while there is work,
/// sleeps a few microseconds between polls, and longer once idle for a while
/// (yielding would hand the core to the client's own busy-polling thread for a whole slice).
fn device_loop() {
    let Some(rt) = runtime() else { return };
    if let Some(cpu) = crate::device_cpu() {
        pin_to(cpu);
    }
    let mut peers: HashMap<u16, UnixStream> = HashMap::new();
    let mut idle = 0u32;
    loop {
        let mut active = false;
        let work = {
            let mut m = rt.lock();
            for &(_, view) in &m.clock_pages {
                write_device_time(view);
            }
            Device::poll_arms(&mut m, &ProcessMemory);
            Device::next_work(&mut m, &ProcessMemory, Instant::now(), &mut active)
        };
        if let Some(work) = work {
            active = true;
            let answer = if work.dlid == 0 {
                // No port has that LID or MAC: the fabric drops the packet.
                let mut m = rt.lock();
                let reason = if m.port.is_eth() {
                    DropReason::Dmac
                } else {
                    DropReason::Dlid
                };
                m.drops.add(reason);
                rt.note_drops(&m);
                None
            } else if work.dlid == rt.lid {
                let mut m = rt.lock();
                let a = Device::respond(&mut m, &work.request, &ProcessMemory);
                rt.note_drops(&m);
                Some(a)
            } else {
                exchange(&rt.dir, &mut peers, work.dlid, &work.request)
            };
            Device::complete(&mut rt.lock(), work, answer, &ProcessMemory, Instant::now());
        }
        if active {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        match idle {
            0..=64 => std::hint::spin_loop(),
            65..=50_000 => std::thread::sleep(Duration::from_micros(10)),
            _ => std::thread::sleep(Duration::from_micros(500)),
        }
    }
}

/// Runs the calling thread on CPU `cpu` only; says so and goes on unpinned if the kernel
/// refuses (no such CPU, or outside the process's cpuset).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed `cpu_set_t` is the empty set; CPU_SET stays inside it for any `cpu`
    // below its size, checked first.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            -1
        } else {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        }
    };
    if rc != 0 {
        eprintln!("mlx5 model: UVERBS_MLX5_MODEL_DEVICE_CPU={cpu}: could not pin the device thread");
    }
}

/// Writes the device's internal timer into a core clock page view: nanoseconds since the
/// model started in this process, big-endian high word then low word (`internal_timer_h`,
/// `internal_timer_l`), in one 8-byte store so a reader never sees half of an update. The
/// device thread refreshes it on every pass (every few microseconds, up to 500 µs when idle).
pub fn write_device_time(view: u64) {
    static START: OnceLock<Instant> = OnceLock::new();
    let ns = START.get_or_init(Instant::now).elapsed().as_nanos() as u64;
    let _ = ProcessMemory.store(
        view + crate::abi::INTERNAL_TIMER_OFFSET % crate::abi::PAGE_SIZE,
        ns.to_be(),
    );
}

/// Sends `req` to the process with `dlid` and waits for its answer; `None` when it cannot
/// be reached or does not answer in time.
fn exchange(dir: &std::path::Path, peers: &mut HashMap<u16, UnixStream>, dlid: u16, req: &Request) -> Option<Response> {
    let stream = match peers.entry(dlid) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let s = UnixStream::connect(dir.join(format!("lid-{dlid}.sock"))).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            v.insert(s)
        }
    };
    let answer = write_frame(stream, &req.encode())
        .ok()
        .and_then(|()| read_frame(stream).ok());
    match answer.and_then(|a| Response::decode(&a)) {
        Some(r) => Some(r),
        None => {
            peers.remove(&dlid);
            None
        }
    }
}

/// An event file: the client reads records from one end of a `SOCK_SEQPACKET` pair, the
/// model writes them to the other.
struct SocketSink(OwnedFd);

impl EventSink for SocketSink {
    fn push(&self, record: &[u8]) {
        // SAFETY: sends `record` (a valid slice) on a socket we own; MSG_NOSIGNAL keeps a
        // closed reader from raising SIGPIPE, MSG_DONTWAIT keeps a full queue from blocking.
        let _ = unsafe {
            libc::send(
                self.0.as_raw_fd(),
                record.as_ptr().cast(),
                record.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
    }
}

/// Event fds made in this process.
pub struct ProcessHost;

impl Host for ProcessHost {
    fn event_fd(&self) -> Result<(i32, Arc<dyn EventSink>), Errno> {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
        }
        // SAFETY: fds[1] was just created and is owned by nobody else.
        let ours = unsafe { OwnedFd::from_raw_fd(fds[1]) };
        crate::fds::mark_event_fd(fds[0]);
        Ok((fds[0], Arc::new(SocketSink(ours))))
    }

    fn close_fd(&self, fd: i32) {
        crate::fds::unmark_fd(fd);
        // SAFETY: `fd` is the client end event_fd created for a command that failed; the
        // client never saw it.
        unsafe { libc::close(fd) };
    }

    fn memlock_pages(&self) -> Option<u64> {
        // CAP_IPC_LOCK (capability 14, linux/capability.h) in the effective set: no limit.
        const CAP_IPC_LOCK: u32 = 14;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        if eff & (1 << CAP_IPC_LOCK) != 0 {
            return None;
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` into `lim`.
        if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
            return None;
        }
        Some(lim.rlim_cur / crate::abi::PAGE_SIZE)
    }

    fn map_dmabuf(&self, fd: i32) -> Result<crate::objects::DmabufMap, Errno> {
        // SAFETY: fcntl on an fd number only queries it.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(libc::EBADF);
        }
        // Only a memfd (shmem) has seals: anything else is no stand-in dma-buf.
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_GET_SEALS) } < 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: a zeroed `stat` is a valid buffer for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes one `stat` into `st`.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size <= 0 {
            return Err(libc::EINVAL);
        }
        let len = st.st_size as u64;
        // The raw system call, not the interposed `mmap`: this is the model's own view of the
        // buffer, not the client's mapping of a device file.
        // SAFETY: a new shared mapping of the whole file, at an address the kernel picks.
        let addr = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                0usize,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0usize,
            )
        };
        if addr == -1 || (addr as isize) < 0 && (addr as isize) > -4096 {
            return Err(libc::ENOMEM);
        }
        fn unmap(addr: u64, len: u64) {
            // SAFETY: the mapping `map_dmabuf` made, unmapped once, when the last region
            // over it is gone (no access of the model's reaches it after that).
            unsafe { libc::syscall(libc::SYS_munmap, addr as usize, len as usize) };
        }
        Ok(crate::objects::DmabufMap {
            addr: addr as u64,
            len,
            unmap,
        })
    }
}
