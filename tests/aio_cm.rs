//! The connection manager on tokio (`uverbs::aio::{AsyncConnector, AsyncListener,
//! AsyncConnection}`) against the kernel's rdma_ucm and rxe, on a current-thread runtime:
//! client and server tasks in one thread, so nothing may block. Both ends in this process on
//! `UVERBS_CM_ADDR` (the test guest's `rxe_cm` on a dummy netdev, 169.254.77.1). Every test
//! ends by checking that no cm_id of this process is left (`rdma resource show cm_id`).

mod common;

use common::cm::*;
use common::wire::{sh, Wire};
use common::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use uverbs::aio::{AsyncConnection, AsyncConnector, AsyncCq, AsyncListener};
use uverbs::cm::ConnParam;
use uverbs::*;

const T: Duration = Duration::from_secs(20);

/// A future that counts how often it was polled: on a current-thread runtime each poll of a
/// spawned task after the first is a wake-up.
struct Counted<F> {
    polls: Arc<AtomicU64>,
    inner: Pin<Box<F>>,
}

impl<F: Future> Counted<F> {
    fn new(polls: &Arc<AtomicU64>, inner: F) -> Self {
        Self {
            polls: polls.clone(),
            inner: Box::pin(inner),
        }
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

/// Polls `fut` exactly once.
async fn poll_once<F: Future>(fut: &mut Pin<Box<F>>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
}

/// One end's verbs objects on the device the CM chose, its completions awaited.
struct AsyncSide {
    _pd: Pd,
    cq: AsyncCq,
    mr: Mr,
}

impl AsyncSide {
    /// The side and an RC QP on it.
    fn new(ctx: &Context) -> (Self, Qp) {
        let pd = ctx.alloc_pd().unwrap();
        let channel = ctx.create_comp_channel().unwrap();
        let mut init = CqInit::new(16);
        init.channel = Some(&channel);
        let cq = ctx.create_cq_with(&init).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
        let mr = pd.alloc_mr(4096, LocalAccess::LOCAL_WRITE).unwrap();
        let cq = AsyncCq::new(cq, &channel).unwrap();
        (Self { _pd: pd, cq, mr }, qp)
    }

    fn post_recv(&mut self, qp: &mut Qp, wr_id: u64) {
        let sge = [self.mr.sge(0, 1024).unwrap()];
        // SAFETY: `mr` outlives the request (the test awaits its completion or flush).
        unsafe { qp.post_recv(&[RecvWr::new(wr_id, &sge)]).unwrap() };
    }

    fn post_send(&mut self, qp: &mut Qp, wr_id: u64, data: &[u8]) {
        self.mr.as_mut_slice()[..data.len()].copy_from_slice(data);
        let sge = [self.mr.sge(0, data.len() as u32).unwrap()];
        // SAFETY: `mr` outlives the request and is not touched until its completion.
        unsafe { qp.post_send(&[SendWr::new(wr_id, SendOp::Send, &sge)]).unwrap() };
    }

    /// Awaits one completion.
    async fn one(&mut self) -> WorkCompletion {
        let mut wc = [WorkCompletion::default()];
        let n = tokio::time::timeout(T, self.cq.poll(&mut wc))
            .await
            .expect("a completion within the timeout")
            .unwrap();
        assert_eq!(n, 1);
        wc[0]
    }
}

/// Resolves `addr` and connects a fresh QP with default parameters.
async fn connect(addr: std::net::SocketAddr) -> Result<AsyncConnection> {
    let connector = AsyncConnector::resolve(addr, T).await?;
    let (_side, qp) = AsyncSide::new(&connector.context()?);
    Ok(connector.connect(qp, &ConnParam::default()).await?)
}

/// Takes the next request and accepts it with a fresh QP and default parameters.
async fn accept(listener: &AsyncListener) -> AsyncConnection {
    let request = listener.next_request().await.unwrap();
    let (_side, qp) = AsyncSide::new(&request.context().unwrap());
    AsyncConnection::accept(request, qp, &ConnParam::default())
        .await
        .unwrap()
}

/// A client task and a server task connect with private data, move a message, and the
/// client disconnects; every object is woken only by its fd: each task is polled at most
/// once per kernel event it waits for (CM events on its channels, completion events on
/// its CQ's channel), plus its first poll.
#[test]
fn client_and_server_tasks_connect_move_a_message_and_disconnect() {
    let addr = cm_addr(7531);
    let before = kernel_footprint();
    let (req_data, rep_data) = (pattern(56, 3), pattern(196, 4));
    let message = b"hello over tokio and rdma_cm";
    let (server_polls, client_polls) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (server_events, client_events) = runtime().block_on(async {
        let listener = AsyncListener::bind(addr).unwrap();
        assert_eq!(listener.local_addr().unwrap(), addr);
        let req_sent = req_data.clone();
        let server = tokio::spawn(Counted::new(&server_polls, async move {
            let request = listener.next_request().await.unwrap();
            assert_eq!(&request.private_data[..], &req_data[..]);
            let (mut side, mut qp) = AsyncSide::new(&request.context().unwrap());
            // The receive is there before the client's first message can be.
            request.init_qp(&mut qp).unwrap();
            side.post_recv(&mut qp, 1);
            let param = ConnParam {
                private_data: &rep_data,
                ..Default::default()
            };
            let mut conn = AsyncConnection::accept(request, qp, &param).await.unwrap();
            assert_eq!(conn.peer_private_data(), &req_data[..]);
            assert_eq!(conn.qp().state(), QpState::Rts);
            let wc = side.one().await;
            wc.result().unwrap();
            assert_eq!(wc.wr_id, 1);
            assert_eq!(&side.mr.as_slice()[..wc.byte_len as usize], message);
            conn.wait_disconnected().await.unwrap();
            assert_eq!(conn.qp().state(), QpState::Err);
            // Done is done: a second wait returns at once.
            conn.wait_disconnected().await.unwrap();
            // The listener's CONNECT_REQUEST, ESTABLISHED and DISCONNECTED.
            3 + side.cq.stats().events
        }));
        let client = tokio::spawn(Counted::new(&client_polls, async move {
            let connector = AsyncConnector::resolve(addr, T).await.unwrap();
            let (mut side, qp) = AsyncSide::new(&connector.context().unwrap());
            let param = ConnParam {
                private_data: &req_sent,
                ..Default::default()
            };
            let mut conn = connector.connect(qp, &param).await.unwrap();
            assert_eq!(conn.peer_private_data(), &pattern(196, 4)[..]);
            assert_eq!(conn.qp().state(), QpState::Rts);
            side.post_send(conn.qp_mut(), 7, message);
            let wc = side.one().await;
            wc.result().unwrap();
            assert_eq!(wc.wr_id, 7);
            conn.disconnect().await.unwrap();
            assert_eq!(conn.qp().state(), QpState::Err);
            conn.disconnect().await.unwrap();
            // ADDR_RESOLVED, ROUTE_RESOLVED, CONNECT_RESPONSE and DISCONNECTED.
            4 + side.cq.stats().events
        }));
        (server.await.unwrap(), client.await.unwrap())
    });
    let (server_polls, client_polls) = (
        server_polls.load(Ordering::Relaxed),
        client_polls.load(Ordering::Relaxed),
    );
    println!("server: {server_polls} polls for {server_events} events; client: {client_polls} polls for {client_events} events");
    assert!(server_polls <= 1 + server_events, "server: {server_polls} polls");
    assert!(client_polls <= 1 + client_events, "client: {client_polls} polls");
    assert_no_cm_ids();
    assert_eq!(kernel_footprint().0, before.0, "an fd was left open");
}

#[test]
fn connecting_where_nothing_listens_is_a_typed_reject() {
    runtime().block_on(async {
        match connect(cm_addr(7532)).await {
            Err(Error::Rejected { status, .. }) => assert_eq!(status, 8, "IB_CM_REJ_INVALID_SERVICE_ID"),
            other => panic!("expected a reject, got {other:?}"),
        }
    });
    assert_no_cm_ids();
}

#[test]
fn outside_a_runtime_is_an_error_that_leaves_no_id() {
    let err = AsyncListener::bind(cm_addr(7536)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { verb: "bind", .. }), "{err}");
    assert!(err.to_string().contains("outside a tokio runtime"), "{err}");
    assert_no_cm_ids();
}

/// Each future dropped where it waits, then the same call again to the end: a resolve of an
/// address nobody answers (ARP across the veth pair of `common::wire`); a connect whose
/// request the listener took (accepting it then fails); `next_request` with nothing queued
/// (`tokio::time::timeout`); an accept waiting for `ESTABLISHED` (the client sees a reject,
/// or a connection it then drops); a disconnect waiting for `DISCONNECTED` (the next
/// `disconnect` waits for the same event). After each no cm_id of the client side is left;
/// run twice, the second round leaves `/proc/self/fd` and `/proc/self/maps` (all lines, and
/// those of `/dev/infiniband`) exactly as it found them.
#[test]
fn dropped_futures_leave_no_id_or_fd_and_the_next_call_succeeds() {
    let (withdrawn, served) = (cm_addr(7533), cm_addr(7534));
    let clients = |dst: std::net::SocketAddr| {
        my_cm_ids()
            .into_iter()
            .filter(|l| l.contains(&format!("dst-addr {dst} ")) && !l.contains(&format!("src-addr {dst} ")))
            .count()
    };
    let wire = Wire::up();
    let nobody: std::net::SocketAddr = "169.254.31.9:7535".parse().unwrap();
    assert!(sh("ip route replace 169.254.31.0/24 dev uvwa src 169.254.30.1"));
    let rt = runtime();
    let round = || {
        rt.block_on(async {
            // A resolve dropped while the kernel resolves an address nobody answers (ARP
            // out of the veth wire), then one to the end.
            let mut resolving = Box::pin(AsyncConnector::resolve(nobody, T));
            assert!(poll_once(&mut resolving).await.is_pending());
            drop(resolving);
            assert_no_cm_ids();
            let connector = AsyncConnector::resolve(withdrawn, T).await.unwrap();

            // A connect dropped once the listener took its request: the request is
            // withdrawn, and accepting it fails (the client's reject came first: the kernel
            // refuses the accept; or the REP found no id: `REJECTED`).
            let listener = AsyncListener::bind(withdrawn).unwrap();
            let (_side, qp) = AsyncSide::new(&connector.context().unwrap());
            let mut connecting = Box::pin(connector.connect(qp, &ConnParam::default()));
            assert!(poll_once(&mut connecting).await.is_pending());
            let request = listener.next_request().await.unwrap();
            drop(connecting);
            assert_eq!(clients(withdrawn), 0, "{}", cm_id_table());
            let (_side, qp) = AsyncSide::new(&request.context().unwrap());
            let accepting = AsyncConnection::accept(request, qp, &ConnParam::default());
            match tokio::time::timeout(T, accepting).await {
                Ok(Err(e @ (Error::Rejected { .. } | Error::RequestWithdrawn { .. }))) => {
                    println!("accepting a withdrawn request: {e}")
                }
                other => panic!("accepting a withdrawn request: {other:?}"),
            }
            drop(listener);
            assert_no_cm_ids();

            // `next_request` dropped with nothing queued; the listener serves on.
            let listener = AsyncListener::bind(served).unwrap();
            let idle = tokio::time::timeout(Duration::from_millis(50), listener.next_request()).await;
            assert!(idle.is_err(), "a request nobody sent: {idle:?}");

            // An accept dropped while it waits for ESTABLISHED.
            let client = tokio::spawn(async move {
                match connect(served).await {
                    Ok(conn) => drop(conn),
                    // The server's reject after its REP, or the kernel refusing the QP moves
                    // when the reject lands between the REP's event and `establish`.
                    Err(e @ (Error::Rejected { .. } | Error::Kernel { .. })) => {
                        println!("an accept dropped in flight: the client saw {e}")
                    }
                    Err(e) => panic!("an accept dropped in flight: {e}"),
                }
            });
            let request = listener.next_request().await.unwrap();
            let (_side, qp) = AsyncSide::new(&request.context().unwrap());
            let mut accepting = Box::pin(AsyncConnection::accept(request, qp, &ConnParam::default()));
            assert!(poll_once(&mut accepting).await.is_pending());
            drop(accepting);
            client.await.unwrap();
            assert_eq!(clients(served), 0, "{}", cm_id_table());

            // A connection on the same listener, and a disconnect dropped while it waits.
            let client = tokio::spawn(async move {
                let mut conn = connect(served).await.unwrap();
                let mut disconnecting = Box::pin(conn.disconnect());
                assert!(poll_once(&mut disconnecting).await.is_pending());
                drop(disconnecting);
                assert_eq!(conn.qp().state(), QpState::Err, "the disconnect went out");
                conn.disconnect().await.unwrap();
            });
            let mut server = accept(&listener).await;
            server.wait_disconnected().await.unwrap();
            client.await.unwrap();
            drop((server, listener));
            assert_no_cm_ids();
        })
    };
    // The first round warms up what a process sets up once; the second must leave exactly
    // what it found.
    round();
    let (before, before_dev) = (process_footprint(), kernel_footprint());
    round();
    let (after, after_dev) = (process_footprint(), kernel_footprint());
    sh("ip route del 169.254.31.0/24 dev uvwa");
    drop(wire);
    println!("fds and mappings: {before:?} -> {after:?}; of /dev/infiniband: {before_dev:?} -> {after_dev:?}");
    assert_eq!(after_dev, before_dev, "a device fd or mapping leaked");
    assert_eq!(after, before, "an fd or a mapping leaked");
}

/// A connect the listener never answers ends at the connector's timeout, on a runtime
/// without tokio's timer, with the QP back in INIT; the server's accept of that withdrawn
/// request is a typed error, and the same QP then connects to the next accept.
#[test]
fn an_unanswered_connect_times_out_and_its_qp_connects_again() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let addr = cm_addr(7544);
    rt.block_on(async {
        let listener = AsyncListener::bind(addr).unwrap();
        let connector = AsyncConnector::resolve(addr, T).await.unwrap();
        let (mut side, qp) = AsyncSide::new(&connector.context().unwrap());
        let start = std::time::Instant::now();
        let failed = connector
            .with_connect_timeout(Duration::from_secs(1))
            .connect(qp, &ConnParam::default())
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(failed.error, Error::TimedOut { verb: "connect", .. }),
            "{failed}"
        );
        assert!(took < Duration::from_secs(10), "{took:?}");
        assert_eq!(failed.qp.state(), QpState::Init);
        let mut qp = failed.qp;
        side.post_recv(&mut qp, 5);

        let stale = listener.next_request().await.unwrap();
        let (_server_side, server_qp) = AsyncSide::new(&stale.context().unwrap());
        match AsyncConnection::accept(stale, server_qp, &ConnParam::default()).await {
            Err(Error::RequestWithdrawn { verb: "accept" }) => {}
            other => panic!("accepting a withdrawn request: {other:?}"),
        }
        let connector = AsyncConnector::resolve(addr, T).await.unwrap();
        let connecting = connector.connect(qp, &ConnParam::default());
        let request = listener.next_request().await.unwrap();
        let (mut server_side, server_qp) = AsyncSide::new(&request.context().unwrap());
        let accepting = AsyncConnection::accept(request, server_qp, &ConnParam::default());
        let (client, server) = futures_join(connecting, accepting).await;
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        server_side.post_send(server.qp_mut(), 6, b"again");
        // No `one()`: its timeout needs tokio's timer, which this runtime lacks.
        let mut wcs = [WorkCompletion::default()];
        assert_eq!(side.cq.poll(&mut wcs).await.unwrap(), 1);
        let wc = wcs[0];
        assert_eq!((wc.wr_id, wc.status, wc.byte_len), (5, WcStatus::SUCCESS, 5));
        client.disconnect().await.unwrap();
        server.wait_disconnected().await.unwrap();
    });
    drop(rt);
    assert_no_cm_ids();
}

/// Both futures to completion, polled in turn (tokio's `join!` needs its macros).
async fn futures_join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (Box::pin(a), Box::pin(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    (ra.unwrap(), rb.unwrap())
}
