//! Helpers for the C boundary: no panic crosses it, errors become errno values, and messages
//! go to stderr without ever panicking themselves.

use libc::c_int;
use std::fmt::Arguments;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// Whether `UVERBS_PROVIDER_VERBOSE` is set to something other than empty or `0`.
pub fn is_verbose() -> bool {
    static VERBOSE: OnceLock<bool> = OnceLock::new();
    *VERBOSE.get_or_init(|| std::env::var_os("UVERBS_PROVIDER_VERBOSE").is_some_and(|v| !v.is_empty() && v != "0"))
}

/// Prints `uverbs_rxe: <msg>` on stderr.
pub fn warn(msg: Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "uverbs_rxe: {msg}");
}

/// [`warn`], only with `UVERBS_PROVIDER_VERBOSE`.
pub fn verbose(msg: Arguments<'_>) {
    if is_verbose() {
        warn(msg);
    }
}

/// Runs `f`, turning a panic into `on_panic` (and a message) instead of unwinding into C.
pub fn guard<T>(verb: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            warn(format_args!("internal error (panic) in {verb}; returning an error"));
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// The errno value that best describes `e`, as the C provider would return it.
pub fn errno_of(e: &uverbs::Error) -> c_int {
    use uverbs::{Error, WrReject};
    match e {
        Error::Kernel { errno, .. } => *errno as c_int,
        Error::WorkRequest {
            reason: WrReject::QueueFull,
            ..
        } => libc::ENOMEM,
        Error::WorkRequest { .. } | Error::InvalidArgument { .. } => libc::EINVAL,
        Error::Unsupported { .. } => libc::EOPNOTSUPP,
        Error::NoDevice { .. } | Error::NoProvider { .. } => libc::ENODEV,
        Error::AbiVersion { .. } => libc::ENOSYS,
        Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

/// Logs `e` (verbose mode) for `verb` and returns its errno.
pub fn fail(verb: &str, e: &uverbs::Error) -> c_int {
    verbose(format_args!("{verb}: {e}"));
    errno_of(e)
}

/// For ops returning a pointer: logs, sets errno, returns null.
pub fn fail_null<T>(verb: &str, e: &uverbs::Error) -> *mut T {
    set_errno(fail(verb, e));
    std::ptr::null_mut()
}

/// For ops returning a pointer when the request itself is not supported or invalid.
pub fn refuse_null<T>(verb: &str, errno: c_int, why: &str) -> *mut T {
    verbose(format_args!("{verb}: {why}"));
    set_errno(errno);
    std::ptr::null_mut()
}
