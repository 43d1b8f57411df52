//! `cargo xtask bench node`: what qosd's user space costs a node, at 10, 110 (kubelet's default
//! `maxPods`) and 250 pods of sleeping containers from generated manifests, with
//! `prometheus-node-exporter` (default collectors) measured in the same run as the peer for
//! idle CPU and scrape cost.
//!
//! Per pod count, one qosd runs under its own cgroup root and manifest directory, and:
//! - idle: its CPU share over the idle window (no scrapes, nothing changing), the peer's over
//!   the same window;
//! - syscalls: `strace -c -f` attached for a few seconds after the idle window, per kind per
//!   second (strace slows what it traces, so this window is not part of the CPU figure);
//! - memory: RSS and its breakdown from `/proc/<pid>/status` and `/proc/<pid>/smaps`
//!   (anonymous, file-backed, the `[heap]` mapping, other anonymous mappings: thread arenas and
//!   stacks);
//! - scrapes: 20 `GET /metrics` of each agent, median and max time, size, series;
//! - churn: one pod added and one removed per second for the churn window, qosd's CPU share
//!   over it, and per added pod the time from its manifest's rename into the directory to its
//!   pod cgroup existing in the cpu hierarchy (p50, p99, max).
//!
//! Beside kubelet ([`kubernetes`]): the same figures with `--pods kubernetes`, the pods served by
//! a played API server and their cgroups and processes made the way kubelet and the runtime
//! make them, with watch events at a steady rate during churn.
//!
//! Speed is measured here, never asserted: the figures and the ratios to the peer are printed.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::procfs::{cpu_seconds, free_port, get, stop, wait_until_serving};

mod kubernetes;
pub(crate) mod soak;

/// Pod counts measured.
const SIZES: [usize; 3] = [10, 110, 250];
/// The idle and churn windows.
const WINDOW: Duration = Duration::from_secs(60);
/// How long strace counts syscalls.
const STRACE_WINDOW: Duration = Duration::from_secs(10);
/// Scrapes per agent per pod count.
const SCRAPES: usize = 20;
/// The peer's binary (Debian's package).
const NODE_EXPORTER: &str = "prometheus-node-exporter";

/// One pod count's figures.
#[derive(Debug, Default)]
pub(super) struct Round {
    pods: usize,
    idle_cpu: f64,
    peer_idle_cpu: f64,
    churn_cpu: f64,
    syscalls: Vec<(String, f64)>,
    memory: Memory,
    scrape: Scrapes,
    peer_scrape: Scrapes,
    /// Manifest change -> pod cgroup, one per pod added during churn.
    change_to_cgroup: Vec<Duration>,
    /// Pods whose cgroup did not appear within the deadline.
    change_missed: usize,
}

/// RSS and its parts, KiB.
#[derive(Debug, Default, Clone, Copy)]
struct Memory {
    rss: u64,
    anon: u64,
    file: u64,
    heap: u64,
    other_anon_mappings: u64,
}

#[derive(Debug, Default, Clone)]
struct Scrapes {
    times: Vec<Duration>,
    bytes: usize,
    series: usize,
}

impl Scrapes {
    fn median(&self) -> Duration {
        percentile(&self.times, 50.0)
    }

    fn max(&self) -> Duration {
        self.times.iter().copied().max().unwrap_or_default()
    }
}

/// Which rounds to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rounds {
    /// Standalone, then beside kubelet.
    All,
    BesideKubelet,
}

/// Runs the benchmark with the release binary at `qosd` (as root).
pub(crate) fn run(qosd: &Path, which: Rounds) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the node benchmark writes cgroups and starts containers: run it as root");
    }
    let peer_addr = free_port()?;
    let mut peer = Command::new(NODE_EXPORTER)
        .arg(format!("--web.listen-address={peer_addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| {
            format!("starting {NODE_EXPORTER} (Debian package prometheus-node-exporter)")
        })?;
    let result = wait_until_serving(peer_addr, &mut peer).and_then(|()| {
        let mut rounds = Vec::new();
        let sizes: &[usize] = if which == Rounds::All { &SIZES } else { &[] };
        for &pods in sizes {
            println!("== node benchmark: {pods} pods");
            rounds.push(measure(qosd, pods, &peer, peer_addr)?);
        }
        let mut beside = Vec::new();
        for pods in kubernetes::SIZES {
            println!("== node benchmark beside kubelet: {pods} pods");
            beside.push(kubernetes::measure(qosd, pods, &peer, peer_addr)?);
        }
        Ok((rounds, beside))
    });
    stop(&mut peer, libc::SIGTERM);
    let (rounds, beside) = result?;
    if !rounds.is_empty() {
        println!(
            "\n== standalone (pods from manifests; change -> cgroup: a manifest renamed in -> its pod cgroup in cgroupfs)"
        );
        print_report(&rounds);
    }
    println!(
        "\n== beside kubelet (--pods kubernetes, a played API server; {} status updates/s and one pod added and one removed per second during churn; change -> cgroup: a pod's watch event -> its container's series labelled in /metrics)",
        kubernetes::UPDATES_PER_SECOND
    );
    print_report(&beside);
    Ok(())
}

