//! One message each way over an RDMA CM connection, on the wire as librdmacm's `rdma_server`
//! and `rdma_client` examples (rdma-core's `librdmacm/examples`): the client connects with no
//! private data and sends 16 bytes, the server answers with 16 bytes, both disconnect.
//!
//! ```text
//! server$ cm_hello server 169.254.77.1:7471     # or: rdma_server -s 169.254.77.1 -p 7471
//! client$ cm_hello client 169.254.77.1:7471     # or: rdma_client -s 169.254.77.1 -p 7471
//! ```
//!
//! `tests/guest/cm_interop.sh` runs it against the C programs both ways.

use std::net::SocketAddr;
use std::time::Duration;
use uverbs::cm::{ConnParam, Connector, Listener};
use uverbs::{Buf, Cq, LocalAccess, Qp, QpInit, QpType, SendOp, WcOpcode, WorkCompletion};

/// rdma_server's and rdma_client's message size.
const MSG: usize = 16;
const TIMEOUT: Duration = Duration::from_secs(30);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, addr) = match args.as_slice() {
        [role, addr] if role == "server" || role == "client" => (role.as_str(), addr.parse::<SocketAddr>()?),
        _ => return Err("usage: cm_hello server|client ADDR:PORT".into()),
    };
    let received = if role == "server" { serve(addr)? } else { connect(addr)? };
    println!(
        "{role}: received {} bytes: {:?}",
        received.len(),
        String::from_utf8_lossy(&received)
    );
    Ok(())
}

/// The verbs objects of one end, its message buffers while the QP does not hold them, and a
/// received message that completed while the end was waiting for its send.
struct End {
    cq: Cq,
    bufs: Vec<Buf>,
    received: Option<Buf>,
}

impl End {
    fn new(ctx: &uverbs::Context) -> Result<(Self, Qp)> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(4)?;
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        (init.cap.max_send_wr, init.cap.max_recv_wr) = (1, 1);
        let qp = pd.create_qp(&init)?;
        let bufs = pd.alloc_mr(2 * MSG, LocalAccess::LOCAL_WRITE)?.into_bufs(MSG)?;
        Ok((
            Self {
                cq,
                bufs,
                received: None,
            },
            qp,
        ))
    }

    fn free_buf(&mut self) -> Result<Buf> {
        self.bufs.pop().ok_or_else(|| "both buffers are posted".into())
    }

    fn post_recv(&mut self, qp: &mut Qp) -> Result<()> {
        let buf = self.free_buf()?;
        qp.recv_buf(buf)?; // the QP holds it until its completion
        Ok(())
    }

    fn send(&mut self, qp: &mut Qp, text: &str) -> Result<()> {
        let mut buf = self.free_buf()?;
        buf.set_len(MSG)?;
        let msg = buf.as_mut_slice();
        msg.fill(0);
        let n = text.len().min(MSG);
        msg[..n].copy_from_slice(&text.as_bytes()[..n]);
        qp.send_buf(SendOp::Send, buf)?;
        let sent = self.wait(qp, WcOpcode::SEND)?;
        self.bufs.push(sent);
        Ok(())
    }

    /// Waits for the completion of the send (`WcOpcode::SEND`) or the receive (`RECV`) and
    /// takes back its buffer (a receive's has the received bytes as its length). The two may
    /// complete in either order.
    fn wait(&mut self, qp: &mut Qp, opcode: WcOpcode) -> Result<Buf> {
        if opcode == WcOpcode::RECV {
            if let Some(buf) = self.received.take() {
                return Ok(buf);
            }
        }
        let start = std::time::Instant::now();
        let mut wc = [WorkCompletion::default()];
        while start.elapsed() < TIMEOUT {
            if let Some(c) = self.cq.reap(&mut wc).iter().next() {
                c.result()?;
                let buf = qp.reclaim(c).ok_or("a completion that gives back no buffer")?;
                if c.opcode == opcode {
                    return Ok(buf);
                }
                if c.opcode == WcOpcode::RECV {
                    self.received = Some(buf);
                } else {
                    self.bufs.push(buf);
                }
                continue;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Err(format!("no {opcode:?} completion within {TIMEOUT:?}").into())
    }
}

/// rdma_server's side: accept, receive, answer, disconnect.
fn serve(addr: SocketAddr) -> Result<Vec<u8>> {
    let listener = Listener::bind(addr)?;
    println!("server: listening on {}", listener.local_addr()?);
    let req = listener.get_request(TIMEOUT)?;
    let (mut end, mut qp) = End::new(&req.context()?)?;
    req.init_qp(&mut qp)?;
    end.post_recv(&mut qp)?;
    let mut conn = req.accept(qp, &ConnParam::default(), TIMEOUT)?;
    let received = end.wait(conn.qp_mut(), WcOpcode::RECV)?;
    end.send(conn.qp_mut(), "rust cm server")?;
    conn.disconnect(TIMEOUT)?;
    Ok(received.as_slice().to_vec())
}

/// rdma_client's side: connect, send, receive the answer, disconnect.
fn connect(addr: SocketAddr) -> Result<Vec<u8>> {
    let connector = Connector::resolve(addr, TIMEOUT)?;
    let (mut end, mut qp) = End::new(&connector.context()?)?;
    connector.id().init_qp(&mut qp)?;
    end.post_recv(&mut qp)?;
    let mut conn = connector.connect(qp, &ConnParam::default(), TIMEOUT)?;
    end.send(conn.qp_mut(), "rust cm client")?;
    let received = end.wait(conn.qp_mut(), WcOpcode::RECV)?;
    conn.disconnect(TIMEOUT)?;
    Ok(received.as_slice().to_vec())
}
