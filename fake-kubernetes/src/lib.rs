//! A Kubernetes API server and kubelet `/pods` endpoint played for qosd's tests (the agent's
//! unit tests and the system tests), speaking the real wire format: no kube-apiserver or
//! kubelet can run on the development machine (see docs/architecture.md), so this is what the
//! Kubernetes pod sources are tested against, beside a real containerd:
//!
//! - `GET /api/v1/pods?fieldSelector=spec.nodeName=N[&limit=..]`: a `PodList` with
//!   `metadata.resourceVersion`, each item with its own;
//! - `GET /api/v1/pods?watch=true&resourceVersion=R[&allowWatchBookmarks=true]`: a chunked
//!   stream of `{"type":"ADDED|MODIFIED|DELETED|BOOKMARK","object":...}` lines, first the
//!   changes after R from the retained history, then live ones; when R is older than the
//!   history (after [`FakeKubernetes::expire_history`]) a single `ERROR` event with the
//!   `Status` 410 Gone / `Expired` the API server sends, after which a client must relist;
//! - `GET /pods`: kubelet's `PodList` of every pod (optionally behind a bearer token);
//! - `GET /version`: the server's version (what clients ask to see it is up);
//! - [`FakeKubernetes::set_available`]`(false)`: every request gets 503 and open watches
//!   end, as when the API server is restarting.
//!
//! Pods are JSON objects as the API server would return them; the test sets their status
//! (container ids from the runtime that really runs them).
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

type Body = BoxBody<Bytes, Infallible>;

/// A running fake; stops (and closes every watch) when dropped.
#[derive(Debug)]
pub struct FakeKubernetes {
    addr: SocketAddr,
    /// Served over https with a certificate this CA (PEM) signed, for `127.0.0.1`.
    tls_ca: Option<String>,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct State {
    resource_version: u64,
    /// By uid.
    pods: BTreeMap<String, Value>,
    /// (resourceVersion, event type, object) of every change still retained.
    history: Vec<(u64, &'static str, Value)>,
    /// Watches from a resourceVersion below this get 410 Gone.
    oldest: u64,
    watches: Vec<Watch>,
    unavailable: bool,
    kubelet_token: Option<String>,
    /// Requests served, by kind, for tests of the clients' behaviour.
    lists: u64,
    watch_starts: u64,
    kubelet_gets: u64,
}

#[derive(Debug)]
struct Watch {
    node: Option<String>,
    sender: UnboundedSender<Bytes>,
}

impl FakeKubernetes {
    /// Starts serving http on a free loopback port, on a thread of its own.
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(None)
    }

    /// Starts serving https (as kubelet's authenticated port does): a test CA is made, and a
    /// server certificate for `127.0.0.1` it signs; [`Self::ca_pem`] is what clients trust.
    pub fn start_tls() -> std::io::Result<Self> {
        let (ca_pem, config) = tls_config().map_err(std::io::Error::other)?;
        let mut fake = Self::start_with(Some(Arc::new(config)))?;
        fake.tls_ca = Some(ca_pem);
        Ok(fake)
    }

    /// The CA that signed the server's certificate (https only).
    #[must_use]
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls_ca.as_deref()
    }

    fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let served = Arc::clone(&state);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("fake-kubernetes".into())
            .spawn(move || runtime.block_on(serve(listener, served, stopped, tls)))?;
        Ok(Self {
            addr,
            tls_ca: None,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`, or `https://` when serving TLS.
    #[must_use]
    pub fn url(&self) -> String {
        let scheme = if self.tls_ca.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// A kubeconfig file content pointing at this server (no authentication).
    #[must_use]
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.url()
        )
    }

    /// Requires `Authorization: Bearer <token>` on `/pods` (kubelet's authenticated port).
    pub fn require_kubelet_token(&self, token: &str) {
        self.lock().kubelet_token = Some(token.to_owned());
    }

    /// Adds or replaces a pod (by `metadata.uid`); returns its new resourceVersion.
    pub fn upsert(&self, mut pod: Value) -> u64 {
        let mut state = self.lock();
        state.resource_version += 1;
        let rv = state.resource_version;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let kind = if state.pods.insert(uid, pod.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.publish(rv, kind, pod);
        rv
    }

    /// Deletes a pod by uid (a `DELETED` event with its last state).
    pub fn delete(&self, uid: &str) {
        let mut state = self.lock();
        let Some(mut pod) = state.pods.remove(uid) else {
            return;
        };
        state.resource_version += 1;
        let rv = state.resource_version;
        pod["metadata"]["resourceVersion"] = json!(rv.to_string());
        state.publish(rv, "DELETED", pod);
    }

    /// Sends a `BOOKMARK` with the current resourceVersion to every watch that asked for them.
    pub fn bookmark(&self) {
        let state = self.lock();
        let line = event_line("BOOKMARK", &bookmark_object(state.resource_version));
        for watch in &state.watches {
            let _ = watch.sender.send(line.clone());
        }
    }

    /// Forgets the history: a watch resumed from an older resourceVersion gets 410 Gone.
    /// Open watches are closed (as an API server restart does).
    pub fn expire_history(&self) {
        let mut state = self.lock();
        state.history.clear();
        state.oldest = state.resource_version + 1;
        state.watches.clear();
    }

    /// Makes the server answer 503 to everything and close open watches (`false`), or serve
    /// again (`true`).
    pub fn set_available(&self, available: bool) {
        let mut state = self.lock();
        state.unavailable = !available;
        if !available {
            state.watches.clear();
        }
    }

    /// (lists, watches started, kubelet `/pods` requests) served so far.
    #[must_use]
    pub fn requests(&self) -> (u64, u64, u64) {
        let state = self.lock();
        (state.lists, state.watch_starts, state.kubelet_gets)
    }

    /// Open watches.
    #[must_use]
    pub fn open_watches(&self) -> usize {
        let mut state = self.lock();
        state.watches.retain(|w| !w.sender.is_closed());
        state.watches.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FakeKubernetes {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl State {
    fn publish(&mut self, rv: u64, kind: &'static str, pod: Value) {
        let line = event_line(kind, &pod);
        self.watches.retain(|w| {
            if w.node.as_deref().is_some_and(|n| node_of(&pod) != n) {
                return !w.sender.is_closed();
            }
            w.sender.send(line.clone()).is_ok()
        });
        self.history.push((rv, kind, pod));
    }
}

fn node_of(pod: &Value) -> &str {
    pod["spec"]["nodeName"].as_str().unwrap_or_default()
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn bookmark_object(rv: u64) -> Value {
    json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}})
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// A CA and a server configuration whose certificate (for 127.0.0.1 and localhost) it signed.
fn tls_config() -> Result<(String, rustls::ServerConfig), Box<dyn std::error::Error + Send + Sync>>
{
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "fake-kubernetes test CA");
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::V4(
            std::net::Ipv4Addr::LOCALHOST,
        )));
    params
        .distinguished_name
        .push(DnType::CommonName, "fake kubelet");
    let server_cert = params.signed_by(&server_key, &issuer)?;
    let key = rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der())?;
    #[expect(
        deprecated,
        reason = "ring is the provider qosd's client (kube-rs, feature `ring`) uses; the played server matches it"
    )]
    let provider = rustls::crypto::ring::default_provider();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![server_cert.der().clone()], key)?;
    Ok((ca_cert.pem(), config))
}

async fn serve(
    listener: std::net::TcpListener,
    state: Arc<Mutex<State>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let accepted = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let state = Arc::clone(&state);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let state = Arc::clone(&state);
                async move { Ok::<_, Infallible>(handle(&state, &request)) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match acceptor {
                Some(acceptor) => {
                    // A client that refuses the certificate ends here.
                    if let Ok(stream) = acceptor.accept(stream).await {
                        let _ = http
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    }
                }
                None => {
                    let _ = http
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                }
            }
        });
    }
}

