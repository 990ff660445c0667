//! An echo service on tokio over the RDMA connection manager, without `unsafe`: each client
//! advertises a region of its memory in its connect request ([`RemoteRegion`]), sends
//! messages of random sizes up to 64 KiB, and the server writes each one back into that
//! region with an RDMA write, then tells the client its length (a zero-byte send with
//! immediate data). The client checks every byte. Four clients of 2,000 messages each run
//! against one server in one process, on one current-thread runtime.
//!
//! ```text
//! $ async_echo 169.254.77.1        # an IPv4 address of a netdev with an RDMA device
//! ```
//!
//! The address defaults to `UVERBS_CM_ADDR` (set in the test guest, where
//! `tests/guest/async_echo.sh` runs this). `UVERBS_ECHO_MESSAGES` changes the 2,000.
#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use uverbs::aio::{AsyncConnection, AsyncConnector, AsyncCq, AsyncListener};
use uverbs::cm::ConnParam;
use uverbs::{AccessFlags, LocalAccess, QpInit, QpType, RemoteRegion, SendOp, WorkCompletion, WorkQueue};

/// The largest message.
const MAX: usize = 64 << 10;
const CLIENTS: usize = 4;
const PORT: u16 = 7474;
/// Connecting and resolving give up after this long.
const TIMEOUT: Duration = Duration::from_secs(30);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Result<()> {
    let ip: IpAddr = match std::env::args().nth(1) {
        Some(ip) => ip.parse()?,
        None => std::env::var("UVERBS_CM_ADDR")
            .map_err(|_| "usage: async_echo IPV4 (or set UVERBS_CM_ADDR)")?
            .parse()?,
    };
    let messages: usize = std::env::var("UVERBS_ECHO_MESSAGES").map_or(Ok(2000), |n| n.parse())?;
    let addr = SocketAddr::new(ip, PORT);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let start = Instant::now();
        let listener = AsyncListener::bind(addr)?;
        let server = tokio::spawn(async move {
            let mut conns = Vec::new();
            for _ in 0..CLIENTS {
                let request = listener.next_request().await?;
                conns.push(tokio::spawn(serve(request)));
            }
            let mut echoed = 0;
            for conn in conns {
                echoed += conn.await??;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(echoed)
        });
        let clients: Vec<_> = (0..CLIENTS)
            .map(|k| tokio::spawn(client(addr, k as u64 + 1, messages)))
            .collect();
        let mut bytes = 0;
        for c in clients {
            bytes += c.await??;
        }
        let echoed = server.await??;
        println!(
            "{CLIENTS} clients x {messages} messages (1 B to 64 KiB, {bytes} bytes) echoed by RDMA write and checked, every byte; server saw {echoed}; {:.1} s",
            start.elapsed().as_secs_f64()
        );
        if echoed != CLIENTS * messages {
            return Err(format!("the server echoed {echoed} messages").into());
        }
        Ok(())
    })
}

