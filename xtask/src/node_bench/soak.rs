//! `cargo xtask soak --minutes N`: churn for N minutes against the release qosd (as root).
//!
//! qosd starts on [`BASE`] sleeping pods from generated manifests. Then, in waves, [`STEP`] pods
//! are added per second up to [`PEAK`] and removed per second (oldest first) down to
//! [`BASE`] again, about 100 pods per wave, while `/metrics` is scraped every second. At the
//! start, after the wave that ends past half time, and at the end, each time with [`BASE`]
//! pods and settled, it samples qosd's RSS, open fds, threads, eBPF map entries, series in
//! `/metrics` and cgroups under its root, and prints them. The goal is no growth once the pod
//! count is back where it started: the run fails if fds, threads, map entries, series or
//! cgroups end above their start (RSS is printed, not judged: the allocator keeps freed pages).
//! qosd measures every cgroup of the node, so run it where nothing else makes cgroups or starts
//! processes in new ones meanwhile: another workload's cgroups are series and map entries too
//! (a kill storm run beside a soak showed exactly that).
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use super::{Agent, cpu_hierarchy, pods_gauge, start_agent, wait_for_pods, write_manifest};
use crate::procfs::{get, rss_kib, stop};

/// Pods at the start, between waves and at the end.
const BASE: usize = 10;
/// Pods at the top of a wave (kubelet's default `maxPods`).
const PEAK: usize = 110;
/// Pods added (or removed) per second.
const STEP: usize = 2;
/// Time given to qosd after the pod count is back before a sample.
const SETTLE: Duration = Duration::from_secs(5);

/// One sample of qosd's resources.
struct Sample {
    label: &'static str,
    at: Duration,
    created: usize,
    rss_kib: u64,
    fds: usize,
    threads: usize,
    map_entries: BTreeMap<String, u64>,
    series: usize,
    cgroups: usize,
}

impl Sample {
    fn map_total(&self) -> u64 {
        self.map_entries.values().sum()
    }
}

pub(crate) fn run(qosd: &Path, minutes: u64) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the soak runs pods in cgroups and loads eBPF programs: run it as root");
    }
    if minutes == 0 {
        bail!("--minutes must be at least 1");
    }
    let mut agent = start_agent(qosd, BASE, PEAK + 10)?;
    let result = soak(&mut agent, Duration::from_secs(minutes * 60));
    stop(&mut agent.child, libc::SIGTERM);
    let root = cpu_hierarchy()?.join(&agent.root);
    let left = root.exists();
    let _ = std::fs::remove_dir_all(&agent.dir);
    if left {
        bail!("{} still exists after qosd stopped", root.display());
    }
    result
}

