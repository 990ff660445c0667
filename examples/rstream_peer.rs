//! The Rust side of the rsocket interop runs (`tests/guest/rsocket_interop.sh`): an
//! [`uverbs::stream`] peer for rdma-core's `rstream` and for a TCP program under
//! `librspreload.so`, every byte checked.
//!
//! ```text
//! rstream_peer rstream-server ADDR:PORT [-S size] [-C count] [-I iterations]
//! rstream_peer rstream-client ADDR:PORT [-S size] [-C count] [-I iterations] [-v 0]
//! rstream_peer echo-server ADDR:PORT
//! rstream_peer echo-client ADDR:PORT [-S total] [-B chunk]
//! ```
//!
//! `rstream-*` speak `rstream -T v`'s exchange: 16 bytes from the client and 16 back, then
//! `iterations` rounds of `count` transfers of `size` bytes from the client, and as many back;
//! each direction's bytes are a counter from 0 (mod 256) across the whole run, as rstream's
//! `format_buf` writes and `verify_buf` checks them. `echo-server` echoes one connection to
//! its end (`tokio::io::copy`); `echo-client` sends `total` bytes of the counter in `chunk`s,
//! reading each chunk back before the next, and checks every byte. Each prints one line and
//! exits 0 on success; `rstream-*` also print the exchange's time as rstream does (both
//! directions' bytes, microseconds per transfer one way), for `tests/stream/bench.sh`. `-v 0`
//! neither writes nor checks the counter (as `rstream` without
//! `-T v`): for counting the stream's own instructions (`tests/stream/callgrind.sh`).

use std::net::SocketAddr;
use std::process::ExitCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uverbs::stream::{RdmaListener, RdmaStream};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A byte counter as rstream's `format_buf`/`verify_buf` keep one.
struct Counter {
    next: u8,
    total: u64,
    on: bool,
}

impl Counter {
    fn new(on: bool) -> Self {
        Self { next: 0, total: 0, on }
    }

    fn fill(&mut self, buf: &mut [u8]) {
        self.total += buf.len() as u64;
        if !self.on {
            return;
        }
        for b in buf {
            *b = self.next;
            self.next = self.next.wrapping_add(1);
        }
    }

    fn check(&mut self, buf: &[u8]) -> Res<()> {
        if !self.on {
            self.total += buf.len() as u64;
            return Ok(());
        }
        for &b in buf {
            if b != self.next {
                return Err(format!("byte {} is {b:#04x}, not {:#04x}", self.total, self.next).into());
            }
            self.next = self.next.wrapping_add(1);
            self.total += 1;
        }
        Ok(())
    }
}

struct Args {
    size: usize,
    count: usize,
    iterations: usize,
    chunk: usize,
    verify: bool,
}

fn parse(rest: &[String]) -> Res<Args> {
    let mut a = Args {
        size: 65536,
        count: 1,
        iterations: 10,
        chunk: 65536,
        verify: true,
    };
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let v: usize = it.next().ok_or(format!("{flag} needs a value"))?.parse()?;
        match flag.as_str() {
            "-S" => a.size = v,
            "-C" => a.count = v,
            "-I" => a.iterations = v,
            "-B" => a.chunk = v,
            "-v" => a.verify = v != 0,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    Ok(a)
}

async fn send(s: &mut RdmaStream, c: &mut Counter, buf: &mut [u8], len: usize) -> Res<()> {
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len());
        c.fill(&mut buf[..n]);
        s.write_all(&buf[..n]).await?;
        left -= n;
    }
    Ok(())
}

async fn recv(s: &mut RdmaStream, c: &mut Counter, buf: &mut [u8], len: usize) -> Res<()> {
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len());
        s.read_exact(&mut buf[..n]).await?;
        c.check(&buf[..n])?;
        left -= n;
    }
    Ok(())
}

/// rstream's exchange, as the client (`client`) or the server.
async fn rstream(mut s: RdmaStream, client: bool, a: &Args) -> Res<()> {
    let (mut out, mut inc) = (Counter::new(a.verify), Counter::new(a.verify));
    let mut buf = vec![0u8; a.size.max(16)];
    if client {
        send(&mut s, &mut out, &mut buf, 16).await?;
        recv(&mut s, &mut inc, &mut buf, 16).await?;
    } else {
        recv(&mut s, &mut inc, &mut buf, 16).await?;
        send(&mut s, &mut out, &mut buf, 16).await?;
    }
    let started = std::time::Instant::now();
    for _ in 0..a.iterations {
        for phase in [client, !client] {
            for _ in 0..a.count {
                if phase {
                    send(&mut s, &mut out, &mut buf, a.size).await?;
                } else {
                    recv(&mut s, &mut inc, &mut buf, a.size).await?;
                }
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if client {
        s.shutdown().await?;
    }
    // The peer's end: rstream shuts down and closes when done.
    let n = s.read(&mut buf).await?;
    if n != 0 {
        return Err(format!("{n} bytes after the exchange").into());
    }
    if !client {
        // An orderly close, as rstream's `rshutdown(SHUT_RDWR)` (the disconnect message, sent
        // and completed before the process ends).
        s.shutdown().await?;
    }
    println!(
        "rstream exchange passed: {} bytes sent, {} received and checked",
        out.total, inc.total
    );
    // As rstream's `show_perf` reports the exchange after the 16-byte start: both directions'
    // bytes, and the time of one transfer one way.
    let bytes = 2 * a.iterations * a.count * a.size;
    let xfers = (2 * a.iterations * a.count).max(1);
    println!(
        "exchange: {bytes} bytes in {secs:.3} s, {:.4} Gb/s, {:.2} usec/xfer",
        bytes as f64 * 8.0 / secs / 1e9,
        secs * 1e6 / xfers as f64
    );
    Ok(())
}

async fn echo_client(mut s: RdmaStream, a: &Args) -> Res<()> {
    let (mut out, mut inc) = (Counter::new(true), Counter::new(true));
    let mut buf = vec![0u8; a.chunk];
    let mut left = a.size;
    while left > 0 {
        let n = left.min(a.chunk);
        send(&mut s, &mut out, &mut buf, n).await?;
        recv(&mut s, &mut inc, &mut buf, n).await?;
        left -= n;
    }
    s.shutdown().await?;
    let n = s.read(&mut buf).await?;
    if n != 0 {
        return Err(format!("{n} bytes after the echo").into());
    }
    println!(
        "echo passed: {} bytes sent, {} echoed and checked",
        out.total, inc.total
    );
    Ok(())
}

async fn run(args: &[String]) -> Res<()> {
    let [mode, addr, rest @ ..] = args else {
        return Err("usage: rstream_peer MODE ADDR:PORT [options] (see the source)".into());
    };
    let addr: SocketAddr = addr.parse()?;
    let a = parse(rest)?;
    match mode.as_str() {
        "rstream-server" | "echo-server" => {
            let listener = RdmaListener::bind(addr)?;
            println!("listening on {addr}");
            let (s, peer) = listener.accept().await?;
            println!("accepted {peer}");
            if mode == "echo-server" {
                let (mut rd, mut wr) = s.into_split();
                let n = tokio::io::copy(&mut rd, &mut wr).await?;
                wr.shutdown().await?;
                println!("echoed {n} bytes");
                Ok(())
            } else {
                rstream(s, false, &a).await
            }
        }
        "rstream-client" => rstream(RdmaStream::connect(addr).await?, true, &a).await,
        "echo-client" => echo_client(RdmaStream::connect(addr).await?, &a).await,
        other => Err(format!("unknown mode {other}").into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rstream_peer: {e}");
            ExitCode::FAILURE
        }
    }
}
