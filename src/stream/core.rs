//! One stream's state: the connection, its CQ and buffers, and rsocket's accounting
//! (docs/rsocket-protocol.md names each counter after rsocket.c's).

use super::ring::SendRing;
use super::wire::{self, ConnData, RsSge, CTRL_SLOTS, SGE_LEN, SGL_SIZE};
use super::StreamOptions;
use crate::aio::{AsyncConnection, AsyncCq};
use crate::attr::{QpType, Transport};
use crate::context::Context;
use crate::cq::CqInit;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, Buf, LocalAccess, RemoteMr};
use crate::owned::Reaped;
use crate::pd::Pd;
use crate::qp::{Qp, QpInit};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr::{Remote, SendOp};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::io::ReadBuf;

/// Bytes of each receive's buffer: writes with immediate place no data there; in the
/// message-send variant (iWARP) a SEND puts its 4-byte message there.
const RECV_SLOT: usize = 16;
/// Bytes of a message SEND in the message-send variant (rsocket's `RS_MSG_SIZE`).
const MSG_SIZE: usize = 4;
/// Completions taken per poll.
const WC_BATCH: usize = 32;
/// The most bytes gathered for one inline write.
const INLINE_MAX: usize = 1024;

/// The verbs objects of a stream before its connection is up.
pub(crate) struct Resources {
    pd: Pd,
    cq: AsyncCq,
    rbuf: RemoteMr,
    tsgl: RemoteMr,
    sbuf: SendRing<Buf>,
    rbufs: Vec<Buf>,
    chunk: u32,
    inline: u32,
    depth: u16,
    msg_send: bool,
}

impl Resources {
    /// The PD, CQ, QP and buffers of one stream on `ctx`.
    pub(crate) fn new(ctx: &Context, o: &StreamOptions) -> Result<(Self, Qp)> {
        // rsocket's RS_OPT_MSG_SEND, chosen as `rs_create_ep` chooses it: by this side's
        // device alone (iWARP has no RDMA write with immediate).
        let msg_send = ctx.device().transport()? == Transport::IWARP;
        let pd = ctx.alloc_pd()?;
        let channel = ctx.create_comp_channel()?;
        let depth = u32::from(o.queue_depth);
        let mut init = CqInit::new(2 * depth + 8);
        init.channel = Some(&channel);
        let cq = ctx.create_cq_with(&init)?;
        let mut qp_init = QpInit::new(QpType::Rc, &cq, &cq);
        qp_init.cap.max_send_wr = depth;
        qp_init.cap.max_recv_wr = depth;
        qp_init.cap.max_send_sge = 1;
        qp_init.cap.max_recv_sge = 1;
        qp_init.cap.max_inline_data = o.inline_threshold.max(SGE_LEN as u32);
        let qp = pd.create_qp(&qp_init)?;
        let inline = o.inline_threshold.min(qp.cap().max_inline_data);
        let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let rbuf = pd.alloc_remote_mr(o.recv_buffer, remote)?;
        let tsgl = pd.alloc_remote_mr(SGL_SIZE * SGE_LEN, remote)?;
        // One piece, the whole buffer, and a handle for each message that may be out.
        let whole = pd
            .alloc_mr(o.send_buffer, LocalAccess::LOCAL_WRITE)?
            .into_bufs(o.send_buffer)?
            .pop()
            .ok_or_else(|| Error::invalid("stream", "an empty send buffer"))?;
        let handles = (0..usize::from(o.queue_depth) + 2)
            .map(|_| whole.empty_handle())
            .collect();
        let sbuf = SendRing::new(whole, handles);
        let rbufs = pd
            .alloc_mr(RECV_SLOT * usize::from(o.queue_depth), LocalAccess::LOCAL_WRITE)?
            .into_bufs(RECV_SLOT)?;
        let cq = AsyncCq::new(cq, &channel)?;
        let chunk = u32::try_from(o.send_chunk).map_err(|_| Error::invalid("stream", "send_chunk too large"))?;
        Ok((
            Self {
                pd,
                cq,
                rbuf,
                tsgl,
                sbuf,
                rbufs,
                chunk,
                inline,
                depth: o.queue_depth,
                msg_send,
            },
            qp,
        ))
    }

