//! Shared set-up for tests that run against a real RDMA device (the rxe driver in the test
//! guest, or a host device). With no device these fail, saying how to run them.
#![allow(dead_code)]

use std::time::{Duration, Instant};
use uverbs::*;

/// How long a test waits for completions before failing.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Opens the device named by `UVERBS_TEST_DEVICE`, or the first one.
pub fn open_test_device() -> Context {
    let name = std::env::var("UVERBS_TEST_DEVICE").ok();
    uverbs::open(name.as_deref()).unwrap_or_else(|e| {
        panic!(
            "{e}\nThese tests need an RDMA device: run them with `cargo xtask test`, which boots a guest with rdma_rxe"
        )
    })
}

/// The RoCE v2 GID to use on port 1 (on `lo`, `::ffff:127.0.0.1`).
pub fn loopback_gid(ctx: &Context) -> Gid {
    ctx.roce_v2_gid(1).expect("a RoCE v2 GID")
}

/// The address of `gid`, as a QP's path (from the same GID locally).
pub fn path_to(gid: &Gid) -> AhAttr {
    gid.route_to(gid.raw)
}

/// Two RC QPs on one device connected to each other, each with its own CQ and MR.
pub struct Pair {
    pub ctx: Context,
    pub pd: Pd,
    pub a: End,
    pub b: End,
}

/// One side of a [`Pair`].
pub struct End {
    pub qp: Qp,
    pub cq: Cq,
    pub mr: RemoteMr,
}

/// Options for [`Pair::with`].
pub struct PairOpts {
    pub qp_type: QpType,
    pub cap: QpCap,
    pub cq_depth: u32,
    pub mr_len: usize,
    pub access: AccessFlags,
}

impl Default for PairOpts {
    fn default() -> Self {
        Self {
            qp_type: QpType::Rc,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            cq_depth: 1024,
            mr_len: 1 << 20,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        }
    }
}

impl Pair {
    /// A connected RC pair with default options.
    pub fn new() -> Self {
        Self::with(PairOpts::default())
    }

    /// A connected pair with `opts`.
    pub fn with(opts: PairOpts) -> Self {
        let ctx = open_test_device();
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let gid = loopback_gid(&ctx);
        let make = || {
            let cq = ctx.create_cq(opts.cq_depth).expect("create_cq");
            let mut init = QpInit::new(opts.qp_type, &cq, &cq);
            init.cap = opts.cap;
            let qp = pd.create_qp(&init).expect("create_qp");
            let mr = pd.alloc_remote_mr(opts.mr_len, opts.access).expect("alloc_remote_mr");
            End { qp, cq, mr }
        };
        let (mut a, mut b) = (make(), make());
        let access = opts.access;
        let (a_qpn, b_qpn) = (a.qp.qpn(), b.qp.qpn());
        for (me, peer) in [(&mut a, b_qpn), (&mut b, a_qpn)] {
            me.qp.to_init(1, access).expect("to INIT");
            me.qp.to_rtr(path_to(&gid), peer, 0, Mtu::Mtu1024).expect("to RTR");
            me.qp.to_rts(0).expect("to RTS");
        }
        Self { ctx, pd, a, b }
    }
}

/// Polls `cq` until `n` completions arrived (asking for at most `batch` at a time).
pub fn poll_n(cq: &mut Cq, n: usize, batch: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    let mut buf = vec![WorkCompletion::default(); batch];
    let start = Instant::now();
    while out.len() < n {
        let want = batch.min(n - out.len());
        let got = cq.poll(&mut buf[..want]);
        out.extend_from_slice(&buf[..got]);
        assert!(
            start.elapsed() < TIMEOUT,
            "timed out with {} of {n} completions: {out:#?}",
            out.len()
        );
    }
    out
}

/// Polls once more after a short wait and asserts nothing else arrived.
pub fn assert_idle(cq: &mut Cq) {
    std::thread::sleep(Duration::from_millis(50));
    let mut wc = [WorkCompletion::default(); 4];
    let n = cq.poll(&mut wc);
    assert_eq!(n, 0, "unexpected completions: {:#?}", &wc[..n]);
}

/// Counts open fds and mappings of uverbs devices in this process.
pub fn kernel_footprint() -> (usize, usize) {
    let fds = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| {
            let p = p.to_string_lossy();
            p.contains("infiniband") || p.contains("[infinibandevent]")
        })
        .count();
    let maps = std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|l| l.contains("/dev/infiniband"))
        .count();
    (fds, maps)
}

/// Plain slices over a [`RemoteMr`] for tests.
pub trait Bytes {
    /// The region's bytes.
    fn bytes(&self) -> &[u8];
    /// The region's bytes, mutably.
    fn bytes_mut(&mut self) -> &mut [u8];
}

impl Bytes for RemoteMr {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the tests run one request flow at a time: they read bytes only after the
        // completions of the requests that write them, and no peer writes while they look.
        unsafe { self.as_slice() }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`: they fill buffers before posting the requests that read them.
        unsafe { self.as_mut_slice() }
    }
}
