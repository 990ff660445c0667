//! `uverbs::stream` (rsocket-compatible byte streams) against the kernel's rdma_ucm and rxe:
//! a `tokio::io::copy` echo over concurrent connections with every byte checked, shutdown
//! from either side, a connect where nothing listens and a peer killed mid-transfer. Both
//! ends in this process (the killed peer in a child process of it) on `UVERBS_CM_ADDR` (the
//! test guest's `rxe_cm` on a dummy netdev; `cargo xtask test` runs it again on siw0, where the
//! stream speaks rsocket's message-send variant). Every test ends by checking that no cm_id, no
//! device fd and no device mapping of this process is left.
//!
//! `UVERBS_STREAM_CONNS` and `UVERBS_STREAM_MIB` size the echo (connections, MiB each way per
//! connection). The defaults (10 x 2 MiB) fit the debug build's pace in the TCG guest (about
//! 0.75 MiB/s each way over all connections); `cargo xtask test` also runs the echo at 10 x
//! 100 MiB from a release build of this file (xtask/src/testrun.rs, docs/test-guest.md).

mod common;

use common::cm::*;
use common::*;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uverbs::stream::{RdmaListener, RdmaStream, StreamOptions};
use uverbs::Error;

const T: Duration = Duration::from_secs(120);

/// The byte at `pos` of stream `seed`: differs per stream and per position.
fn byte_at(seed: u64, pos: u64) -> u8 {
    let x = (pos ^ (seed << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (pos as u8)
}

fn fill(seed: u64, pos: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        *b = byte_at(seed, pos + i as u64);
    }
}

/// Checks `got` is the stream's bytes from `pos`.
fn check(seed: u64, pos: u64, got: &[u8]) {
    for (i, &b) in got.iter().enumerate() {
        let want = byte_at(seed, pos + i as u64);
        assert_eq!(
            b,
            want,
            "stream {seed}: byte {} is {b:#04x}, not {want:#04x}",
            pos + i as u64
        );
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Writes `len` bytes of stream `seed` in writes of up to `piece`, then shuts down.
async fn send_stream<W: AsyncWriteExt + Unpin>(w: &mut W, seed: u64, len: u64, piece: usize) -> std::io::Result<()> {
    let mut buf = vec![0u8; piece];
    let mut pos = 0;
    while pos < len {
        let n = (len - pos).min(piece as u64) as usize;
        fill(seed, pos, &mut buf[..n]);
        w.write_all(&buf[..n]).await?;
        pos += n as u64;
    }
    w.shutdown().await
}

/// Reads stream `seed` to its end, checking every byte; returns how many came.
async fn recv_stream<R: AsyncReadExt + Unpin>(r: &mut R, seed: u64) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 256 << 10];
    let mut pos = 0;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(pos);
        }
        check(seed, pos, &buf[..n]);
        pos += n as u64;
    }
}

/// Checks that nothing of the streams is left: no cm_id, device fd or mapping. A dropped
/// stream still owed a disconnect is torn down by a thread of its own within about half a
/// second (`RdmaStream`'s drop), so the check waits up to 10 s for that to finish.
fn leak_check(before: (usize, usize)) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (!my_cm_ids().is_empty() || kernel_footprint() != before) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_no_cm_ids();
    assert_eq!(kernel_footprint(), before, "a device fd or mapping was left");
}

/// Acceptance 1: `tokio::io::copy` echo servers, `UVERBS_STREAM_CONNS` connections at once,
/// each sending `UVERBS_STREAM_MIB` MiB and reading them back, every byte checked.
#[test]
fn copy_echo_over_concurrent_connections_checks_every_byte() {
    let conns = env_or("UVERBS_STREAM_CONNS", 10);
    let mib = env_or("UVERBS_STREAM_MIB", 2);
    let len = mib << 20;
    let addr = cm_addr(7601);
    let before = kernel_footprint();
    let start = Instant::now();
    runtime().block_on(async {
        let listener = RdmaListener::bind(addr).unwrap();
        let server = tokio::spawn(async move {
            let mut echoes = Vec::new();
            for _ in 0..conns {
                let (stream, peer) = listener.accept().await.unwrap();
                assert_eq!(peer.ip(), addr.ip());
                echoes.push(tokio::spawn(async move {
                    let (mut rd, mut wr) = stream.into_split();
                    let n = tokio::io::copy(&mut rd, &mut wr).await.unwrap();
                    wr.shutdown().await.unwrap();
                    n
                }));
            }
            let mut total = 0;
            for e in echoes {
                total += e.await.unwrap();
            }
            total
        });
        let mut clients = Vec::new();
        for seed in 0..conns {
            clients.push(tokio::spawn(async move {
                let stream = RdmaStream::connect(addr).await.unwrap();
                assert_eq!(stream.peer_addr().unwrap(), addr);
                let (mut rd, mut wr) = stream.into_split();
                let writer = tokio::spawn(async move { send_stream(&mut wr, seed, len, 100_000).await.unwrap() });
                let got = recv_stream(&mut rd, seed).await.unwrap();
                writer.await.unwrap();
                assert_eq!(got, len, "stream {seed} came back short");
            }));
        }
        // TCG moves under 1 MiB/s in all (docs/test-guest.md): 5 s per MiB, plus set-up.
        let limit = T + Duration::from_secs(5 * conns * mib);
        for c in clients {
            tokio::time::timeout(limit, c).await.expect("the echo in time").unwrap();
        }
        assert_eq!(server.await.unwrap(), conns * len);
    });
    let secs = start.elapsed().as_secs_f64();
    println!(
        "echo: {conns} connections x {mib} MiB each way, every byte checked, in {secs:.1} s ({:.1} MiB/s each way in all)",
        (conns * mib) as f64 / secs
    );
    leak_check(before);
}