    /// Whether the stream speaks rsocket's message-send variant (`RS_OPT_MSG_SEND`: every
    /// message an RDMA write, if it carries bytes, then a 4-byte SEND with what the
    /// immediate would hold).
    pub(crate) fn msg_send(&self) -> bool {
        self.msg_send
    }

    /// Posts every receive (the QP in INIT or later).
    pub(crate) fn post_recvs(&mut self, qp: &mut Qp) -> Result<()> {
        while let Some(buf) = self.rbufs.pop() {
            qp.recv_buf(buf)?;
        }
        Ok(())
    }

    /// This side's `rs_conn_data`.
    pub(crate) fn conn_data(&self) -> ConnData {
        ConnData {
            credits: self.depth,
            target_sgl: RsSge {
                addr: self.tsgl.addr(),
                key: self.tsgl.rkey(),
                length: SGL_SIZE as u32,
            },
            data_buf: RsSge {
                addr: self.rbuf.addr(),
                key: self.rbuf.rkey(),
                length: (self.rbuf.len() / 2) as u32,
            },
        }
    }
}

/// The wakers of the two halves: the reactor wakes both on any event of the stream's fds.
#[derive(Default)]
struct Wakers {
    read: Mutex<Option<Waker>>,
    write: Mutex<Option<Waker>>,
}

impl Wakers {
    fn set(slot: &Mutex<Option<Waker>>, waker: &Waker) {
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }
}

impl Wake for Wakers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        for slot in [&self.read, &self.write] {
            if let Some(w) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                w.wake();
            }
        }
    }
}

/// What a posted send was, oldest first (every send is signaled; a queue completes in order).
#[derive(Debug, Clone, Copy)]
enum Sent {
    Data,
    Ctrl,
}

/// Which half polls.
#[derive(Clone, Copy)]
enum Half {
    Read,
    Write,
}

/// Why the stream can no longer move data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Down {
    /// The peer went away without rsocket's disconnect (or the transport failed).
    Reset,
    /// A protocol violation or a local failure.
    Failed,
}

/// A stream's state (docs/rsocket-protocol.md for the protocol and its counters).
pub(crate) struct Core {
    // Dropped first: the QP and the id go before the CQ and the buffers.
    conn: AsyncConnection,
    cq: AsyncCq,
    rbuf: RemoteMr,
    tsgl: RemoteMr,
    sbuf: SendRing<Buf>,
    _pd: Pd,
    wc: Box<[WorkCompletion]>,
    sent: VecDeque<Sent>,
    chunk: u32,
    inline: u32,
    /// rsocket's message-send variant (iWARP): [`Resources::msg_send`].
    msg_send: bool,
    wakers: Arc<Wakers>,
    waker: Waker,
    /// Where the pieces of an inline write spread over several slices are gathered.
    stage: Box<[u8]>,
    // Sending.
    sseq_no: u16,
    sseq_comp: u16,
    sqe_avail: u32,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    target: [RsSge; SGL_SIZE],
    target_sge: usize,
    /// SGL updates that arrived and are not loaded into `target` yet.
    sgl_arrived: u32,
    /// The entry of `tsgl` the peer writes its next SGL update into (message-send variant).
    sgl_next: usize,
    remote_sgl: RsSge,
    remote_sge: u32,
    // Receiving.
    rq_size: u16,
    rseq_no: u16,
    rseq_comp: u16,
    rmsg: VecDeque<u32>,
    rbuf_size: u32,
    rbuf_offset: u32,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    // State.
    /// The peer has not ended its side (no shutdown or disconnect message yet).
    readable: bool,
    /// This side may still send data.
    writable: bool,
    /// This side sent its shutdown or disconnect message.
    closed_sent: bool,
    /// The connection's DISCONNECTED came.
    cm_down: bool,
    down: Option<Down>,
    error: Option<Error>,
    /// How many of `RdmaStream` and its halves hold this stream (`release`).
    holders: u8,
    /// The disconnect of a dropped stream is posted.
    disconnect_posted: bool,
    /// The peer's shutdown or disconnect message came.
    peer_ended: bool,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaStream")
            .field("qp", &self.conn.qp().qpn())
            .field("readable", &self.readable)
            .field("writable", &self.writable)
            .field("down", &self.down)
            .finish_non_exhaustive()
    }
}

