//! The Rust side of the mlx5 differential (same WQE bytes, doorbells and completions as
//! libmlx5): the script of `tests/mlx5/wqe_diff.c` (whose header describes it) run through
//! this crate's public API on the Rust mlx5 provider, printing exactly what the C program
//! prints. Built as the example `mlx5_wqe_diff` (`--features mlx5`); run on the mlx5 model
//! by `cargo xtask mlx5 --step`.

use std::ffi::{c_char, c_int, CString};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use uverbs::{
    AccessFlags, Ah, AhAttr, Cq, GlobalRoute, Mtu, QpCap, QpInit, QpType, RecvWr, Remote, SendFlags, SendOp, SendWr,
    Sge, WorkCompletion,
};

/// The UD QP's Q_Key (as the C side's).
const QKEY: u32 = 0x1111_1111;

/// One parsed send request: its fields, SGEs kept apart so the list can borrow them, and on
/// the UD QP its destination (AH number, remote QPN, remote Q_Key).
struct Send {
    wr_id: u64,
    op: SendOp,
    flags: SendFlags,
    sges: Vec<Sge>,
    ud: Option<(usize, u32, u32)>,
}

/// The capabilities and CQ size of a `qp` or `ud` line.
fn caps(w: &mut std::str::SplitWhitespace<'_>) -> Result<(QpCap, u32), String> {
    let cap = QpCap {
        max_send_wr: num(w)? as u32,
        max_recv_wr: num(w)? as u32,
        max_send_sge: num(w)? as u32,
        max_recv_sge: num(w)? as u32,
        max_inline_data: num(w)? as u32,
    };
    Ok((cap, num(w)? as u32))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wqe_diff: {e}");
            ExitCode::FAILURE
        }
    }
}

type Step = unsafe extern "C" fn(*const c_char) -> c_int;

/// The model's trace step, if this process runs on the model.
fn model_step() -> Option<Step> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a symbol up.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"uverbs_mlx5_model_step".as_ptr()) };
    // SAFETY: the model exports the symbol with this signature (tests/mlx5/model).
    (!f.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, Step>(f) })
}

fn num(words: &mut std::str::SplitWhitespace<'_>) -> Result<u64, String> {
    let w = words.next().ok_or("script: number expected")?;
    match w.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => w.parse(),
    }
    .map_err(|e| format!("script: {w}: {e}"))
}

