//! cmatose over `uverbs::cm`: rdma-core's `ucmatose` (`librdmacm/examples/cmatose.c`),
//! option for option and message for message, so that each side runs against the C program.
//!
//! ```text
//! server$ cmatose [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-a ack_timeout] [-p port]
//! client$ cmatose -s server_address [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-t tos] [-a ack_timeout] [-p port]
//! ```
//!
//! All connections are driven from one event channel, as in cmatose: the client resolves
//! every id's address and route, creates each QP (send and receive CQs of `message_count`
//! entries), posts `message_count` receives and connects; the server accepts each request
//! after posting its receives. Once all are up, the server sends `message_count` messages of
//! `message_size` bytes on each connection and waits for their completions, the client
//! receives them and sends as many back, the server receives those and disconnects every
//! connection; both wait for each `DISCONNECTED`. The progress lines are cmatose's. `-t`
//! sets each client id's type of service and `-a` its ACK timeout once its address is
//! resolved (before the route); the server sets `-a` on each request before accepting. A
//! refused option is reported and the test goes on, as cmatose does. The options cmatose
//! has and this does not (`-f`, `-P`, `-m`) are refused.
//!
//! `tests/guest/rping_cmatose_interop.sh` runs it against rdmacm-utils' `ucmatose` both ways.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};
use uverbs::cm::{CmEvent, CmEventKind, CmId, CmOption, ConnParam, EventChannel};
use uverbs::{Context, Cq, LocalAccess, Mr, Qp, QpInit, QpType, RecvWr, SendOp, SendWr, WcStatus, WorkCompletion};

/// cmatose gives address and route resolution 2 s each.
const RESOLVE: Duration = Duration::from_secs(2);
/// How long a wait may see no progress before this side gives up (cmatose waits forever).
const STALL: Duration = Duration::from_secs(60);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[derive(Debug)]
struct Options {
    /// `-s`: the server to connect to; none: be the server.
    server_addr: Option<String>,
    /// `-b`: the address to bind (server) or connect from (client).
    bind_addr: Option<String>,
    connections: usize,
    message_count: usize,
    message_size: usize,
    /// `-t`: the clients' type of service.
    tos: Option<u8>,
    /// `-a`: the QPs' ACK timeout (4.096 µs × 2^value).
    ack_timeout: Option<u8>,
    port: u16,
}

impl Options {
    /// The options `-t` and `-a` ask for, in cmatose's order.
    fn cm_options(&self, client: bool) -> Vec<(CmOption, &'static str)> {
        let tos = self.tos.filter(|_| client).map(|t| (CmOption::Tos(t), "TOS"));
        let ack = self.ack_timeout.map(|t| (CmOption::AckTimeout(t), "ack timeout"));
        tos.into_iter().chain(ack).collect()
    }
}

const USAGE: &str = "usage: cmatose
\t[-s server_address]
\t[-b bind_address]
\t[-c connections]
\t[-C message_count]
\t[-S message_size]
\t[-t type_of_service]
\t[-a ack_timeout]
\t[-p port_number]";

fn main() {
    let opts = match parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            println!("{USAGE}");
            std::process::exit(1);
        }
    };
    let ret = Test::new(&opts).and_then(|mut test| {
        let ret = if opts.server_addr.is_some() {
            test.run_client(&opts)
        } else {
            test.run_server(&opts)
        };
        println!("test complete");
        // The connections' resources, then their ids, then the channel (cmatose's order).
        drop(test);
        ret
    });
    let status = match ret {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cmatose: {e}");
            1
        }
    };
    println!("return status {status}");
    std::process::exit(status);
}