/// Small and odd-sized writes (inline, buffer-sized, vectored) arrive in order.
#[test]
fn mixed_write_sizes_and_vectored_writes_arrive_in_order() {
    let addr = cm_addr(7602);
    let before = kernel_footprint();
    runtime().block_on(async {
        let listener = RdmaListener::bind(addr).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            recv_stream(&mut s, 9).await.unwrap()
        });
        let mut s = RdmaStream::connect(addr).await.unwrap();
        let mut pos = 0u64;
        for size in [1usize, 7, 16, 63, 64, 65, 1000, 4096, 65535, 65536, 65537, 300_000, 3] {
            let mut v = vec![0; size];
            fill(9, pos, &mut v);
            s.write_all(&v).await.unwrap();
            pos += size as u64;
        }
        // Vectored: three slices in one call.
        let mut a = vec![0; 10];
        let mut b = vec![0; 70_000];
        let mut c = vec![0; 5];
        fill(9, pos, &mut a);
        fill(9, pos + 10, &mut b);
        fill(9, pos + 70_010, &mut c);
        let slices = [
            std::io::IoSlice::new(&a),
            std::io::IoSlice::new(&b),
            std::io::IoSlice::new(&c),
        ];
        let mut done = 0;
        while done < 70_015 {
            // Re-slice what is left.
            let mut rest: Vec<std::io::IoSlice<'_>> = Vec::new();
            let mut skip = done;
            for sl in &slices {
                if skip >= sl.len() {
                    skip -= sl.len();
                    continue;
                }
                rest.push(std::io::IoSlice::new(&sl[skip..]));
                skip = 0;
            }
            done += s.write_vectored(&rest).await.unwrap();
        }
        pos += 70_015;
        s.flush().await.unwrap();
        s.shutdown().await.unwrap();
        assert_eq!(tokio::time::timeout(T, server).await.unwrap().unwrap(), pos);
        // The server dropped its end: this side reads the end of the stream.
        let mut rest = Vec::new();
        assert_eq!(s.read_to_end(&mut rest).await.unwrap(), 0);
    });
    leak_check(before);
}

/// The server shuts its side down first: the client reads the end of the stream and can
/// still write; the server reads what the client wrote, then the client's shutdown.
#[test]
fn shutdown_from_the_server_side() {
    let addr = cm_addr(7603);
    let before = kernel_footprint();
    runtime().block_on(async {
        let listener = RdmaListener::bind(addr).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            send_stream(&mut s, 3, 1 << 20, 32 << 10).await.unwrap();
            // Writes after a shutdown are refused.
            let err = s.write_all(b"late").await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BrokenPipe, "{err}");
            recv_stream(&mut s, 4).await.unwrap()
        });
        let mut s = RdmaStream::connect(addr).await.unwrap();
        assert_eq!(recv_stream(&mut s, 3).await.unwrap(), 1 << 20);
        // Again: still the end.
        assert_eq!(s.read(&mut [0u8; 16]).await.unwrap(), 0);
        send_stream(&mut s, 4, 300_000, 8192).await.unwrap();
        assert_eq!(tokio::time::timeout(T, server).await.unwrap().unwrap(), 300_000);
    });
    leak_check(before);
}

/// The client shuts down and drops its stream without reading: the server reads the data,
/// then the end; its writes then fail with a typed error, not a hang.
#[test]
fn client_shutdown_and_drop_end_the_server_side() {
    let addr = cm_addr(7604);
    let before = kernel_footprint();
    runtime().block_on(async {
        let listener = RdmaListener::bind(addr).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let n = recv_stream(&mut s, 5).await.unwrap();
            // The peer is gone: writing fails, soon (after the disconnect arrives).
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match s.write_all(&[0u8; 4096]).await {
                    Err(e) => {
                        assert!(
                            matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
                            "{e}"
                        );
                        break;
                    }
                    Ok(()) => {
                        assert!(Instant::now() < deadline, "writes to a gone peer kept succeeding");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            n
        });
        let mut s = RdmaStream::connect(addr).await.unwrap();
        send_stream(&mut s, 5, 500_000, 50_000).await.unwrap();
        drop(s);
        assert_eq!(tokio::time::timeout(T, server).await.unwrap().unwrap(), 500_000);
    });
    leak_check(before);
}