fn soak(agent: &mut Agent, length: Duration) -> Result<()> {
    wait_for_pods(agent, BASE)?;
    std::thread::sleep(SETTLE);
    let started = Instant::now();
    let mut samples = vec![sample(agent, "start", started, 0)?];
    let mut churn: VecDeque<PathBuf> = VecDeque::new();
    let (mut created, mut rising) = (0usize, true);
    let (mut scrapes, mut failed, mut slowest) = (0usize, 0usize, Duration::ZERO);
    loop {
        let tick = Instant::now();
        if rising {
            for _ in 0..STEP {
                churn.push_back(write_manifest(
                    &agent.manifests,
                    &format!("soak-{created:05}"),
                    created,
                )?);
                created += 1;
            }
            rising = BASE + churn.len() < PEAK;
        } else {
            for _ in 0..STEP {
                if let Some(oldest) = churn.pop_front() {
                    std::fs::remove_file(&oldest)
                        .with_context(|| format!("removing {}", oldest.display()))?;
                }
            }
            if churn.is_empty() {
                rising = true;
                let elapsed = started.elapsed();
                if samples.len() == 1 && elapsed >= length / 2 {
                    wait_for_pods(agent, BASE)?;
                    std::thread::sleep(SETTLE);
                    samples.push(sample(agent, "middle", started, created)?);
                } else if elapsed >= length {
                    break;
                }
            }
        }
        scrapes += 1;
        match get(agent.addr, "/metrics") {
            Ok((_, took)) => slowest = slowest.max(took),
            Err(_) => failed += 1,
        }
        if let Some(rest) = Duration::from_secs(1).checked_sub(tick.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    wait_for_pods(agent, BASE)?;
    std::thread::sleep(SETTLE);
    samples.push(sample(agent, "end", started, created)?);
    println!(
        "\nsoak: {created} pods created and deleted in {:.1} min ({BASE} to {PEAK} and back, {STEP} per second), root /{}; {scrapes} scrapes, {failed} failed, slowest {:.0} ms",
        started.elapsed().as_secs_f64() / 60.0,
        agent.root,
        slowest.as_secs_f64() * 1000.0
    );
    print_samples(&samples);
    judge(&samples)
}

/// qosd's resources now.
fn sample(agent: &Agent, label: &'static str, started: Instant, created: usize) -> Result<Sample> {
    let pid = agent.child.id();
    let (body, _) = get(agent.addr, "/metrics")?;
    let text = String::from_utf8_lossy(&body);
    let pods = pods_gauge(&text);
    if pods != BASE {
        bail!("sampling {label}: qosd_pods is {pods}, not {BASE}");
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no Threads: in /proc/<pid>/status")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    let mut map_entries = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("qosd_bpf_map_entries{map=\"") else {
            continue;
        };
        if let Some((map, value)) = rest.split_once("\"} ") {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "an entry count gauge"
            )]
            let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
            map_entries.insert(map.to_owned(), n);
        }
    }
    Ok(Sample {
        label,
        at: started.elapsed(),
        created,
        rss_kib: rss_kib(pid)?,
        fds,
        threads,
        map_entries,
        series: text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .count(),
        cgroups: count_dirs(&cpu_hierarchy()?.join(&agent.root)),
    })
}

/// Directories under `dir`, itself included.
fn count_dirs(dir: &Path) -> usize {
    1 + std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| count_dirs(&e.path()))
                .sum()
        })
        .unwrap_or(0)
}

fn print_samples(samples: &[Sample]) {
    println!(
        "\n{:<7} {:>7} {:>8} {:>9} {:>5} {:>8} {:>12} {:>7} {:>8}",
        "sample",
        "at s",
        "created",
        "RSS MiB",
        "fds",
        "threads",
        "map entries",
        "series",
        "cgroups"
    );
    for s in samples {
        #[expect(clippy::cast_precision_loss, reason = "KiB to MiB for display")]
        let rss = s.rss_kib as f64 / 1024.0;
        println!(
            "{:<7} {:>7.0} {:>8} {:>9.1} {:>5} {:>8} {:>12} {:>7} {:>8}",
            s.label,
            s.at.as_secs_f64(),
            s.created,
            rss,
            s.fds,
            s.threads,
            s.map_total(),
            s.series,
            s.cgroups
        );
    }
    if let Some(end) = samples.last() {
        println!("map entries at the end: {:?}", end.map_entries);
    }
}

/// Fails when a countable resource ended above its start.
fn judge(samples: &[Sample]) -> Result<()> {
    let (Some(start), Some(end)) = (samples.first(), samples.last()) else {
        bail!("no samples");
    };
    let figures = [
        ("open fds", start.fds as u64, end.fds as u64),
        ("threads", start.threads as u64, end.threads as u64),
        ("eBPF map entries", start.map_total(), end.map_total()),
        ("series", start.series as u64, end.series as u64),
        ("cgroups", start.cgroups as u64, end.cgroups as u64),
    ];
    let grew: Vec<String> = figures
        .iter()
        .filter(|(_, before, after)| after > before)
        .map(|(what, before, after)| format!("{what} {before} -> {after}"))
        .collect();
    #[expect(clippy::cast_precision_loss, reason = "a ratio for display")]
    let rss = end.rss_kib as f64 / start.rss_kib.max(1) as f64;
    println!("RSS end/start: {rss:.2}x (not judged)");
    if grew.is_empty() {
        println!("no growth: fds, threads, map entries, series and cgroups at the end <= start");
        Ok(())
    } else {
        bail!("grew over the soak: {}", grew.join(", "))
    }
}
