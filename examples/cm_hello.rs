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
use uverbs::{AccessFlags, Cq, Mr, Qp, QpInit, QpType, RecvWr, SendOp, SendWr, WorkCompletion};

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

/// The verbs objects of one end: the receive buffer at 0, the send buffer at `MSG`.
struct End {
    cq: Cq,
    mr: Mr,
}

impl End {
    fn new(ctx: &uverbs::Context) -> Result<(Self, Qp)> {
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(4)?;
        let mut init = QpInit::new(QpType::Rc, &cq, &cq);
        (init.cap.max_send_wr, init.cap.max_recv_wr) = (1, 1);
        let qp = pd.create_qp(&init)?;
        let mr = pd.alloc_mr(2 * MSG, AccessFlags::LOCAL_WRITE)?;
        Ok((Self { cq, mr }, qp))
    }

    fn post_recv(&mut self, qp: &mut Qp) -> Result<()> {
        let sge = [self.mr.sge(0, MSG as u32)?];
        // SAFETY: `mr` lives until the completion is polled (`wait`).
        unsafe { qp.post_recv(&[RecvWr::new(1, &sge)])? };
        Ok(())
    }

    fn send(&mut self, qp: &mut Qp, text: &str) -> Result<()> {
        let msg = &mut self.mr.as_mut_slice()[MSG..];
        let n = text.len().min(MSG);
        msg[..n].copy_from_slice(&text.as_bytes()[..n]);
        let sge = [self.mr.sge(MSG, MSG as u32)?];
        // SAFETY: `mr` lives until the completion is polled (`wait`).
        unsafe { qp.post_send(&[SendWr::new(2, SendOp::Send, &sge)])? };
        self.wait(2)?;
        Ok(())
    }

    /// Waits for the completion of request `wr_id`.
    fn wait(&mut self, wr_id: u64) -> Result<WorkCompletion> {
        let start = std::time::Instant::now();
        let mut wc = [WorkCompletion::default()];
        while start.elapsed() < TIMEOUT {
            if self.cq.poll(&mut wc) == 1 {
                wc[0].result()?;
                if wc[0].wr_id != wr_id {
                    return Err(format!("completion of request {}, expected {wr_id}", wc[0].wr_id).into());
                }
                return Ok(wc[0]);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Err(format!("no completion of request {wr_id} within {TIMEOUT:?}").into())
    }

    fn received(&self, wc: &WorkCompletion) -> Vec<u8> {
        self.mr.as_slice()[..wc.byte_len as usize].to_vec()
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
    let wc = end.wait(1)?;
    end.send(conn.qp_mut(), "rust cm server")?;
    conn.disconnect(TIMEOUT)?;
    Ok(end.received(&wc))
}

/// rdma_client's side: connect, send, receive the answer, disconnect.
fn connect(addr: SocketAddr) -> Result<Vec<u8>> {
    let connector = Connector::resolve(addr, TIMEOUT)?;
    let (mut end, mut qp) = End::new(&connector.context()?)?;
    connector.id().init_qp(&mut qp)?;
    end.post_recv(&mut qp)?;
    let mut conn = connector.connect(qp, &ConnParam::default(), TIMEOUT)?;
    end.send(conn.qp_mut(), "rust cm client")?;
    let wc = end.wait(1)?;
    conn.disconnect(TIMEOUT)?;
    Ok(end.received(&wc))
}
