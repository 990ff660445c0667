//! The `LD_PRELOAD` interposer: the libc entry points the client's calls land in.
//!
//! With `UVERBS_MLX5_MODEL_DIR` set, `/dev/infiniband/uverbs0` opens as a device file of the
//! model (backed by a `/dev/null` descriptor, so `fstat` reports the character device sysfs
//! names), `write`/`ioctl`/`mmap`/`close` on it go to the model, paths under
//! `/sys/class/infiniband*` lead into `<dir>/sysfs`, and RDMA netlink is refused (libibverbs
//! then reads sysfs). Every other call goes to the next definition (`dlsym(RTLD_NEXT)`).
//! Without the variable, everything passes through.
//!
//! No panic leaves these functions: each model call runs under `catch_unwind` and becomes
//! `EIO`. The model's lock is only taken for descriptors the model made, so the model's own
//! libc calls (made while it holds the lock) pass straight through.

use crate::fds::{fd_kind, mark_fd, unmark_fd, FD_DEVICE, FD_EVENT, FD_OTHER};
use crate::kernel::{MapAccess, Mapping};
use crate::mem::ProcessMemory;
use crate::runtime::{model_dir, runtime, ProcessHost};
use libc::{c_char, c_int, c_uint, c_ulong, c_void, off_t, size_t, ssize_t};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

const DEVICE_PATH: &[u8] = b"/dev/infiniband/uverbs0";
const SYSFS_PREFIX: &[u8] = b"/sys/class/infiniband";
const NETLINK_RDMA: c_int = 20;

/// UAR and core clock pages currently mapped (munmap only takes the lock when there are
/// some).
static MAPPED_PAGES: AtomicUsize = AtomicUsize::new(0);

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Resolves and caches the next definition of a libc function.
macro_rules! real {
    ($name:literal, fn($($t:ty),*) -> $r:ty) => {{
        static PTR: AtomicUsize = AtomicUsize::new(0);
        let mut p = PTR.load(Ordering::Relaxed);
        if p == 0 {
            // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds the definition after
            // this library (libc's).
            p = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) } as usize;
            PTR.store(p, Ordering::Relaxed);
        }
        if p == 0 {
            None
        } else {
            // SAFETY: the symbol is libc's function of this exact C signature.
            Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(p) })
        }
    }};
}

/// Runs a model operation, turning a panic into `EIO`.
fn guarded<T>(fail: T, f: impl FnOnce() -> Result<T, c_int>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

/// What a path means to the model.
enum Path {
    Device,
    Redirect(CString),
    Other,
}

fn classify(path: *const c_char) -> Path {
    if path.is_null() {
        return Path::Other;
    }
    let Some(dir) = model_dir() else { return Path::Other };
    // SAFETY: a non-null path argument of a libc call is a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    if bytes == DEVICE_PATH {
        return Path::Device;
    }
    let sysfs_class = dir.join("sysfs/class").into_os_string().into_encoded_bytes();
    let mut full = None;
    if let Some(rest) = bytes.strip_prefix(SYSFS_PREFIX) {
        if rest.is_empty() || rest.starts_with(b"/") || rest.starts_with(b"_verbs") {
            let mut f = sysfs_class.clone();
            f.extend_from_slice(b"/infiniband");
            f.extend_from_slice(rest);
            full = Some(f);
        }
    }
    // The port's own files (LID, GIDs and their attributes) differ between processes: they
    // come from this process's port directory, whichever way the path was spelt.
    let mut port_prefix = sysfs_class;
    port_prefix.extend_from_slice(b"/infiniband/mlx5_0/ports/1");
    let candidate = full.as_deref().unwrap_or(bytes);
    if let Some(rest) = candidate.strip_prefix(port_prefix.as_slice()) {
        if [&b"/gids"[..], b"/gid_attrs", b"/lid"]
            .iter()
            .any(|p| rest.starts_with(p))
        {
            if let Some(port_dir) = runtime().map(|rt| rt.port_dir()) {
                let mut f = port_dir.into_os_string().into_encoded_bytes();
                f.extend_from_slice(rest);
                full = Some(f);
            }
        }
    }
    match full.map(CString::new) {
        Some(Ok(c)) => Path::Redirect(c),
        _ => Path::Other,
    }
}

/// The path to give the real function: the redirection, `/dev/null` for the device file
/// (for the stat family), or the caller's.
fn with_path<R>(path: *const c_char, f: impl FnOnce(*const c_char) -> R) -> R {
    match classify(path) {
        Path::Device => f(c"/dev/null".as_ptr()),
        Path::Redirect(c) => f(c.as_ptr()),
        Path::Other => f(path),
    }
}

