//! The HTTP endpoint: `GET /metrics` (Prometheus text format 0.0.4), `GET /healthz` and
//! `GET /inspect` (the JSON [`Report`] `qosd inspect` prints).
//! hyper serves HTTP/1.1 so the agent carries no hand-written HTTP parser.
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
use hyper_util::rt::TokioIo;
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
    /// what `inspect` gives (the container manager's tree, rendered on request).
    pub async fn serve(
        self,
        metrics: Arc<Metrics>,
        inspect: Inspect,
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_metrics_and_health_and_stops_on_shutdown() {
        let metrics = Arc::new(Metrics::new().expect("registry"));
        let server = MetricsServer::bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = server.local_addr().expect("bound");
        let (stop, stopped) = watch::channel(false);
        let inspect = Inspect::default();
        inspect.set(Report::message("standalone", "kubepods"));
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
}