/// A running qosd of one round, its directories and cgroup root.
struct Agent {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    manifests: PathBuf,
    root: String,
    /// The cpu hierarchy's directory of the besteffort tier, where the pods' cgroups appear.
    besteffort: PathBuf,
}

fn measure(qosd: &Path, pods: usize, peer: &Child, peer_addr: SocketAddr) -> Result<Round> {
    let mut agent = start_agent(qosd, pods, pods + 20)?;
    let result = measure_running(&mut agent, pods, peer, peer_addr);
    stop(&mut agent.child, libc::SIGTERM);
    let left = agent.besteffort.exists();
    let _ = std::fs::remove_dir_all(&agent.dir);
    if left {
        eprintln!(
            "warning: {} still exists after qosd stopped",
            agent.besteffort.display()
        );
    }
    result
}

/// qosd on `pods` generated pods, admitting up to `max_pods` (kubelet's `maxPods`).
fn start_agent(qosd: &Path, pods: usize, max_pods: usize) -> Result<Agent> {
    let dir = std::env::temp_dir().join(format!("qosd-bench-node-{}-{pods}", std::process::id()));
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)
        .with_context(|| format!("creating {}", manifests.display()))?;
    let config = dir.join("kubelet.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: {max_pods}\n"
        ),
    )
    .with_context(|| format!("writing {}", config.display()))?;
    for i in 0..pods {
        write_manifest(&manifests, &format!("pod-{i:04}"), i)?;
    }
    let root = format!("qosd-bench-{}-{pods}", std::process::id());
    let besteffort = cpu_hierarchy()?.join(&root).join("kubepods/besteffort");
    let addr = free_port()?;
    let log = std::fs::File::create(dir.join("qosd.log"))?;
    let mut child = Command::new(qosd)
        .arg("run")
        .arg(format!("--metrics-addr={addr}"))
        .arg("--manifest-dir")
        .arg(&manifests)
        .arg("--kubelet-config")
        .arg(&config)
        .arg(format!("--cgroup-root=/{root}"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--container-log-dir")
        .arg(dir.join("logs"))
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", qosd.display()))?;
    if let Err(e) = wait_until_serving(addr, &mut child) {
        stop(&mut child, libc::SIGTERM);
        return Err(e);
    }
    let agent = Agent {
        child,
        addr,
        dir,
        manifests,
        root,
        besteffort,
    };
    Ok(agent)
}

fn measure_running(
    agent: &mut Agent,
    pods: usize,
    peer: &Child,
    peer_addr: SocketAddr,
) -> Result<Round> {
    let pid = agent.child.id();
    wait_for_pods(agent, pods)?;
    let mut round = measure_settled(pid, &agent.dir, agent.addr, pods, peer, peer_addr)?;
    churn(agent, pods, &mut round)?;
    Ok(round)
}

/// After start-up work (first reconcile, container starts) settles: idle CPU of qosd and the
/// peer over [`WINDOW`], qosd's syscalls and memory, and both scrapes.
fn measure_settled(
    pid: u32,
    dir: &Path,
    addr: SocketAddr,
    pods: usize,
    peer: &Child,
    peer_addr: SocketAddr,
) -> Result<Round> {
    std::thread::sleep(Duration::from_secs(5));
    let mut round = Round {
        pods,
        ..Round::default()
    };
    let (ours, theirs) = (cpu_seconds(pid)?, cpu_seconds(peer.id())?);
    let started = Instant::now();
    std::thread::sleep(WINDOW);
    let elapsed = started.elapsed().as_secs_f64();
    round.idle_cpu = (cpu_seconds(pid)? - ours) / elapsed;
    round.peer_idle_cpu = (cpu_seconds(peer.id())? - theirs) / elapsed;
    println!(
        "idle: qosd {:.2}% of a core, node_exporter {:.2}%",
        round.idle_cpu * 100.0,
        round.peer_idle_cpu * 100.0
    );
    round.syscalls = count_syscalls(pid, dir)?;
    round.memory = memory(pid)?;
    round.scrape = scrapes(addr)?;
    round.peer_scrape = scrapes(peer_addr)?;
    Ok(round)
}

/// Waits until qosd reports `pods` pods admitted (`qosd_pods`, summed over QoS classes).
fn wait_for_pods(agent: &mut Agent, pods: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(status) = agent.child.try_wait()? {
            bail!(
                "qosd exited with {status}; its log is {}",
                agent.dir.join("qosd.log").display()
            );
        }
        let admitted = get(agent.addr, "/metrics")
            .map(|(body, _)| pods_gauge(&String::from_utf8_lossy(&body)))
            .unwrap_or(0);
        if admitted == pods {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{admitted} of {pods} pods admitted after 180 s");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The sum of `qosd_pods{qos_class=...}`.
pub(super) fn pods_gauge(exposition: &str) -> usize {
    exposition
        .lines()
        .filter(|l| l.starts_with("qosd_pods{"))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .map(|v| {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a pod count gauge"
            )]
            let n = v as usize;
            n
        })
        .sum()
}

/// A sleeping pod: every third Burstable (a tiny request), the others BestEffort.
fn write_manifest(dir: &Path, name: &str, i: usize) -> Result<PathBuf> {
    let resources = if i.is_multiple_of(3) {
        "\n    resources: {requests: {cpu: 1m, memory: 1Mi}}"
    } else {
        ""
    };
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: bench}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: sleeper\n    command: [/bin/sleep, '86400']{resources}\n"
    );
    // Written beside the directory, then renamed in: the watcher never sees half a file.
    let staged = dir.with_extension("staging");
    std::fs::create_dir_all(&staged)?;
    let tmp = staged.join(format!("{name}.yaml"));
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    let path = dir.join(format!("{name}.yaml"));
    std::fs::rename(&tmp, &path).with_context(|| format!("moving {} in", path.display()))?;
    Ok(path)
}

