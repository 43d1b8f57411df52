//! The node benchmark beside kubelet: qosd with `--pods kubernetes` on a node of N pods. There
//! is no kubelet or API server here, so the benchmark plays them: it makes the QoS tiers, each
//! pod's cgroup and its container's (named by its runtime id, as containerd and runc do with
//! the cgroupfs driver) in every hierarchy, with a sleeping process that joins the container's
//! cgroups before it execs (as runc's init does, so its memory is charged there), and
//! serves the pods, their runtime ids in their status, from the played API server
//! (`fake-kubernetes`) that qosd watches.
//!
//! Idle: nothing changes. Churn: [`UPDATES_PER_SECOND`] pod status updates per second (watch
//! events, as kubelet's status updates make them) and one pod added and one removed per second.
//! Latency: for pods added after the churn window, the time from the pod's watch event to its
//! container's series in `/metrics` carrying its labels (the scrapes that poll for it are not
//! in any CPU figure).
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use fake_kubernetes::{FakeKubernetes, pod_object};

use super::{Round, WINDOW, measure_settled, pods_gauge};
use crate::procfs::{cpu_seconds, free_port, get, stop, wait_until_serving};

/// Pod counts measured beside kubelet.
pub(super) const SIZES: [usize; 2] = [110, 250];
/// Pod status updates per second during churn.
pub(super) const UPDATES_PER_SECOND: u32 = 10;
/// Pods added one by one after churn to measure event -> labelled series.
const LATENCY_PROBES: usize = 30;
const NODE: &str = "bench-node";
const NAMESPACE: &str = "bench";

/// The played kubelet and runtime: cgroups and processes of each pod, in every hierarchy.
struct Node {
    /// Hierarchy mounts the pods' cgroups are made in.
    mounts: Vec<PathBuf>,
    root: String,
    pods: Vec<PlayedPod>,
    next: usize,
}

struct PlayedPod {
    uid: String,
    /// `kubepods/<tier>/pod<uid>` under the root.
    pod_dir: String,
    container_id: String,
    process: Child,
    burstable: bool,
    name: String,
}

impl Node {
    fn new(pods: usize) -> Result<Self> {
        let root = format!("qosd-bench-k8s-{}-{pods}", std::process::id());
        let mounts = mounts()?;
        for mount in &mounts {
            for tier in ["kubepods/burstable", "kubepods/besteffort"] {
                std::fs::create_dir_all(mount.join(&root).join(tier))
                    .with_context(|| format!("creating {tier} under {}", mount.display()))?;
            }
        }
        Ok(Self {
            mounts,
            root,
            pods: Vec::new(),
            next: 0,
        })
    }