fn print_wc(wc: &WorkCompletion, qpn: u32) {
    println!(
        "wc id={:x} status={} opcode={} vendor_err={:x} byte_len={} imm={:08x} qp={} src_qp={:x} flags={:x} \
         pkey={} slid={} sl={} dlid_path_bits={}",
        wc.wr_id,
        wc.status.0,
        wc.opcode.0,
        wc.vendor_err,
        wc.byte_len,
        wc.imm_data,
        if wc.qp_num == qpn { "self" } else { "other" },
        wc.src_qp,
        wc.wc_flags.bits(),
        wc.pkey_index,
        wc.slid,
        wc.sl,
        wc.dlid_path_bits
    );
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, device, script] = &args[..] else {
        return Err("usage: mlx5_wqe_diff <device> <script>".into());
    };
    let step = model_step().ok_or("not on the mlx5 model (no uverbs_mlx5_model_step)")?;
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    let text = std::fs::read_to_string(script)?;
    let ctx = uverbs::open(Some(device))?;
    let pd = ctx.alloc_pd()?;
    let mut lines = text.lines();
    let header = lines.next().ok_or("script: no qp line")?;
    let mut w = header
        .strip_prefix("qp ")
        .ok_or("script: qp line first")?
        .split_whitespace();
    let (cap, cqe) = caps(&mut w)?;
    let mut cq: Cq = ctx.create_cq(cqe)?;
    let mut init = QpInit::new(QpType::Rc, &cq, &cq);
    init.cap = cap;
    let mut qp = pd.create_qp(&init)?;
    qp.to_init(
        1,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
    )?;
    let mut qpn = qp.qpn();
    // Connected to itself: the model executes nothing while it traces. On a RoCE port by
    // GID 0 (RoCE v1, link-local: the kernel takes the MAC out of it), as wqe_diff.c does.
    let port = ctx.query_port(1)?;
    let grh = match port.needs_grh() {
        true => Some(GlobalRoute {
            dgid: ctx.query_gid(1, 0)?.raw,
            sgid_index: 0,
            hop_limit: 1,
            traffic_class: 0,
            flow_label: 0,
        }),
        false => None,
    };
    let ah = AhAttr {
        port_num: 1,
        dlid: port.lid,
        grh,
        ..Default::default()
    };
    qp.to_rtr(ah, qpn, 0, Mtu::Mtu1024)?;
    qp.to_rts(0)?;
    let (mut sends, mut recvs): (Vec<Send>, Vec<(u64, Vec<Sge>)>) = (Vec::new(), Vec::new());
    let mut expected = 0usize;
    // The RC QP and its CQ once a UD QP took over, and the AHs.
    let mut retired = None;
    let mut ahs: Vec<Ah> = Vec::new();
    for line in lines {
        let mut w = line.split_whitespace();
        match w.next() {
            Some("z") => {
                let qp_type = match num(&mut w)? {
                    0 => QpType::Rc,
                    1 => QpType::Uc,
                    2 => QpType::Ud,
                    t => return Err(format!("script: z line of type {t}").into()),
                };
                let mut init = QpInit::new(qp_type, &cq, &cq);
                init.cap = QpCap {
                    max_send_wr: num(&mut w)? as u32,
                    max_recv_wr: num(&mut w)? as u32,
                    max_send_sge: num(&mut w)? as u32,
                    max_recv_sge: num(&mut w)? as u32,
                    max_inline_data: num(&mut w)? as u32,
                };
                drop(pd.create_qp(&init)?);
            }
            Some("ud") => {
                let (cap, cqe) = caps(&mut w)?;
                let ud_cq = ctx.create_cq(cqe)?;
                let mut init = QpInit::new(QpType::Ud, &ud_cq, &ud_cq);
                init.cap = cap;
                let mut ud = pd.create_qp(&init)?;
                ud.ud_to_rts(1, QKEY)?;
                qpn = ud.qpn();
                retired = Some((std::mem::replace(&mut qp, ud), std::mem::replace(&mut cq, ud_cq)));
            }
            Some("A") => {
                let mut attr = AhAttr {
                    port_num: 1,
                    dlid: num(&mut w)? as u16,
                    sl: num(&mut w)? as u8,
                    src_path_bits: num(&mut w)? as u8,
                    static_rate: num(&mut w)? as u8,
                    grh: None,
                };
                let global = num(&mut w)? != 0;
                let (hop_limit, traffic_class, flow_label) =
                    (num(&mut w)? as u8, num(&mut w)? as u8, num(&mut w)? as u32);
                let mut dgid = [0u8; 16];
                dgid[..8].copy_from_slice(&num(&mut w)?.to_be_bytes());
                dgid[8..].copy_from_slice(&num(&mut w)?.to_be_bytes());
                if global {
                    attr.grh = Some(GlobalRoute {
                        dgid,
                        sgid_index: 0,
                        hop_limit,
                        traffic_class,
                        flow_label,
                    });
                }
                ahs.push(pd.create_ah(&attr)?);
            }
            Some("S") => {
                let wr_id = num(&mut w)?;
                let (op, flags, imm) = (num(&mut w)?, num(&mut w)? as u32, num(&mut w)? as u32);
                let remote = Remote {
                    addr: num(&mut w)?,
                    rkey: num(&mut w)? as u32,
                };
                let (compare, swap_add) = (num(&mut w)?, num(&mut w)?);
                let flags = SendFlags::from_bits_retain(flags);
                let mut sges = Vec::new();
                for _ in 0..num(&mut w)? {
                    let (addr, length, lkey) = (num(&mut w)?, num(&mut w)? as u32, num(&mut w)? as u32);
                    let addr = match flags.contains(SendFlags::INLINE) {
                        true => pattern.as_ptr() as u64 + addr,
                        false => addr,
                    };
                    sges.push(Sge { addr, length, lkey });
                }
                let op = match op {
                    0 => SendOp::RdmaWrite(remote),
                    1 => SendOp::RdmaWriteWithImm(remote, imm),
                    2 => SendOp::Send,
                    3 => SendOp::SendWithImm { imm },
                    4 => SendOp::RdmaRead(remote),
                    5 => SendOp::CompareSwap {
                        remote,
                        compare,
                        swap: swap_add,
                    },
                    6 => SendOp::FetchAdd { remote, add: swap_add },
                    _ => return Err(format!("script: opcode {op}").into()),
                };
                // On the UD QP: remote QPN, remote Q_Key, AH number.
                let ud = retired
                    .as_ref()
                    .map(|_| (compare as usize, remote.addr as u32, remote.rkey));
                sends.push(Send {
                    wr_id,
                    op,
                    flags,
                    sges,
                    ud,
                });
            }
            Some("P") if !sends.is_empty() => {
                let mut wrs = Vec::new();
                for s in &sends {
                    let mut wr = SendWr::new(s.wr_id, s.op, &s.sges).set_flags(s.flags);
                    if let Some((ah, remote_qpn, remote_qkey)) = s.ud {
                        let ah = ahs.get(ah).ok_or("script: no such AH")?;
                        wr = wr.to(ah.ud_dest(remote_qpn, remote_qkey));
                    }
                    wrs.push(wr);
                }
                // SAFETY: inline SGEs name `pattern`, alive here; the others are never
                // touched: while it traces, the model executes nothing.
                let posted = match unsafe { qp.post_send(&wrs) } {
                    Ok(()) => wrs.len(),
                    Err(uverbs::Error::WorkRequest { index, .. }) => index,
                    Err(e) => return Err(e.into()),
                };
                let then = if posted < wrs.len() { ", then an error" } else { "" };
                println!("post_send {}: {posted} posted{then}", wrs.len());
                expected += wrs[..posted]
                    .iter()
                    .filter(|w| w.flags.contains(SendFlags::SIGNALED))
                    .count();
                sends.clear();
            }
            Some("R") => {
                let wr_id = num(&mut w)?;
                let mut sges = Vec::new();
                for _ in 0..num(&mut w)? {
                    let (addr, length, lkey) = (num(&mut w)?, num(&mut w)? as u32, num(&mut w)? as u32);
                    sges.push(Sge { addr, length, lkey });
                }
                recvs.push((wr_id, sges));
            }
            Some("Q") if !recvs.is_empty() => {
                let wrs: Vec<RecvWr<'_>> = recvs.iter().map(|(id, s)| RecvWr::new(*id, s)).collect();
                // SAFETY: the buffers are never touched: while it traces, the model executes
                // nothing.
                let posted = match unsafe { qp.post_recv(&wrs) } {
                    Ok(()) => wrs.len(),
                    Err(uverbs::Error::WorkRequest { index, .. }) => index,
                    Err(e) => return Err(e.into()),
                };
                let then = if posted < wrs.len() { ", then an error" } else { "" };
                println!("post_recv {}: {posted} posted{then}", wrs.len());
                expected += posted;
                recvs.clear();
            }
            Some("T") => {
                let label = line[1..].trim().to_string();
                let c = CString::new(label.clone())?;
                // SAFETY: a NUL-terminated string; the step reads it only during the call.
                if unsafe { step(c.as_ptr()) } != 0 {
                    return Err("the model's trace step failed".into());
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut wc = [WorkCompletion::default(); 16];
                let mut got = 0;
                while got < expected && Instant::now() < deadline {
                    let n = cq.poll(&mut wc);
                    for c in &wc[..n] {
                        print_wc(c, qpn);
                    }
                    got += n;
                }
                let more = cq.poll(&mut wc);
                println!("step {label}: {got} completions of {expected}, {more} more after");
                expected = 0;
            }
            _ => {}
        }
    }
    // As the C side: the AHs, the QPs in the order made, then their CQs.
    drop(ahs);
    match retired {
        Some((rc, rc_cq)) => {
            drop(rc);
            drop(qp);
            drop(rc_cq);
            drop(cq);
        }
        None => {
            drop(qp);
            drop(cq);
        }
    }
    println!("wqe_diff: done");
    Ok(())
}
