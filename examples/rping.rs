//! rping over `uverbs::cm`: the client and server of rdma-core's `rping`
//! (`librdmacm/examples/rping.c`), option for option and on the wire, so that each side runs
//! against the C program.
//!
//! ```text
//! server$ rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
//! client$ rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
//! ```
//!
//! Each ping: the client fills its source buffer with `rdma-ping-N: ` and a rotating run of
//! letters and sends its address, rkey and size (16 bytes: a big-endian u64 and two u32s);
//! the server RDMA READs it and answers with a 16-byte "go ahead"; the client sends its sink
//! buffer the same way, the server RDMA WRITEs the data (up to its NUL) there and answers
//! again. `-v` prints the data (`ping data: ...` on the client, `server ping data: ...` on
//! the server), `-V` makes the client compare sink and source. The client disconnects after
//! `-C` pings (0: never); the server serves one client, until it disconnects.
//!
//! `tests/guest/rping_cmatose_interop.sh` runs it against rdmacm-utils' `rping` both ways.

use nix::poll::{PollFd, PollFlags, PollTimeout};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::Duration;
use uverbs::cm::{CmEventKind, ConnParam, Connection, Connector, Listener};
use uverbs::{
    AccessFlags, CompChannel, Context, Cq, CqInit, LocalAccess, Mr, Pd, Qp, QpInit, QpType, RecvWr, Remote, RemoteMr,
    SendOp, SendWr, WcOpcode, WorkCompletion,
};

/// rping's default port and ping size.
const DEFAULT_PORT: u16 = 7174;
const DEFAULT_SIZE: usize = 64;
/// rping's size limits: room for `rdma-ping-2147483647: ` and a NUL; below 64 KiB.
const MIN_SIZE: usize = 26;
const MAX_SIZE: usize = 64 * 1024 - 1;
/// The advertisement (`struct rping_rdma_info`): buf (u64), rkey (u32), size (u32), big-endian.
const INFO: usize = 16;
/// rping's send queue depth; its CQ holds twice that.
const SQ_DEPTH: u32 = 16;
/// rping gives address and route resolution 2 s each.
const RESOLVE: Duration = Duration::from_secs(2);
/// How long a step may make no progress before this side gives up (rping waits forever).
const STALL: Duration = Duration::from_secs(60);

/// Receive buffer at 0, send buffer at `INFO`, in the control region.
const RECV_AT: usize = 0;
const SEND_AT: usize = INFO;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[derive(Debug)]
struct Options {
    server: bool,
    addr: Option<IpAddr>,
    source: Option<IpAddr>,
    port: u16,
    /// Pings before the client disconnects; 0: forever.
    count: u64,
    size: usize,
    verbose: bool,
    validate: bool,
    debug: bool,
}

const USAGE: &str = "rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
\t-c\t\tclient side
\t-I\t\tSource address to bind to for client.
\t-s\t\tserver side.  To bind to any address with IPv6 use -a ::0
\t-v\t\tdisplay ping data to stdout
\t-V\t\tvalidate ping data
\t-d\t\tdebug printfs
\t-S size \tping data size
\t-C count\tping count times
\t-a addr\t\taddress
\t-p port\t\tport";

fn main() {
    let opts = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            println!("{USAGE}");
            std::process::exit(EXIT_BAD_OPTIONS);
        }
    };
    let result = if opts.server {
        run_server(&opts)
    } else {
        run_client(&opts)
    };
    if let Err(e) = result {
        eprintln!("rping {}: {e}", if opts.server { "server" } else { "client" });
        std::process::exit(1);
    }
}

/// rping's exit status for bad options (EINVAL).
const EXIT_BAD_OPTIONS: i32 = nix::errno::Errno::EINVAL as i32;