impl Core {
    pub(crate) fn new(conn: AsyncConnection, r: Resources, peer: ConnData) -> Result<Self> {
        let depth = u32::from(r.depth);
        let rbuf_size = r.rbuf.len() as u32;
        let wakers = Arc::new(Wakers::default());
        Ok(Self {
            conn,
            cq: r.cq,
            rbuf: r.rbuf,
            tsgl: r.tsgl,
            sbuf: r.sbuf,
            _pd: r.pd,
            wc: vec![WorkCompletion::default(); WC_BATCH].into_boxed_slice(),
            sent: VecDeque::with_capacity(depth as usize + 1),
            chunk: r.chunk,
            inline: r.inline,
            msg_send: r.msg_send,
            waker: Waker::from(wakers.clone()),
            stage: vec![0; INLINE_MAX].into_boxed_slice(),
            wakers,
            sseq_no: 0,
            sseq_comp: peer.credits,
            sqe_avail: depth - CTRL_SLOTS,
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SLOTS,
            target: [peer.data_buf, RsSge::default()],
            target_sge: 0,
            sgl_arrived: 0,
            sgl_next: 1 % SGL_SIZE,
            remote_sgl: peer.target_sgl,
            remote_sge: 1 % peer.target_sgl.length,
            rq_size: r.depth,
            rseq_no: 0,
            rseq_comp: r.depth / 2,
            rmsg: VecDeque::with_capacity(depth as usize + 1),
            rbuf_size,
            rbuf_offset: 0,
            rbuf_bytes_avail: rbuf_size / 2,
            rbuf_free_offset: rbuf_size / 2,
            readable: true,
            writable: true,
            closed_sent: false,
            cm_down: false,
            down: None,
            error: None,
            holders: 1,
            disconnect_posted: false,
            peer_ended: false,
        })
    }

    pub(crate) fn peer_addr(&self) -> Result<SocketAddr> {
        let a = self.conn.get_ref().id().query_addr()?;
        a.dst.ok_or_else(|| Error::malformed("peer_addr", "no peer address"))
    }

    pub(crate) fn local_addr(&self) -> Result<SocketAddr> {
        let a = self.conn.get_ref().id().query_addr()?;
        a.src.ok_or_else(|| Error::malformed("local_addr", "no local address"))
    }

    /// Marks the stream failed with `e` (the first error stays).
    fn fail(&mut self, e: Error) {
        if self.down.is_none() {
            self.down = Some(Down::Failed);
        }
        self.readable = false;
        self.writable = false;
        self.error.get_or_insert(e);
    }

    /// Whether control messages may still go out.
    fn connected(&self) -> bool {
        self.down.is_none() && !self.cm_down
    }

    /// Takes the completions there are without registering for a wake-up: the hot path.
    /// What it reaps (receives posted again, credits and send slots back) is what the
    /// registering [`Core::progress`] would reap; a half that then has nothing to do calls
    /// that one before it returns `Pending`. (A completion it takes after another half armed
    /// the CQ still raises that half's event.)
    fn take_completions(&mut self) {
        let mut wc = std::mem::take(&mut self.wc);
        loop {
            match self.cq.get_mut().try_reap(&mut wc) {
                Err(e) => {
                    self.fail(e);
                    break;
                }
                Ok(reaped) => {
                    let full = reaped.len() == WC_BATCH;
                    self.completions(&reaped);
                    if !full {
                        break;
                    }
                }
            }
        }
        self.wc = wc;
        self.update_credits();
    }

