//! The HTTP endpoint: `GET /metrics` (Prometheus text format 0.0.4), `GET /healthz` and
//! `GET /inspect` (the JSON [`Report`] `qosd inspect` prints).
//! hyper serves HTTP/1.1 so the agent carries no hand-written HTTP parser.
//!
//! The endpoint is bounded ([`Limits`]): a request's headers must arrive within a timeout
//! and fit a buffer, a connection lives at most so long, and at most so many are open at
//! once (more are closed as they come), so a slow or hostile client cannot hold a scrape, the
//! agent's memory or its file descriptors. It listens on loopback unless told otherwise.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use super::Metrics;
use crate::report::Report;

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

/// How long `/inspect` waits for the container manager to render its tree.
const INSPECT_WAIT: Duration = Duration::from_secs(5);

/// `qosd inspect`'s report ([`Report`]). While a container manager runs, it is built on
/// request by the manager's own thread (it reads cgroups' limits and processes, so it is not
/// built while nobody asks); otherwise a fixed report is served.
#[derive(Clone, Debug, Default)]
pub struct Inspect(Arc<InspectState>);

/// A table added to every report, with its data under a key of `data` (the NUMA placement).
pub type Appendix = Arc<dyn Fn() -> (crate::report::Section, serde_json::Value) + Send + Sync>;

#[derive(Default)]
struct InspectState {
    /// `Some`: served as is. `None`: the renderer answers requests.
    fixed: Mutex<Option<Report>>,
    /// Requests waiting for the renderer.
    waiting: Mutex<Vec<oneshot::Sender<Report>>>,
    /// Tables the agent adds after the manager's, by their key in `data`.
    appendices: Mutex<Vec<(&'static str, Appendix)>>,
}

impl std::fmt::Debug for InspectState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InspectState")
            .field("fixed", &self.fixed)
            .finish_non_exhaustive()
    }
}

impl Inspect {
    /// Serves `report` from now on (no renderer, or the renderer has stopped).
    pub fn set(&self, report: Report) {
        if let Ok(mut fixed) = self.0.fixed.lock() {
            *fixed = Some(report);
        }
        self.answer_with(Report::default);
    }

    /// From now on requests wait for [`Self::answer_with`] (the renderer's side).
    pub fn render_on_request(&self) {
        if let Ok(mut fixed) = self.0.fixed.lock() {
            *fixed = None;
        }
    }

    /// True when a request is waiting for the renderer.
    #[must_use]
    pub fn wanted(&self) -> bool {
        self.0.waiting.lock().is_ok_and(|w| !w.is_empty())
    }

    /// Answers every waiting request with one rendering (none when nobody waits).
    pub fn answer_with(&self, render: impl FnOnce() -> Report) {
        let waiting = match self.0.waiting.lock() {
            Ok(mut waiting) => std::mem::take(&mut *waiting),
            Err(_) => return,
        };
        if waiting.is_empty() {
            return;
        }
        let text = self
            .0
            .fixed
            .lock()
            .ok()
            .and_then(|f| f.clone())
            .unwrap_or_else(render);
        for requester in waiting {
            // A requester that gave up is fine.
            let _ = requester.send(text.clone());
        }
    }

    /// Adds a table after the manager's in every report, its data under `key`.
    pub fn append(&self, key: &'static str, appendix: Appendix) {
        if let Ok(mut appendices) = self.0.appendices.lock() {
            appendices.push((key, appendix));
        }
    }