/// The cpu controller's hierarchy (v1) or the unified one, from this process's mountinfo.
fn cpu_hierarchy() -> Result<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut unified = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mount = left.split_whitespace().nth(4).unwrap_or_default();
        let mut right = right.split_whitespace();
        let fstype = right.next().unwrap_or_default();
        let options = right.nth(1).unwrap_or_default();
        if fstype == "cgroup" && options.split(',').any(|o| o == "cpu") {
            return Ok(PathBuf::from(mount));
        }
        if fstype == "cgroup2" {
            unified.get_or_insert_with(|| PathBuf::from(mount));
        }
    }
    unified.context("no cpu cgroup hierarchy mounted")
}

/// `strace -c -f` on `pid` for [`STRACE_WINDOW`]: calls per second by syscall, most first.
pub(super) fn count_syscalls(pid: u32, dir: &Path) -> Result<Vec<(String, f64)>> {
    let out = dir.join("strace.txt");
    let mut strace = Command::new("strace")
        .args(["-c", "-f", "-q", "-p", &pid.to_string(), "-o"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting strace (Debian package strace)")?;
    std::thread::sleep(STRACE_WINDOW);
    stop(&mut strace, libc::SIGINT);
    let text =
        std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    Ok(parse_strace_summary(&text, STRACE_WINDOW.as_secs_f64()))
}

/// strace's `-c` table: `% time  seconds  usecs/call  calls  [errors]  syscall`.
fn parse_strace_summary(text: &str, seconds: f64) -> Vec<(String, f64)> {
    let mut rows: Vec<(String, f64)> = text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let name = *fields.last()?;
            if name == "total" || fields.len() < 5 || fields[0].parse::<f64>().is_err() {
                return None;
            }
            let calls: f64 = fields.get(3)?.parse().ok()?;
            Some((name.to_owned(), calls / seconds))
        })
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows
}

fn memory(pid: u32) -> Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let (heap, other) = smaps_anon(&smaps);
    Ok(Memory {
        rss: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
        heap,
        other_anon_mappings: other,
    })
}

/// (Rss of `[heap]`, Rss of nameless anonymous mappings), KiB.
fn smaps_anon(smaps: &str) -> (u64, u64) {
    let (mut heap, mut other) = (0, 0);
    let mut current: Option<bool> = None;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A mapping header: `start-end perms offset dev inode [name]`.
        if fields
            .first()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            current = match fields.get(5) {
                Some(&"[heap]") => Some(true),
                None if fields.get(4) == Some(&"0") => Some(false),
                _ => None,
            };
        } else if let (Some(&"Rss:"), Some(kib), Some(is_heap)) =
            (fields.first(), fields.get(1), current)
        {
            let kib: u64 = kib.parse().unwrap_or(0);
            if is_heap {
                heap += kib;
            } else {
                other += kib;
            }
        }
    }
    (heap, other)
}

