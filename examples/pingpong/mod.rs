//! Ports of rdma-core's pingpong examples (libibverbs/examples/{rc,uc,ud,srq}_pingpong.c) to
//! `uverbs`, shared by the examples `rc_pingpong`, `uc_pingpong`, `ud_pingpong` and
//! `srq_pingpong` (each a `main` that names its [`Kind`]).
//!
//! Each speaks its C tool's out-of-band TCP exchange byte for byte, takes its options with the
//! same defaults, sets the same QP attributes and runs the same ping-pong loop, so either side
//! can be the C program:
//!
//! ```text
//! server$ ud_pingpong -d rxe0 -g 1            # or: ibv_ud_pingpong -d rxe0 -g 1
//! client$ ud_pingpong -d rxe0 -g 1 <server>   # or: ibv_ud_pingpong -d rxe0 -g 1 <server>
//! ```
//!
//! The exchange: each side sends one 52-byte message per QP, `"%04x:%06x:%06x:%s"` of LID,
//! QPN, PSN and the GID as 32 hex digits, plus a NUL (`srq_pingpong` always sends 256, zeros
//! past its QPs, as the C tool does). The client connects and sends first; the server reads
//! them, connects its QPs (UD: creates the address handle), and answers with its own; the
//! client then sends `"done\0"` and connects.
//!
//! What each tool does as its C original:
//! - `rc_pingpong`, `uc_pingpong`: one RC (UC) QP, sends of `-s` bytes (default 4096) from and
//!   receives into one buffer; UC connects with only the path, PSNs and MTU.
//! - `ud_pingpong`: one UD QP (Q_Key 0x11111111), an address handle to the peer (with a GRH
//!   when the peer's GID has a non-zero interface id: always on RoCE); receives of
//!   `size + 40` bytes (the GRH room), sends of `size` bytes from offset 40 (default 2048); no
//!   `-m`: the size must fit the port's active MTU.
//! - `srq_pingpong`: `-q` RC QPs (default 16, at most 256) on one CQ, all receiving from one
//!   shared receive queue of `-r` receives; `-n` counts the exchanges of all QPs together.
//!
//! Differences from the C tools: `-e`, `-o`, `-O`, `-P`, `-t` and `-j` (events, on-demand
//! paging, timestamps, device memory) are refused; `-N` is accepted and changes nothing (there
//! is one post API here). `--timeout` is new: instead of waiting forever, the program gives up
//! when no peer connects, or no completion arrives, for that long. With `-c`, invalid data is
//! reported as in C and also makes the exit status non-zero.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use uverbs::{
    AccessFlags, Ah, AhAttr, GlobalRoute, LocalAccess, Mtu, Pd, Qp, QpAttr, QpCap, QpInit, QpState, QpType, RecvWr,
    SendFlags, SendOp, SendWr, Sge, Srq, SrqInit, WorkCompletion,
};

const PINGPONG_RECV_WRID: u64 = 1;
const PINGPONG_SEND_WRID: u64 = 2;

/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`, the NUL included.
const MSG_LEN: usize = 52;
/// What the client sends last: `sizeof "done"`, the NUL included.
const DONE: &[u8; 5] = b"done\0";
/// ud_pingpong's Q_Key, on both sides.
const UD_QKEY: u32 = 0x1111_1111;
/// The GRH room ahead of every UD receive.
const GRH_ROOM: usize = 40;
/// srq_pingpong's `MAX_QP`: the most QPs, and the number of address messages each way.
const MAX_QP: u32 = 256;

/// Which C tool this program is a port of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ibv_rc_pingpong`.
    Rc,
    /// `ibv_uc_pingpong`.
    Uc,
    /// `ibv_ud_pingpong`.
    Ud,
    /// `ibv_srq_pingpong`.
    Srq,
}

impl Kind {
    fn bit(self) -> u8 {
        match self {
            Kind::Rc => RC,
            Kind::Uc => UC,
            Kind::Ud => UD,
            Kind::Srq => SRQ,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Rc => "rc_pingpong",
            Kind::Uc => "uc_pingpong",
            Kind::Ud => "ud_pingpong",
            Kind::Srq => "srq_pingpong",
        }
    }
}

struct Opts {
    servername: Option<String>,
    port: u16,
    ib_devname: Option<String>,
    ib_port: u8,
    size: u32,
    mtu: Mtu,
    num_qp: u32,
    rx_depth: u32,
    iters: u32,
    sl: u8,
    gidx: i32,
    validate_buf: bool,
    timeout: Duration,
}

impl Opts {
    fn new(kind: Kind) -> Self {
        Self {
            servername: None,
            port: 18515,
            ib_devname: None,
            ib_port: 1,
            size: if kind == Kind::Ud { 2048 } else { 4096 },
            mtu: Mtu::Mtu1024,
            num_qp: 16,
            rx_depth: 500,
            iters: 1000,
            sl: 0,
            gidx: -1,
            validate_buf: false,
            timeout: Duration::from_secs(60),
        }
    }
}