/// getopt's rules for `s:b:c:C:S:t:a:p:`: a value follows its letter in the same word or the next.
fn parse(args: impl Iterator<Item = String>) -> Result<Options> {
    let mut o = Options {
        server_addr: None,
        bind_addr: None,
        connections: 1,
        message_count: 10,
        message_size: 100,
        tos: None,
        ack_timeout: None,
        port: 7471,
    };
    let mut args = args.peekable();
    while let Some(word) = args.next() {
        let mut letters = word.strip_prefix('-').filter(|l| !l.is_empty()).map(str::chars);
        let Some(letter) = letters.as_mut().and_then(Iterator::next) else {
            return Err(format!("unexpected argument {word:?}").into());
        };
        if !"sbcCStap".contains(letter) {
            return Err(format!("cmatose: option -{letter} is not supported here").into());
        }
        let rest: String = letters.into_iter().flatten().collect();
        let value = if rest.is_empty() {
            args.next().ok_or_else(|| format!("-{letter} needs a value"))?
        } else {
            rest
        };
        let number = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| format!("-{letter}: invalid number {v:?}"))
        };
        match letter {
            's' => o.server_addr = Some(value),
            'b' => o.bind_addr = Some(value),
            'c' => o.connections = number(&value)?,
            'C' => o.message_count = number(&value)?,
            'S' => o.message_size = number(&value)?,
            't' => o.tos = Some(byte(&value)?),
            'a' => o.ack_timeout = Some(byte(&value)?),
            _ => o.port = value.parse().map_err(|_| format!("invalid port {value:?}"))?,
        }
    }
    // cmatose sends nothing when messages are empty.
    if o.message_size == 0 {
        o.message_count = 0;
    }
    Ok(o)
}

/// A number as `strtoul(value, NULL, 0)` reads it (`0x` hexadecimal, `0` octal, else
/// decimal), kept to its low byte as cmatose's `uint8_t` does.
fn byte(value: &str) -> Result<u8> {
    let (digits, radix) = if let Some(hex) = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")) {
        (hex, 16)
    } else if value.len() > 1 && value.starts_with('0') {
        (&value[1..], 8)
    } else {
        (value, 10)
    };
    let n = u64::from_str_radix(digits, radix).map_err(|_| format!("invalid number {value:?}"))?;
    Ok(n as u8)
}

/// Sets `options` on `id`, reporting a refusal as cmatose's perror does and going on.
fn set_options(options: &[(CmOption, &str)], mut set: impl FnMut(CmOption) -> uverbs::Result<()>) {
    for (option, name) in options {
        if let Err(e) = set(*option) {
            eprintln!("cmatose: set {name} option failed: {e}");
        }
    }
}

/// `name:port` as rdma_getaddrinfo resolves it (numeric or a host name).
fn socket_addr(name: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (name, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| format!("cmatose: getaddrinfo error: no address for {name:?}").into())
}

/// One connection's verbs objects (`struct cmatest_node`), dropped before its id.
struct Verbs {
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    /// `message_size` bytes: every send goes from here and every receive lands here, as in
    /// cmatose (whose messages carry no meaning); none without messages, as in cmatose.
    mem: Option<Mr>,
}

impl Verbs {
    fn new(ctx: &Context, o: &Options) -> Result<Self> {
        let pd = ctx.alloc_pd()?;
        let cqe = o.message_count.max(1) as u32;
        let send_cq = ctx.create_cq(cqe)?;
        let recv_cq = ctx.create_cq(cqe)?;
        let mut init = QpInit::new(QpType::Rc, &send_cq, &recv_cq);
        (init.cap.max_send_wr, init.cap.max_recv_wr) = (cqe, cqe);
        (init.cap.max_send_sge, init.cap.max_recv_sge) = (1, 1);
        init.sq_sig_all = true;
        let qp = pd.create_qp(&init)?;
        let mem = if o.message_count > 0 {
            Some(pd.alloc_mr(o.message_size.max(1), LocalAccess::LOCAL_WRITE)?)
        } else {
            None
        };
        Ok(Self {
            qp,
            send_cq,
            recv_cq,
            mem,
        })
    }