    /// Takes every completion and connection event there is, registering the halves' shared
    /// waker for the next; `half`'s waker is the one to wake.
    fn progress(&mut self, cx: &mut TaskContext<'_>, half: Half) {
        let slot = match half {
            Half::Read => &self.wakers.read,
            Half::Write => &self.wakers.write,
        };
        Wakers::set(slot, cx.waker());
        let waker = self.waker.clone();
        let mut cx = TaskContext::from_waker(&waker);
        let mut wc = std::mem::take(&mut self.wc);
        loop {
            match self.cq.poll_reap(&mut cx, &mut wc) {
                Poll::Pending => break,
                Poll::Ready(Err(e)) => {
                    self.fail(e);
                    break;
                }
                Poll::Ready(Ok(reaped)) => self.completions(&reaped),
            }
        }
        self.wc = wc;
        if !self.cm_down {
            match self.conn.poll_disconnected(&mut cx) {
                Poll::Pending => {}
                Poll::Ready(result) => {
                    self.cm_down = true;
                    if let Err(e) = result {
                        self.fail(e);
                    }
                    // The peer's last messages may have completed between the poll above and
                    // the event: take them before judging how it ended.
                    self.take_completions();
                    // The peer went away without its shutdown or disconnect message: a reset.
                    if !self.peer_ended && self.down.is_none() {
                        self.down = Some(Down::Reset);
                    }
                    self.readable = false;
                    self.writable = false;
                }
            }
        }
        self.update_credits();
    }

    fn completions(&mut self, reaped: &Reaped<'_>) {
        for c in reaped.iter() {
            let is_recv = c.opcode.0 & WcOpcode::RECV.0 != 0;
            let buf = self.conn.qp_mut().reclaim(c);
            if c.status != WcStatus::SUCCESS {
                // Flushed or failed: the connection is over; buffers are dropped with it.
                if c.status != WcStatus::WR_FLUSH_ERR && self.connected() {
                    self.down = Some(Down::Reset);
                    self.error.get_or_insert(Error::malformed(
                        "rsocket stream",
                        format!("a work request failed: {}", c.status),
                    ));
                }
                self.readable = false;
                self.writable = false;
                continue;
            }
            if is_recv {
                // The message: the immediate, or in the message-send variant the 4 bytes a
                // SEND put into the receive's buffer, in the sender's byte order (rsocket reads
                // them so; a peer of the other byte order is refused at connect).
                let msg = c.imm().or_else(|| {
                    let b = buf
                        .as_ref()
                        .filter(|_| self.msg_send && c.byte_len as usize == MSG_SIZE)?;
                    let m = <[u8; MSG_SIZE]>::try_from(b.as_slice().get(..MSG_SIZE)?).ok()?;
                    Some(u32::from_ne_bytes(m))
                });
                if let Some(buf) = buf {
                    if self.connected() {
                        if let Err(refused) = self.conn.qp_mut().recv_buf(buf) {
                            self.fail(refused.error);
                        }
                    }
                }
                match msg {
                    Some(msg) => self.message(msg, c.byte_len),
                    None if self.msg_send => self.fail(Error::malformed(
                        "rsocket stream",
                        format!("a receive of {} bytes, not a 4-byte message", c.byte_len),
                    )),
                    None => self.fail(Error::malformed("rsocket stream", "a message without immediate data")),
                }
            } else {
                if let Some(buf) = buf {
                    self.sbuf.give_back(buf);
                }
                match self.sent.pop_front() {
                    Some(Sent::Data) => self.sqe_avail += 1,
                    Some(Sent::Ctrl) => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                    None => self.fail(Error::malformed("rsocket stream", "a send completion for no send")),
                }
            }
        }
    }

    /// One received message.
    fn message(&mut self, imm: u32, byte_len: u32) {
        let (op, data) = wire::split_imm(imm);
        match op {
            wire::OP_DATA => {
                if self.rmsg.len() > usize::from(self.rq_size) || data > self.rbuf_size / 2 {
                    self.fail(Error::malformed("rsocket stream", "the peer sent beyond its credits"));
                } else if self.readable {
                    self.rmsg.push_back(data);
                }
            }
            wire::OP_SGL => {
                self.sseq_comp = data as u16;
                if self.msg_send {
                    self.sgl_written();
                } else if byte_len as usize == SGE_LEN {
                    self.sgl_arrived += 1;
                }
            }
            wire::OP_CTRL => match data {
                wire::CTRL_DISCONNECT => {
                    self.readable = false;
                    self.writable = false;
                    self.peer_ended = true;
                }
                wire::CTRL_SHUTDOWN => {
                    self.readable = false;
                    self.peer_ended = true;
                }
                wire::CTRL_KEEPALIVE => {}
                other => self.fail(Error::malformed(
                    "rsocket stream",
                    format!("unknown control message {other}"),
                )),
            },
            wire::OP_IOMAP_SGL => self.fail(Error::malformed(
                "rsocket stream",
                "an iomap update, though this side offered no iomap",
            )),
            other => self.fail(Error::malformed(
                "rsocket stream",
                format!("reserved operation {other}"),
            )),
        }
    }