fn usage(kind: Kind, argv0: &str) {
    println!("Usage:");
    println!("  {argv0}            start a server and wait for connection");
    println!("  {argv0} <host>     connect to server at <host>");
    println!();
    println!("Options:");
    println!("  -p, --port=<port>      listen on/connect to port <port> (default 18515)");
    println!("  -d, --ib-dev=<dev>     use IB device <dev> (default first device found)");
    println!("  -i, --ib-port=<port>   use port <port> of IB device (default 1)");
    let size = if kind == Kind::Ud { 2048 } else { 4096 };
    println!("  -s, --size=<size>      size of message to exchange (default {size})");
    if kind != Kind::Ud {
        println!("  -m, --mtu=<size>       path MTU (default 1024)");
    }
    if kind == Kind::Srq {
        println!("  -q, --num-qp=<num>     number of QPs to use (default 16, at most 256)");
    }
    println!("  -r, --rx-depth=<dep>   number of receives to post at a time (default 500)");
    println!("  -n, --iters=<iters>    number of exchanges (default 1000)");
    println!("  -l, --sl=<sl>          service level value");
    println!("  -g, --gid-idx=<gid index> local port gid index");
    println!("  -c, --chk              validate received buffer");
    if kind == Kind::Rc {
        println!("  -N, --new_send         accepted for compatibility (no effect)");
    }
    println!("      --timeout=<sec>    give up after <sec> seconds without a peer or without");
    println!("                         completions (default 60)");
    println!("  -h, --help             print this help");
    match kind {
        Kind::Rc => {
            println!("Not supported by this port: -e/--events, -o/--odp, -O/--iodp, -P/--prefetch,\n  -t/--ts, -j/--dm")
        }
        Kind::Srq => println!("Not supported by this port: -e/--events, -o/--odp"),
        Kind::Uc | Kind::Ud => println!("Not supported by this port: -e/--events"),
    }
}

// ---------------------------------------------------------------------------------------------
// Command line: getopt_long(3) semantics (bundled short flags, `-p1`/`-p 1`, `--port=1`/
// `--port 1`, unique prefixes of long names, operands anywhere, `--` ends options).

/// The tools that take an option (bits of [`Kind::bit`]).
const RC: u8 = 1;
const UC: u8 = 2;
const UD: u8 = 4;
const SRQ: u8 = 8;
const ALL: u8 = RC | UC | UD | SRQ;

struct OptSpec {
    short: Option<char>,
    long: &'static str,
    has_arg: bool,
    tools: u8,
}

#[rustfmt::skip]
const OPTIONS: &[OptSpec] = &[
    OptSpec { short: Some('p'), long: "port", has_arg: true, tools: ALL },
    OptSpec { short: Some('d'), long: "ib-dev", has_arg: true, tools: ALL },
    OptSpec { short: Some('i'), long: "ib-port", has_arg: true, tools: ALL },
    OptSpec { short: Some('s'), long: "size", has_arg: true, tools: ALL },
    OptSpec { short: Some('m'), long: "mtu", has_arg: true, tools: RC | UC | SRQ },
    OptSpec { short: Some('q'), long: "num-qp", has_arg: true, tools: SRQ },
    OptSpec { short: Some('r'), long: "rx-depth", has_arg: true, tools: ALL },
    OptSpec { short: Some('n'), long: "iters", has_arg: true, tools: ALL },
    OptSpec { short: Some('l'), long: "sl", has_arg: true, tools: ALL },
    OptSpec { short: Some('e'), long: "events", has_arg: false, tools: ALL },
    OptSpec { short: Some('g'), long: "gid-idx", has_arg: true, tools: ALL },
    OptSpec { short: Some('o'), long: "odp", has_arg: false, tools: RC | SRQ },
    OptSpec { short: Some('O'), long: "iodp", has_arg: false, tools: RC },
    OptSpec { short: Some('P'), long: "prefetch", has_arg: false, tools: RC },
    OptSpec { short: Some('t'), long: "ts", has_arg: false, tools: RC },
    OptSpec { short: Some('c'), long: "chk", has_arg: false, tools: ALL },
    OptSpec { short: Some('j'), long: "dm", has_arg: false, tools: RC },
    OptSpec { short: Some('N'), long: "new_send", has_arg: false, tools: RC },
    OptSpec { short: None, long: "timeout", has_arg: true, tools: ALL },
    OptSpec { short: Some('h'), long: "help", has_arg: false, tools: ALL },
];

enum Parsed {
    Run(Opts),
    Help,
}

/// `strtol(s, NULL, 0)` done strictly: optional sign, then `0x` hex, leading-`0` octal or
/// decimal, and nothing else.
fn parse_c_int(s: &str) -> Option<i64> {
    let t = s.trim_start();
    let (neg, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()?
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()?
    } else {
        t.parse::<i64>().ok()?
    };
    Some(if neg { -v } else { v })
}