/// getopt's rules for `a:I:p:C:S:scvVd`: flags may be grouped (`-vV`), a value follows its
/// letter in the same word or the next.
fn parse(args: impl Iterator<Item = String>) -> Result<Options> {
    let mut o = Options {
        server: false,
        addr: None,
        source: None,
        port: DEFAULT_PORT,
        count: 0,
        size: DEFAULT_SIZE,
        verbose: false,
        validate: false,
        debug: false,
    };
    let mut role = None;
    let mut args = args.peekable();
    while let Some(word) = args.next() {
        let Some(letters) = word.strip_prefix('-').filter(|l| !l.is_empty()) else {
            return Err(format!("unexpected argument {word:?}").into());
        };
        for (i, letter) in letters.char_indices() {
            if "aIpCS".contains(letter) {
                let rest = &letters[i + letter.len_utf8()..];
                let value = if rest.is_empty() {
                    args.next().ok_or_else(|| format!("-{letter} needs a value"))?
                } else {
                    rest.to_string()
                };
                match letter {
                    'a' => o.addr = Some(lookup(&value)?),
                    'I' => o.source = Some(lookup(&value)?),
                    'p' => o.port = value.parse().map_err(|_| format!("invalid port {value:?}"))?,
                    'C' => o.count = value.parse().map_err(|_| format!("Invalid count {value}"))?,
                    _ => {
                        o.size = value
                            .parse()
                            .ok()
                            .filter(|s| (MIN_SIZE..=MAX_SIZE).contains(s))
                            .ok_or_else(|| {
                                format!("Invalid size {value} (valid range is {MIN_SIZE} to {})", MAX_SIZE + 1)
                            })?
                    }
                }
                break;
            }
            match letter {
                's' => role = Some(true),
                'c' => role = Some(false),
                'v' => o.verbose = true,
                'V' => o.validate = true,
                'd' => o.debug = true,
                _ => return Err(format!("unknown option -{letter}").into()),
            }
        }
    }
    o.server = role.ok_or("-s or -c is required")?;
    if !o.server && o.addr.is_none() {
        return Err("the client needs -a addr".into());
    }
    Ok(o)
}

/// An address or host name, as rping's getaddrinfo.
fn lookup(name: &str) -> Result<IpAddr> {
    if let Ok(ip) = name.parse() {
        return Ok(ip);
    }
    (name, 0)
        .to_socket_addrs()?
        .next()
        .map(|a| a.ip())
        .ok_or_else(|| format!("getaddrinfo failed - invalid hostname or IP address {name:?}").into())
}

/// The verbs objects of one side: a CQ on a completion channel (for both queues), the
/// control region (receive and send advertisements) and the QP.
struct Verbs {
    qp: Qp,
    cq: Cq,
    comp: CompChannel,
    ctl: Mr,
    pd: Pd,
}

impl Verbs {
    fn new(ctx: &Context) -> Result<Self> {
        let pd = ctx.alloc_pd()?;
        let comp = ctx.create_comp_channel()?;
        let mut cq = ctx.create_cq_with(&CqInit {
            channel: Some(&comp),
            ..CqInit::new(SQ_DEPTH * 2)
        })?;
        cq.req_notify(false)?;
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        init.cap.max_send_wr = SQ_DEPTH;
        init.cap.max_recv_wr = 2;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        let qp = pd.create_qp(&init)?;
        let ctl = pd.alloc_mr(2 * INFO, LocalAccess::LOCAL_WRITE)?;
        Ok(Self { qp, cq, comp, ctl, pd })
    }

    fn post_recv(qp: &mut Qp, ctl: &Mr) -> Result<()> {
        let sge = [ctl.sge(RECV_AT, INFO as u32)?];
        // SAFETY: `ctl` outlives every request: both sides bind it before the connection
        // that owns the QP, so the QP is destroyed first.
        unsafe { qp.post_recv(&[RecvWr::new(WR_RECV, &sge)])? };
        Ok(())
    }

    /// Sends the control region's send buffer (an advertisement, or a "go ahead").
    fn send_ctl(qp: &mut Qp, ctl: &Mr) -> Result<()> {
        let sge = [ctl.sge(SEND_AT, INFO as u32)?];
        // SAFETY: as in `post_recv`.
        unsafe { qp.post_send(&[SendWr::new(WR_SEND, SendOp::Send, &sge)])? };
        Ok(())
    }
}

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_RDMA: u64 = 3;

/// What waiting for the next completion ended with.
enum Next {
    Completion(WorkCompletion),
    /// The peer disconnected (and this side answered).
    Disconnected,
}