fn open_device(flags: c_int) -> c_int {
    let Some(real) = real!("open", fn(*const c_char, c_int, c_uint) -> c_int) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    guarded(-1, || {
        let rt = runtime().ok_or(libc::ENODEV)?;
        // SAFETY: libc open of a constant path.
        let fd = unsafe { real(c"/dev/null".as_ptr(), libc::O_RDWR | (flags & libc::O_CLOEXEC), 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        rt.lock().open(fd);
        mark_fd(fd, FD_DEVICE);
        crate::log!("open uverbs0 -> fd {fd}");
        Ok(fd)
    })
}

macro_rules! open_like {
    ($name:ident, $real:literal) => {
        /// Interposed: opens the model's device file or a redirected sysfs path.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
            match classify(path) {
                Path::Device => open_device(flags),
                other => {
                    let Some(real) = real!($real, fn(*const c_char, c_int, c_uint) -> c_int) else {
                        set_errno(libc::ENOSYS);
                        return -1;
                    };
                    let p = if let Path::Redirect(c) = &other {
                        c.as_ptr()
                    } else {
                        path
                    };
                    // SAFETY: forwards the caller's arguments to libc's function.
                    unsafe { real(p, flags, mode) }
                }
            }
        }
    };
}
open_like!(open, "open");
open_like!(open64, "open64");

macro_rules! open_fortified {
    ($name:ident, $real:literal) => {
        /// Interposed: the `_FORTIFY_SOURCE` form of `open`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int) -> c_int {
            match classify(path) {
                Path::Device => open_device(flags),
                other => {
                    let Some(real) = real!($real, fn(*const c_char, c_int) -> c_int) else {
                        set_errno(libc::ENOSYS);
                        return -1;
                    };
                    let p = if let Path::Redirect(c) = &other {
                        c.as_ptr()
                    } else {
                        path
                    };
                    // SAFETY: forwards the caller's arguments to libc's function.
                    unsafe { real(p, flags) }
                }
            }
        }
    };
}
open_fortified!(__open_2, "__open_2");
open_fortified!(__open64_2, "__open64_2");

macro_rules! openat_like {
    ($name:ident, $real:literal) => {
        /// Interposed: `openat` with an absolute path behaves as `open`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
            match classify(path) {
                Path::Device => open_device(flags),
                other => {
                    let Some(real) = real!($real, fn(c_int, *const c_char, c_int, c_uint) -> c_int) else {
                        set_errno(libc::ENOSYS);
                        return -1;
                    };
                    let p = if let Path::Redirect(c) = &other {
                        c.as_ptr()
                    } else {
                        path
                    };
                    // SAFETY: forwards the caller's arguments to libc's function.
                    unsafe { real(dirfd, p, flags, mode) }
                }
            }
        }
    };
}
openat_like!(openat, "openat");
openat_like!(openat64, "openat64");

macro_rules! stat_like {
    ($name:ident, $real:literal, $buf:ty) => {
        /// Interposed: the stat family sees the device file and the sysfs tree.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut $buf) -> c_int {
            let Some(real) = real!($real, fn(*const c_char, *mut $buf) -> c_int) else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            // SAFETY: forwards to libc's function with the caller's buffer.
            with_path(path, |p| unsafe { real(p, buf) })
        }
    };
}
stat_like!(stat, "stat", libc::stat);
stat_like!(stat64, "stat64", libc::stat64);
stat_like!(lstat, "lstat", libc::stat);
stat_like!(lstat64, "lstat64", libc::stat64);

macro_rules! xstat_like {
    ($name:ident, $real:literal, $buf:ty) => {
        /// Interposed: glibc's versioned stat entry points (`__xstat`, ...).
        #[no_mangle]
        pub unsafe extern "C" fn $name(ver: c_int, path: *const c_char, buf: *mut $buf) -> c_int {
            let Some(real) = real!($real, fn(c_int, *const c_char, *mut $buf) -> c_int) else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            // SAFETY: forwards to libc's function with the caller's buffer.
            with_path(path, |p| unsafe { real(ver, p, buf) })
        }
    };
}
xstat_like!(__xstat, "__xstat", libc::stat);
xstat_like!(__xstat64, "__xstat64", libc::stat64);
xstat_like!(__lxstat, "__lxstat", libc::stat);
xstat_like!(__lxstat64, "__lxstat64", libc::stat64);

