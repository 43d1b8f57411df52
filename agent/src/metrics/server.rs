//! The HTTP endpoint: `GET /metrics` (Prometheus text format 0.0.4) and `GET /healthz`.
//! hyper serves HTTP/1.1 so the agent carries no hand-written HTTP parser.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::Metrics;

/// Errors of the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("binding the metrics endpoint to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The container manager's latest state as text, published for `qosd inspect`.
#[derive(Clone, Debug, Default)]
pub struct InspectText(Arc<std::sync::RwLock<String>>);

impl InspectText {
    /// Replaces the published text.
    pub fn set(&self, text: String) {
        if let Ok(mut guard) = self.0.write() {
            *guard = text;
        }
    }

    /// The published text.
    #[must_use]
    pub fn get(&self) -> String {
        self.0.read().map(|g| g.clone()).unwrap_or_default()
    }
}

/// A bound, not yet serving, endpoint.
pub struct MetricsServer {
    listener: TcpListener,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr) -> Result<Self, ServerError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        Ok(Self { listener })
    }

    /// The bound address.
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` changes; in-flight scrapes are not awaited. `/inspect` returns
    /// the latest text the container manager published in `inspect`.
    pub async fn serve(
        self,
        metrics: Arc<Metrics>,
        inspect: InspectText,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = shutdown.changed() => return,
            };
            let (stream, peer) = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a metrics connection");
                    continue;
                }
            };
            let metrics = metrics.clone();
            let inspect = inspect.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| respond(req, metrics.clone(), inspect.clone()));
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
                }
            });
        }
    }
}

async fn respond(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
    inspect: InspectText,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            // Reading kernel maps and walking cgroupfs blocks; keep it off the reactor threads.
            let text = tokio::task::spawn_blocking(move || metrics.render())
                .await
                .unwrap_or_else(|e| format!("# collection failed: {e}\n"));
            (
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            )
        }
        (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        (&Method::GET, "/inspect") => (StatusCode::OK, "text/plain; charset=utf-8", inspect.get()),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /metrics\n".to_owned(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use super::*;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        response
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_metrics_and_health_and_stops_on_shutdown() {
        let metrics = Arc::new(Metrics::new().expect("registry"));
        let server = MetricsServer::bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = server.local_addr().expect("bound");
        let (stop, stopped) = watch::channel(false);
        let inspect = InspectText::default();
        inspect.set("kubepods\n".into());
        let task = tokio::spawn(server.serve(metrics, inspect, stopped));

        let body = tokio::task::spawn_blocking(move || get(addr, "/metrics"))
            .await
            .expect("join");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(body.contains("qosd_build_info"), "{body}");
        let health = tokio::task::spawn_blocking(move || get(addr, "/healthz"))
            .await
            .expect("join");
        assert!(health.ends_with("ok\n"), "{health}");
        let tree = tokio::task::spawn_blocking(move || get(addr, "/inspect"))
            .await
            .expect("join");
        assert!(tree.ends_with("\r\n\r\nkubepods\n"), "{tree}");
        let missing = tokio::task::spawn_blocking(move || get(addr, "/nope"))
            .await
            .expect("join");
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");

        stop.send(true).expect("signal");
        tokio::time::timeout(std::time::Duration::from_secs(1), task)
            .await
            .expect("stops promptly")
            .expect("join");
    }
}