/// One client: connects with its inbox advertised, then sends `messages` messages and checks
/// each echo. Returns the bytes sent.
async fn client(addr: SocketAddr, seed: u64, messages: usize) -> Result<usize> {
    // Connection setup: until the QP is ready to post.
    let connector = AsyncConnector::resolve(addr, TIMEOUT).await?;
    let ctx = connector.context()?;
    let pd = ctx.alloc_pd()?;
    let mut cq = ctx.create_async_cq(64)?;
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
    let inbox = pd.alloc_remote_mr(MAX, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let advert = inbox.region().encode();
    let param = ConnParam {
        private_data: &advert,
        ..Default::default()
    };
    let mut conn = connector.connect(qp, &param).await.map_err(|f| f.error)?;

    // Buffers: one to send from, a few small ones for the server's notes.
    let mut out = pd.alloc_mr(MAX, LocalAccess::LOCAL_WRITE)?.into_bufs(MAX)?.remove(0);
    let mut notes = pd.alloc_mr(4 * 64, LocalAccess::LOCAL_WRITE)?.into_bufs(64)?;
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (mut bytes, mut echo) = (0, vec![0u8; MAX]);
    for n in 0..=messages {
        // The last message is empty: it says goodbye.
        let len = if n == messages { 0 } else { 1 + rng.below(MAX) };
        out.set_len(len)?;
        rng.fill(out.as_mut_slice());
        let qp = conn.qp_mut();
        qp.recv_buf(notes.pop().ok_or("no note buffer")?)?;
        qp.send_buf(SendOp::Send, out)?;
        if len == 0 {
            // The goodbye's receive is flushed at the disconnect; nothing comes back for it.
            one_completion(&mut cq, qp, WorkQueue::Send)
                .await?
                .ok_or("the send's buffer")?;
            break;
        }
        let (mut sent, mut note) = (None, None);
        while sent.is_none() || note.is_none() {
            let mut wc = [WorkCompletion::default(); 4];
            let reaped = cq.reap(&mut wc).await?;
            for c in reaped.iter() {
                c.result().map_err(|e| format!("client {seed} message {n}: {e}"))?;
                while let Some(r) = qp.reclaim_detailed(c) {
                    match r.queue {
                        WorkQueue::Send => sent = Some(r.buf),
                        WorkQueue::Recv => {
                            note = c.imm();
                            notes.push(r.buf);
                        }
                    }
                }
            }
        }
        out = sent.ok_or("the send's buffer")?;
        let echoed = note.ok_or("the note")? as usize;
        inbox.read(0, &mut echo[..echoed])?;
        if echoed != len || echo[..len] != *out.as_slice() {
            return Err(format!("client {seed} message {n}: {len} bytes sent, {echoed} echoed, not the same").into());
        }
        bytes += len;
    }
    conn.disconnect().await?;
    Ok(bytes)
}

/// The buffer of the next completion of `queue`'s request on `qp`, if it held one.
async fn one_completion(cq: &mut AsyncCq, qp: &mut uverbs::Qp, queue: WorkQueue) -> Result<Option<uverbs::Buf>> {
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        for c in cq.reap(&mut wc).await?.iter() {
            c.result()?;
            let buf = qp.reclaim(c);
            if c.queue() == Some(queue) {
                return Ok(buf);
            }
        }
    }
}

/// One connection of the server: accepts it with its receives posted, then writes each
/// message back into the client's advertised region and tells the client its length, until
/// the empty goodbye. Returns the messages echoed.
async fn serve(request: uverbs::cm::ConnectRequest) -> Result<usize> {
    // Connection setup: until the QP is ready to post.
    let inbox = RemoteRegion::decode(&request.private_data)?;
    let ctx = request.context()?;
    let pd = ctx.alloc_pd()?;
    let mut cq = ctx.create_async_cq(64)?;
    let mut qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
    request.init_qp(&mut qp)?;
    for buf in pd.alloc_mr(2 * MAX, LocalAccess::LOCAL_WRITE)?.into_bufs(MAX)? {
        qp.recv_buf(buf)?;
    }
    let mut conn = AsyncConnection::accept(request, qp, &ConnParam::default()).await?;

    let mut echoed = 0;
    let mut wc = [WorkCompletion::default(); 8];
    'serving: loop {
        let reaped = cq.reap(&mut wc).await?;
        let qp = conn.qp_mut();
        for c in reaped.iter() {
            c.result()?;
            while let Some(r) = qp.reclaim_detailed(c) {
                match r.queue {
                    // The write of an echo is done: the buffer takes the next message.
                    WorkQueue::Send => qp.recv_buf(r.buf)?,
                    WorkQueue::Recv if r.buf.is_empty() => break 'serving,
                    WorkQueue::Recv => {
                        let len = r.buf.len() as u32;
                        // The write lands before the note that follows it on this QP.
                        qp.write_buf(r.buf, &inbox, 0)?;
                        qp.send_inline(SendOp::SendWithImm { imm: len }, &[])?;
                        echoed += 1;
                    }
                }
            }
        }
    }
    conn.wait_disconnected().await?;
    Ok(echoed)
}

/// xorshift64*: the message sizes and bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}