    /// Message-send variant: an SGL message does not say whether an SGE was written before
    /// it (its SEND is 4 bytes either way), so the entry the peer writes next is read: not
    /// zero, it is a new part of the peer's receive buffer. It is loaded at once and the entry
    /// cleared, so that a later credit-only message is not taken for it again: the peer
    /// writes an entry again only after this side used up what it loaded from it.
    fn sgl_written(&mut self) {
        let k = self.sgl_next;
        let mut b = [0u8; SGE_LEN];
        if let Err(e) = self.tsgl.read(k * SGE_LEN, &mut b) {
            self.fail(e.into());
            return;
        }
        let sge = RsSge::from_ne_bytes(&b);
        if sge.length == 0 {
            return; // credits only
        }
        if self.target[k].length != 0 {
            self.fail(Error::malformed(
                "rsocket stream",
                "the peer wrote a target SGE that was still in use",
            ));
            return;
        }
        if let Err(e) = self.tsgl.write(k * SGE_LEN, &[0; SGE_LEN]) {
            self.fail(e.into());
            return;
        }
        self.target[k] = sge;
        self.sgl_next = (k + 1) % SGL_SIZE;
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    /// Whether a credit update may go out: it takes two control slots in the message-send
    /// variant (write and SEND), as rsocket's `rs_2ctrl_avail` asks.
    fn credit_ctrl_avail(&self) -> bool {
        self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) >= self.requests_per_message()
    }

    /// Send requests one message takes: a write with immediate, or in the message-send
    /// variant a write and a SEND.
    fn requests_per_message(&self) -> u32 {
        if self.msg_send {
            2
        } else {
            1
        }
    }

    /// Posts a control message (zero-length or with `payload` inline) at `at`; in the
    /// message-send variant a write of `payload` (if any) and the message as a SEND, each a
    /// control slot.
    fn post_ctrl(&mut self, imm: u32, at: u64, payload: &[u8]) -> Result<()> {
        let remote = Remote {
            addr: at,
            rkey: self.remote_sgl.key,
        };
        if self.msg_send {
            if !payload.is_empty() {
                self.conn.qp_mut().send_inline(SendOp::RdmaWrite(remote), payload)?;
                self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
                self.sent.push_back(Sent::Ctrl);
            }
            self.post_msg(imm)?;
        } else {
            self.conn
                .qp_mut()
                .send_inline(SendOp::RdmaWriteWithImm(remote, imm), payload)?;
        }
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.sent.push_back(Sent::Ctrl);
        Ok(())
    }

    /// Message-send variant: `msg` (what the immediate would hold) as a 4-byte inline SEND,
    /// in this host's byte order (rsocket's `rs_post_msg`). The caller counts its slot.
    fn post_msg(&mut self, msg: u32) -> Result<()> {
        self.conn.qp_mut().send_inline(SendOp::Send, &msg.to_ne_bytes())
    }

    /// rsocket's `rs_update_credits`: grants credits and buffer space when half is due.
    fn update_credits(&mut self) {
        let half = self.rbuf_size / 2;
        let due = self.rbuf_bytes_avail >= half || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0;
        if !(due && self.credit_ctrl_avail() && self.connected() && !self.closed_fully()) {
            return;
        }
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size / 2);
        let credits = u32::from(self.rseq_no) + u32::from(self.rq_size);
        let result = if self.rbuf_bytes_avail >= half {
            let sge = RsSge {
                addr: self.rbuf.addr() + u64::from(self.rbuf_free_offset),
                key: self.rbuf.rkey(),
                length: half,
            };
            // The peer's address: wrapping, since it only ever addresses the peer's memory.
            let at = self
                .remote_sgl
                .addr
                .wrapping_add(u64::from(self.remote_sge) * SGE_LEN as u64);
            let r = self.post_ctrl(wire::imm(wire::OP_SGL, credits), at, &sge.to_ne_bytes());
            if r.is_ok() {
                self.rbuf_bytes_avail -= half;
                self.rbuf_free_offset += half;
                if self.rbuf_free_offset >= self.rbuf_size {
                    self.rbuf_free_offset = 0;
                }
                self.remote_sge = (self.remote_sge + 1) % self.remote_sgl.length;
            }
            r
        } else {
            self.post_ctrl(wire::imm(wire::OP_SGL, credits), self.remote_sgl.addr, &[])
        };
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Whether this side sent its disconnect (no more control messages then).
    fn closed_fully(&self) -> bool {
        self.closed_sent && !self.readable
    }

