//! A writer for the `newc` cpio format, which the kernel unpacks as initramfs.

/// Builds a cpio (newc) archive in memory.
#[derive(Default)]
pub struct Archive {
    buf: Vec<u8>,
    next_ino: u32,
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

impl Archive {
    /// A directory (parents are not created implicitly).
    pub fn dir(&mut self, path: &str) {
        self.entry(path, S_IFDIR | 0o755, 0, b"");
    }

    /// A regular file with permission bits `perm`.
    pub fn file(&mut self, path: &str, perm: u32, data: &[u8]) {
        self.entry(path, S_IFREG | perm, 0, data);
    }

    /// A symbolic link at `path` pointing to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) {
        self.entry(path, S_IFLNK | 0o777, 0, target.as_bytes());
    }

    /// A character device node.
    pub fn char_dev(&mut self, path: &str, perm: u32, major: u32, minor: u32) {
        self.entry(path, S_IFCHR | perm, (major << 8) | minor, b"");
    }

    /// Appends the trailer and returns the archive bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.header("TRAILER!!!", 0, 0, 0, 0, 0);
        self.buf
    }

    fn entry(&mut self, path: &str, mode: u32, rdev: u32, data: &[u8]) {
        self.next_ino += 1;
        let nlink = if mode & S_IFDIR == S_IFDIR { 2 } else { 1 };
        let path = path.trim_start_matches('/');
        self.header(path, self.next_ino, mode, nlink, rdev, data.len() as u32);
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn header(&mut self, name: &str, ino: u32, mode: u32, nlink: u32, rdev: u32, size: u32) {
        let fields = [
            ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime: fixed, so archives are reproducible
            size,
            0, // dev major
            0, // dev minor
            rdev >> 8,
            rdev & 0xff,
            name.len() as u32 + 1,
            0, // check
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Round-trips through the system's cpio, when it is installed.
    #[test]
    fn cpio_lists_what_we_wrote() {
        let mut a = Archive::default();
        a.dir("/bin");
        a.file("/bin/hello", 0o755, b"hi there");
        a.symlink("/bin/sh", "hello");
        let bytes = a.finish();
        assert!(bytes.len().is_multiple_of(4));
        let Some(cpio) = crate::proc::find_program("cpio") else {
            return;
        };
        let out = crate::proc::filter(std::process::Command::new(cpio).args(["-t", "--quiet"]), &bytes, &[0]).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "bin\nbin/hello\nbin/sh\n");
    }
}