    fn post_recvs(&mut self, o: &Options) -> Result<()> {
        let Some(mem) = &self.mem else { return Ok(()) };
        let sge = [mem.sge(0, o.message_size as u32)?];
        for _ in 0..o.message_count {
            // SAFETY: `mem` is declared after `qp`, so it outlives the QP and every request.
            unsafe { self.qp.post_recv(&[RecvWr::new(0, &sge)])? };
        }
        Ok(())
    }

    fn post_sends(&mut self, o: &Options) -> Result<()> {
        let Some(mem) = &self.mem else { return Ok(()) };
        let sge = [mem.sge(0, o.message_size as u32)?];
        for _ in 0..o.message_count {
            // SAFETY: as in `post_recvs`.
            unsafe { self.qp.post_send(&[SendWr::new(0, SendOp::Send, &sge)])? };
        }
        Ok(())
    }
}

/// Polls `cq` until `n` completions arrived, each successful.
fn complete(cq: &mut Cq, n: usize) -> Result<()> {
    let mut wc = [WorkCompletion::default(); 8];
    let (mut done, mut last) = (0, Instant::now());
    while done < n {
        let got = cq.poll(&mut wc[..(n - done).min(8)]);
        for c in &wc[..got] {
            if c.status != WcStatus::SUCCESS {
                return Err(format!("cmatose: completion failed: {:?}", c.status).into());
            }
        }
        if got > 0 {
            (done, last) = (done + got, Instant::now());
        } else if last.elapsed() > STALL {
            return Err(format!("cmatose: {done} of {n} completions after {STALL:?}").into());
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    Ok(())
}

/// One connection (`struct cmatest_node`).
struct Node {
    // Declared first: dropped before the id (cmatose destroys the id last).
    verbs: Option<Verbs>,
    id: CmId,
    connected: bool,
}

impl Node {
    fn verbs(&mut self) -> Result<&mut Verbs> {
        self.verbs.as_mut().ok_or_else(|| "a connection without a QP".into())
    }

    /// `rdma_disconnect`: the QP to ERR, then DISCONNECT; the connection counts as down.
    fn disconnect(&mut self) -> Result<()> {
        self.connected = false;
        let verbs = self.verbs.as_mut().ok_or("a connection without a QP")?;
        self.id.disconnect(&mut verbs.qp)?;
        Ok(())
    }
}

/// Hashes the ids' uids, which are distinct counters the library hands out (not input from
/// a peer): one multiplication spreads them over the table, where `HashMap`'s default
/// SipHash (made for keys an attacker may choose) costs more than the rest of a lookup.
/// cmatose finds its node through the id's context pointer.
#[derive(Default)]
struct UidHasher(u64);

impl Hasher for UidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 << 8 | u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// The test's state (`struct cmatest`). Declared before the channel: the ids go first.
struct Test {
    nodes: Vec<Node>,
    /// Node index by id uid.
    by_uid: HashMap<u64, usize, BuildHasherDefault<UidHasher>>,
    connects_left: usize,
    disconnects_left: usize,
    channel: EventChannel,
}

impl Test {
    fn new(o: &Options) -> Result<Self> {
        Ok(Self {
            nodes: Vec::with_capacity(o.connections),
            by_uid: HashMap::with_capacity_and_hasher(o.connections, Default::default()),
            connects_left: o.connections,
            disconnects_left: 0,
            channel: EventChannel::open()?,
        })
    }

    fn node(&mut self, event: &CmEvent) -> Result<&mut Node> {
        let i = *self
            .by_uid
            .get(&event.uid)
            .ok_or_else(|| format!("an event for an unknown id: {:?}", event.kind))?;
        Ok(&mut self.nodes[i])
    }

    /// `cma_handler`: one event.
    fn handle(&mut self, event: &mut CmEvent, o: &Options) -> Result<()> {
        match event.kind {
            CmEventKind::ADDR_RESOLVED => {
                let node = self.node(event)?;
                set_options(&o.cm_options(true), |option| node.id.set_option(option));
                if let Err(e) = node.id.resolve_route(RESOLVE) {
                    self.connects_left = self.connects_left.saturating_sub(1);
                    return Err(format!("cmatose: resolve route failed: {e}").into());
                }
            }
            CmEventKind::ROUTE_RESOLVED => {
                let node = self.node(event)?;
                // Made in its place in the node (no move of the QP and CQs afterwards).
                let verbs = node.verbs.insert(Verbs::new(&node.id.context()?, o)?);
                node.id.init_qp(&mut verbs.qp)?;
                verbs.post_recvs(o)?;
                // cmatose's parameters: one read each way, 5 retries, no RNR retry.
                let param = ConnParam {
                    responder_resources: Some(1),
                    initiator_depth: Some(1),
                    flow_control: false,
                    retry_count: 5,
                    rnr_retry_count: 0,
                    // The kernel's ACK timeout, as librdmacm leaves it.
                    ack_timeout: None,
                    ..Default::default()
                };
                node.id.connect(&mut verbs.qp, &param)?;
            }
            CmEventKind::CONNECT_RESPONSE => {
                // librdmacm completes the active side itself and reports ESTABLISHED.
                let node = self.node(event)?;
                let verbs = node.verbs.as_mut().ok_or("a response for a connection without a QP")?;
                node.id.establish(&mut verbs.qp)?;
                self.established(event)?;
            }
            CmEventKind::CONNECT_REQUEST => {
                let mut req = event.take_request().ok_or("a connect request without its new id")?;
                if self.nodes.len() == o.connections {
                    println!("cmatose: failing connection request");
                    req.reject(&[])?;
                    return Ok(());
                }
                set_options(&o.cm_options(false), |option| req.set_option(option));
                let mut verbs = Verbs::new(&req.context()?, o)?;
                req.init_qp(&mut verbs.qp)?;
                verbs.post_recvs(o)?;
                let id = req.accept_id(&mut verbs.qp, &ConnParam::default())?;
                self.by_uid.insert(id.uid(), self.nodes.len());
                self.nodes.push(Node {
                    verbs: Some(verbs),
                    id,
                    connected: false,
                });
            }
            CmEventKind::ESTABLISHED => {
                // iWARP: the kernel moved the QP to RTS; record it before posting.
                let node = self.node(event)?;
                if let Some(verbs) = node.verbs.as_mut() {
                    node.id.established(&mut verbs.qp)?;
                }
                self.established(event)?;
            }
            CmEventKind::ADDR_ERROR
            | CmEventKind::ROUTE_ERROR
            | CmEventKind::CONNECT_ERROR
            | CmEventKind::UNREACHABLE
            | CmEventKind::REJECTED => {
                let name = event.kind.name().unwrap_or("UNKNOWN");
                println!("cmatose: event: RDMA_CM_EVENT_{name}, error: {}", event.status);
                self.connects_left = self.connects_left.saturating_sub(1);
                return Err(format!("RDMA_CM_EVENT_{name} (status {})", event.status).into());
            }
            CmEventKind::DISCONNECTED => {
                // Answer the peer's disconnect (the QP to ERR, DISCONNECT), once.
                let node = self.node(event)?;
                if node.connected {
                    node.disconnect()?;
                }
                self.disconnects_left = self.disconnects_left.saturating_sub(1);
            }
            _ => {}
        }
        Ok(())
    }

    /// A connection is up: one connect less to wait for, one disconnect more.
    fn established(&mut self, event: &CmEvent) -> Result<()> {
        let node = self.node(event)?;
        if !node.connected {
            node.connected = true;
            self.connects_left = self.connects_left.saturating_sub(1);
            self.disconnects_left += 1;
        }
        Ok(())
    }

    /// Handles events until every connection is up (or one failed).
    fn connect_events(&mut self, o: &Options) -> Result<()> {
        while self.connects_left > 0 {
            let mut event = self.channel.get_event(Some(STALL))?;
            self.handle(&mut event, o)?;
        }
        Ok(())
    }

    /// Handles events until every connection is down.
    fn disconnect_events(&mut self, o: &Options) -> Result<()> {
        while self.disconnects_left > 0 {
            let mut event = self.channel.get_event(Some(STALL))?;
            self.handle(&mut event, o)?;
        }
        Ok(())
    }

    /// Polls the send or receive CQ of every connected node for `message_count` completions.
    fn poll_cqs(&mut self, o: &Options, recv: bool) -> Result<()> {
        for node in self.nodes.iter_mut().filter(|n| n.connected) {
            let verbs = node.verbs()?;
            complete(
                if recv { &mut verbs.recv_cq } else { &mut verbs.send_cq },
                o.message_count,
            )?;
        }
        Ok(())
    }

    fn post_sends(&mut self, o: &Options) -> Result<()> {
        for node in self.nodes.iter_mut().filter(|n| n.connected) {
            node.verbs()?.post_sends(o)?;
        }
        Ok(())
    }

    fn run_server(&mut self, o: &Options) -> Result<()> {
        println!("cmatose: starting server");
        let ip = match &o.bind_addr {
            Some(b) => socket_addr(b, o.port)?,
            None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), o.port),
        };
        let mut listener = self.channel.create_id()?;
        listener.bind(ip)?;
        listener.listen(0)?;
        self.connect_events(o)?;
        if o.message_count > 0 {
            println!("initiating data transfers");
            self.post_sends(o)?;
            println!("completing sends");
            self.poll_cqs(o, false)?;
            println!("receiving data transfers");
            self.poll_cqs(o, true)?;
            println!("data transfers complete");
        }
        println!("cmatose: disconnecting");
        for node in self.nodes.iter_mut().filter(|n| n.connected) {
            node.disconnect()?;
        }
        self.disconnect_events(o)?;
        println!("disconnected");
        listener.destroy()?;
        Ok(())
    }

    fn run_client(&mut self, o: &Options) -> Result<()> {
        println!("cmatose: starting client");
        let dst = socket_addr(o.server_addr.as_deref().ok_or("no -s")?, o.port)?;
        let src = o.bind_addr.as_deref().map(|b| socket_addr(b, 0)).transpose()?;
        println!("cmatose: connecting");
        for i in 0..o.connections {
            let mut id = self.channel.create_id()?;
            id.resolve_addr(src, dst, RESOLVE)?;
            self.by_uid.insert(id.uid(), i);
            self.nodes.push(Node {
                verbs: None,
                id,
                connected: false,
            });
        }
        let ret = self.connect_events(o).and_then(|()| {
            if o.message_count > 0 {
                println!("receiving data transfers");
                self.poll_cqs(o, true)?;
                println!("sending replies");
                self.post_sends(o)?;
                println!("data transfers complete");
            }
            Ok(())
        });
        // As cmatose: wait for the server's disconnects even after a failure.
        let ret2 = self.disconnect_events(o);
        ret.and(ret2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_follow_cmatose() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>().into_iter();
        let o = parse(args("-s 169.254.77.1 -c 4 -C50 -p 7480")).unwrap();
        assert_eq!(o.server_addr.as_deref(), Some("169.254.77.1"));
        assert_eq!(
            (o.connections, o.message_count, o.message_size, o.port),
            (4, 50, 100, 7480)
        );
        let o = parse(args("-b 169.254.77.1 -S 0")).unwrap();
        assert!(o.server_addr.is_none());
        assert_eq!((o.message_size, o.message_count), (0, 0));
        let o = parse(args("-s 169.254.77.1 -t 0x68 -a18")).unwrap();
        assert_eq!((o.tos, o.ack_timeout), (Some(0x68), Some(18)));
        assert_eq!(o.cm_options(true).len(), 2);
        assert_eq!(o.cm_options(false).len(), 1, "the server sets only the ACK timeout");
        assert_eq!((byte("010").unwrap(), byte("300").unwrap()), (8, 44));
        assert!(parse(args("-m")).is_err(), "migration is not supported");
        assert!(parse(args("-c")).is_err(), "-c needs a value");
    }
}