fn num<T: TryFrom<i64>>(name: &str, value: &str, ok: impl Fn(i64) -> bool) -> Result<T, String> {
    parse_c_int(value)
        .filter(|&v| ok(v))
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| format!("invalid value {value:?} for {name}"))
}

fn options(kind: Kind) -> impl Iterator<Item = &'static OptSpec> {
    OPTIONS.iter().filter(move |o| o.tools & kind.bit() != 0)
}

fn find_long(kind: Kind, name: &str) -> Result<&'static OptSpec, String> {
    if let Some(spec) = options(kind).find(|o| o.long == name) {
        return Ok(spec);
    }
    let matches: Vec<_> = options(kind).filter(|o| o.long.starts_with(name)).collect();
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(format!("unrecognized option '--{name}'")),
        _ => Err(format!("option '--{name}' is ambiguous")),
    }
}

fn apply(o: &mut Opts, spec: &OptSpec, arg: Option<&str>) -> Result<bool, String> {
    let name = match spec.short {
        Some(c) => format!("-{c}/--{}", spec.long),
        None => format!("--{}", spec.long),
    };
    let a = arg.unwrap_or("");
    match spec.long {
        "port" => o.port = num(&name, a, |v| (0..=65535).contains(&v))?,
        "ib-dev" => o.ib_devname = Some(a.to_string()),
        "ib-port" => o.ib_port = num(&name, a, |v| v >= 1)?,
        "size" => o.size = num(&name, a, |_| true)?,
        "mtu" => {
            let bytes: u32 = num(&name, a, |_| true)?;
            o.mtu = match bytes {
                256 => Mtu::Mtu256,
                512 => Mtu::Mtu512,
                1024 => Mtu::Mtu1024,
                2048 => Mtu::Mtu2048,
                4096 => Mtu::Mtu4096,
                _ => return Err(format!("invalid MTU {a:?} (256, 512, 1024, 2048 or 4096)")),
            };
        }
        "num-qp" => o.num_qp = num(&name, a, |v| (1..=i64::from(MAX_QP)).contains(&v))?,
        "rx-depth" => o.rx_depth = num(&name, a, |v| v >= 1 && v < i64::from(u32::MAX))?,
        "iters" => o.iters = num(&name, a, |_| true)?,
        "sl" => o.sl = num(&name, a, |_| true)?,
        "gid-idx" => o.gidx = num(&name, a, |v| v <= 255)?,
        "chk" => o.validate_buf = true,
        "new_send" => {}
        "timeout" => o.timeout = Duration::from_secs(num(&name, a, |v| v >= 1)?),
        "help" => return Ok(false),
        _ => return Err(format!("option {name} is not supported by this port")),
    }
    Ok(true)
}

fn parse_args(kind: Kind, args: &[String]) -> Result<Parsed, String> {
    let mut o = Opts::new(kind);
    let mut operands = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            operands.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(body) = arg.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (body, None),
            };
            let spec = find_long(kind, name)?;
            let value = match (spec.has_arg, inline) {
                (false, Some(_)) => return Err(format!("option '--{}' doesn't allow an argument", spec.long)),
                (false, None) => None,
                (true, Some(v)) => Some(v),
                (true, None) => {
                    let v = args
                        .get(i)
                        .ok_or_else(|| format!("option '--{}' requires an argument", spec.long))?;
                    i += 1;
                    Some(v.as_str())
                }
            };
            if !apply(&mut o, spec, value)? {
                return Ok(Parsed::Help);
            }
        } else if arg.len() > 1 && arg.starts_with('-') {
            let flags = &arg[1..];
            for (pos, c) in flags.char_indices() {
                let spec = options(kind)
                    .find(|s| s.short == Some(c))
                    .ok_or_else(|| format!("invalid option -- '{c}'"))?;
                if !spec.has_arg {
                    if !apply(&mut o, spec, None)? {
                        return Ok(Parsed::Help);
                    }
                    continue;
                }
                let rest = &flags[pos + c.len_utf8()..];
                let value = if !rest.is_empty() {
                    rest
                } else {
                    let v = args
                        .get(i)
                        .ok_or_else(|| format!("option requires an argument -- '{c}'"))?;
                    i += 1;
                    v.as_str()
                };
                if !apply(&mut o, spec, Some(value))? {
                    return Ok(Parsed::Help);
                }
                break;
            }
        } else {
            operands.push(arg.clone());
        }
    }
    match operands.len() {
        0 => {}
        1 => o.servername = operands.pop(),
        _ => return Err(format!("expected at most one host name, got {operands:?}")),
    }
    if kind == Kind::Srq && o.num_qp > o.rx_depth {
        return Err(format!(
            "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
            o.rx_depth, o.num_qp
        ));
    }
    Ok(Parsed::Run(o))
}

// ---------------------------------------------------------------------------------------------
// The out-of-band exchange (pingpong.c's wire GID format and rc_pingpong.c's message).