fn handle(state: &Mutex<State>, request: &Request<Incoming>) -> Response<Body> {
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    if state.unavailable {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &status(503, "ServiceUnavailable", "the server is restarting"),
        );
    }
    let query = parse_query(request.uri().query().unwrap_or_default());
    match request.uri().path() {
        "/api/v1/pods" => {
            let node = query
                .get("fieldSelector")
                .and_then(|s| s.strip_prefix("spec.nodeName="))
                .map(str::to_owned);
            if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
                state.watch_starts += 1;
                let from = query
                    .get("resourceVersion")
                    .and_then(|rv| rv.parse::<u64>().ok())
                    .unwrap_or(state.resource_version);
                watch_response(&mut state, node, from)
            } else {
                state.lists += 1;
                let items: Vec<&Value> = state
                    .pods
                    .values()
                    .filter(|p| node.as_deref().is_none_or(|n| node_of(p) == n))
                    .collect();
                json_response(
                    StatusCode::OK,
                    &json!({"kind": "PodList", "apiVersion": "v1",
                            "metadata": {"resourceVersion": state.resource_version.to_string()},
                            "items": items}),
                )
            }
        }
        "/version" => json_response(
            StatusCode::OK,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake-kubernetes",
                    "platform": "linux/amd64"}),
        ),
        "/pods" => {
            state.kubelet_gets += 1;
            if let Some(token) = &state.kubelet_token {
                let sent = request
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok());
                if sent != Some(format!("Bearer {token}").as_str()) {
                    return json_response(
                        StatusCode::UNAUTHORIZED,
                        &status(401, "Unauthorized", "Unauthorized"),
                    );
                }
            }
            let items: Vec<&Value> = state.pods.values().collect();
            json_response(
                StatusCode::OK,
                &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
            )
        }
        _ => json_response(
            StatusCode::NOT_FOUND,
            &status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        ),
    }
}

fn watch_response(state: &mut State, node: Option<String>, from: u64) -> Response<Body> {
    let (sender, mut receiver) = unbounded_channel::<Bytes>();
    if from + 1 < state.oldest {
        let message = format!("too old resource version: {from} ({})", state.oldest);
        let _ = sender.send(event_line("ERROR", &status(410, "Expired", &message)));
        drop(sender);
    } else {
        for (rv, kind, pod) in &state.history {
            if *rv > from && node.as_deref().is_none_or(|n| node_of(pod) == n) {
                let _ = sender.send(event_line(kind, pod));
            }
        }
        state.watches.push(Watch { node, sender });
    }
    let stream = futures::stream::poll_fn(move |cx| {
        receiver
            .poll_recv(cx)
            .map(|line| line.map(|l| Ok::<_, Infallible>(Frame::data(l))))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(StreamBody::new(stream).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn json_response(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// `a=b&c=d`, percent-decoded.
fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One container of [`pod_object`]: name, requests, limits (`cpu`/`memory` quantities) and
/// the `containerID` the status reports (`None`: not created yet).
pub type ContainerSpec<'a> = (
    &'a str,
    &'a [(&'a str, &'a str)],
    &'a [(&'a str, &'a str)],
    Option<&'a str>,
);

/// A pod object as the API server would return it, bound to `node`.
#[must_use]
pub fn pod_object(
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
    containers: &[ContainerSpec<'_>],
) -> Value {
    let specs: Vec<Value> = containers
        .iter()
        .map(|(name, requests, limits, _)| {
            let list = |items: &[(&str, &str)]| {
                items
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), json!(v)))
                    .collect::<serde_json::Map<String, Value>>()
            };
            json!({"name": name, "image": "busybox",
                   "resources": {"requests": list(requests), "limits": list(limits)}})
        })
        .collect();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(name, _, _, id)| {
            json!({"name": name, "containerID": id, "restartCount": 0, "ready": id.is_some()})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"nodeName": node, "containers": specs},
        "status": {"phase": "Running", "containerStatuses": statuses}
    })
}

/// How long tests wait for a condition.
pub const PATIENCE: Duration = Duration::from_secs(10);
