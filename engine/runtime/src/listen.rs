//! The HTTP listener: connections accepted up to a cap, each with a deadline for its request
//! headers, served by the router until the server shuts down.
//!
//! A connection that has not sent a request's headers within the header timeout is closed: a
//! new connection's first request and an idle keep-alive connection's next one alike (vLLM's
//! uvicorn closes idle keep-alive connections after 5 s), so idle or half-sent sockets cannot
//! pile up. At the connection cap the listener stops accepting until a connection closes: new
//! ones wait in the kernel's backlog instead of taking the process's file descriptors. The
//! request body's deadline is the router's (`ApiConfig::body_timeout`). HTTP/1.1 only, as
//! vLLM's uvicorn serves.

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io::ErrorKind;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connection limits (`serve --header-timeout`, `--max-connections`; their defaults are the
/// flags', 5 s and 1,000).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConnLimits {
    /// Longest wait for a request's headers, the wait for the first byte included.
    pub header_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves; then stops accepting,
/// closes idle connections and waits for the others' responses to end.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = open.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // A connection that went away before it was accepted: the next one.
                Err(e) if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::ConnectionReset
                ) => continue,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin (as axum::serve does).
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Streams write small frames: without TCP_NODELAY each waits for the peer's delayed ACK.
        let _ = tcp.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // A connection closed by a timeout or the peer ends here; nothing to report.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