#[derive(Debug, Clone, Copy, Default)]
struct Dest {
    lid: u32,
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

impl Dest {
    /// `gid_to_wire_gid` then `sprintf("%04x:%06x:%06x:%s")`, NUL-terminated.
    fn to_wire(self) -> [u8; MSG_LEN] {
        // gid_to_wire_gid prints each 4-byte group as a big-endian number: in effect the 16
        // bytes in order as hex.
        let wire_gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let text = format!("{:04x}:{:06x}:{:06x}:{wire_gid}", self.lid, self.qpn, self.psn);
        assert_eq!(text.len(), MSG_LEN - 1, "address message {text:?}");
        let mut msg = [0u8; MSG_LEN];
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// `sscanf("%x:%x:%x:%s")` then `wire_gid_to_gid`, but refusing malformed input.
    fn from_wire(msg: &[u8]) -> Result<Self, String> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = String::from_utf8_lossy(&msg[..end]);
        let bad = || format!("malformed address message from the peer: {text:?}");
        let mut parts = text.splitn(4, ':');
        let mut field = || {
            parts
                .next()
                .and_then(|p| u32::from_str_radix(p, 16).ok())
                .ok_or_else(bad)
        };
        let (lid, qpn, psn) = (field()?, field()?, field()?);
        let wgid = parts.next().ok_or_else(bad)?;
        if wgid.len() != 32 || !wgid.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut gid = [0u8; 16];
        for (i, chunk) in gid.chunks_exact_mut(4).enumerate() {
            let v = u32::from_str_radix(&wgid[i * 8..i * 8 + 8], 16).map_err(|_| bad())?;
            chunk.copy_from_slice(&v.to_be_bytes());
        }
        Ok(Self { lid, qpn, psn, gid })
    }

    fn print(&self, which: &str) {
        println!(
            "  {which} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid)
        );
    }
}

fn set_timeouts(s: &TcpStream, timeout: Duration) -> io::Result<()> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))
}

/// Reads `n` address messages.
fn read_dests(s: &mut TcpStream, n: u32) -> io::Result<Vec<[u8; MSG_LEN]>> {
    (0..n)
        .map(|_| {
            let mut msg = [0u8; MSG_LEN];
            s.read_exact(&mut msg).map(|()| msg)
        })
        .collect()
}

fn parse_dests(msgs: &[[u8; MSG_LEN]]) -> Result<Vec<Dest>, String> {
    msgs.iter().map(|m| Dest::from_wire(m)).collect()
}

fn client_exch_dest(servername: &str, port: u16, my: &[Dest], timeout: Duration) -> Result<Vec<Dest>, String> {
    let addrs: Vec<SocketAddr> = (servername, port)
        .to_socket_addrs()
        .map_err(|e| format!("{e} for {servername}:{port}"))?
        .collect();
    let mut last_err = None;
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_err = Some(format!("{addr}: {e}")),
        }
    }
    let mut s = stream.ok_or_else(|| {
        format!(
            "Couldn't connect to {servername}:{port} ({})",
            last_err.unwrap_or_else(|| "no addresses".into())
        )
    })?;
    set_timeouts(&s, timeout).map_err(|e| format!("setting socket timeouts: {e}"))?;

    for d in my {
        s.write_all(&d.to_wire())
            .map_err(|e| format!("Couldn't send local address: {e}"))?;
    }
    let msgs = read_dests(&mut s, my.len() as u32)
        .and_then(|m| s.write_all(DONE).map(|()| m))
        .map_err(|e| format!("client read/write: {e}\nCouldn't read/write remote address"))?;
    parse_dests(&msgs)
}

/// The server's half: reads the client's messages, calls `connect` with them, answers with
/// `my` and waits for `"done"`.
fn server_exch_dest(
    port: u16,
    my: &[Dest],
    timeout: Duration,
    connect: impl FnOnce(&[Dest]) -> Result<(), String>,
) -> Result<Vec<Dest>, String> {
    // Like getaddrinfo(NULL, AI_PASSIVE): the wildcard address; IPv6 (dual stack) if the
    // system has it, else IPv4. std sets SO_REUSEADDR, as the C tool does.
    let listener = TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
        .map_err(|e| format!("Couldn't listen to port {port}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listening socket: {e}"))?;
    let deadline = Instant::now() + timeout;
    let mut conn = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!(
                        "accept() failed: no client connected to port {port} within {} s",
                        timeout.as_secs()
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("accept() failed: {e}")),
        }
    };
    drop(listener);
    conn.set_nonblocking(false)
        .and_then(|()| set_timeouts(&conn, timeout))
        .map_err(|e| format!("accepted socket: {e}"))?;

    let msgs = read_dests(&mut conn, my.len() as u32)
        .map_err(|e| format!("server read: {e}\nCouldn't read remote address"))?;
    let rem = parse_dests(&msgs)?;
    connect(&rem).map_err(|e| format!("{e}\nCouldn't connect to remote QP"))?;

    let mut done = [0u8; DONE.len()];
    my.iter()
        .try_for_each(|d| conn.write_all(&d.to_wire()))
        .and_then(|()| conn.read_exact(&mut done))
        .map_err(|e| format!("Couldn't send/recv local address: {e}"))?;
    if &done != DONE {
        return Err(format!(
            "Couldn't send/recv local address: expected \"done\", got {:?}",
            String::from_utf8_lossy(&done)
        ));
    }
    Ok(rem)
}