    /// The error for a stream that is down.
    fn down_error(&self, writing: bool) -> io::Error {
        if let Some(e) = &self.error {
            return io::Error::other(e.to_string());
        }
        match self.down {
            Some(Down::Reset) => io::Error::new(io::ErrorKind::ConnectionReset, "the rsocket peer went away"),
            _ if writing && self.closed_sent => io::Error::new(io::ErrorKind::BrokenPipe, "this side shut down"),
            _ => io::Error::new(io::ErrorKind::ConnectionReset, "the rsocket peer disconnected"),
        }
    }

    pub(crate) fn poll_read(&mut self, cx: &mut TaskContext<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // Always: receives are posted again only here, and credits granted below count on them.
        self.take_completions();
        if self.rmsg.is_empty() {
            // Nothing to read: wait for more (registering for the wake-up), unless it came
            // meanwhile or the connection ended.
            self.progress(cx, Half::Read);
        }
        if self.rmsg.is_empty() {
            if self.down == Some(Down::Reset) || self.error.is_some() {
                return Poll::Ready(Err(self.down_error(false)));
            }
            if !self.readable {
                return Poll::Ready(Ok(())); // end of stream
            }
            return Poll::Pending;
        }
        let dst = out.initialize_unfilled();
        let mut done = 0;
        while done < dst.len() {
            let Some(front) = self.rmsg.front_mut() else { break };
            let n = (*front).min((dst.len() - done) as u32);
            let mut left = n as usize;
            while left > 0 {
                let at = self.rbuf_offset as usize;
                let piece = left.min(self.rbuf_size as usize - at);
                if let Err(e) = self.rbuf.read(at, &mut dst[done..done + piece]) {
                    self.fail(e.into());
                    return Poll::Ready(Err(self.down_error(false)));
                }
                done += piece;
                left -= piece;
                self.rbuf_offset += piece as u32;
                if self.rbuf_offset == self.rbuf_size {
                    self.rbuf_offset = 0;
                }
            }
            // What was read was written into space granted to the peer: more than the buffer
            // holds means the peer wrote where it had no credit.
            match self.rbuf_bytes_avail.checked_add(n).filter(|&a| a <= self.rbuf_size) {
                Some(a) => self.rbuf_bytes_avail = a,
                None => {
                    self.fail(Error::malformed(
                        "rsocket stream",
                        "the peer wrote beyond the space granted to it",
                    ));
                    return Poll::Ready(Err(self.down_error(false)));
                }
            }
            *front -= n;
            if *front == 0 {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            }
        }
        out.advance(done);
        self.update_credits();
        Poll::Ready(Ok(()))
    }

    /// Loads the next target SGE the peer wrote, if the current one is spent.
    fn target_ready(&mut self) -> bool {
        if self.target[self.target_sge].length != 0 {
            return true;
        }
        if self.sgl_arrived == 0 {
            return false;
        }
        let mut b = [0u8; SGE_LEN];
        if let Err(e) = self.tsgl.read(self.target_sge * SGE_LEN, &mut b) {
            self.fail(e.into());
            return false;
        }
        self.sgl_arrived -= 1;
        self.target[self.target_sge] = RsSge::from_ne_bytes(&b);
        self.target[self.target_sge].length != 0
    }

    /// A post of a write failed: the stream fails, and the write reports what it had
    /// already taken, or the error if nothing.
    fn write_failed(&mut self, e: Error, written: usize) -> Poll<io::Result<usize>> {
        self.fail(e);
        Poll::Ready(if written > 0 {
            Ok(written)
        } else {
            Err(self.down_error(true))
        })
    }

