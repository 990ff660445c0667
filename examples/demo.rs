//! Lists the RDMA devices, then moves real traffic through the Rust provider on the first one:
//! RC sends between two QPs, an RDMA write and read checked byte for byte, and UD sends.
//!
//! `cargo xtask demo` runs this in a guest with the rdma_rxe driver when the host has no
//! RDMA device; on a host with one, `cargo run --release --example demo [device]`.

use std::process::ExitCode;
use std::time::{Duration, Instant};
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
        println!("  gid[{}] {} type {}", g.index, g.ip(), g.gid_type);
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
    rc_traffic(&ctx, path)?;
    ud_traffic(&ctx, path)
}

const MSG: usize = 4096;
const DEPTH: u64 = 64;

/// RC sends with every payload checked, then an RDMA write and read.
fn rc_traffic(ctx: &Context, path: AhAttr) -> DemoResult<()> {
    let pd = ctx.alloc_pd()?;
    let (mut scq, mut rcq) = (ctx.create_cq(256)?, ctx.create_cq(256)?);
    let mut init = QpInit::new(QpType::Rc, &scq, &rcq);
    init.cap.max_send_wr = DEPTH as u32;
    init.cap.max_recv_wr = DEPTH as u32;
    let (mut a, mut b) = (pd.create_qp(&init)?, pd.create_qp(&init)?);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let (an, bn) = (a.qpn(), b.qpn());
    for (qp, peer) in [(&mut a, bn), (&mut b, an)] {
        qp.to_init(1, access)?;
        qp.to_rtr(path, peer, 0, Mtu::Mtu1024)?;
        qp.to_rts(0)?;
    }
    // Sources and the read's target: only this process's requests touch them, so plain
    // slices. The receive and write target: peers write it, so volatile copies.
    let mut src = pd.alloc_mr(MSG * DEPTH as usize, AccessFlags::LOCAL_WRITE)?;
    let dst = pd.alloc_remote_mr(MSG * DEPTH as usize, access)?;
    let post_recv = |b: &mut Qp, i: u64| {
        let sge = dst.sge((i % DEPTH) as usize * MSG, MSG as u32).expect("in bounds");
        // SAFETY: the slot is read only after its completion and reposted after that.
        unsafe { b.post_recv(&[RecvWr::new(i, &[sge])]) }
    };
    const TOTAL: u64 = 20_000;
    for i in 0..DEPTH {
        post_recv(&mut b, i)?;
    }
    let (mut sent, mut sdone, mut rdone) = (0u64, 0u64, 0u64);
    let mut wc = [WorkCompletion::default(); 32];
    let start = Instant::now();
    while rdone < TOTAL {
        while sent < TOTAL && sent - sdone < DEPTH / 2 && sent < rdone + DEPTH {
            let off = (sent % DEPTH) as usize * MSG;
            src.as_mut_slice()[off..off + 8].copy_from_slice(&sent.to_le_bytes());
            let sge = [src.sge(off, MSG as u32).expect("in bounds")];
            // SAFETY: the slot is rewritten only after this send completes.
            unsafe { a.post_send(&[SendWr::new(sent, SendOp::Send, &sge)]) }?;
            sent += 1;
        }
        let n = scq.poll(&mut wc);
        sdone += check(&wc[..n])? as u64;
        let n = rcq.poll(&mut wc);
        check(&wc[..n])?;
        for c in &wc[..n] {
            let off = (c.wr_id % DEPTH) as usize * MSG;
            let mut seq = [0; 8];
            dst.read(off, &mut seq)?;
            let seq = u64::from_le_bytes(seq);
            if seq != c.wr_id || c.byte_len as usize != MSG {
                return Err(format!("message {} carried {seq}", c.wr_id).into());
            }
            rdone += 1;
            if c.wr_id + DEPTH < TOTAL {
                post_recv(&mut b, c.wr_id + DEPTH)?;
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err("traffic stalled".into());
        }
    }
    // The last sends' completions may still be pending when the last receive is in: take
    // them, so the waits below see the write's and the read's own.
    while sdone < TOTAL {
        let n = scq.poll(&mut wc);
        sdone += check(&wc[..n])? as u64;
        if start.elapsed() > Duration::from_secs(120) {
            return Err("send completions stalled".into());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "RC: {TOTAL} sends of {MSG} B, every payload checked: {:.0} msg/s, {:.1} MB/s",
        TOTAL as f64 / secs,
        (TOTAL as usize * MSG) as f64 / secs / 1e6
    );

    src.as_mut_slice()[..MSG]
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    let remote = Remote {
        addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let sge = [src.sge(0, MSG as u32).expect("in bounds")];
    unsafe { a.post_send(&[SendWr::new(1, SendOp::RdmaWrite(remote), &sge)]) }?;
    wait_one(&mut scq)?;
    let back = [src.sge(MSG, MSG as u32).expect("in bounds")];
    unsafe { a.post_send(&[SendWr::new(2, SendOp::RdmaRead(remote), &back)]) }?;
    wait_one(&mut scq)?;
    let written = dst.to_vec(0, MSG)?;
    let same = src.as_slice()[..MSG] == written[..] && src.as_slice()[..MSG] == src.as_slice()[MSG..2 * MSG];
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
    const QKEY: u32 = 0x1234;
    let pd = ctx.alloc_pd()?;
    let mut cq = ctx.create_cq(64)?;
    let mut qps = Vec::new();
    for _ in 0..2 {
        let mut qp = pd.create_qp(&QpInit::new(QpType::Ud, &cq, &cq))?;
        qp.ud_to_rts(1, QKEY)?;
        qps.push(qp);
    }
    let ah = pd.create_ah(&path)?;
    let mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE)?;
    let recv = [mr.sge(4096, 40 + 512).expect("in bounds")];
    let dest = ah.ud_dest(qps[1].qpn(), QKEY);
    let sge = [mr.sge(0, 512).expect("in bounds")];
    for i in 0..10 {
        unsafe { qps[1].post_recv(&[RecvWr::new(100 + i, &recv)]) }?;
        unsafe { qps[0].post_send(&[SendWr::new(i, SendOp::Send, &sge).to(dest)]) }?;
        for _ in 0..2 {
            let c = wait_one(&mut cq)?;
            if c.opcode == WcOpcode::RECV && (c.src_qp != qps[0].qpn() || c.byte_len != 40 + 512) {
                return Err(format!("UD receive {c:?}").into());
            }
        }
    }
    println!("UD: 10 datagrams of 512 B via an address handle, source QP and the 40-byte GRH room checked");
    Ok(())
}

fn check(wcs: &[WorkCompletion]) -> DemoResult<usize> {
    match wcs.iter().find(|c| !c.is_success()) {
        Some(c) => Err(format!("completion failed: {c:?}").into()),
        None => Ok(wcs.len()),
    }
}

fn wait_one(cq: &mut Cq) -> DemoResult<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    let start = Instant::now();
    // `try_poll`: an overrun CQ ends the wait with an error instead of an empty poll forever.
    while cq.try_poll(&mut wc)? == 0 {
        if start.elapsed() > Duration::from_secs(30) {
            return Err("no completion within 30 s".into());
        }
    }
    check(&wc)?;
    Ok(wc[0])
}
