//! Async I/O on tokio (feature `tokio`): completions awaited through the CQ's completion
//! channel ([`AsyncCq`]), async events as a [`Stream`](futures_core::Stream)
//! ([`AsyncEvents`]), and the connection manager's connect, accept and disconnect as futures
//! ([`AsyncConnector`], [`AsyncListener`], [`AsyncConnection`]); all on tokio's reactor,
//! woken only when their fd is readable. (Not named `tokio`, so that `use uverbs::*` leaves
//! the `tokio` crate's name alone.)
//!
//! ```no_run
//! # async fn f(ctx: uverbs::Context) -> uverbs::Result<()> {
//! let mut cq = ctx.create_async_cq(256)?; // on a completion channel of its own
//! let mut wc = [uverbs::WorkCompletion::default(); 16];
//! let n = cq.poll(&mut wc).await?; // at least one
//! # let _ = n;
//! # Ok(())
//! # }
//! ```
//!
//! A client and a server on one current-thread runtime (rxe on a netdev with
//! 169.254.77.1; the CM refuses loopback addresses):
//!
//! ```no_run
//! use std::time::Duration;
//! use uverbs::aio::{AsyncConnection, AsyncConnector, AsyncListener};
//! use uverbs::cm::ConnParam;
//! use uverbs::{QpInit, QpType};
//!
//! async fn server(listener: AsyncListener) -> uverbs::Result<()> {
//!     let request = listener.next_request().await?; // request.private_data: the client's
//!     let ctx = request.context()?;
//!     let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16)?);
//!     let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
//!     let mut conn = AsyncConnection::accept(request, qp, &ConnParam::default()).await?;
//!     conn.wait_disconnected().await // the client's disconnect, answered
//! }
//!
//! async fn client(addr: std::net::SocketAddr) -> uverbs::Result<()> {
//!     let connector = AsyncConnector::resolve(addr, Duration::from_secs(2)).await?;
//!     let ctx = connector.context()?;
//!     let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16)?);
//!     let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq))?;
//!     let param = ConnParam { private_data: b"hello", ..Default::default() };
//!     let mut conn = connector.connect(qp, &param).await?; // conn.qp_mut() is in RTS
//!     conn.disconnect().await
//! }
//!
//! fn main() -> uverbs::Result<()> {
//!     let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
//!     rt.block_on(async {
//!         let addr = "169.254.77.1:7471".parse().unwrap();
//!         let listener = AsyncListener::bind(addr)?;
//!         let server = tokio::spawn(server(listener));
//!         client(addr).await?;
//!         server.await.expect("the server task")
//!     })
//! }
//! ```
//!
//! Cancellation: [`AsyncCq::poll`], [`AsyncListener::next_request`],
//! [`AsyncConnection::disconnect`] and [`AsyncConnection::wait_disconnected`] are cancellation
//! safe (dropped, they lose no completion, request or event; the next call carries on).
//! [`AsyncConnector::resolve`], [`AsyncConnector::connect`] and [`AsyncConnection::accept`]
//! own the id (and the QP) they bring up: dropped, they destroy them, so no cm_id is left
//! half-connected and the peer sees a reject. Each method's documentation says exactly what
//! is left. `connect` and `accept` end by themselves at [`CONNECT_TIMEOUT`] (a connect's is
//! set with [`AsyncConnector::with_connect_timeout`]); a failed connect hands its QP back
//! ([`crate::cm::ConnectFailed`]).

mod cm;
mod cq;
mod events;

pub use cm::{AsyncConnection, AsyncConnector, AsyncListener, CONNECT_TIMEOUT};
pub use cq::{AsyncCq, WaitStats};
pub use events::AsyncEvents;

use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, BorrowedFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Puts `fd` in non-blocking mode, as a reactor needs.
fn set_nonblocking(fd: BorrowedFd<'_>, verb: &'static str) -> Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let raw = fd.as_raw_fd();
    let flags = fcntl(raw, FcntlArg::F_GETFL).map_err(|e| Error::kernel(verb, e))?;
    let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
    fcntl(raw, FcntlArg::F_SETFL(flags)).map_err(|e| Error::kernel(verb, e))?;
    Ok(())
}

fn reactor_error(verb: &'static str, e: std::io::Error) -> Error {
    Error::io(format!("{verb}: tokio reactor"), e)
}

/// Registers `inner`'s fd for readability with the current runtime's reactor.
///
/// # Safety
/// `inner.as_raw_fd()` must return the same open fd for as long as `inner` lives.
unsafe fn register<T: AsRawFd>(inner: T, verb: &'static str) -> Result<AsyncFd<T>> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::invalid(verb, "called outside a tokio runtime"));
    }
    // SAFETY: forwarded caller contract.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(|e| reactor_error(verb, e.into()))
}
