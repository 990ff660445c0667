//! Byte streams over RC QPs on tokio, wire-compatible with rdma-core's rsockets (feature
//! `tokio`): [`RdmaListener`] and [`RdmaStream`], which implements tokio's `AsyncRead` and
//! `AsyncWrite` and splits into halves ([`RdmaStream::into_split`]).
//!
//! The protocol is rsocket's (`docs/rsocket-protocol.md`): connect private data
//! (`rs_conn_data`), data as RDMA writes with immediate into the receive buffer the peer
//! advertised, credits and buffer halves granted back by SGL updates, shutdown and disconnect
//! as control messages; on an iWARP device (no write with immediate) rsocket's message-send
//! variant, as rsocket speaks it there: each message a plain RDMA write (if it carries bytes)
//! followed by a 4-byte SEND holding what the immediate would. A C program on `librdmacm`'s rsockets (`rstream`, a TCP program under
//! `librspreload.so`) is a peer, in either role (`riowrite`'s iomaps are not offered, so
//! `riostream` is not). What rsockets can negotiate and this implementation does not speak
//! (a big-endian peer, another protocol version) is refused at connect or accept with an
//! error that says so.
//!
//! ```no_run
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use uverbs::stream::{RdmaListener, RdmaStream};
//!
//! async fn echo_once(addr: std::net::SocketAddr) -> std::io::Result<()> {
//!     let listener = RdmaListener::bind(addr)?;
//!     let server = tokio::spawn(async move {
//!         let (stream, _peer) = listener.accept().await?;
//!         let (mut rd, mut wr) = stream.into_split();
//!         tokio::io::copy(&mut rd, &mut wr).await?;
//!         wr.shutdown().await?;
//!         std::io::Result::Ok(())
//!     });
//!     let mut stream = RdmaStream::connect(addr).await?;
//!     stream.write_all(b"hello").await?;
//!     stream.shutdown().await?;
//!     let mut back = Vec::new();
//!     stream.read_to_end(&mut back).await?;
//!     assert_eq!(back, b"hello");
//!     server.await.expect("the server task")?;
//!     Ok(())
//! }
//! ```
//!
//! Completions and connection events are awaited on tokio's reactor (the CQ's completion
//! channel and the connection's event channel); the two halves of a split stream share them
//! and wake each other. A read or write that finds its completions already there takes them
//! without the reactor, and spends tokio's cooperative budget as a socket's would, so that a
//! task copying a busy stream yields to the others. Data is copied once on each side: into a registered send buffer (or
//! inline into the request, up to [`StreamOptions::inline_threshold`]), and out of the
//! registered receive buffer; the hot path allocates nothing.

mod core;
mod ring;
mod wire;

use self::core::{Core, Resources};
use crate::aio::{AsyncConnection, AsyncConnector, AsyncListener};
use crate::cm::ConnParam;
use crate::error::{Error, Result};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Sizes of a stream's buffers and queues. The defaults fit rxe's limits, which are narrower
/// than a hardware RoCE device's.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StreamOptions {
    /// Bytes of the receive buffer the peer writes into, used in two halves (rsocket's
    /// `rbuf_size`, 128 KiB there). Default 256 KiB; at least 8 KiB, even.
    pub recv_buffer: usize,
    /// Bytes of registered send buffer (rsocket's `sbuf_size`), used as a ring: each data
    /// message takes the bytes it carries until its send completes. Default 256 KiB.
    pub send_buffer: usize,
    /// The largest data message. Default 64 KiB (rsocket's largest transfer).
    pub send_chunk: usize,
    /// Writes of at most this many bytes go inline in the request, not through the send
    /// buffer. Default 64 (rsocket's); 16 bytes of inline data are always asked for (the
    /// SGL updates).
    pub inline_threshold: u32,
    /// Send and receive queue depth (rsocket's `sq_size`/`rq_size`, 384 there). Default 128;
    /// 16 to 65534.
    pub queue_depth: u16,
    /// How long address and route resolution may take. Default 2 s.
    pub resolve_timeout: Duration,
}

impl Default for StreamOptions {
    fn default() -> Self {
        Self {
            recv_buffer: 256 << 10,
            send_buffer: 256 << 10,
            send_chunk: 64 << 10,
            inline_threshold: 64,
            queue_depth: 128,
            resolve_timeout: Duration::from_secs(2),
        }
    }
}