    /// The report with the appended tables (built on a blocking thread: they read cgroupfs).
    pub async fn get(&self) -> Report {
        let mut report = self.manager_report().await;
        let appendices = self
            .0
            .appendices
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default();
        if appendices.is_empty() {
            return report;
        }
        let built = tokio::task::spawn_blocking(move || {
            appendices
                .iter()
                .map(|(key, build)| (*key, build()))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for (key, (section, data)) in built {
            report.sections.push(section);
            if let serde_json::Value::Object(map) = &mut report.data {
                map.insert(key.to_owned(), data);
            } else if report.data.is_null() {
                report.data = serde_json::json!({ key: data });
            }
        }
        report
    }

    /// The manager's report: the fixed one, or the renderer's answer (a note when it does not
    /// come).
    async fn manager_report(&self) -> Report {
        let (tx, rx) = oneshot::channel();
        {
            let fixed = self.0.fixed.lock().ok().and_then(|f| f.clone());
            if let Some(text) = fixed {
                return text;
            }
            match self.0.waiting.lock() {
                Ok(mut waiting) => waiting.push(tx),
                Err(_) => return Report::default(),
            }
        }
        match tokio::time::timeout(INSPECT_WAIT, rx).await {
            Ok(Ok(report)) => report,
            _ => Report::message(
                "unknown",
                &format!(
                    "the container manager did not answer within {} s",
                    INSPECT_WAIT.as_secs()
                ),
            ),
        }
    }
}

/// What one client may take of the endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; more are closed at accept.
    pub connections: usize,
    /// How long a request's headers may take to arrive (also between keep-alive requests).
    pub header_timeout: Duration,
    /// The largest request head accepted (hyper's read buffer).
    pub max_head_bytes: usize,
    /// How long one connection may stay open, whatever it does.
    pub connection_lifetime: Duration,
}

impl Default for Limits {
    /// 64 connections (Prometheus keeps one per target, a person a few), 10 s for headers,
    /// 16 KiB of request head, 5 minutes per connection.
    fn default() -> Self {
        Self {
            connections: 64,
            header_timeout: Duration::from_secs(10),
            max_head_bytes: 16 * 1024,
            connection_lifetime: Duration::from_secs(300),
        }
    }
}

/// A bound, not yet serving, endpoint.
pub struct MetricsServer {
    listener: TcpListener,
    limits: Limits,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr) -> Result<Self, ServerError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        Ok(Self {
            listener,
            limits: Limits::default(),
        })
    }

    /// The same endpoint with other limits (the tests' small ones; qosd serves with the
    /// defaults).
    #[cfg(test)]
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The bound address.
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` changes; in-flight scrapes are not awaited. `/inspect` returns
    /// what `inspect` gives (the container manager's tree, rendered on request).
    pub async fn serve(
        self,
        metrics: Arc<Metrics>,
        inspect: Inspect,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let limits = self.limits;
        let open = Arc::new(tokio::sync::Semaphore::new(limits.connections));
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
            let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
                tracing::warn!(%peer, limit = limits.connections, "metrics endpoint: too many connections open; closed");
                drop(stream);
                continue;
            };
            let metrics = metrics.clone();
            let inspect = inspect.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let service = service_fn(move |req| respond(req, metrics.clone(), inspect.clone()));
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_timeout)
                    .max_buf_size(limits.max_head_bytes.max(8192))
                    .serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(limits.connection_lifetime, connection).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "metrics connection open too long; closed");
                    }
                }
            });
        }
    }
}

async fn respond(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
    inspect: Inspect,
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
        (&Method::GET, "/inspect") => (
            StatusCode::OK,
            "application/json",
            serde_json::to_string(&inspect.get().await)
                .unwrap_or_else(|e| format!("{{\"error\": \"encoding the report: {e}\"}}")),
        ),
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

    /// An endpoint on a free loopback port with `limits`, serving until the sender says so.
    async fn serving(
        limits: Limits,
        inspect: Inspect,
    ) -> (SocketAddr, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let metrics = Arc::new(Metrics::new().expect("registry"));
        let server = MetricsServer::bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind")
            .with_limits(limits);
        let addr = server.local_addr().expect("bound");
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(server.serve(metrics, inspect, stopped));
        (addr, stop, task)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_metrics_and_health_and_stops_on_shutdown() {
        let inspect = Inspect::default();
        inspect.set(Report::message("standalone", "kubepods"));
        let (addr, stop, task) = serving(Limits::default(), inspect).await;

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
        assert!(tree.contains("application/json"), "{tree}");
        let (_, body) = tree.split_once("\r\n\r\n").expect("body");
        let report: Report = serde_json::from_str(body).expect("a report");
        assert_eq!(report, Report::message("standalone", "kubepods"));
        let missing = tokio::task::spawn_blocking(move || get(addr, "/nope"))
            .await
            .expect("join");
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");

        stop.send(true).expect("signal");
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("stops promptly")
            .expect("join");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inspect_is_rendered_only_when_asked_and_by_the_renderer() {
        let inspect = Inspect::default();
        inspect.render_on_request();
        let renders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // The renderer's loop (the container manager's thread), ticking every 10 ms.
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let renderer = {
            let inspect = inspect.clone();
            let renders = renders.clone();
            std::thread::spawn(move || {
                while finished.recv_timeout(Duration::from_millis(10)).is_err() {
                    inspect.answer_with(|| {
                        let n = renders.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        Report::message("standalone", &format!("tree {n}"))
                    });
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            renders.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing is rendered while nobody asks"
        );
        assert_eq!(inspect.get().await, Report::message("standalone", "tree 1"));
        assert_eq!(inspect.get().await, Report::message("standalone", "tree 2"));
        // Once the renderer stops, the fixed text is served without waiting.
        done.send(()).expect("stop the renderer");
        renderer.join().expect("renderer");
        inspect.set(Report::message("standalone", "stopped"));
        assert_eq!(
            inspect.get().await,
            Report::message("standalone", "stopped")
        );
        assert_eq!(renders.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// A client that opens connections and sends nothing cannot hold the endpoint: past the
    /// limit they are closed at accept, and one that never finishes its headers is closed after
    /// the header timeout; a scrape still answers meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_and_slow_clients_are_bounded() {
        let limits = Limits {
            connections: 4,
            header_timeout: Duration::from_millis(300),
            max_head_bytes: 8192,
            connection_lifetime: Duration::from_secs(60),
        };
        let (addr, stop, task) = serving(limits, Inspect::default()).await;
        let outcome = tokio::task::spawn_blocking(move || {
            // Four slow clients take every slot; a fifth is closed at once.
            let mut slow: Vec<std::net::TcpStream> = (0..4)
                .map(|_| {
                    let mut s = std::net::TcpStream::connect(addr).expect("connect");
                    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                        .expect("part");
                    s
                })
                .collect();
            std::thread::sleep(Duration::from_millis(100));
            let mut fifth = std::net::TcpStream::connect(addr).expect("connect");
            fifth
                .set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            let _ = write!(fifth, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
            // Closed means the end of the stream or a reset, never the read timing out (a
            // server that kept it waiting).
            let mut answer = Vec::new();
            let refused = answer_closed(fifth.read_to_end(&mut answer)) && answer.is_empty();
            // The slow ones are closed after the header timeout, freeing the slots.
            let mut closed = 0;
            for s in &mut slow {
                s.set_read_timeout(Some(Duration::from_secs(2)))
                    .expect("timeout");
                let mut buf = Vec::new();
                if s.read_to_end(&mut buf).is_ok() {
                    closed += 1;
                }
            }
            let after = get(addr, "/healthz");
            (refused, closed, after)
        })
        .await
        .expect("join");
        assert!(outcome.0, "a connection past the limit is closed");
        assert_eq!(outcome.1, 4, "slow clients closed after the header timeout");
        assert!(outcome.2.ends_with("ok\n"), "{}", outcome.2);
        stop.send(true).expect("signal");
        let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
    }

    /// Whether a read to the end found the connection closed by the server (its end, or a
    /// reset), not timed out.
    fn answer_closed(read: std::io::Result<usize>) -> bool {
        match read {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }

    /// A request head larger than the limit is refused, not buffered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_oversized_request_head_is_refused() {
        let (addr, stop, task) = serving(Limits::default(), Inspect::default()).await;
        let answer = tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(addr).expect("connect");
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let big = "a".repeat(64 * 1024);
            let _ = write!(
                stream,
                "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n"
            );
            let mut response = String::new();
            let closed = answer_closed(stream.read_to_string(&mut response));
            (closed, response)
        })
        .await
        .expect("join");
        let (closed, answer) = answer;
        assert!(closed, "the connection is closed, not left waiting");
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
            "{}",
            &answer[..answer.len().min(200)]
        );
        stop.send(true).expect("signal");
        let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
    }
}