    /// A pod as kubelet and the runtime would have it: pod and container cgroups, a sleeping
    /// process in the container's. Every third is Burstable, the others BestEffort.
    fn add(&mut self) -> Result<&PlayedPod> {
        let i = self.next;
        self.next += 1;
        let uid = format!("00000000-0000-4000-8000-{i:012}");
        let burstable = i.is_multiple_of(3);
        let tier = if burstable { "burstable" } else { "besteffort" };
        let pod_dir = format!("kubepods/{tier}/pod{uid}");
        let container_id = format!("{:064x}", 0xc0de_0000_u64 + i as u64);
        let mut procs = Vec::new();
        for mount in &self.mounts {
            let dir = mount.join(&self.root).join(&pod_dir).join(&container_id);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            procs.push(dir.join("cgroup.procs"));
        }
        // As runc does: the process joins the container's cgroups, then execs the workload,
        // whose memory is then charged to the container (memory does not move with a task).
        let process = Command::new("sh")
            .arg("-c")
            .arg(r#"for procs in "$@"; do echo $$ > "$procs" || exit 1; done; exec sleep 86400"#)
            .arg("sh")
            .args(&procs)
            .stdin(Stdio::null())
            .spawn()
            .context("starting a sleeping container process")?;
        self.pods.push(PlayedPod {
            uid,
            pod_dir,
            container_id,
            process,
            burstable,
            name: format!("pod-{i:04}"),
        });
        self.pods.last().context("just added")
    }

    /// Removes the oldest pod: its process, then its cgroups (deepest first).
    fn remove_oldest(&mut self) -> Option<String> {
        if self.pods.is_empty() {
            return None;
        }
        let mut pod = self.pods.remove(0);
        let _ = pod.process.kill();
        let _ = pod.process.wait();
        for mount in &self.mounts {
            let base = mount.join(&self.root).join(&pod.pod_dir);
            remove_dir_retrying(&base.join(&pod.container_id));
            remove_dir_retrying(&base);
        }
        Some(pod.uid)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        while self.remove_oldest().is_some() {}
        for mount in &self.mounts {
            for dir in ["kubepods/burstable", "kubepods/besteffort", "kubepods", ""] {
                remove_dir_retrying(&mount.join(&self.root).join(dir));
            }
        }
    }
}

/// A cgroup whose last process has just been killed may be busy for a moment.
fn remove_dir_retrying(dir: &Path) {
    for _ in 0..50 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The hierarchies containerd's runc makes a container's cgroup in: v1, each controller that
/// matters here and, on a hybrid layout, the unified hierarchy too (as runc does, where the
/// kernel's cgroup ids for eBPF come from); v2, the unified one.
fn mounts() -> Result<Vec<PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut v1 = Vec::new();
    let mut unified = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount = PathBuf::from(left.split_whitespace().nth(4).unwrap_or_default());
        let mut right = right.split_whitespace();
        let fstype = right.next().unwrap_or_default();
        let options = right.nth(1).unwrap_or_default();
        if fstype == "cgroup"
            && options
                .split(',')
                .any(|o| ["cpu", "cpuacct", "memory", "pids"].contains(&o))
            && !v1.contains(&mount)
        {
            v1.push(mount);
        } else if fstype == "cgroup2" {
            unified.get_or_insert(mount);
        }
    }
    v1.extend(unified);
    if v1.is_empty() {
        bail!("no cgroup hierarchy mounted");
    }
    Ok(v1)
}

/// The pod object the played API server serves for `pod`, with `generation` in an annotation
/// (a status update changes it).
fn object(pod: &PlayedPod, generation: u64) -> serde_json::Value {
    let requests: &[(&str, &str)] = if pod.burstable {
        &[("cpu", "1m"), ("memory", "1Mi")]
    } else {
        &[]
    };
    let mut object = pod_object(
        NAMESPACE,
        &pod.name,
        &pod.uid,
        NODE,
        &[(
            "sleeper",
            requests,
            &[],
            Some(&format!("containerd://{}", pod.container_id)),
        )],
    );
    object["metadata"]["annotations"] =
        serde_json::json!({"bench.qosd/generation": generation.to_string()});
    object
}

