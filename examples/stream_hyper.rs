//! hyper, unmodified, over [`uverbs::stream`]: an HTTP/1.1 server and client in one process,
//! on one RDMA stream (rsocket protocol) through hyper-util's `TokioIo` adapter. The client
//! sends `N` POST requests with bodies of different sizes; the server answers each with the
//! body reversed and its length in a header; the client checks every byte.
//!
//! ```text
//! stream_hyper ADDR:PORT [N]
//! ```
//!
//! `tests/guest/rsocket_interop.sh` runs it in the test guest on `$UVERBS_CM_ADDR`.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::process::ExitCode;
use uverbs::stream::{RdmaListener, RdmaStream};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Request `i`'s body.
fn body(i: usize) -> Vec<u8> {
    let len = [0, 1, 100, 4096, 65536, 200_000][i % 6] + i;
    (0..len).map(|k| (k * 31 + i * 7) as u8).collect()
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let body = req.into_body().collect().await?.to_bytes();
    let mut reversed = body.to_vec();
    reversed.reverse();
    let mut resp = Response::new(Full::new(Bytes::from(reversed)));
    resp.headers_mut().insert(
        "x-request-length",
        body.len().to_string().parse().expect("a header value"),
    );
    Ok(resp)
}

async fn run(addr: SocketAddr, n: usize) -> Res<()> {
    let listener = RdmaListener::bind(addr)?;
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await?;
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), hyper::service::service_fn(handle))
            .await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });
    let stream = RdmaStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let mut bytes = 0;
    for i in 0..n {
        let sent = body(i);
        let req = Request::post(format!("/reverse/{i}"))
            .header("host", "rdma")
            .body(Full::new(Bytes::from(sent.clone())))?;
        let resp = sender.send_request(req).await?;
        if resp.status() != 200 {
            return Err(format!("request {i}: status {}", resp.status()).into());
        }
        let len = resp.headers().get("x-request-length").cloned();
        let got = resp.into_body().collect().await?.to_bytes();
        let mut want = sent.clone();
        want.reverse();
        if got[..] != want[..] || len.as_ref().and_then(|v| v.to_str().ok()) != Some(&sent.len().to_string()) {
            return Err(format!("request {i}: the answer ({} bytes) is not the body reversed", got.len()).into());
        }
        bytes += sent.len() + got.len();
    }
    drop(sender);
    conn.await??;
    server.await??;
    println!("hyper over uverbs::stream: {n} requests, {bytes} body bytes checked");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(addr) = args.first().and_then(|a| a.parse().ok()) else {
        eprintln!("usage: stream_hyper ADDR:PORT [N]");
        return ExitCode::from(2);
    };
    let n = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(24);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(run(addr, n)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stream_hyper: {e}");
            ExitCode::FAILURE
        }
    }
}