// ---------------------------------------------------------------------------------------------
// Verbs.

/// The path to `dest`, with the GRH the C tools give it: only when `grh_from`'s GID has a
/// non-zero interface id (always on RoCE), towards that GID, hop limit 1, source GID `-g`.
fn path(o: &Opts, dest: &Dest, grh_from: &Dest) -> Result<AhAttr, String> {
    let grh = (grh_from.gid[8..] != [0u8; 8]).then_some(GlobalRoute {
        dgid: grh_from.gid,
        sgid_index: o.gidx as u8,
        hop_limit: 1,
        traffic_class: 0,
        flow_label: 0,
    });
    let dlid = u16::try_from(dest.lid).map_err(|_| format!("peer LID {:#x} out of range", dest.lid))?;
    Ok(AhAttr {
        port_num: o.ib_port,
        dlid,
        sl: o.sl,
        src_path_bits: 0,
        static_rate: 0,
        grh,
    })
}

/// `pp_connect_ctx`: each QP to RTR and RTS towards its peer QP with the C tool's attributes
/// (UC: no RC-only ones); UD: RTR, RTS, then the address handle it returns.
fn connect(kind: Kind, qps: &mut [Qp], pd: &Pd, o: &Opts, my: &[Dest], rem: &[Dest]) -> Result<Option<Ah>, String> {
    if kind == Kind::Ud {
        let qp = &mut qps[0];
        qp.modify(&QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        })
        .map_err(|e| format!("Failed to modify QP to RTR: {e}"))?;
        qp.modify(&QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(my[0].psn),
            ..Default::default()
        })
        .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
        let ah = pd
            .create_ah(&path(o, &rem[0], &rem[0])?)
            .map_err(|e| format!("Failed to create AH: {e}"))?;
        return Ok(Some(ah));
    }
    let rc = kind != Kind::Uc;
    for (i, qp) in qps.iter_mut().enumerate() {
        // srq_pingpong takes the GRH from the first peer QP's GID (all share one port).
        qp.modify(&QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(o.mtu),
            dest_qpn: Some(rem[i].qpn),
            rq_psn: Some(rem[i].psn),
            max_dest_rd_atomic: rc.then_some(1),
            min_rnr_timer: rc.then_some(12),
            ah: Some(path(o, &rem[i], &rem[0])?),
            ..Default::default()
        })
        .map_err(|e| format!("Failed to modify QP[{i}] to RTR: {e}"))?;
        qp.modify(&QpAttr {
            state: Some(QpState::Rts),
            timeout: rc.then_some(14),
            retry_cnt: rc.then_some(7),
            rnr_retry: rc.then_some(7),
            sq_psn: Some(my[i].psn),
            max_rd_atomic: rc.then_some(1),
            ..Default::default()
        })
        .map_err(|e| format!("Failed to modify QP[{i}] to RTS: {e}"))?;
    }
    Ok(None)
}

/// `pp_post_recv`: posts up to `n` receives of `sge`, one at a time, to the SRQ if there is
/// one, else to `qp`; returns how many were posted and the error that stopped it early.
fn post_recvs(srq: &mut Option<Srq>, qp: &mut Qp, sge: &Sge, n: u32) -> (u32, Option<uverbs::Error>) {
    for i in 0..n {
        let wr = [RecvWr::new(PINGPONG_RECV_WRID, std::slice::from_ref(sge))];
        // SAFETY: `sge` names the MR `mr` in `run`, which is declared before the SRQ and the
        // QPs and so outlives them (and all their work requests). No Rust reference to that
        // memory exists while receives are outstanding: the client fills it before the first
        // receive is posted, and the server reads it (-c) only after the QPs and the SRQ are
        // destroyed.
        let posted = match srq.as_mut() {
            Some(s) => unsafe { s.post_recv(&wr) },
            None => unsafe { qp.post_recv(&wr) },
        };
        if let Err(e) = posted {
            return (i, Some(e));
        }
    }
    (n, None)
}

/// `pp_post_send`: one signaled SEND of `sge` (UD: through `ud`'s AH to its QPN).
fn post_send(qp: &mut Qp, sge: &Sge, flags: SendFlags, ud: Option<(&Ah, u32)>) -> Result<(), String> {
    let mut wr = SendWr::new(PINGPONG_SEND_WRID, SendOp::Send, std::slice::from_ref(sge)).set_flags(flags);
    if let Some((ah, qpn)) = ud {
        wr = wr.to(ah.ud_dest(qpn, UD_QKEY));
    }
    // SAFETY: `sge` names the MR `mr` in `run`, which outlives the QPs (see `post_recvs`); the
    // device only reads it for a send, and with INLINE the bytes are copied before return.
    unsafe { qp.post_send(&[wr]) }.map_err(|e| format!("Couldn't post send: {e}"))
}