/// One pod count beside kubelet.
pub(super) fn measure(
    qosd: &Path,
    pods: usize,
    peer: &Child,
    peer_addr: SocketAddr,
) -> Result<Round> {
    let dir = std::env::temp_dir().join(format!("qosd-bench-k8s-{}-{pods}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut node = Node::new(pods)?;
    let fake = FakeKubernetes::start().context("starting the played API server")?;
    for _ in 0..pods {
        let pod = node.add()?;
        fake.upsert(object(pod, 0));
    }
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig())?;
    let addr = free_port()?;
    let log = std::fs::File::create(dir.join("qosd.log"))?;
    let mut child = Command::new(qosd)
        .arg("run")
        .arg(format!("--metrics-addr={addr}"))
        .args(["--pods", "kubernetes", "--node-name", NODE])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg(format!("--cgroup-root=/{}", node.root))
        .args(["--cgroup-driver", "cgroupfs"])
        .arg("--kubelet-root")
        .arg(dir.join("kubelet"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", qosd.display()))?;
    let result = wait_until_serving(addr, &mut child).and_then(|()| {
        run_round(
            &mut child, addr, &dir, pods, &mut node, &fake, peer, peer_addr,
        )
    });
    stop(&mut child, libc::SIGTERM);
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

#[expect(clippy::too_many_arguments, reason = "one round's parts, passed once")]
fn run_round(
    child: &mut Child,
    addr: SocketAddr,
    dir: &Path,
    pods: usize,
    node: &mut Node,
    fake: &FakeKubernetes,
    peer: &Child,
    peer_addr: SocketAddr,
) -> Result<Round> {
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "qosd exited with {status}; its log is {}",
                dir.join("qosd.log").display()
            );
        }
        let known = get(addr, "/metrics")
            .map(|(body, _)| pods_gauge(&String::from_utf8_lossy(&body)))
            .unwrap_or(0);
        if known == pods {
            break;
        }
        if Instant::now() > deadline {
            bail!("qosd knows {known} of {pods} pods after 120 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut round = measure_settled(pid, dir, addr, pods, peer, peer_addr)?;

    // Churn: status updates at a steady rate, one pod in and one out per second.
    let before = cpu_seconds(pid)?;
    let started = Instant::now();
    let mut generation = 0u64;
    let mut updates = 0u64;
    let mut churned = 0usize;
    while started.elapsed() < WINDOW {
        let second = Instant::now();
        for _ in 0..UPDATES_PER_SECOND {
            generation += 1;
            let index = usize::try_from(generation).unwrap_or(0) % node.pods.len().max(1);
            if let Some(pod) = node.pods.get(index) {
                fake.upsert(object(pod, generation));
                updates += 1;
            }
            std::thread::sleep(Duration::from_millis(1000 / u64::from(UPDATES_PER_SECOND)) / 2);
        }
        let added = node.add()?;
        fake.upsert(object(added, 0));
        if let Some(uid) = node.remove_oldest() {
            fake.delete(&uid);
        }
        churned += 1;
        if let Some(rest) = Duration::from_secs(1).checked_sub(second.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    round.churn_cpu = (cpu_seconds(pid)? - before) / started.elapsed().as_secs_f64();
    println!(
        "churn: {updates} status updates and {churned} pods added and removed in {:.0} s, qosd {:.2}% of a core",
        started.elapsed().as_secs_f64(),
        round.churn_cpu * 100.0
    );

    // Latency: a pod's watch event -> its container's series labelled.
    for _ in 0..LATENCY_PROBES {
        let expected = node.pods.len() + 1;
        let pod = node.add()?;
        let name = pod.name.clone();
        let event = Instant::now();
        fake.upsert(object(pod, 0));
        let deadline = event + Duration::from_secs(10);
        let mut known = None;
        let mut slowest_scrape = Duration::ZERO;
        loop {
            let asked = Instant::now();
            let (body, _) = get(addr, "/metrics")?;
            slowest_scrape = slowest_scrape.max(asked.elapsed());
            let text = String::from_utf8_lossy(&body);
            if known.is_none() && pods_gauge(&text) == expected {
                known = Some(event.elapsed());
            }
            let labelled = format!("pod=\"{name}\"");
            if text
                .lines()
                .any(|l| l.contains(&labelled) && l.contains("container=\"sleeper\""))
            {
                let took = event.elapsed();
                if took > Duration::from_secs(1) {
                    println!(
                        "slow: {name} labelled {} ms after its event (counted in qosd_pods after {:?} ms; slowest scrape meanwhile {} ms)",
                        took.as_millis(),
                        known.map(|k| k.as_millis()),
                        slowest_scrape.as_millis()
                    );
                }
                round.change_to_cgroup.push(took);
                break;
            }
            if Instant::now() > deadline {
                round.change_missed += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(round)
}