fn scrapes(addr: SocketAddr) -> Result<Scrapes> {
    let mut out = Scrapes::default();
    for _ in 0..SCRAPES {
        let (body, took) = get(addr, "/metrics")?;
        out.times.push(took);
        out.bytes = body.len();
        out.series = String::from_utf8_lossy(&body)
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count();
    }
    Ok(out)
}

/// One pod added and one removed per second over [`WINDOW`]; qosd's CPU share over it and each
/// added pod's manifest -> cgroup time.
fn churn(agent: &Agent, pods: usize, round: &mut Round) -> Result<()> {
    let pid = agent.child.id();
    let before = cpu_seconds(pid)?;
    let started = Instant::now();
    let mut removable: Vec<PathBuf> = (0..pods)
        .map(|i| agent.manifests.join(format!("pod-{i:04}.yaml")))
        .collect();
    let mut added = 0usize;
    while started.elapsed() < WINDOW {
        let tick = Instant::now();
        let known = pod_dirs(&agent.besteffort);
        let name = format!("churn-{added:04}");
        // Every third generated pod is Burstable; churn pods are BestEffort (index 1).
        let path = write_manifest(&agent.manifests, &name, 1)?;
        let written = Instant::now();
        let deadline = written + Duration::from_secs(10);
        loop {
            if pod_dirs(&agent.besteffort)
                .difference(&known)
                .next()
                .is_some()
            {
                round.change_to_cgroup.push(written.elapsed());
                break;
            }
            if Instant::now() > deadline {
                round.change_missed += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        removable.push(path);
        let gone = removable.remove(0);
        std::fs::remove_file(&gone).with_context(|| format!("removing {}", gone.display()))?;
        added += 1;
        if let Some(rest) = Duration::from_secs(1).checked_sub(tick.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    round.churn_cpu = (cpu_seconds(pid)? - before) / started.elapsed().as_secs_f64();
    println!(
        "churn: {added} pods added and removed in {:.0} s, qosd {:.2}% of a core (root /{})",
        started.elapsed().as_secs_f64(),
        round.churn_cpu * 100.0,
        agent.root
    );
    Ok(())
}

/// The `pod*` directories of a tier.
fn pod_dirs(tier: &Path) -> BTreeSet<String> {
    std::fs::read_dir(tier)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("pod"))
                .collect()
        })
        .unwrap_or_default()
}

/// The `p`th percentile (nearest rank) of `values`.
fn percentile(values: &[Duration], p: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "an index into a short list"
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn print_report(rounds: &[Round]) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{:>5} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>17} {:>9} {:>7} {:>21}",
        "pods",
        "idle cpu",
        "peer cpu",
        "churn cpu",
        "rss MiB",
        "anon",
        "heap",
        "scrape med/max ms",
        "size KB",
        "series",
        "change->cgroup p50/p99"
    );
    for r in rounds {
        let _ = writeln!(
            out,
            "{:>5} {:>8.2}% {:>8.2}% {:>8.2}% {:>8.1} {:>8.1} {:>8.1} {:>8.1}/{:<8.1} {:>9.0} {:>7} {:>9.0}/{:<5.0} ms{}",
            r.pods,
            r.idle_cpu * 100.0,
            r.peer_idle_cpu * 100.0,
            r.churn_cpu * 100.0,
            kib_to_mib(r.memory.rss),
            kib_to_mib(r.memory.anon),
            kib_to_mib(r.memory.heap),
            ms(r.scrape.median()),
            ms(r.scrape.max()),
            kb(r.scrape.bytes),
            r.scrape.series,
            ms(percentile(&r.change_to_cgroup, 50.0)),
            ms(percentile(&r.change_to_cgroup, 99.0)),
            if r.change_missed > 0 {
                format!(" ({} missed)", r.change_missed)
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(
        out,
        "\nnode_exporter (the peer, default collectors), same runs:"
    );
    for r in rounds {
        let ratio_cpu = if r.peer_idle_cpu > 0.0 {
            format!("{:.2}x", r.idle_cpu / r.peer_idle_cpu)
        } else {
            "-".to_owned()
        };
        let peer_median = ms(r.peer_scrape.median());
        let ratio_scrape = if peer_median > 0.0 {
            format!("{:.2}x", ms(r.scrape.median()) / peer_median)
        } else {
            "-".to_owned()
        };
        let _ = writeln!(
            out,
            "{:>5} pods: node_exporter scrape {:.1}/{:.1} ms, {:.0} KB, {} series; qosd/node_exporter idle CPU {ratio_cpu}, scrape time {ratio_scrape}",
            r.pods,
            peer_median,
            ms(r.peer_scrape.max()),
            kb(r.peer_scrape.bytes),
            r.peer_scrape.series
        );
    }
    let _ = writeln!(
        out,
        "\nsyscalls per second (strace -c -f, {} s):",
        STRACE_WINDOW.as_secs()
    );
    for r in rounds {
        let top: Vec<String> = r
            .syscalls
            .iter()
            .take(8)
            .map(|(name, rate)| format!("{name} {rate:.0}"))
            .collect();
        let total: f64 = r.syscalls.iter().map(|(_, rate)| rate).sum();
        let _ = writeln!(out, "{:>5} pods: {total:.0}/s: {}", r.pods, top.join(", "));
    }
    let _ = writeln!(
        out,
        "\nmemory breakdown, MiB (RSS = anonymous + file-backed):"
    );
    for r in rounds {
        let m = r.memory;
        let _ = writeln!(
            out,
            "{:>5} pods: rss {:.1} = anon {:.1} (heap {:.1}, other anonymous mappings {:.1}) + file {:.1}",
            r.pods,
            kib_to_mib(m.rss),
            kib_to_mib(m.anon),
            kib_to_mib(m.heap),
            kib_to_mib(m.other_anon_mappings),
            kib_to_mib(m.file)
        );
    }
    let by_pods: BTreeMap<usize, &Round> = rounds.iter().map(|r| (r.pods, r)).collect();
    if let (Some(small), Some(large)) = (by_pods.values().next(), by_pods.values().last())
        && large.pods > small.pods
        && small.idle_cpu > 0.0
    {
        #[expect(clippy::cast_precision_loss, reason = "pod counts")]
        let pods_ratio = large.pods as f64 / small.pods as f64;
        let _ = writeln!(
            out,
            "idle CPU grows {:.1}x from {} to {} pods ({pods_ratio:.0}x the pods)",
            large.idle_cpu / small.idle_cpu,
            small.pods,
            large.pods
        );
    }
    print!("{out}");
}

#[expect(
    clippy::cast_precision_loss,
    reason = "KiB of a process, far below 2^53"
)]
fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[expect(clippy::cast_precision_loss, reason = "bytes of one scrape")]
fn kb(bytes: usize) -> f64 {
    bytes as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_summary_rows_become_rates() {
        // strace 6.1's -c table (Debian bookworm), trimmed.
        let text = "% time     seconds  usecs/call     calls    errors syscall\n\
------ ----------- ----------- --------- --------- ----------------\n\
 40.00    0.004000           2      2000           openat\n\
 30.00    0.003000           1      3000       120 read\n\
 30.00    0.003000           1      1000           close\n\
------ ----------- ----------- --------- --------- ----------------\n\
100.00    0.010000           1      6000       120 total\n";
        let rows = parse_strace_summary(text, 10.0);
        assert_eq!(
            rows,
            vec![
                ("read".to_owned(), 300.0),
                ("openat".to_owned(), 200.0),
                ("close".to_owned(), 100.0)
            ]
        );
    }

    #[test]
    fn heap_and_anonymous_mappings_are_summed_apart() {
        let smaps = "55d0-55d8 rw-p 00000000 00:00 0                          [heap]\n\
Size:                132 kB\n\
Rss:                 100 kB\n\
7f00-7f10 rw-p 00000000 00:00 0 \n\
Rss:                  40 kB\n\
7f10-7f20 r-xp 00000000 08:01 1234                       /usr/lib/libc.so.6\n\
Rss:                 500 kB\n\
7ffc-7ffd rw-p 00000000 00:00 0                          [stack]\n\
Rss:                   8 kB\n";
        assert_eq!(smaps_anon(smaps), (100, 40));
    }

    #[test]
    fn pods_gauge_sums_the_classes_and_percentiles_take_the_nearest_rank() {
        let text = "# HELP qosd_pods x\nqosd_pods{qos_class=\"besteffort\"} 7\nqosd_pods{qos_class=\"burstable\"} 3\nqosd_podsx 9\n";
        assert_eq!(pods_gauge(text), 10);
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&values, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&values, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&[], 99.0), Duration::ZERO);
    }
}
