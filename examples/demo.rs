//! Lists the RDMA devices, then moves real traffic through the Rust provider on the first one:
//! RC sends between two QPs, an RDMA write and read checked byte for byte, and UD sends, all
//! posted without `unsafe` (buffers moved into the QP and given back by their completions).
//!
//! `cargo xtask demo` runs this in a guest with the rdma_rxe driver when the host has no
//! RDMA device; on a host with one, `cargo run --release --example demo [device]`.
//!
//! On an iWARP device (siw) the QPs reach RTS only through the connection manager: the demo
//! then connects its two RC QPs over `uverbs::cm` at the address given as the second argument
//! or in `UVERBS_CM_ADDR` (an IPv4 address of the device's netdev), and shows that iWARP has
//! no UD QPs (`tests/guest/demo_siw.sh` runs it on siw0).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use uverbs::cm::{ConnParam, Connection, Listener};
use uverbs::*;

/// The demo's own failures (bad data, stalls) next to the library's errors.
type DemoResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> DemoResult<()> {
    let list = devices()?;
    println!("{} RDMA device(s)", list.len());
    for d in &list {
        println!(
            "  {:<10} {} driver_id={:?} abi={} netdev={}",
            d.name,
            d.dev_path.display(),
            d.driver_id,
            d.abi_version,
            d.parent_netdev.as_deref().unwrap_or("-")
        );
    }
    let name = std::env::args().nth(1);
    let ctx = open(name.as_deref())?;
    let attr = ctx.query_device()?;
    let port = ctx.query_port(1)?;
    println!(
        "\n{}: vendor {:#x}, max_qp {}, max_cqe {}, max_mr {}, max_sge {}; port 1 state {:?} mtu {} link layer {:?}",
        ctx.device().name,
        attr.vendor_id,
        attr.max_qp,
        attr.max_cqe,
        attr.max_mr,
        attr.max_sge,
        port.state,
        port.active_mtu.map_or(0, Mtu::bytes),
        port.link_layer
    );
    let gids = ctx.gid_table()?;
    for g in &gids {
        println!("  gid[{}] {} type {:?}", g.index, g.ip(), g.gid_type);
    }
    if ctx.device().transport()? == Transport::IWARP {
        let ip = std::env::args()
            .nth(2)
            .or_else(|| std::env::var("UVERBS_CM_ADDR").ok())
            .ok_or("an iWARP device connects through the CM: give an IPv4 address of its netdev")?;
        let addr = SocketAddr::new(ip.parse()?, 7499);
        println!("\niWARP: connecting through the RDMA CM at {addr}");
        rc_traffic(&ctx, Link::Cm(addr))?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(4)?;
        return match pd.create_qp(&QpInit::new(QpType::Ud, &cq, &cq)) {
            Err(e @ Error::Unsupported { .. }) => {
                println!("UD: {e}");
                Ok(())
            }
            Err(e) => Err(e.into()),
            Ok(_) => Err("an iWARP device made a UD QP".into()),
        };
    }
    // RoCE addresses by GID; InfiniBand by LID (both QPs are on this port).
    let path = if port.needs_grh() {
        let gid = ctx.roce_v2_gid(1)?;
        println!("\nusing gid[{}] {}", gid.index, gid.ip());
        gid.route_to(gid.raw)
    } else {
        println!("\nusing lid {}", port.lid);
        AhAttr {
            port_num: 1,
            dlid: port.lid,
            ..Default::default()
        }
    };
    rc_traffic(&ctx, Link::Path(path))?;
    ud_traffic(&ctx, path)
}

/// How the two RC QPs reach RTS: by hand on `path`, or through the CM at an address (iWARP).
enum Link {
    Path(AhAttr),
    Cm(SocketAddr),
}