impl StreamOptions {
    fn check(&self, verb: &'static str) -> Result<()> {
        let bad = |why: &str| Err(Error::invalid(verb, format!("StreamOptions: {why}")));
        if self.recv_buffer < 8 << 10 || self.recv_buffer % 2 != 0 || self.recv_buffer > 1 << 30 {
            return bad("recv_buffer must be even, 8 KiB to 1 GiB");
        }
        if self.send_chunk == 0 || self.send_chunk > 1 << 28 || self.send_buffer < self.send_chunk {
            return bad("send_chunk must be 1 byte to 256 MiB and at most send_buffer");
        }
        if self.send_buffer > 1 << 30 {
            return bad("send_buffer must be at most 1 GiB");
        }
        if !(16..=0xFFFE).contains(&self.queue_depth) {
            return bad("queue_depth must be 16 to 65534");
        }
        if self.inline_threshold > 1024 {
            return bad("inline_threshold must be at most 1024");
        }
        Ok(())
    }
}

/// Listens for rsocket stream connections (the RDMA CM's TCP port space).
#[derive(Debug)]
pub struct RdmaListener {
    listener: AsyncListener,
    options: StreamOptions,
}

impl RdmaListener {
    /// Binds and listens on `addr` (an address of a netdev with an RDMA device; port 0
    /// picks one) with the default options. Must be called inside a tokio runtime.
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        Self::bind_with(addr, StreamOptions::default())
    }

    /// [`RdmaListener::bind`] with `options` for the streams it accepts.
    pub fn bind_with(addr: SocketAddr, options: StreamOptions) -> Result<Self> {
        options.check("RdmaListener::bind")?;
        Ok(Self {
            listener: AsyncListener::bind(addr)?,
            options,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Waits for the next connect request and accepts it, returning the stream and the
    /// peer's address. A request whose private data is not an rsocket peer's this
    /// implementation speaks is rejected, and its error returned (the listener goes on).
    ///
    /// Cancellation safe while it waits for a request; dropped during the accept, the new
    /// connection is torn down (the peer sees a reject or a disconnect).
    pub async fn accept(&self) -> Result<(RdmaStream, SocketAddr)> {
        let request = self.listener.next_request().await?;
        let peer_addr = request
            .query_addr()?
            .dst
            .ok_or_else(|| Error::malformed("accept", "no peer address"))?;
        let peer = match wire::ConnData::decode("accept", &request.private_data) {
            Ok(peer) => peer,
            Err(e) => {
                let _ = request.reject(&[]);
                return Err(e);
            }
        };
        let ctx = request.context()?;
        let (mut resources, mut qp) = Resources::new(&ctx, &self.options)?;
        request.init_qp(&mut qp)?;
        resources.post_recvs(&mut qp)?;
        let data = resources.conn_data().encode();
        let param = ConnParam {
            private_data: &data,
            ..ConnParam::default()
        };
        let conn = AsyncConnection::accept(request, qp, &param).await?;
        Ok((RdmaStream::new(Core::new(conn, resources, peer)?), peer_addr))
    }
}

/// A byte stream to an rsocket peer: tokio's `AsyncRead` and `AsyncWrite`.
///
/// Reads end (`Ok(0)`) once the peer shut its side down or disconnected in order, after the
/// data it sent before; a peer that went away without either (a killed process) ends reads
/// and writes with `ConnectionReset`. Dropping the stream (the last of its halves) never
/// blocks: a stream still owed rsocket's disconnect posts it, and a short-lived thread waits
/// up to half a second for it to leave and then tears down the QP, CM id, buffers and fds; a
/// stream with nothing owed is torn down at once. A process that exits right after a
/// drop may cut that thread short (the peer then sees a reset, not the end): shut the stream
/// down (`AsyncWriteExt::shutdown`) and read to its end for an orderly close.
#[derive(Debug)]
pub struct RdmaStream {
    core: Arc<Mutex<Core>>,
}

impl RdmaStream {
    fn new(core: Core) -> Self {
        Self {
            core: Arc::new(Mutex::new(core)),
        }
    }

    /// Connects to an rsocket listener at `addr` with the default options. A connect where
    /// nothing listens is [`Error::Rejected`] (on iWARP, [`Error::Kernel`] with
    /// `ECONNREFUSED`: the TCP connect was refused); a peer this implementation does not speak
    /// is refused with an error naming what.
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        Self::connect_with(addr, StreamOptions::default()).await
    }

    /// [`RdmaStream::connect`] with `options`.
    pub async fn connect_with(addr: SocketAddr, options: StreamOptions) -> Result<Self> {
        options.check("RdmaStream::connect")?;
        let connector = AsyncConnector::resolve(addr, options.resolve_timeout).await?;
        let ctx = connector.context()?;
        let (mut resources, mut qp) = Resources::new(&ctx, &options)?;
        connector.id().init_qp(&mut qp)?;
        resources.post_recvs(&mut qp)?;
        let data = resources.conn_data().encode();
        let param = ConnParam {
            private_data: &data,
            responder_resources: Some(0),
            // rsocket's work-around for iWARP devices that issue an RDMA read while the
            // connection is set up: an initiator depth of 1 in the message-send variant.
            initiator_depth: Some(u8::from(resources.msg_send())),
            ..ConnParam::default()
        };
        let conn = connector.connect(qp, &param).await?;
        // A refused answer drops the connection here: it disconnects.
        let peer = wire::ConnData::decode("connect", conn.peer_private_data())?;
        Ok(Self::new(Core::new(conn, resources, peer)?))
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Result<SocketAddr> {
        lock(&self.core).peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        lock(&self.core).local_addr()
    }

    /// Splits into a read half and a write half, which may live in different tasks. The
    /// connection lives until both are dropped.
    pub fn into_split(self) -> (RdmaReadHalf, RdmaWriteHalf) {
        {
            let mut core = lock(&self.core);
            core.hold();
            core.hold();
        }
        // `self` lets go of its own hold when it drops here.
        (
            RdmaReadHalf {
                core: self.core.clone(),
            },
            RdmaWriteHalf {
                core: self.core.clone(),
            },
        )
    }
}

/// One holder of the stream (the whole stream or a half) let go. The last one posts
/// rsocket's disconnect if the peer is still owed one (without waiting); waiting for it to
/// leave (up to half a second on a slow device, or for a control slot first) happens on a
/// short-lived thread of its own, so that a drop never blocks the runtime. That thread lets go of the stream's last reference once the message
/// left, which tears down the QP, CM id, buffers and fds; a stream that needs no disconnect
/// is torn down here, by the last reference. A thread that cannot start leaves the teardown
/// to the last reference without the message: the peer sees the connection's end.
fn release(core: &Arc<Mutex<Core>>) {
    if !lock(core).release() {
        return;
    }
    let core = Arc::clone(core);
    let _ = std::thread::Builder::new()
        .name("uverbs-stream-close".into())
        .spawn(move || lock(&core).close_best_effort());
}

impl Drop for RdmaStream {
    fn drop(&mut self) {
        release(&self.core);
    }
}

impl Drop for RdmaReadHalf {
    fn drop(&mut self) {
        release(&self.core);
    }
}

impl Drop for RdmaWriteHalf {
    fn drop(&mut self) {
        release(&self.core);
    }
}

fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    // A panic while locked left the state as far as it got; the stream fails on its own.
    core.lock().unwrap_or_else(|e| e.into_inner())
}

/// The read half of an [`RdmaStream`] ([`RdmaStream::into_split`]).
#[derive(Debug)]
pub struct RdmaReadHalf {
    core: Arc<Mutex<Core>>,
}

/// The write half of an [`RdmaStream`] ([`RdmaStream::into_split`]).
#[derive(Debug)]
pub struct RdmaWriteHalf {
    core: Arc<Mutex<Core>>,
}

macro_rules! impl_io {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut TaskContext<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
                let r = lock(&self.core).poll_read(cx, buf);
                if r.is_ready() {
                    coop.made_progress();
                }
                r
            }
        }
    };
    (write $t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut TaskContext<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                let coop = std::task::ready!(tokio::task::coop::poll_proceed(cx));
                let r = lock(&self.core).poll_write(cx, bufs);
                if r.is_ready() {
                    coop.made_progress();
                }
                r
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
                lock(&self.core).poll_flush(cx)
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
                lock(&self.core).poll_shutdown(cx)
            }
        }
    };
}

impl_io!(RdmaStream);
impl_io!(write RdmaStream);
impl_io!(RdmaReadHalf);
impl_io!(write RdmaWriteHalf);
