//! Shared set-up for tests that run against a real RDMA device (the rxe driver in the test
//! guest, or a host device). With no device these fail, saying how to run them.
#![allow(dead_code)]

pub mod cm;
pub mod kernel;
pub mod link;
pub mod srq;
pub mod wire;

use std::time::{Duration, Instant};
use uverbs::*;

/// How long a test waits for completions before failing.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A current-thread tokio runtime with I/O and timers, for the `uverbs::aio` tests.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .unwrap()
}

/// Opens the device named by `UVERBS_TEST_DEVICE`, or the first one.
pub fn open_test_device() -> Context {
    let name = std::env::var("UVERBS_TEST_DEVICE").ok();
    uverbs::open(name.as_deref()).unwrap_or_else(|e| {
        panic!(
            "{e}\nThese tests need an RDMA device: run them with `cargo xtask test`, which boots a guest with rdma_rxe"
        )
    })
}

/// The kernel driver behind the test device. Tests expect different results by driver only
/// where the hardware or its driver truly differs; each such place says why, and
/// docs/mlx5-model.md lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// SoftRoCE (`rdma_rxe`), the test guest's device.
    Rxe,
    /// ConnectX (`mlx5_ib`), or the mlx5 model on the host (`cargo xtask mlx5 --step`).
    Mlx5,
    /// soft-iWARP (`siw`), in the test guest under `xtask/guest/with_siw.sh`.
    Siw,
}

/// The driver of `ctx`'s device, by the provider that drives it (the ABI version does not
/// tell: mlx5 and siw are both 1).
pub fn driver(ctx: &Context) -> Driver {
    let dev = ctx.device();
    let provider = uverbs::providers().iter().find(|p| p.matches(dev)).map(|p| p.name());
    match provider {
        Some("rxe") => Driver::Rxe,
        Some("mlx5") => Driver::Mlx5,
        Some("siw") => Driver::Siw,
        other => panic!("{}: no test expectations for provider {other:?}", dev.name),
    }
}

/// `byte_len` of a successful SEND or RDMA_WRITE completion of `len` bytes, at the requester.
/// rxe and siw report the length. On mlx5 the field is undefined there (ibv_poll_cq(3) defines it at
/// the requester for READ and atomics only, and libmlx5 leaves it unwritten): the Rust
/// provider reports 0.
pub fn sent_byte_len(ctx: &Context, len: usize) -> u32 {
    match driver(ctx) {
        Driver::Rxe | Driver::Siw => len as u32,
        Driver::Mlx5 => 0,
    }
}

/// `src_qp` of an RC receive completion sent by `peer_qpn`: rxe and siw (whose CQE has no
/// such field) leave it 0; mlx5 reports the sender's QPN (the CQE's `flags_rqpn`, which libmlx5 copies for every receive).
pub fn rc_recv_src_qp(ctx: &Context, peer_qpn: u32) -> u32 {
    match driver(ctx) {
        Driver::Rxe | Driver::Siw => 0,
        Driver::Mlx5 => peer_qpn,
    }
}

/// The GRH flag of an RC receive completion: rxe sets it on every RoCE receive, RC included
/// (docs/kernel-facts.md); mlx5 sets it when the packet carried a GRH, which on InfiniBand (the
/// model) a path without a global route does not, and on RoCE every packet does; siw (iWARP,
/// no GRH at all) never.
pub fn rc_recv_grh(ctx: &Context) -> WcFlags {
    if driver(ctx) == Driver::Siw {
        return WcFlags::empty();
    }
    let roce = ctx.query_port(1).expect("query_port 1").needs_grh();
    match driver(ctx) == Driver::Rxe || roce {
        true => WcFlags::GRH,
        false => WcFlags::empty(),
    }
}

/// The RoCE v2 GID to use on port 1 (on `lo`, `::ffff:127.0.0.1`).
pub fn loopback_gid(ctx: &Context) -> Gid {
    ctx.roce_v2_gid(1).expect("a RoCE v2 GID")
}

/// The address of `gid`, as a QP's path (from the same GID locally).
pub fn path_to(gid: &Gid) -> AhAttr {
    gid.route_to(gid.raw)
}