macro_rules! fstatat_like {
    ($name:ident, $real:literal, $buf:ty) => {
        /// Interposed: `fstatat` with an absolute path.
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, buf: *mut $buf, flags: c_int) -> c_int {
            let Some(real) = real!($real, fn(c_int, *const c_char, *mut $buf, c_int) -> c_int) else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            // SAFETY: forwards to libc's function with the caller's buffer.
            with_path(path, |p| unsafe { real(dirfd, p, buf, flags) })
        }
    };
}
fstatat_like!(fstatat, "fstatat", libc::stat);
fstatat_like!(fstatat64, "fstatat64", libc::stat64);

macro_rules! fxstatat_like {
    ($name:ident, $real:literal, $buf:ty) => {
        /// Interposed: glibc's versioned `fstatat`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            ver: c_int,
            dirfd: c_int,
            path: *const c_char,
            buf: *mut $buf,
            flags: c_int,
        ) -> c_int {
            let Some(real) = real!($real, fn(c_int, c_int, *const c_char, *mut $buf, c_int) -> c_int) else {
                set_errno(libc::ENOSYS);
                return -1;
            };
            // SAFETY: forwards to libc's function with the caller's buffer.
            with_path(path, |p| unsafe { real(ver, dirfd, p, buf, flags) })
        }
    };
}
fxstatat_like!(__fxstatat, "__fxstatat", libc::stat);
fxstatat_like!(__fxstatat64, "__fxstatat64", libc::stat64);

/// Interposed: `statx` (what Rust's std uses).
#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    let Some(real) = real!(
        "statx",
        fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int
    ) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwards to libc's function with the caller's buffer.
    with_path(path, |p| unsafe { real(dirfd, p, flags, mask, buf) })
}

/// Interposed: `opendir` lists the sysfs tree.
#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    let Some(real) = real!("opendir", fn(*const c_char) -> *mut libc::DIR) else {
        set_errno(libc::ENOSYS);
        return std::ptr::null_mut();
    };
    // SAFETY: forwards to libc's function.
    with_path(path, |p| unsafe { real(p) })
}

/// Interposed: RDMA netlink is refused, so libibverbs reads sysfs.
#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if model_dir().is_some() && domain == libc::AF_NETLINK && protocol == NETLINK_RDMA {
        crate::log!("refusing RDMA netlink");
        set_errno(libc::EPROTONOSUPPORT);
        return -1;
    }
    let Some(real) = real!("socket", fn(c_int, c_int, c_int) -> c_int) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwards the caller's arguments to libc's function.
    unsafe { real(domain, ty, protocol) }
}

/// Interposed: commands on the device file.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    if fd_kind(fd) == FD_DEVICE {
        return guarded(-1, || {
            let rt = runtime().ok_or(libc::EBADF)?;
            rt.lock().write(fd, buf as u64, count, &ProcessMemory, &ProcessHost)?;
            Ok(count as ssize_t)
        });
    }
    let Some(real) = real!("write", fn(c_int, *const c_void, size_t) -> ssize_t) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwards the caller's arguments to libc's function.
    unsafe { real(fd, buf, count) }
}

/// Interposed: events read from the model's event fds are counted, as the kernel counts
/// them at read time.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    let Some(real) = real!("read", fn(c_int, *mut c_void, size_t) -> ssize_t) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwards the caller's arguments to libc's function.
    let n = unsafe { real(fd, buf, count) };
    if n > 0 && fd_kind(fd) == FD_EVENT {
        if let Some(rt) = runtime() {
            // SAFETY: the read just filled `n` bytes of the caller's buffer.
            let bytes = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n as usize) };
            let _ = catch_unwind(AssertUnwindSafe(|| rt.lock().events_read(fd, bytes)));
        }
    }
    n
}

/// Interposed: `RDMA_VERBS_IOCTL` on the device file.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if fd_kind(fd) == FD_DEVICE {
        return guarded(-1, || {
            let rt = runtime().ok_or(libc::EBADF)?;
            rt.lock().ioctl(fd, request, arg as u64, &ProcessMemory, &ProcessHost)?;
            Ok(0)
        });
    }
    let Some(real) = real!("ioctl", fn(c_int, c_ulong, *mut c_void) -> c_int) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwards the caller's arguments to libc's function (the third is the one
    // pointer-sized variadic argument every ioctl takes).
    unsafe { real(fd, request, arg) }
}

