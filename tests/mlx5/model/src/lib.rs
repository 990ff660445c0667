//! A model of an mlx5 (ConnectX) device and of the uverbs kernel that drives it, for tests:
//! Debian's unmodified libibverbs and libmlx5 (and this repository's Rust core) run on it
//! through an `LD_PRELOAD` interposer, with no RDMA hardware.
//!
//! - [`kernel`]: the uverbs commands of the mlx5 driver (framed `write()` and the ioctl
//!   methods modelled), validating driver data as Linux 6.1 does.
//! - [`device`]: executes WQEs when the doorbell records move, writes CQEs, raises events.
//! - [`runtime`]: the model inside one process: its port on a Unix-socket fabric shared by
//!   the processes started with the same `UVERBS_MLX5_MODEL_DIR`, and its threads.
//! - [`interpose`]: the libc functions the client's calls land in (`/dev/infiniband/uverbs0`,
//!   the sysfs tree, `write`/`ioctl`/`mmap` on the device file).
//! - [`trace`]: the differential trace file (commands' driver data), and [`stepper`]: its
//!   steps, which read the rings and retire what they traced.
//!
//! Without `UVERBS_MLX5_MODEL_DIR` the interposer passes every call through.

#![deny(unsafe_op_in_unsafe_fn, rust_2018_idioms)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod device;
#[cfg(not(feature = "harness"))]
mod fds;
#[cfg(any(test, feature = "harness"))]
pub mod harness;
// The interposer and the process runtime it starts: left out of the harness build (the fuzz
// target links the model into a program whose own `open`, `read`, ... must stay libc's).
#[cfg(not(feature = "harness"))]
#[allow(unsafe_code)]
mod interpose;
pub mod kernel;
pub mod mem;
pub mod objects;
pub mod port;
#[cfg(not(feature = "harness"))]
pub mod runtime;
pub mod stepper;
#[cfg(not(feature = "harness"))]
mod sysfs;
pub mod trace;
pub mod wire;

#[cfg(test)]
mod tests;

/// Whether `UVERBS_MLX5_MODEL_LOG=1`.
pub fn log_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("UVERBS_MLX5_MODEL_LOG").is_some_and(|v| v == "1"))
}

/// Whether `UVERBS_MLX5_MODEL_WC=1`: the device has write combining (`dev->wc_support`), so
/// GET_CONTEXT reports BlueFlame registers of 512 bytes, BlueFlame UARs can be allocated and
/// WC pages mapped. Off by default: the model then stands for a device without write
/// combining (`bf_reg_size` 0, no BlueFlame).
pub fn wc_support() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("UVERBS_MLX5_MODEL_WC").is_some_and(|v| v == "1"))
}

/// `UVERBS_MLX5_MODEL_DEVICE_CPU=N`: the device thread runs on CPU `N` only. For native
/// benchmarks, with the harness pinned to another CPU: left to the scheduler, the two threads
/// move between the cores, and the time a process measures varied up to 2.5× from one
/// process to the next. `None` when unset.
pub fn device_cpu() -> Option<usize> {
    static CPU: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *CPU.get_or_init(|| std::env::var("UVERBS_MLX5_MODEL_DEVICE_CPU").ok()?.parse().ok())
}

/// `bf_reg_size` as GET_CONTEXT reports it (hw/mlx5/main.c:1790: `1 << log_bf_reg_size`
/// with write combining, 0 without).
pub fn bf_reg_size() -> u32 {
    if wc_support() {
        512
    } else {
        0
    }
}

/// Writes one `mlx5-model:` line to stderr when logging is on.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        if $crate::log_enabled() {
            eprintln!("mlx5-model: {}", format_args!($($arg)*));
        }
    };
}
