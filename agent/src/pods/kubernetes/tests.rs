//! The Kubernetes pod sources against the played API server and kubelet
//! (the `fake-kubernetes` crate), over real HTTP with kube-rs.
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use fake_kubernetes::{FakeKubernetes, PATIENCE, pod_object};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

fn pod(uid: &str, node: &str) -> Value {
    pod_object(
        "shop",
        &format!("web-{uid}"),
        uid,
        node,
        &[(
            "app",
            &[("cpu", "100m")],
            &[("cpu", "200m")],
            Some("containerd://abc"),
        )],
    )
}

/// Polls until `done` holds of everything received (events, errors), or fails after PATIENCE.
fn poll_until(
    source: &mut ChannelSource,
    seen: &mut Vec<String>,
    errors: &mut Vec<String>,
    done: impl Fn(&ChannelSource, &[String], &[String]) -> bool,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        for event in source.poll() {
            seen.push(match event {
                PodEvent::Added(p) => format!("+{}", p.pod.metadata.uid),
                PodEvent::Updated(p) => format!("~{}", p.pod.metadata.uid),
                PodEvent::Removed { uid, .. } => format!("-{uid}"),
            });
        }
        errors.extend(source.new_errors().iter().map(ToString::to_string));
        if done(source, seen, errors) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out; events {seen:?}, errors {errors:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn api_source(
    rt: &tokio::runtime::Runtime,
    fake: &FakeKubernetes,
    dir: &std::path::Path,
) -> (ChannelSource, api::ApiServerWatch) {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).expect("kubeconfig");
    let (client, url) = rt
        .block_on(client::api_server(&client::ApiServerOptions {
            kubeconfig: Some(kubeconfig),
        }))
        .expect("client");
    api::start(client, "node-a", &url, rt.handle())
}

/// The played API server with `pods`, an API source on it that has listed and is watching,
/// and what it delivered so far.
struct Watching {
    fake: FakeKubernetes,
    source: ChannelSource,
    seen: Vec<String>,
    errors: Vec<String>,
    _watch: api::ApiServerWatch,
    _dir: tempfile::TempDir,
}

fn watching(rt: &tokio::runtime::Runtime, pods: &[(&str, &str)]) -> Watching {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeKubernetes::start().expect("fake");
    for (uid, node) in pods {
        fake.upsert(pod(uid, node));
    }
    let (mut source, watch) = api_source(rt, &fake, dir.path());
    let (mut seen, mut errors) = (Vec::new(), Vec::new());
    poll_until(&mut source, &mut seen, &mut errors, |s, _, _| s.synced());
    poll_until(&mut source, &mut seen, &mut errors, |_, _, _| {
        fake.open_watches() == 1
    });
    Watching {
        fake,
        source,
        seen,
        errors,
        _watch: watch,
        _dir: dir,
    }
}

impl Watching {
    fn until(&mut self, done: impl Fn(&ChannelSource, &[String], &[String]) -> bool) {
        poll_until(&mut self.source, &mut self.seen, &mut self.errors, done);
    }
}

#[test]
fn the_api_watch_delivers_this_nodes_pods_and_their_changes() {
    let rt = runtime();
    let mut w = watching(&rt, &[("a", "node-a"), ("other", "node-b")]);
    assert_eq!(w.seen, ["+a"], "only pods bound to node-a");
    assert_eq!(w.source.reachable(), Some(true));
    w.fake.upsert(pod("b", "node-a"));
    let mut changed = pod("a", "node-a");
    changed["status"]["phase"] = json!("Succeeded");
    w.fake.upsert(changed);
    w.fake.upsert(pod("other2", "node-b"));
    w.fake.delete("b");
    w.fake.bookmark();
    w.until(|_, seen, _| seen.len() == 4);
    assert_eq!(w.seen, ["+a", "+b", "~a", "-b"]);
    assert!(w.errors.is_empty(), "{:?}", w.errors);
    assert_eq!(w.fake.requests().0, 1, "one list; the rest came by watch");
}

#[test]
fn losing_the_api_server_loses_nothing_and_a_410_relists() {
    let rt = runtime();
    let mut w = watching(&rt, &[("a", "node-a"), ("b", "node-a")]);
    // Gone: errors and unreachable, but no pod is removed.
    w.fake.set_available(false);
    w.until(|s, _, e| s.reachable() == Some(false) && !e.is_empty());
    assert_eq!(
        w.seen,
        ["+a", "+b"],
        "nothing removed while the server is away"
    );
    assert!(w.errors[0].contains("API server"), "{:?}", w.errors);

    // While away, b was deleted and c created, and the history expired: back, the watch
    // gets 410 Gone, relists, and the list brings both changes.
    w.fake.delete("b");
    w.fake.upsert(pod("c", "node-a"));
    w.fake.expire_history();
    w.fake.set_available(true);
    w.until(|s, seen, _| s.reachable() == Some(true) && seen.len() == 4);
    assert_eq!(w.seen, ["+a", "+b", "-b", "+c"]);
    assert!(
        w.fake.requests().0 >= 2,
        "relisted: {:?}",
        w.fake.requests()
    );
}

#[test]
fn a_malformed_pod_is_reported_by_name_and_field_and_loses_only_itself() {
    let rt = runtime();
    let mut w = watching(&rt, &[("a", "node-a")]);
    let mut bad = pod("a", "node-a");
    bad["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("lots");
    w.fake.upsert(bad);
    w.fake.upsert(pod("d", "node-a"));
    w.until(|_, seen, e| seen.len() == 2 && !e.is_empty());
    assert_eq!(w.seen, ["+a", "+d"], "a keeps its last good version");
    assert!(
        w.errors[0].contains("pod shop/web-a: spec.containers[0].resources.limits.cpu"),
        "{:?}",
        w.errors
    );
}

#[test]
fn kubelets_pods_with_a_token_and_without_it() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeKubernetes::start().expect("fake");
    fake.upsert(pod("a", "node-a"));
    fake.require_kubelet_token("s3cret");
    let token = dir.path().join("token");
    std::fs::write(&token, "wrong").expect("token");
    let options = |token_file| client::KubeletOptions {
        url: fake.url(),
        token_file,
        ca_file: None,
        insecure_skip_tls_verify: false,
        period: Duration::from_millis(100),
    };
    let _runtime = rt.enter();
    // Over http the token is not sent (the read-only port has none): refused here.
    let plain = client::kubelet(&options(Some(token))).expect("client");
    let (mut source, _poll) =
        kubelet::start(plain, &fake.url(), Duration::from_millis(100), rt.handle());
    let (mut seen, mut errors) = (Vec::new(), Vec::new());
    poll_until(&mut source, &mut seen, &mut errors, |s, _, e| {
        s.reachable() == Some(false) && !e.is_empty()
    });
    assert!(errors[0].contains("/pods"), "{errors:?}");
    assert!(seen.is_empty());

    // Open: pods arrive, then a deletion, then kubelet away and back: nothing lost.
    let open = {
        let fake_open = FakeKubernetes::start().expect("fake");
        fake_open.upsert(pod("a", "node-a"));
        fake_open.upsert(pod("b", "node-a"));
        fake_open
    };
    let client = client::kubelet(&client::KubeletOptions {
        url: open.url(),
        ..options(None)
    })
    .expect("client");
    let (mut source, _poll) =
        kubelet::start(client, &open.url(), Duration::from_millis(100), rt.handle());
    let (mut seen, mut errors) = (Vec::new(), Vec::new());
    poll_until(&mut source, &mut seen, &mut errors, |s, _, _| s.synced());
    assert_eq!(seen, ["+a", "+b"]);
    open.set_available(false);
    poll_until(&mut source, &mut seen, &mut errors, |s, _, _| {
        s.reachable() == Some(false)
    });
    open.delete("b");
    open.set_available(true);
    poll_until(&mut source, &mut seen, &mut errors, |_, seen, _| {
        seen.len() == 3
    });
    assert_eq!(seen, ["+a", "+b", "-b"]);
}

#[test]
fn kubelets_authenticated_port_over_https_with_its_ca_and_a_token() {
    let rt = runtime();
    let _runtime = rt.enter();
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeKubernetes::start_tls().expect("https fake");
    fake.upsert(pod("a", "node-a"));
    fake.require_kubelet_token("s3cret");
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, fake.ca_pem().expect("a CA")).expect("ca");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret").expect("token");
    let source_with =
        |token_file: &std::path::Path, ca_file: Option<std::path::PathBuf>, insecure: bool| {
            let client = client::kubelet(&client::KubeletOptions {
                url: fake.url(),
                token_file: Some(token_file.to_owned()),
                ca_file,
                insecure_skip_tls_verify: insecure,
                period: Duration::from_millis(100),
            })
            .expect("client");
            kubelet::start(client, &fake.url(), Duration::from_millis(100), rt.handle())
        };
    assert!(fake.url().starts_with("https://"));

    // The right CA and token: the pods.
    let (mut source, _poll) = source_with(&token, Some(ca.clone()), false);
    let (mut seen, mut errors) = (Vec::new(), Vec::new());
    poll_until(&mut source, &mut seen, &mut errors, |s, _, _| s.synced());
    assert_eq!(seen, ["+a"]);
    assert!(errors.is_empty(), "{errors:?}");

    // Another CA: the certificate is refused, nothing is delivered.
    let other = FakeKubernetes::start_tls().expect("another CA");
    let other_ca = dir.path().join("other.crt");
    std::fs::write(&other_ca, other.ca_pem().expect("a CA")).expect("ca");
    let (mut source, _poll) = source_with(&token, Some(other_ca), false);
    let (mut seen, mut errors) = (Vec::new(), Vec::new());
    poll_until(&mut source, &mut seen, &mut errors, |s, _, e| {
        s.reachable() == Some(false) && !e.is_empty()
    });
    assert!(seen.is_empty(), "{seen:?}");

    // A wrong token: 401, nothing delivered.
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "guess").expect("token");
    let (mut source, _poll) = source_with(&wrong, Some(ca), false);
    let (mut seen, mut errors) = (Vec::new(), Vec::new());
    poll_until(&mut source, &mut seen, &mut errors, |s, _, e| {
        s.reachable() == Some(false) && !e.is_empty()
    });
    assert!(seen.is_empty());
    assert!(
        errors
            .iter()
            .any(|e| e.contains("401") || e.contains("Unauthorized")),
        "{errors:?}"
    );

    // No CA but told to skip verification (self-signed kubelet certificates): the pods.
    let (mut source, _poll) = source_with(&token, None, true);
    let (mut seen, mut errors) = (Vec::new(), Vec::new());
    poll_until(&mut source, &mut seen, &mut errors, |s, _, _| s.synced());
    assert_eq!(seen, ["+a"]);
}