fn mmap_device(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, offset: i64) -> *mut c_void {
    guarded(libc::MAP_FAILED, || {
        let rt = runtime().ok_or(libc::EBADF)?;
        let page = crate::abi::PAGE_SIZE as i64;
        if offset < 0 || offset % page != 0 {
            return Err(libc::EINVAL);
        }
        let access = MapAccess {
            write: prot & libc::PROT_WRITE != 0,
            exec: prot & libc::PROT_EXEC != 0,
            shared: flags & libc::MAP_SHARED != 0,
        };
        let mut model = rt.lock();
        let mapping = model.check_mmap(fd, (offset / page) as u64, len as u64, access)?;
        let real = real!(
            "mmap",
            fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void
        )
        .ok_or(libc::ENOSYS)?;
        let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE);
        let p = match mapping {
            Mapping::Uar => {
                let prot = libc::PROT_READ | libc::PROT_WRITE;
                // SAFETY: an anonymous shared page stands for the UAR; MAP_FIXED is honoured
                // only when the caller asked for it at its own address.
                let p = unsafe { real(addr, len, prot, libc::MAP_SHARED | libc::MAP_ANONYMOUS | fixed, -1, 0) };
                if p == libc::MAP_FAILED {
                    return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM));
                }
                model.mapped(fd, (offset / page) as u64, p as u64);
                p
            }
            Mapping::CoreClock => {
                let (client, view) = map_clock_page(real, addr, len, prot, fixed)?;
                crate::runtime::write_device_time(view as u64);
                model.mapped_clock(client as u64, view as u64);
                client
            }
        };
        MAPPED_PAGES.fetch_add(1, Ordering::AcqRel);
        crate::log!("mmap offset {offset:#x} -> {p:?}");
        Ok(p)
    })
}

/// The core clock page: a memfd page mapped for the client as it asked (read-only: the
/// kernel refused write access) and once more writable for the model, which keeps the
/// device's timer in it. Returns `(client mapping, model view)`.
fn map_clock_page(
    real: unsafe extern "C" fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    fixed: c_int,
) -> Result<(*mut c_void, *mut c_void), c_int> {
    let last_errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM);
    // SAFETY: a NUL-terminated name and valid flags.
    let raw = unsafe { libc::memfd_create(c"mlx5-model-core-clock".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(last_errno());
    }
    // SAFETY: `raw` is a new descriptor this function alone owns; closing it goes to libc
    // (the interposed `close` passes descriptors the model did not mark straight through).
    let memfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on the memfd just made.
    if unsafe { libc::ftruncate(memfd.as_raw_fd(), len as off_t) } != 0 {
        return Err(last_errno());
    }
    // SAFETY: a new shared mapping of the memfd at an address the kernel picks.
    let view = unsafe {
        real(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    };
    if view == libc::MAP_FAILED {
        return Err(last_errno());
    }
    // SAFETY: the client's mapping of the same page with the client's protection; MAP_FIXED
    // only where the caller asked for it at its own address.
    let client = unsafe { real(addr, len, prot, libc::MAP_SHARED | fixed, memfd.as_raw_fd(), 0) };
    if client == libc::MAP_FAILED {
        let e = last_errno();
        real_munmap(view, len);
        return Err(e);
    }
    Ok((client, view))
}

/// Interposed: UAR pages of the device file.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    if fd_kind(fd) == FD_DEVICE {
        return mmap_device(addr, len, prot, flags, fd, offset);
    }
    let Some(real) = real!(
        "mmap",
        fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void
    ) else {
        set_errno(libc::ENOSYS);
        return libc::MAP_FAILED;
    };
    // SAFETY: forwards the caller's arguments to libc's function.
    unsafe { real(addr, len, prot, flags, fd, offset) }
}

/// Interposed: `mmap64` (the same as `mmap` on 64-bit).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    // SAFETY: same contract as mmap.
    unsafe { mmap(addr, len, prot, flags, fd, offset) }
}

/// Unmaps a page the interposer mapped for itself, through libc's `munmap` (a call to
/// `libc::munmap` from here would land in the interposed one below).
fn real_munmap(addr: *mut c_void, len: size_t) {
    if let Some(real) = real!("munmap", fn(*mut c_void, size_t) -> c_int) {
        // SAFETY: callers pass a mapping the interposer made and no longer uses.
        unsafe { real(addr, len) };
    }
}