/// Connects `a` (the active side) with `b` through the CM at `addr`; `b` takes `recvs` as
/// its receive buffers before it accepts (an iWARP SEND that finds no receive ends the
/// connection).
fn cm_connect(addr: SocketAddr, a: Qp, mut b: Qp, recvs: Vec<Buf>) -> DemoResult<(Connection, Connection)> {
    let listener = Listener::bind(addr)?;
    let t = Duration::from_secs(20);
    std::thread::scope(|s| {
        let listener = &listener;
        let server = s.spawn(move || -> Result<Connection> {
            let req = listener.get_request(t)?;
            req.init_qp(&mut b)?;
            for buf in recvs {
                b.recv_buf(buf)?;
            }
            req.accept(b, &ConnParam::default(), t)
        });
        let connector = uverbs::cm::Connector::resolve(addr, t)?;
        let a = connector.connect(a, &ConnParam::default(), t)?;
        let b = server.join().map_err(|_| "the accepting thread panicked")??;
        Ok((a, b))
    })
}

const MSG: usize = 4096;
const DEPTH: usize = 64;

/// RC sends with every payload checked, then an RDMA write and read, all through the safe
/// posts: each buffer is moved into the QP and comes back with its completion.
fn rc_traffic(ctx: &Context, link: Link) -> DemoResult<()> {
    let pd = ctx.alloc_pd()?;
    let (mut scq, mut rcq) = (ctx.create_cq(256)?, ctx.create_cq(256)?);
    let mut init = QpInit::new(QpType::Rc, &scq, &rcq);
    init.cap.max_send_wr = DEPTH as u32;
    init.cap.max_recv_wr = DEPTH as u32;
    let (mut a, mut b) = (pd.create_qp(&init)?, pd.create_qp(&init)?);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    // Local memory (only this process's requests touch it), cut into buffers: the free
    // send buffers, and receive buffers, all lent to B's receive queue.
    let mut free = pd.alloc_mr(MSG * DEPTH, LocalAccess::LOCAL_WRITE)?.into_bufs(MSG)?;
    let recvs = pd.alloc_mr(MSG * DEPTH, LocalAccess::LOCAL_WRITE)?.into_bufs(MSG)?;
    // Through the CM the connections own the QPs; kept here while the traffic runs.
    let (mut conns, mut own) = (None, None);
    match link {
        Link::Path(path) => {
            let (an, bn) = (a.qpn(), b.qpn());
            for (qp, peer) in [(&mut a, bn), (&mut b, an)] {
                qp.to_init(1, access)?;
                qp.to_rtr(path, peer, 0, Mtu::Mtu1024)?;
                qp.to_rts(0)?;
            }
            for buf in recvs {
                b.recv_buf(buf)?;
            }
            own = Some((a, b));
        }
        Link::Cm(addr) => conns = Some(cm_connect(addr, a, b, recvs)?),
    }
    let (a, b): (&mut Qp, &mut Qp) = match (conns.as_mut(), own.as_mut()) {
        (Some((ca, cb)), _) => (ca.qp_mut(), cb.qp_mut()),
        (None, Some((a, b))) => (a, b),
        (None, None) => return Err("no QPs".into()),
    };
    const TOTAL: u64 = 20_000;
    let (mut sent, mut received) = (0u64, 0u64);
    let mut wc = [WorkCompletion::default(); 32];
    let start = Instant::now();
    while received < TOTAL || free.len() < DEPTH {
        // A send per free buffer, never more than B has receives posted for.
        while sent < TOTAL && sent < received + DEPTH as u64 {
            let Some(mut buf) = free.pop() else { break };
            buf.set_len(MSG)?;
            buf.as_mut_slice()[..8].copy_from_slice(&sent.to_le_bytes());
            a.send_buf(SendOp::Send, buf)?;
            sent += 1;
        }
        let reaped = scq.reap(&mut wc);
        for c in reaped.iter() {
            c.result()?;
        }
        a.reclaim_all(&reaped, &mut free);
        for c in rcq.reap(&mut wc).iter() {
            c.result()?;
            let buf = b.reclaim(c).ok_or("a receive completion gives its buffer back")?;
            let seq = u64::from_le_bytes(buf.as_slice()[..8].try_into()?);
            if seq != received || buf.len() != MSG {
                return Err(format!("message {received} carried {seq} in {} bytes", buf.len()).into());
            }
            received += 1;
            b.recv_buf(buf)?;
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err("traffic stalled".into());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "RC: {TOTAL} sends of {MSG} B, every payload checked: {:.0} msg/s, {:.1} MB/s",
        TOTAL as f64 / secs,
        (TOTAL as usize * MSG) as f64 / secs / 1e6
    );

    // The peer-visible target: peers write it, so it is reached by volatile copies.
    let dst = pd.alloc_remote_mr(MSG, access)?;
    let remote = dst.remote(0)?;
    let (mut out, mut back) = (free.pop().ok_or("a free buffer")?, free.pop().ok_or("a free buffer")?);
    out.set_len(MSG)?;
    back.set_len(MSG)?;
    out.as_mut_slice()
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    back.as_mut_slice().fill(0);
    a.send_buf(SendOp::RdmaWrite(remote), out)?;
    let (_, out) = wait_buf(&mut scq, &mut [&mut *a])?;
    a.send_buf(SendOp::RdmaRead(remote), back)?;
    let (_, back) = wait_buf(&mut scq, &mut [&mut *a])?;
    let written = dst.to_vec(0, MSG)?;
    let same = out.as_slice() == &written[..] && out.as_slice() == back.as_slice();
    println!(
        "RC: RDMA write then read of {MSG} B: {}",
        if same { "bytes match" } else { "MISMATCH" }
    );
    if same {
        Ok(())
    } else {
        Err("RDMA read returned other bytes".into())
    }
}

/// UD sends through an address handle.
fn ud_traffic(ctx: &Context, path: AhAttr) -> DemoResult<()> {
    // The Q_Key both QPs agree on: any value of the application's choosing.
    const QKEY: u32 = 0x1234;
    let pd = ctx.alloc_pd()?;
    let mut cq = ctx.create_cq(64)?;
    let ud_qp = || -> DemoResult<Qp> {
        let mut qp = pd.create_qp(&QpInit::new(QpType::Ud, &cq, &cq))?;
        qp.ud_to_rts(1, QKEY)?;
        Ok(qp)
    };
    let (mut s, mut r) = (ud_qp()?, ud_qp()?);
    let ah = pd.create_ah(&path)?;
    let dest = ah.ud_dest(r.qpn(), QKEY);
    let mut bufs = pd.alloc_mr(8192, LocalAccess::LOCAL_WRITE)?.into_bufs(4096)?;
    let (mut inbox, mut msg) = (bufs.pop(), bufs.pop());
    for _ in 0..10 {
        r.recv_buf(inbox.take().ok_or("the receive buffer is back")?)?;
        let mut m = msg.take().ok_or("the send buffer is back")?;
        m.set_len(512)?;
        s.send_buf_with(SendOp::Send, m, SendFlags::SIGNALED, Some(dest))?;
        for _ in 0..2 {
            let (c, buf) = wait_buf(&mut cq, &mut [&mut s, &mut r])?;
            if c.opcode != WcOpcode::RECV {
                msg = Some(buf);
                continue;
            }
            // A UD receive starts with 40 bytes of GRH room.
            if c.src_qp != s.qpn() || buf.len() != 40 + 512 {
                return Err(format!("UD receive {c:?}").into());
            }
            inbox = Some(buf);
        }
    }
    println!("UD: 10 datagrams of 512 B via an address handle, source QP and the 40-byte GRH room checked");
    Ok(())
}

/// The next completion on `cq`, which must be a success, with the buffer it gives back to
/// one of `qps`.
fn wait_buf(cq: &mut Cq, qps: &mut [&mut Qp]) -> DemoResult<(WorkCompletion, Buf)> {
    let mut wc = [WorkCompletion::default()];
    let start = Instant::now();
    loop {
        // `try_reap`: an overrun CQ ends the wait with an error instead of an empty poll forever.
        if let Some(c) = cq.try_reap(&mut wc)?.iter().next() {
            c.result()?;
            let buf = qps
                .iter_mut()
                .find_map(|qp| qp.reclaim(c))
                .ok_or("a completion that gives no buffer back")?;
            return Ok((*c, buf));
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err("no completion within 30 s".into());
        }
    }
}
