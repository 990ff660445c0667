//! The differential trace against libmlx5 (`xtask/src/mlx5_diff.rs`): with
//! `UVERBS_MLX5_MODEL_TRACE=<file>` the model appends to that file what a provider gave it,
//! in a form two providers' runs can be compared line by line:
//!
//! - `cmd <NAME> outlen=<n> <hex>`: the driver data (`udata.inbuf`) of each command, and how
//!   many driver response bytes the caller offered ([`command`]).
//! - `step <label>` and what follows it: the rings and doorbells at each step
//!   (`stepper.rs`, which also retires what it traced).
//!
//! This module only keeps the file and writes to it; it names neither the kernel nor the
//! device, which both write to it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Mutex;

/// Whether `UVERBS_MLX5_MODEL_TRACE` names a trace file this process could open.
pub fn enabled() -> bool {
    file().is_some()
}

fn file() -> Option<&'static Mutex<std::fs::File>> {
    static T: std::sync::OnceLock<Option<Mutex<std::fs::File>>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let path = std::env::var_os("UVERBS_MLX5_MODEL_TRACE").filter(|p| !p.is_empty())?;
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).ok()?;
        Some(Mutex::new(file))
    })
    .as_ref()
}

/// Appends `text` to the trace (no-op unless tracing).
pub fn emit(text: &str) {
    if let Some(f) = file() {
        let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
        let _ = f.write_all(text.as_bytes());
    }
}

/// `bytes` as lowercase hex, two digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Records a command's driver data (no-op unless tracing).
pub fn command(name: &str, udata_in: &[u8], outlen: usize) {
    if enabled() {
        emit(&format!("cmd {name} outlen={outlen} {}\n", hex(udata_in)));
    }
}