/// Interposed: a UAR page unmapped is forgotten by the device first.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    if MAPPED_PAGES.load(Ordering::Acquire) > 0 {
        if let Some(rt) = runtime() {
            let mut m = rt.lock();
            let before = m.mapped_pages();
            for view in m.unmapped(addr as u64, len as u64) {
                // A clock page view, forgotten by the model just now under its lock: nothing
                // writes it any more.
                real_munmap(view as *mut c_void, crate::abi::PAGE_SIZE as size_t);
            }
            MAPPED_PAGES.fetch_sub(before - m.mapped_pages(), Ordering::AcqRel);
        }
    }
    let Some(real) = real!("munmap", fn(*mut c_void, size_t) -> c_int) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwards the caller's arguments to libc's function.
    unsafe { real(addr, len) }
}

/// Interposed: closing the device file destroys its context; closing an event fd forgets
/// it.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let kind = fd_kind(fd);
    if kind != FD_OTHER {
        if let Some(rt) = runtime() {
            let mut m = rt.lock();
            if kind == FD_DEVICE {
                let before = m.mapped_pages();
                m.close(fd);
                MAPPED_PAGES.fetch_sub(before - m.mapped_pages(), Ordering::AcqRel);
                crate::log!("close uverbs0 fd {fd}");
            } else {
                m.fd_closed(fd);
            }
            unmark_fd(fd);
        }
    }
    let Some(real) = real!("close", fn(c_int) -> c_int) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwards the caller's argument to libc's function.
    unsafe { real(fd) }
}

/// Runs when the library is loaded: builds the sysfs tree and points libibverbs at it.
extern "C" fn init() {
    let _ = catch_unwind(|| {
        let Some(dir) = model_dir() else { return };
        let root = dir.join("sysfs");
        if let Err(e) = crate::sysfs::build(&root) {
            crate::log!("cannot build {}: {e}", root.display());
            return;
        }
        if std::env::var_os("SYSFS_PATH").is_none() {
            // Runs in the loader's constructor, before the program's threads exist.
            std::env::set_var("SYSFS_PATH", &root);
        }
    });
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = init;

/// Not interposed: the differential trace's step (`stepper.rs`), called by the test programs
/// of `tests/mlx5/` (found with `dlsym`) after each post. Returns 0, or -1 when the model
/// is not running.
///
/// # Safety
/// `label` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn uverbs_mlx5_model_step(label: *const c_char) -> c_int {
    let label = if label.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string (our contract).
        unsafe { CStr::from_ptr(label) }.to_string_lossy().into_owned()
    };
    guarded(-1, || {
        let rt = runtime().ok_or(libc::ENODEV)?;
        crate::stepper::step(&mut rt.lock(), &label, &ProcessMemory);
        Ok(0)
    })
}

/// Not interposed: how many BlueFlame copies the device compared with their WQE and found
/// whole (`device/bfcheck.rs`), for the test programs (found with `dlsym`); -1 when the model
/// is not running.
#[no_mangle]
pub extern "C" fn uverbs_mlx5_model_bf_copies_checked() -> i64 {
    guarded(-1, || {
        let rt = runtime().ok_or(libc::ENODEV)?;
        let n = rt.lock().bf_copies_checked;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    })
}

/// Not interposed: the client has no post in flight (every UAR store it made is complete):
/// the device checks every bfreg now (`device/bfcheck.rs` `check_quiescent`). Returns the
/// number of violations recorded so far, or -1 when the model is not running.
#[no_mangle]
pub extern "C" fn uverbs_mlx5_model_check_bfregs() -> c_int {
    guarded(-1, || {
        let rt = runtime().ok_or(libc::ENODEV)?;
        let mut model = rt.lock();
        crate::device::bfcheck::check_quiescent(&mut model, &ProcessMemory, u64::from(crate::bf_reg_size()));
        Ok(c_int::try_from(model.violations.len()).unwrap_or(c_int::MAX))
    })
}

/// Not interposed: the violations the device recorded so far (`device/bfcheck.rs`), for the
/// test programs (found with `dlsym`). Writes them as text, one a line (`reason: detail`),
/// NUL-terminated and cut to `len` bytes, to `buf` (unless null); returns how many there
/// are, or -1 when the model is not running.
///
/// # Safety
/// `buf` is null or has room for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn uverbs_mlx5_model_violations(buf: *mut c_char, len: size_t) -> c_int {
    guarded(-1, || {
        let rt = runtime().ok_or(libc::ENODEV)?;
        let model = rt.lock();
        let text: String = model.violations.iter().map(|v| format!("{v}\n")).collect();
        if !buf.is_null() && len > 0 {
            let n = text.len().min(len - 1);
            // SAFETY: `buf` has room for `len` bytes (our contract); `n + 1 <= len`.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        Ok(c_int::try_from(model.violations.len()).unwrap_or(c_int::MAX))
    })
}