/// The path from port 1 back to itself, by the port's link layer: on RoCE (rxe) the RoCE v2
/// GID of [`loopback_gid`]; on InfiniBand (the mlx5 model) the port's own LID, no GRH.
pub fn loopback_path(ctx: &Context) -> AhAttr {
    let port = ctx.query_port(1).expect("query_port 1");
    match port.needs_grh() {
        true => path_to(&loopback_gid(ctx)),
        false => AhAttr {
            port_num: 1,
            dlid: port.lid,
            ..Default::default()
        },
    }
}

/// The path from port 1 back to itself with a global route, and the GID it goes to: on RoCE
/// (rxe) [`loopback_path`]'s; on InfiniBand (the mlx5 model) the port's LID with a GRH to
/// its GID 0.
pub fn loopback_path_with_grh(ctx: &Context) -> (AhAttr, Gid) {
    let port = ctx.query_port(1).expect("query_port 1");
    match port.needs_grh() {
        true => {
            let gid = loopback_gid(ctx);
            (path_to(&gid), gid)
        }
        false => {
            let gid = ctx.query_gid(1, 0).expect("GID 0");
            let path = AhAttr {
                dlid: port.lid,
                ..path_to(&gid)
            };
            (path, gid)
        }
    }
}

/// Two RC QPs on one device connected to each other, each with its own CQ and MR: by hand
/// over the loopback path, or on iWARP (siw) through the CM ([`link::cm_connect`], `a` the
/// active side).
pub struct Pair {
    pub ctx: Context,
    pub pd: Pd,
    pub a: End,
    pub b: End,
    /// The CM ids of an iWARP pair's connection.
    pub cm: Option<link::CmLink>,
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
    pub sq_sig_all: bool,
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
            sq_sig_all: false,
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
        let make = || {
            let cq = ctx.create_cq(opts.cq_depth).expect("create_cq");
            let mut init = QpInit::new(opts.qp_type, &cq, &cq);
            init.cap = opts.cap;
            init.sq_sig_all = opts.sq_sig_all;
            let qp = pd.create_qp(&init).expect("create_qp");
            let mr = pd.alloc_remote_mr(opts.mr_len, opts.access).expect("alloc_remote_mr");
            End { qp, cq, mr }
        };
        let (mut a, mut b) = (make(), make());
        if link::is_iwarp(&ctx) {
            assert_eq!(opts.qp_type, QpType::Rc, "iWARP connects RC QPs only");
            let cm = Some(link::cm_connect(&mut a.qp, &mut b.qp));
            return Self { ctx, pd, a, b, cm };
        }
        let path = loopback_path(&ctx);
        let access = opts.access;
        let (a_qpn, b_qpn) = (a.qp.qpn(), b.qp.qpn());
        for (me, peer) in [(&mut a, b_qpn), (&mut b, a_qpn)] {
            me.qp.to_init(1, access).expect("to INIT");
            me.qp.to_rtr(path, peer, 0, Mtu::Mtu1024).expect("to RTR");
            me.qp.to_rts(0).expect("to RTS");
        }
        Self {
            ctx,
            pd,
            a,
            b,
            cm: None,
        }
    }
}

/// Waits until the RDMA WRITEs `p.a` completed are in `p.b`'s memory: on siw, which completes
/// a WRITE once sent (docs/kernel-facts.md), by an 8-byte READ from `p.b` whose completion
/// follows their placement; elsewhere a WRITE's completion already means placed.
pub fn await_placement(p: &mut Pair) {
    if driver(&p.ctx) != Driver::Siw {
        return;
    }
    let len = p.a.mr.len();
    let sge = [p.a.mr.sge(len - 8, 8).unwrap()];
    let from = Remote {
        addr: p.b.mr.addr() + p.b.mr.len() as u64 - 8,
        rkey: p.b.mr.rkey(),
    };
    // SAFETY: the last 8 bytes of A's region are written only by this READ, polled below.
    unsafe { p.a.qp.post_send(&[SendWr::new(u64::MAX, SendOp::RdmaRead(from), &sge)]) }.expect("READ");
    let c = poll_n(&mut p.a.cq, 1, 1)[0];
    assert_eq!((c.wr_id, c.status), (u64::MAX, WcStatus::SUCCESS), "{c:?}");
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

/// Whether [`kernel_footprint`] sees the device: not on the mlx5 model
/// (`UVERBS_MLX5_MODEL_DIR` set), whose device file is a `/dev/null` descriptor and whose UAR
/// pages are anonymous memory.
pub fn footprint_visible() -> bool {
    std::env::var_os("UVERBS_MLX5_MODEL_DIR").is_none()
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