/// `sysconf(_SC_PAGESIZE)`: `AT_PAGESZ` from the auxiliary vector (pairs of native words).
fn page_size() -> usize {
    const AT_PAGESZ: usize = 6;
    const WORD: usize = size_of::<usize>();
    let word = |b: &[u8]| usize::from_ne_bytes(b.try_into().expect("one word"));
    std::fs::read("/proc/self/auxv")
        .ok()
        .and_then(|auxv| {
            auxv.chunks_exact(2 * WORD)
                .map(|e| (word(&e[..WORD]), word(&e[WORD..])))
                .find(|&(key, _)| key == AT_PAGESZ)
                .map(|(_, v)| v)
        })
        .filter(|v| v.is_power_of_two())
        .unwrap_or(4096)
}

/// `lrand48() & 0xffffff` after `srand48(getpid() * time(NULL))`: a random 24-bit PSN, from
/// std's randomly keyed hasher mixed with the pid and the time.
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    h.write_u128(now);
    (h.finish() & 0xff_ffff) as u32
}

fn run(kind: Kind, o: &Opts) -> Result<(), String> {
    let page_size = page_size();
    let size = usize::try_from(o.size).map_err(|_| format!("size {} too large", o.size))?;

    let ctx = uverbs::open(o.ib_devname.as_deref()).map_err(|e| match &o.ib_devname {
        Some(name) => format!("Couldn't open IB device {name}: {e}"),
        None => format!("No usable IB device found: {e}"),
    })?;
    let portinfo = ctx
        .query_port(o.ib_port)
        .map_err(|e| format!("Couldn't get port info: {e}"))?;
    if kind == Kind::Ud {
        let mtu = portinfo.active_mtu.map_or(0, Mtu::bytes);
        if o.size > mtu {
            return Err(format!("Requested size larger than port MTU ({mtu})"));
        }
    }
    // UD receives start with the GRH room; sends come from after it.
    let head = if kind == Kind::Ud { GRH_ROOM } else { 0 };
    let pd = ctx.alloc_pd().map_err(|e| format!("Couldn't allocate PD: {e}"))?;
    let mut mr = pd
        .alloc_mr(size + head, LocalAccess::LOCAL_WRITE)
        .map_err(|e| format!("Couldn't register MR: {e}"))?;
    // As in C: srq_pingpong's buffer starts zeroed, the others' filled with 0x7b.
    mr.as_mut_slice().fill(if kind == Kind::Srq { 0 } else { 0x7b });
    if o.servername.is_some() && o.validate_buf {
        // C does this just before the first send; it is done here, before any receive is
        // posted into the buffer, which puts the same bytes on the wire. C writes
        // `i / page_size % sizeof(char)`, which is always 0.
        for i in (0..size).step_by(page_size) {
            mr.as_mut_slice()[head + i] = 0;
        }
    }
    let recv_len = u32::try_from(size + head).map_err(|_| format!("size {} too large", o.size))?;
    let recv_sge = mr.sge(0, recv_len).map_err(|e| e.to_string())?;
    let send_sge = mr.sge(head, o.size).map_err(|e| e.to_string())?;

    let nqp = if kind == Kind::Srq { o.num_qp } else { 1 };
    let mut cq = ctx
        .create_cq(o.rx_depth + nqp)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let mut srq = match kind {
        Kind::Srq => Some(
            pd.create_srq(&SrqInit::new(o.rx_depth, 1))
                .map_err(|e| format!("Couldn't create SRQ: {e}"))?,
        ),
        _ => None,
    };
    let qp_type = match kind {
        Kind::Rc | Kind::Srq => QpType::Rc,
        Kind::Uc => QpType::Uc,
        Kind::Ud => QpType::Ud,
    };
    let mut qps = Vec::new();
    let mut send_flags = SendFlags::SIGNALED;
    for i in 0..nqp {
        let mut init = QpInit::new(qp_type, &cq, &cq);
        init.srq = srq.as_ref();
        let own_rq = srq.is_none();
        init.cap = QpCap {
            max_send_wr: 1,
            max_recv_wr: if own_rq { o.rx_depth } else { 0 },
            max_send_sge: 1,
            max_recv_sge: u32::from(own_rq),
            max_inline_data: 0,
        };
        init.sq_sig_all = false;
        let qp = pd
            .create_qp(&init)
            .map_err(|e| format!("Couldn't create QP[{i}]: {e}"))?;
        if qp.cap().max_inline_data >= o.size {
            send_flags |= SendFlags::INLINE;
        }
        qps.push(qp);
    }
    for (i, qp) in qps.iter_mut().enumerate() {
        let r = match kind {
            Kind::Ud => qp.modify(&QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port_num: Some(o.ib_port),
                qkey: Some(UD_QKEY),
                ..Default::default()
            }),
            _ => qp.to_init(o.ib_port, AccessFlags::empty()),
        };
        r.map_err(|e| format!("Failed to modify QP[{i}] to INIT: {e}"))?;
    }

    let (mut routs, err) = post_recvs(&mut srq, &mut qps[0], &recv_sge, o.rx_depth);
    if routs < o.rx_depth {
        return Err(format!(
            "Couldn't post receive ({routs}){}",
            err.map(|e| format!(": {e}")).unwrap_or_default()
        ));
    }

    if !portinfo.needs_grh() && portinfo.lid == 0 {
        return Err("Couldn't get local LID".into());
    }
    let gid = if o.gidx >= 0 {
        ctx.query_gid(o.ib_port, o.gidx as u8)
            .map_err(|e| format!("can't read sgid of index {}: {e}", o.gidx))?
            .raw
    } else {
        [0; 16]
    };
    let my: Vec<Dest> = qps
        .iter()
        .map(|qp| Dest {
            lid: u32::from(portinfo.lid),
            qpn: qp.qpn(),
            psn: random_psn(),
            gid,
        })
        .collect();
    for d in &my {
        d.print("local address: ");
    }
    // srq_pingpong always sends MAX_QP messages, zeros past its QPs.
    let mut wire = my.clone();
    if kind == Kind::Srq {
        wire.resize(MAX_QP as usize, Dest::default());
    }

    let mut ah = None;
    let rem = match &o.servername {
        Some(server) => client_exch_dest(server, o.port, &wire, o.timeout)?,
        None => server_exch_dest(o.port, &wire, o.timeout, |rem| {
            ah = connect(kind, &mut qps, &pd, o, &my, rem)?;
            Ok(())
        })?,
    };
    for d in &rem[..qps.len()] {
        d.print("remote address:");
    }
    if o.servername.is_some() {
        ah = connect(kind, &mut qps, &pd, o, &my, &rem)?;
    }
    let ud = ah.as_ref().map(|a| (a, rem[0].qpn));

    let mut pending = vec![PINGPONG_RECV_WRID; qps.len()];
    if o.servername.is_some() {
        for (qp, p) in qps.iter_mut().zip(&mut pending) {
            post_send(qp, &send_sge, send_flags, ud)?;
            *p |= PINGPONG_SEND_WRID;
        }
    }
    // Receives are posted again once at most this many are left (one per QP).
    let refill_at = nqp;

    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let batch = if kind == Kind::Srq { o.num_qp + o.rx_depth } else { 2 };
    let mut wc = vec![WorkCompletion::default(); batch as usize];
    let mut idle_polls = 0u32;
    let mut stalled_since: Option<Instant> = None;
    while rcnt < o.iters || scnt < o.iters {
        let ne = cq.poll(&mut wc);
        if ne == 0 {
            idle_polls = idle_polls.wrapping_add(1);
            if idle_polls % 1024 == 0 {
                let since = *stalled_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= o.timeout {
                    return Err(format!(
                        "no completion for {} s (received {rcnt}, sent {scnt} of {}); giving up",
                        o.timeout.as_secs(),
                        o.iters
                    ));
                }
            }
            continue;
        }
        idle_polls = 0;
        stalled_since = None;
        // parse_single_wc
        for c in &wc[..ne] {
            if !c.is_success() {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}\nparse WC failed {ne}",
                    c.status.name().unwrap_or("unknown"),
                    c.status.0,
                    c.wr_id as i32
                ));
            }
            let qp_ind = qps
                .iter()
                .position(|qp| qp.qpn() == c.qp_num)
                .ok_or_else(|| format!("Couldn't find QPN {:06x}", c.qp_num))?;
            match c.wr_id {
                PINGPONG_SEND_WRID => scnt += 1,
                PINGPONG_RECV_WRID => {
                    routs -= 1;
                    if routs <= refill_at {
                        let (n, err) = post_recvs(&mut srq, &mut qps[0], &recv_sge, o.rx_depth - routs);
                        routs += n;
                        if routs < o.rx_depth {
                            return Err(format!(
                                "Couldn't post receive ({routs}){}",
                                err.map(|e| format!(": {e}")).unwrap_or_default()
                            ));
                        }
                    }
                    rcnt += 1;
                }
                other => {
                    return Err(format!(
                        "Completion for unknown wr_id {}\nparse WC failed {ne}",
                        other as i32
                    ))
                }
            }
            pending[qp_ind] &= !c.wr_id;
            if scnt < o.iters && pending[qp_ind] == 0 {
                post_send(&mut qps[qp_ind], &send_sge, send_flags, ud)?;
                pending[qp_ind] = PINGPONG_RECV_WRID | PINGPONG_SEND_WRID;
            }
        }
    }
    let elapsed = start.elapsed();

    // C: `float usec = ...; long long bytes = size * iters * 2;` then printf of doubles.
    let usec_f = elapsed.as_micros() as f32;
    let usec = f64::from(usec_f);
    let bytes = i64::from(o.size) * i64::from(o.iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1_000_000.0,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / 1_000_000.0,
        f64::from(usec_f / o.iters as f32)
    );

    // Destroy the QPs and the SRQ first so nothing can still write the buffer while it is
    // checked.
    drop(qps);
    drop(srq);
    drop(ah);
    if o.servername.is_none() && o.validate_buf {
        let buf = mr.as_slice();
        let mut invalid = 0usize;
        for i in (0..size).step_by(page_size) {
            if buf[head + i] != 0 {
                println!("invalid data in page {}", i / page_size);
                invalid += 1;
            }
        }
        if invalid > 0 {
            return Err(format!("{invalid} page(s) of the received buffer are invalid"));
        }
    }
    Ok(())
}