    /// The request that carries `len` bytes of data to `remote`: a write with the message as
    /// its immediate, or in the message-send variant a plain write ([`Core::post_msg`] then
    /// sends the message).
    fn data_op(&self, remote: Remote, len: u32) -> SendOp {
        if self.msg_send {
            SendOp::RdmaWrite(remote)
        } else {
            SendOp::RdmaWriteWithImm(remote, wire::imm(wire::OP_DATA, len))
        }
    }

    fn can_send(&mut self) -> bool {
        self.sqe_avail >= self.requests_per_message() && self.sseq_no != self.sseq_comp && self.target_ready()
    }

    pub(crate) fn poll_write(&mut self, cx: &mut TaskContext<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        let mut written = 0;
        let (mut slice, mut offset) = (0, 0);
        let (mut reaped, mut polled) = (false, false);
        while written < total {
            if !self.writable {
                return Poll::Ready(if written > 0 {
                    Ok(written)
                } else {
                    Err(self.down_error(true))
                });
            }
            let need_buf = (total - written).min(self.chunk as usize) > self.inline as usize;
            if !(self.can_send() && (!need_buf || self.sbuf.can_take())) {
                if polled || written > 0 {
                    break;
                }
                // First the completions there are; only if they free nothing, the
                // registering poll (the wake-up for when they do).
                if reaped {
                    self.progress(cx, Half::Write);
                    polled = true;
                } else {
                    self.take_completions();
                    reaped = true;
                }
                continue;
            }
            let target = self.target[self.target_sge];
            let mut len = ((total - written) as u64)
                .min(u64::from(self.chunk))
                .min(u64::from(target.length)) as u32;
            let remote = Remote {
                addr: target.addr,
                rkey: target.key,
            };
            let posted = if len <= self.inline {
                let op = self.data_op(remote, len);
                let n = len as usize;
                let first = &bufs[slice][offset..];
                if first.len() >= n {
                    // In one slice: straight from it.
                    offset += n;
                    if offset == bufs[slice].len() {
                        slice += 1;
                        offset = 0;
                    }
                    self.conn.qp_mut().send_inline(op, &first[..n])
                } else {
                    gather(bufs, &mut slice, &mut offset, &mut self.stage[..n]);
                    self.conn.qp_mut().send_inline(op, &self.stage[..n])
                }
            } else {
                // The next bytes of the ring, up to where the buffer ends.
                match self.sbuf.take(len as usize) {
                    None => Err(Error::invalid("rsocket stream", "no send buffer space")),
                    Some(mut buf) => {
                        len = buf.len() as u32;
                        let op = self.data_op(remote, len);
                        gather(bufs, &mut slice, &mut offset, buf.as_mut_slice());
                        self.conn.qp_mut().send_buf(op, buf).map_err(|r| {
                            // The newest piece, where `give_back` expects the oldest: it
                            // keeps the count right but not the ring's order, which is
                            // enough because the stream fails right after (`write_failed`)
                            // and never takes from the ring again.
                            if let Some(buf) = r.buf {
                                self.sbuf.give_back(buf);
                            }
                            r.error
                        })
                    }
                }
            };
            if let Err(e) = posted {
                return self.write_failed(e, written);
            }
            self.sent.push_back(Sent::Data);
            self.sseq_no = self.sseq_no.wrapping_add(1);
            self.sqe_avail -= 1;
            if self.msg_send {
                // The message-send variant: the message follows the write as a SEND.
                if let Err(e) = self.post_msg(wire::imm(wire::OP_DATA, len)) {
                    return self.write_failed(e, written);
                }
                self.sent.push_back(Sent::Data);
                self.sqe_avail -= 1;
            }
            let t = &mut self.target[self.target_sge];
            t.addr = t.addr.wrapping_add(u64::from(len));
            t.length -= len;
            if t.length == 0 {
                self.target_sge = (self.target_sge + 1) % SGL_SIZE;
            }
            written += len as usize;
        }
        if written > 0 {
            Poll::Ready(Ok(written))
        } else {
            Poll::Pending
        }
    }