/// On IB and RoCE the peer's CM rejects (reason 8); on iWARP (siw) the TCP connect is
/// refused, which the kernel returns as `ECONNREFUSED`.
#[test]
fn connect_where_nothing_listens_is_a_typed_reject() {
    let iwarp = common::link::is_iwarp(&open_test_device());
    let before = kernel_footprint();
    runtime().block_on(async {
        match RdmaStream::connect(cm_addr(7605)).await {
            Err(Error::Rejected { status, .. }) if !iwarp => assert_eq!(status, 8, "IB_CM_REJ_INVALID_SERVICE_ID"),
            Err(e) if iwarp && e.errno() == Some(nix::errno::Errno::ECONNREFUSED) => {}
            other => panic!("expected a reject, got {other:?}"),
        }
    });
    leak_check(before);
}

#[test]
fn options_out_of_range_are_refused() {
    let mut o = StreamOptions::default();
    o.recv_buffer = 1000;
    let err = runtime()
        .block_on(RdmaStream::connect_with(cm_addr(7606), o))
        .unwrap_err();
    assert!(err.to_string().contains("recv_buffer"), "{err}");
}

/// The body of the killed peer: run as a child process of this test binary (with
/// `UVERBS_STREAM_CHILD` naming the address), it connects and sends until killed.
#[test]
fn child_sender() {
    let Ok(addr) = std::env::var("UVERBS_STREAM_CHILD") else {
        return; // only as the child of `a_peer_killed_mid_transfer_*`
    };
    let addr: SocketAddr = addr.parse().unwrap();
    runtime().block_on(async {
        let mut s = RdmaStream::connect(addr).await.unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let mut pos = 0;
        loop {
            fill(11, pos, &mut buf);
            s.write_all(&buf).await.unwrap();
            pos += buf.len() as u64;
        }
    });
}

/// Listens on `addr`, starts this test binary's `child_sender` as a child process sending to
/// it, and accepts the child's stream. The listener is returned to be kept as long as the stream.
async fn accept_child_sender(addr: SocketAddr) -> (RdmaListener, std::process::Child, RdmaStream) {
    let listener = RdmaListener::bind(addr).unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_sender", "--nocapture", "--test-threads=1"])
        .env("UVERBS_STREAM_CHILD", addr.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (s, _) = tokio::time::timeout(T, listener.accept()).await.unwrap().unwrap();
    (listener, child, s)
}

/// A peer process killed while it sends: the reader gets the bytes that came (each checked),
/// then `ConnectionReset` or the end of the stream, within seconds; nothing is left behind.
#[test]
fn a_peer_killed_mid_transfer_is_a_reset_or_end() {
    let addr = cm_addr(7607);
    let before = kernel_footprint();
    runtime().block_on(async {
        let (_listener, mut child, mut s) = accept_child_sender(addr).await;
        let mut buf = vec![0u8; 64 << 10];
        let mut pos = 0u64;
        let mut killed = false;
        let end = loop {
            let r = tokio::time::timeout(T, s.read(&mut buf))
                .await
                .expect("a reset or the end in time");
            match r {
                Ok(0) => break "end",
                Ok(n) => {
                    check(11, pos, &buf[..n]);
                    pos += n as u64;
                    if !killed && pos >= 1 << 20 {
                        child.kill().unwrap();
                        killed = true;
                    }
                }
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
                    break "reset";
                }
            }
        };
        let _ = child.kill();
        child.wait().unwrap();
        assert!(killed, "the stream ended before the child was killed");
        println!("killed peer: {pos} bytes checked, then {end}");
        // Writing to it fails too.
        assert!(s.write_all(&[1u8; 100]).await.is_err());
    });
    leak_check(before);
}

/// A drop never blocks the runtime: dropping a stream whose peer process was just killed
/// (its QP is gone, which this side has not seen yet, so rsocket's disconnect is still owed
/// and would wait out the device's retries) returns at once; the teardown finishes in the
/// background and leaves no cm_id, fd or mapping.
#[test]
fn a_drop_returns_at_once_and_the_teardown_leaves_nothing() {
    let addr = cm_addr(7608);
    let before = kernel_footprint();
    runtime().block_on(async {
        let (_listener, mut child, mut s) = accept_child_sender(addr).await;
        let mut buf = vec![0u8; 64 << 10];
        let mut pos = 0u64;
        while pos < 256 << 10 {
            let n = tokio::time::timeout(T, s.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0, "the child's stream ended early");
            check(11, pos, &buf[..n]);
            pos += n as u64;
        }
        // Reaped: the child's QP and id are destroyed.
        child.kill().unwrap();
        child.wait().unwrap();
        let started = Instant::now();
        drop(s);
        let took = started.elapsed();
        // A blocking teardown waits up to 500 ms here (rxe's first retry comes later).
        assert!(took < Duration::from_millis(300), "dropping the stream took {took:?}");
        println!("drop with a disconnect owed returned in {took:?}");
    });
    leak_check(before);
}