/// The program: `kind`'s options from the command line, then the ping-pong.
pub fn main(kind: Kind) -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let argv0 = args.first().map_or(kind.name(), String::as_str).to_string();
    let opts = match parse_args(kind, args.get(1..).unwrap_or_default()) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            usage(kind, &argv0);
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("{argv0}: {msg}");
            usage(kind, &argv0);
            return ExitCode::FAILURE;
        }
    };
    match run(kind, &opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_message_matches_the_c_format() {
        let mut gid = [0u8; 16];
        gid[10..12].copy_from_slice(&[0xff, 0xff]);
        gid[12..].copy_from_slice(&[127, 0, 0, 1]);
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid,
        };
        let msg = d.to_wire();
        assert_eq!(&msg[..], b"0000:000011:abcdef:00000000000000000000ffff7f000001\0");
        let back = Dest::from_wire(&msg).unwrap();
        assert_eq!((back.lid, back.qpn, back.psn, back.gid), (0, 0x11, 0xabcdef, gid));
        assert!(Dest::from_wire(b"hello\0").is_err());
        assert!(Dest::from_wire(b"0000:000011:abcdef:0000ffff7f000001\0").is_err());
    }

    #[test]
    fn numbers_parse_like_strtol_base_0() {
        assert_eq!(parse_c_int("18515"), Some(18515));
        assert_eq!(parse_c_int("0x100"), Some(256));
        assert_eq!(parse_c_int("010"), Some(8));
        assert_eq!(parse_c_int("0"), Some(0));
        assert_eq!(parse_c_int("-1"), Some(-1));
        assert_eq!(parse_c_int("12abc"), None);
    }

    #[test]
    fn options_parse_like_getopt_long() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let Ok(Parsed::Run(o)) = parse_args(
            Kind::Rc,
            &args(&[
                "-p18600", "-d", "rxe0", "-cn", "10000", "--gid=1", "host", "--mtu", "4096",
            ]),
        ) else {
            panic!("should parse");
        };
        assert_eq!(o.port, 18600);
        assert_eq!(o.ib_devname.as_deref(), Some("rxe0"));
        assert!(o.validate_buf);
        assert_eq!((o.iters, o.gidx, o.mtu), (10000, 1, Mtu::Mtu4096));
        assert_eq!(o.servername.as_deref(), Some("host"));
        assert_eq!((o.size, o.rx_depth, o.sl), (4096, 500, 0));
        assert!(parse_args(Kind::Rc, &args(&["-e"])).is_err());
        assert!(parse_args(Kind::Rc, &args(&["-m", "1000"])).is_err());
        assert!(parse_args(Kind::Rc, &args(&["-p", "70000"])).is_err());
        assert!(parse_args(Kind::Rc, &args(&["a", "b"])).is_err());
    }

    #[test]
    fn each_tool_takes_its_c_options() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // -q only for srq_pingpong (at most 256 QPs, no more than receives), -m not for UD.
        let Ok(Parsed::Run(o)) = parse_args(Kind::Srq, &args(&["-q", "4", "-r", "8"])) else {
            panic!("srq_pingpong takes -q");
        };
        assert_eq!((o.num_qp, o.rx_depth), (4, 8));
        assert!(parse_args(Kind::Srq, &args(&["-q", "257"])).is_err());
        assert!(parse_args(Kind::Srq, &args(&["-r", "8"])).is_err());
        assert!(parse_args(Kind::Rc, &args(&["-q", "4"])).is_err());
        assert!(parse_args(Kind::Ud, &args(&["-m", "1024"])).is_err());
        assert!(parse_args(Kind::Uc, &args(&["-N"])).is_err());
        let Ok(Parsed::Run(o)) = parse_args(Kind::Ud, &args(&["-g", "1", "-c"])) else {
            panic!("ud_pingpong takes -g and -c");
        };
        assert_eq!((o.size, o.gidx, o.validate_buf), (2048, 1, true));
        let Ok(Parsed::Run(o)) = parse_args(Kind::Uc, &args(&["--mtu=4096"])) else {
            panic!("uc_pingpong takes --mtu");
        };
        assert_eq!((o.size, o.mtu), (4096, Mtu::Mtu4096));
    }
}
