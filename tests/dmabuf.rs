//! dma-buf memory regions (`Pd::reg_dmabuf_mr`, the ioctl REG_DMABUF_MR).
//!
//! No real exporter is available here: Debian's 6.1 kernel is built without `CONFIG_UDMABUF`,
//! so there is no `/dev/udmabuf` to turn a memfd into a dma-buf (docs/kernel-facts.md). On
//! rxe the kernel refuses the method before it looks at the fd (6.1's rxe has no
//! `reg_user_mr_dmabuf`), so a memfd is passed and the refusal checked. On the mlx5 model the
//! model stands in for the exporter: it maps the memfd passed as the dma-buf
//! (docs/mlx5-model.md), and the bytes RDMA moves are checked through the test's own mapping
//! of the same memfd.

mod common;

use common::*;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use uverbs::*;

const BUF_LEN: usize = 64 << 10;

/// A memfd of `BUF_LEN` zero bytes.
fn memfd() -> OwnedFd {
    // SAFETY: the name is NUL-terminated; memfd_create returns a new fd or -1.
    let fd = unsafe { libc::memfd_create(c"uverbs-dmabuf".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on an fd we own.
    let r = unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), BUF_LEN as libc::off_t) };
    assert_eq!(r, 0, "ftruncate: {}", std::io::Error::last_os_error());
    fd
}

/// The memfd's bytes, mapped shared (unmapped on drop).
struct Shared {
    ptr: *mut u8,
}

impl Shared {
    fn new(fd: &OwnedFd) -> Self {
        // SAFETY: a fresh shared mapping of the whole file; checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BUF_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(fd),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        Self { ptr: p.cast() }
    }

    /// The bytes. Called only while no work request touches the region.
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is BUF_LEN bytes and lives as long as `self`; the device writes
        // it only while a work request runs, and the tests call this between completions.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, BUF_LEN) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), BUF_LEN) };
    }
}

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