/// Waits for the next completion of `cq`, or the peer's disconnect on the connection's
/// channel: sleeps in poll(2) on both fds, never spinning.
fn next(cq: &mut Cq, comp: &CompChannel, conn: &mut Connection) -> Result<Next> {
    loop {
        let mut wc = [WorkCompletion::default()];
        if cq.poll(&mut wc) == 1 {
            if wc[0].status == uverbs::WcStatus::WR_FLUSH_ERR {
                // The connection closed under a posted request: on iWARP the kernel flushes
                // the queues when the peer closes, before the CM reports the disconnect. As C
                // rping, a flush ends the loop like the disconnect it comes from.
                conn.wait_disconnected(STALL)?;
                return Ok(Next::Disconnected);
            }
            if wc[0].status != uverbs::WcStatus::SUCCESS {
                return Err(format!("cq completion failed status {:?} (wr {})", wc[0].status, wc[0].wr_id).into());
            }
            return Ok(Next::Completion(wc[0]));
        }
        let (cq_ready, cm_ready) = {
            let mut fds = [
                PollFd::new(comp.as_fd(), PollFlags::POLLIN),
                PollFd::new(conn.channel().as_fd(), PollFlags::POLLIN),
            ];
            let ms = PollTimeout::try_from(STALL.as_millis() as i32).unwrap_or(PollTimeout::MAX);
            if nix::poll::poll(&mut fds, ms)? == 0 {
                return Err(format!("nothing happened within {STALL:?}").into());
            }
            let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if cm_ready {
            // The only event a connection's channel reports is the peer's disconnect; any
            // other is an error.
            conn.wait_disconnected(Duration::ZERO)?;
            return Ok(Next::Disconnected);
        }
        if cq_ready {
            // Consume the event, re-arm, then poll again: a completion after the poll
            // above raises a new event because the arm comes first.
            comp.get_event(Some(Duration::ZERO))?;
            cq.req_notify(false)?;
        }
    }
}

/// The advertisement of `size` bytes at `remote`.
fn advertise(ctl: &mut Mr, remote: Remote, size: usize) {
    let msg = &mut ctl.as_mut_slice()[SEND_AT..SEND_AT + INFO];
    msg[..8].copy_from_slice(&remote.addr.to_be_bytes());
    msg[8..12].copy_from_slice(&remote.rkey.to_be_bytes());
    msg[12..].copy_from_slice(&(size as u32).to_be_bytes());
}

/// The received advertisement: where and how many bytes.
fn advertised(ctl: &Mr) -> (Remote, u32) {
    let msg = &ctl.as_slice()[RECV_AT..RECV_AT + INFO];
    let be32 = |b: &[u8]| u32::from_be_bytes(b.try_into().expect("4 bytes"));
    let addr = u64::from_be_bytes(msg[..8].try_into().expect("8 bytes"));
    (
        Remote {
            addr,
            rkey: be32(&msg[8..12]),
        },
        be32(&msg[12..]),
    )
}

/// The bytes up to (not including) the first NUL, as `%s` prints them.
fn c_str(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// A receive completion of exactly one advertisement (rping refuses anything else).
fn check_recv(wc: &WorkCompletion) -> Result<()> {
    if wc.byte_len as usize != INFO {
        return Err(format!("Received bogus data, size {}", wc.byte_len).into());
    }
    Ok(())
}

fn run_server(o: &Options) -> Result<()> {
    let ip = o.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let listener = Listener::bind(SocketAddr::new(ip, o.port))?;
    if o.debug {
        println!("rdma_bind_addr successful on {}", listener.local_addr()?);
    }
    // rping serves the first request and waits for it as long as it takes.
    let req = loop {
        let mut event = listener.channel().get_event(None)?;
        match event.kind {
            CmEventKind::CONNECT_REQUEST => {
                break event.take_request().ok_or("a connect request without its new id")?
            }
            k => eprintln!("unhandled event: {k:?}, ignoring"),
        }
    };
    let Verbs {
        mut qp,
        mut cq,
        comp,
        mut ctl,
        pd,
    } = Verbs::new(&req.context()?)?;
    // The server's buffer: RDMA READ lands here and RDMA WRITE goes out from here.
    let buf = pd.alloc_mr(o.size, LocalAccess::LOCAL_WRITE)?;
    req.init_qp(&mut qp)?;
    Verbs::post_recv(&mut qp, &ctl)?;
    let mut conn = req.accept(qp, &ConnParam::default(), STALL)?;
    if o.debug {
        println!("accepted; peer QP {}", conn.qp().qpn());
    }
    // The "go ahead" carries no information: 16 zero bytes, as rping's unused send buffer.
    ctl.as_mut_slice()[SEND_AT..].fill(0);
    loop {
        // The client's source advertisement, or its disconnect.
        let Some((src, len)) = server_recv(&mut cq, &comp, &mut conn, &ctl, o)? else {
            break;
        };
        if len as usize > o.size {
            return Err(format!("the client's {len} bytes do not fit this side's {} (-S)", o.size).into());
        }
        let sge = [buf.sge(0, len)?];
        // SAFETY: `buf` outlives the request: its completion is awaited just below.
        unsafe {
            conn.qp_mut()
                .post_send(&[SendWr::new(WR_RDMA, SendOp::RdmaRead(src), &sge)])?
        };
        wait_for(&mut cq, &comp, &mut conn, WcOpcode::RDMA_READ)?;
        if o.verbose {
            println!("server ping data: {}", c_str(&buf.as_slice()[..len as usize]));
        }
        Verbs::send_ctl(conn.qp_mut(), &ctl)?;
        let Some((sink, sink_len)) = server_recv(&mut cq, &comp, &mut conn, &ctl, o)? else {
            break;
        };
        // The data up to its NUL and the NUL, as rping (strlen + 1), within both buffers.
        let data = &buf.as_slice()[..len as usize];
        let n = data.iter().position(|&b| b == 0).map_or(data.len(), |p| p + 1);
        let n = n.min(sink_len as usize) as u32;
        let sge = [buf.sge(0, n)?];
        // SAFETY: as for the read.
        unsafe {
            conn.qp_mut()
                .post_send(&[SendWr::new(WR_RDMA, SendOp::RdmaWrite(sink), &sge)])?
        };
        wait_for(&mut cq, &comp, &mut conn, WcOpcode::RDMA_WRITE)?;
        Verbs::send_ctl(conn.qp_mut(), &ctl)?;
    }
    eprintln!("server DISCONNECT EVENT...");
    Ok(())
}

/// Waits for the next advertisement (reposting the receive), reaping send completions on the
/// way; `None` once the client disconnected.
fn server_recv(
    cq: &mut Cq,
    comp: &CompChannel,
    conn: &mut Connection,
    ctl: &Mr,
    o: &Options,
) -> Result<Option<(Remote, u32)>> {
    loop {
        match next(cq, comp, conn)? {
            Next::Disconnected => return Ok(None),
            Next::Completion(wc) if wc.opcode == WcOpcode::RECV => {
                check_recv(&wc)?;
                let (remote, len) = advertised(ctl);
                if o.debug {
                    println!(
                        "Received rkey {:x} addr {:x} len {len} from peer",
                        remote.rkey, remote.addr
                    );
                }
                Verbs::post_recv(conn.qp_mut(), ctl)?;
                return Ok(Some((remote, len)));
            }
            Next::Completion(wc) if wc.opcode == WcOpcode::SEND => continue,
            Next::Completion(wc) => return Err(format!("unexpected completion {:?}", wc.opcode).into()),
        }
    }
}

/// Waits for the completion of the one RDMA request outstanding, reaping send completions.
fn wait_for(cq: &mut Cq, comp: &CompChannel, conn: &mut Connection, op: WcOpcode) -> Result<()> {
    loop {
        match next(cq, comp, conn)? {
            Next::Disconnected => return Err(format!("the peer disconnected during {op:?}").into()),
            Next::Completion(wc) if wc.opcode == op => return Ok(()),
            Next::Completion(wc) if wc.opcode == WcOpcode::SEND => continue,
            Next::Completion(wc) => return Err(format!("{:?} while waiting for {op:?}", wc.opcode).into()),
        }
    }
}

/// The client's receive of a "go ahead" (reposting the receive), reaping send completions.
fn client_recv(cq: &mut Cq, comp: &CompChannel, conn: &mut Connection, ctl: &Mr) -> Result<()> {
    loop {
        match next(cq, comp, conn)? {
            Next::Disconnected => {
                eprintln!("client DISCONNECT EVENT...");
                return Err("the server disconnected".into());
            }
            Next::Completion(wc) if wc.opcode == WcOpcode::RECV => {
                check_recv(&wc)?;
                return Verbs::post_recv(conn.qp_mut(), ctl);
            }
            Next::Completion(wc) if wc.opcode == WcOpcode::SEND => continue,
            Next::Completion(wc) => return Err(format!("unexpected completion {:?}", wc.opcode).into()),
        }
    }
}

/// Ping `ping`'s data: `rdma-ping-N: ` then letters from `start` on, 'A' after 'z', and a
/// NUL in the last byte.
fn fill_ping(buf: &mut [u8], ping: u64, start: u8) {
    let prefix = format!("rdma-ping-{ping}: ");
    let n = prefix.len().min(buf.len());
    buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    let mut c = start;
    for b in &mut buf[n..] {
        *b = c;
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
}

fn run_client(o: &Options) -> Result<()> {
    let dst = SocketAddr::new(o.addr.ok_or("no -a")?, o.port);
    let connector = Connector::resolve_from(o.source.map(|ip| SocketAddr::new(ip, 0)), dst, RESOLVE)?;
    let Verbs {
        mut qp,
        mut cq,
        comp,
        mut ctl,
        pd,
    } = Verbs::new(&connector.context()?)?;
    // The source the server reads and the sink it writes.
    let mut source = pd.alloc_mr(o.size, LocalAccess::LOCAL_WRITE | LocalAccess::REMOTE_READ)?;
    let sink = pd.alloc_remote_mr(
        o.size,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )?;
    connector.id().init_qp(&mut qp)?;
    Verbs::post_recv(&mut qp, &ctl)?;
    // rping's parameters: one read in flight each way, no flow control, 7 retries of each kind.
    let param = ConnParam {
        responder_resources: Some(1),
        initiator_depth: Some(1),
        flow_control: false,
        retry_count: 7,
        rnr_retry_count: 7,
        // The kernel's ACK timeout, as librdmacm leaves it.
        ack_timeout: None,
        ..Default::default()
    };
    let mut conn = connector.connect(qp, &param, STALL)?;
    if o.debug {
        println!("rdma_connect successful");
    }
    let result = pings(o, &mut conn, &mut cq, &comp, &mut ctl, &mut source, &sink);
    if result.is_ok() {
        conn.disconnect(STALL)?;
        eprintln!("client DISCONNECT EVENT...");
    }
    drop(conn);
    result
}

fn pings(
    o: &Options,
    conn: &mut Connection,
    cq: &mut Cq,
    comp: &CompChannel,
    ctl: &mut Mr,
    source: &mut Mr,
    sink: &RemoteMr,
) -> Result<()> {
    let mut start = b'A';
    let mut ping = 0u64;
    while o.count == 0 || ping < o.count {
        fill_ping(source.as_mut_slice(), ping, start);
        start = if start >= b'z' { b'A' } else { start + 1 };
        advertise(ctl, source.remote(0)?, o.size);
        Verbs::send_ctl(conn.qp_mut(), ctl)?;
        // The server read the source.
        client_recv(cq, comp, conn, ctl)?;
        advertise(ctl, sink.remote(0)?, o.size);
        Verbs::send_ctl(conn.qp_mut(), ctl)?;
        // The server wrote the sink.
        client_recv(cq, comp, conn, ctl)?;
        let echoed = sink.to_vec(0, o.size)?;
        if o.validate && echoed != source.as_slice() {
            return Err("data mismatch!".into());
        }
        if o.verbose {
            println!("ping data: {}", c_str(&echoed));
        }
        ping += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ping_data_is_rpings() {
        let mut buf = [0u8; 64];
        fill_ping(&mut buf, 0, b'A');
        assert_eq!(
            c_str(&buf),
            "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
        fill_ping(&mut buf, 12, b'y');
        assert!(c_str(&buf).starts_with("rdma-ping-12: yzABC"), "{}", c_str(&buf));
        assert_eq!(buf[63], 0);
    }

    #[test]
    fn options_follow_getopt() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>().into_iter();
        let o = parse(args("-c -a 169.254.77.1 -C10 -vV -p 7200 -S 100")).unwrap();
        assert!(!o.server && o.verbose && o.validate && !o.debug);
        assert_eq!((o.count, o.port, o.size), (10, 7200, 100));
        assert_eq!(o.addr, Some("169.254.77.1".parse().unwrap()));
        assert!(parse(args("-s -S 25")).is_err());
        assert!(parse(args("-c")).is_err(), "a client needs an address");
        assert!(parse(args("-v")).is_err(), "a role is required");
        assert!(parse(args("-s -q")).is_err(), "-q is not supported");
    }
}
