//! The kernel log as the fuzzer reads it: new `/dev/kmsg` records that report a bug or a
//! warning ([`KERNEL_SIGNS`], as the guest harness looks for), checked after every round.

/// Kernel log lines of a bug or warning (as the guest harness looks for), read from
/// `/dev/kmsg` where this process may (root in the test guest); nothing elsewhere.
pub(crate) struct Kmsg(Option<std::fs::File>);

const KERNEL_SIGNS: &[&str] = &[
    "BUG:",
    "WARNING:",
    "Oops",
    "general protection fault",
    "UBSAN:",
    "KASAN:",
    "Kernel panic",
];

impl Kmsg {
    pub(crate) fn open() -> Self {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()
            .and_then(|mut f| f.seek(SeekFrom::End(0)).ok().map(|_| f));
        Self(file)
    }

    /// The new records that report a problem.
    pub(crate) fn problems(&mut self) -> Vec<String> {
        use std::io::Read;
        let Some(f) = &mut self.0 else { return Vec::new() };
        let mut out = Vec::new();
        let mut record = vec![0u8; 8192];
        loop {
            match f.read(&mut record) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&record[..n]);
                    if KERNEL_SIGNS.iter().any(|s| text.contains(s)) {
                        out.push(text.trim_end().to_string());
                    }
                }
                // EPIPE: records were overwritten before they were read; go on from here.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        out
    }

    pub(crate) fn present(&self) -> bool {
        self.0.is_some()
    }
}