#[test]
fn offset_and_iova_in_different_page_positions_are_refused_before_the_kernel() {
    let ctx = open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let fd = memfd();
    match pd.reg_dmabuf_mr(fd.as_fd(), 1, 4096, 0x10_0000, ALL) {
        Err(Error::InvalidArgument { verb, .. }) => assert_eq!(verb, "REG_DMABUF_MR"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// rxe (Linux 6.1): the kernel answers EOPNOTSUPP (core/uverbs_std_types_mr.c: the device has
/// no `reg_user_mr_dmabuf`), which the library reports as `Error::Unsupported`.
#[test]
fn rxe_refuses_dmabuf_regions_with_a_typed_error() {
    let ctx = open_test_device();
    if driver(&ctx) != Driver::Rxe {
        return;
    }
    let pd = ctx.alloc_pd().unwrap();
    let fd = memfd();
    match pd.reg_dmabuf_mr(fd.as_fd(), 0, 8192, 0x20_0000, ALL) {
        Err(Error::Unsupported { verb, what }) => {
            assert_eq!(verb, "REG_DMABUF_MR");
            assert!(what.contains("EOPNOTSUPP"), "{what}");
        }
        other => panic!("expected Error::Unsupported, got {other:?}"),
    }
    // The refusal left nothing behind: the PD is still free to go.
    drop(pd);
}

/// mlx5 model: a memfd region registered as a dma-buf MR; a peer RDMA-writes into it and
/// RDMA-reads from it, and it is the local side of a write; every byte of the buffer checked
/// through the memfd's own mapping.
#[test]
fn rdma_write_and_read_through_a_dmabuf_region() {
    let mut p = Pair::new();
    if driver(&p.ctx) != Driver::Mlx5 {
        return;
    }
    let fd = memfd();
    let mut shared = Shared::new(&fd);
    // Bytes 4096..4096+16384 of the buffer, addressed from an iova with the same page offset.
    const OFF: usize = 4096;
    const LEN: usize = 16384;
    let iova = 0x7000_0000_0000u64;
    let dm =
        p.pd.reg_dmabuf_mr(fd.as_fd(), OFF as u64, LEN, iova, ALL)
            .expect("reg_dmabuf_mr");
    drop(fd); // the registration holds its own reference
    assert_eq!((dm.addr(), dm.len(), dm.access()), (iova, LEN, ALL));
    assert_ne!(dm.lkey(), 0);
    let region = dm.region();
    assert_eq!(
        (region.addr(), region.rkey(), region.len()),
        (iova, dm.rkey(), LEN as u64)
    );

    // A peer's RDMA write of 5000 bytes lands at region offset 1000.
    for (i, b) in p.a.mr.bytes_mut()[..5000].iter_mut().enumerate() {
        *b = (i * 13 % 251) as u8 + 1;
    }
    let sge = p.a.mr.sge(0, 5000).unwrap();
    let at = dm.remote(1000).unwrap();
    // SAFETY: A's bytes are not touched until the completion.
    unsafe { p.a.qp.post_send(&[SendWr::new(1, SendOp::RdmaWrite(at), &[sge])]) }.unwrap();
    let c = poll_n(&mut p.a.cq, 1, 4)[0];
    assert_eq!((c.status, c.wr_id), (WcStatus::SUCCESS, 1));
    let mut want = vec![0u8; BUF_LEN];
    want[OFF + 1000..OFF + 6000].copy_from_slice(&p.a.mr.bytes()[..5000]);
    assert!(shared.bytes() == &want[..], "the buffer after the RDMA write");

    // A peer's RDMA read of the last 7000 bytes of the region, written by the exporter.
    for (i, b) in shared.bytes()[OFF + LEN - 7000..OFF + LEN].iter_mut().enumerate() {
        *b = (i * 7 % 253) as u8;
    }
    want[OFF + LEN - 7000..OFF + LEN].copy_from_slice(&shared.bytes()[OFF + LEN - 7000..OFF + LEN]);
    let sge = p.a.mr.sge(8192, 7000).unwrap();
    let from = dm.remote(LEN - 7000).unwrap();
    // SAFETY: as above.
    unsafe { p.a.qp.post_send(&[SendWr::new(2, SendOp::RdmaRead(from), &[sge])]) }.unwrap();
    let c = poll_n(&mut p.a.cq, 1, 4)[0];
    assert_eq!((c.status, c.wr_id, c.byte_len), (WcStatus::SUCCESS, 2, 7000));
    assert_eq!(&p.a.mr.bytes()[8192..8192 + 7000], &want[OFF + LEN - 7000..OFF + LEN]);

    // The region as the local side: B writes 3000 of its bytes (from region offset 200) into
    // A's region at 20000.
    let sge = dm.sge(200, 3000).unwrap();
    let to = p.a.mr.remote(20000).unwrap();
    // SAFETY: the dma-buf bytes are not changed until the completion.
    unsafe { p.b.qp.post_send(&[SendWr::new(3, SendOp::RdmaWrite(to), &[sge])]) }.unwrap();
    let c = poll_n(&mut p.b.cq, 1, 4)[0];
    assert_eq!((c.status, c.wr_id), (WcStatus::SUCCESS, 3));
    assert_eq!(&p.a.mr.bytes()[20000..23000], &want[OFF + 200..OFF + 3200]);
    // Nothing else in the buffer changed.
    assert!(shared.bytes() == &want[..], "the whole buffer at the end");

    // Past the region: the device refuses (a remote access error), the bytes stay.
    let sge = p.a.mr.sge(0, 16).unwrap();
    let past = Remote {
        addr: iova + LEN as u64 - 8,
        rkey: dm.rkey(),
    };
    // SAFETY: as above.
    unsafe { p.a.qp.post_send(&[SendWr::new(4, SendOp::RdmaWrite(past), &[sge])]) }.unwrap();
    let c = poll_n(&mut p.a.cq, 1, 4)[0];
    assert_eq!((c.status, c.wr_id), (WcStatus::REM_ACCESS_ERR, 4));
    assert!(shared.bytes() == &want[..], "the buffer after a refused write");
}

/// mlx5 model: a range past the buffer's end is the kernel's EINVAL (ib_umem_dmabuf_get).
#[test]
fn a_range_past_the_buffer_is_einval_on_mlx5() {
    let ctx = open_test_device();
    if driver(&ctx) != Driver::Mlx5 {
        return;
    }
    let pd = ctx.alloc_pd().unwrap();
    let fd = memfd();
    let e = pd
        .reg_dmabuf_mr(fd.as_fd(), 8192, BUF_LEN, 8192, ALL)
        .expect_err("past the end");
    assert_eq!(e.errno(), Some(nix::errno::Errno::EINVAL), "{e}");
    // A whole-buffer region is fine.
    pd.reg_dmabuf_mr(fd.as_fd(), 0, BUF_LEN, 0, ALL)
        .expect("the whole buffer");
}