    pub(crate) fn poll_flush(&mut self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        // Posted data is on its way; a flush waits for the device to be done with it.
        loop {
            if self.sent.is_empty() || !self.connected() {
                return Poll::Ready(Ok(()));
            }
            let before = self.sent.len();
            self.progress(cx, Half::Write);
            // The connection's end may come with no completion for what is posted (on siw, a
            // SEND posted as the peer closed got none): the check above ends the flush then.
            if self.sent.len() == before && self.connected() {
                return Poll::Pending;
            }
        }
    }

    pub(crate) fn poll_shutdown(&mut self, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        if !self.closed_sent {
            if !self.connected() {
                self.closed_sent = true;
                self.writable = false;
                return Poll::Ready(Ok(()));
            }
            if !self.ctrl_avail() {
                self.progress(cx, Half::Write);
                if !self.ctrl_avail() {
                    return if self.connected() {
                        Poll::Pending
                    } else {
                        Poll::Ready(Ok(()))
                    };
                }
            }
            let ctrl = if self.readable {
                wire::CTRL_SHUTDOWN
            } else {
                wire::CTRL_DISCONNECT
            };
            let at = self.remote_sgl.addr;
            if let Err(e) = self.post_ctrl(wire::imm(wire::OP_CTRL, ctrl), at, &[]) {
                self.fail(e);
                return Poll::Ready(Err(self.down_error(true)));
            }
            self.closed_sent = true;
            self.writable = false;
        }
        self.poll_flush(cx)
    }

    /// Counts another holder of the stream (a half of a split).
    pub(crate) fn hold(&mut self) {
        self.holders = self.holders.saturating_add(1);
    }

    /// One holder let go. True when it was the last and the stream still owes the peer
    /// rsocket's disconnect: posted here already if a control slot is free (so that it is on
    /// its way even if the process ends right after), and [`Core::close_best_effort`] waits
    /// for it to leave (and posts it, if no slot was free).
    pub(crate) fn release(&mut self) -> bool {
        self.holders = self.holders.saturating_sub(1);
        if self.holders != 0 || !self.connected() || self.closed_fully() {
            return false;
        }
        self.post_disconnect();
        true
    }

    /// Posts rsocket's disconnect once, if a control slot is free; whether it is posted.
    fn post_disconnect(&mut self) -> bool {
        if self.disconnect_posted {
            return true;
        }
        if !self.ctrl_avail() || !self.connected() {
            return false;
        }
        let at = self.remote_sgl.addr;
        if self
            .post_ctrl(wire::imm(wire::OP_CTRL, wire::CTRL_DISCONNECT), at, &[])
            .is_err()
        {
            // The QP refused: the teardown goes on without the message.
            self.down.get_or_insert(Down::Failed);
            return false;
        }
        self.closed_sent = true;
        self.disconnect_posted = true;
        true
    }

    /// Waits up to half a second for rsocket's disconnect to be posted (for a control slot)
    /// and to leave: the best a dropped stream can do. Blocks: called on a thread of its own
    /// (`release` in the module above), never on the runtime's.
    pub(crate) fn close_best_effort(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut wc = std::mem::take(&mut self.wc);
        let mut spins = 0u32;
        let mut settle = |core: &mut Self, wc: &mut [WorkCompletion]| {
            let reaped = core.cq.get_mut().reap(wc);
            core.completions(&reaped);
            // Natively the message leaves within microseconds; on a slow device, sleep.
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        while !self.post_disconnect() && self.connected() && Instant::now() < deadline {
            settle(self, &mut wc);
        }
        while self.disconnect_posted && !self.sent.is_empty() && self.connected() && Instant::now() < deadline {
            settle(self, &mut wc);
        }
        self.wc = wc;
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // The disconnect message went out (or could not) before the last holder let go.
        let _ = self.conn.start_disconnect();
    }
}

/// Copies the next `out.len()` bytes of `bufs` from (`slice`, `offset`) into `out`.
fn gather(bufs: &[io::IoSlice<'_>], slice: &mut usize, offset: &mut usize, out: &mut [u8]) {
    let mut done = 0;
    while done < out.len() {
        let src = &bufs[*slice][*offset..];
        let n = src.len().min(out.len() - done);
        out[done..done + n].copy_from_slice(&src[..n]);
        done += n;
        *offset += n;
        if *offset == bufs[*slice].len() {
            *slice += 1;
            *offset = 0;
        }
    }
}
