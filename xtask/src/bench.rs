//! `cargo xtask bench`: runs qosd's criterion benchmarks and prints their figures against the
//! targets the project set (issue 4: topology merge under 10 ms, CPU allocation under 1 ms),
//! and, for every benchmark `X/qosd` with a peer `X/<peer>` measured in the same run, the
//! ratio between them.
//!
//! This module owns the list of benchmarks, how they are run (`cargo bench -p qosd --features
//! testing --bench NAME`, with the kernel object build skipped: benchmarks never load it) and
//! the summary table, parsed from criterion's `time: [low estimate high]` lines.
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::node_bench::Rounds;
use crate::setup;

/// Benchmark targets of package `qosd`, in run order.
const BENCHES: &[&str] = &["topology", "cpu_manager"];

/// Upper bounds per benchmark id prefix (the first match applies).
const TARGETS: &[(&str, Duration)] = &[
    ("topology_merge/", Duration::from_millis(10)),
    ("topology_admit/", Duration::from_millis(10)),
    ("cpu_manager_allocate_release/", Duration::from_millis(1)),
    ("memory_manager_allocate_release/", Duration::from_millis(1)),
];

/// One criterion result.
#[derive(Debug, Clone, PartialEq)]
struct Figure {
    id: String,
    low: Duration,
    estimate: Duration,
    high: Duration,
}

/// Runs every benchmark (or those whose id contains `filter`) and prints the figures.
pub(crate) fn run(filter: Option<&str>) -> Result<()> {
    match filter {
        Some("node") => return node_section(Rounds::All),
        Some("node-kubernetes") => return node_section(Rounds::BesideKubelet),
        _ => {}
    }
    let started = Instant::now();
    let mut figures = Vec::new();
    for bench in BENCHES {
        println!("== cargo bench -p qosd --bench {bench}");
        let mut cmd = Command::new("cargo");
        cmd.args([
            "bench",
            "-p",
            "qosd",
            "--features",
            "testing",
            "--bench",
            bench,
        ])
        .current_dir(crate::workspace_root())
        .env("AYA_BUILD_SKIP", "1")
        .stdout(Stdio::piped());
        if let Some(filter) = filter {
            cmd.args(["--", filter]);
        }
        let mut child = cmd.spawn().context("starting cargo bench")?;
        let stdout = child.stdout.take().context("cargo bench stdout")?;
        let mut previous = String::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading cargo bench output")?;
            println!("{line}");
            if let Some(figure) = parse_line(&line, &previous) {
                figures.push(figure);
            }
            if !line.trim().is_empty() {
                previous = line;
            }
        }
        let status = child.wait().context("waiting for cargo bench")?;
        if !status.success() {
            bail!("cargo bench --bench {bench} failed: {status}");
        }
    }
    print_summary(&figures, started.elapsed());
    if filter.is_none_or(|f| "ebpf_overhead".contains(f)) {
        overhead_section()?;
    }
    if filter.is_none() {
        node_section(Rounds::All)?;
    }
    let over: Vec<&Figure> = figures
        .iter()
        .filter(|f| target_for(&f.id).is_some_and(|t| f.estimate > t))
        .collect();
    if !over.is_empty() {
        bail!("{} benchmark(s) over target", over.len());
    }
    Ok(())
}

fn target_for(id: &str) -> Option<Duration> {
    TARGETS
        .iter()
        .find(|(prefix, _)| id.starts_with(prefix))
        .map(|(_, t)| *t)
}

/// Parses `id  time: [1.2 µs 1.3 µs 1.4 µs]`, or a `time:` line whose id is the previous line.
fn parse_line(line: &str, previous: &str) -> Option<Figure> {
    let (head, rest) = line.split_once("time:")?;
    let id = if head.trim().is_empty() {
        previous.trim()
    } else {
        head.trim()
    };
    let inner = rest.trim().strip_prefix('[')?.strip_suffix(']')?;
    let tokens: Vec<&str> = inner.split_whitespace().collect();
    let [low, low_unit, est, est_unit, high, high_unit] = tokens.as_slice() else {
        return None;
    };
    Some(Figure {
        id: id.to_string(),
        low: duration(low, low_unit)?,
        estimate: duration(est, est_unit)?,
        high: duration(high, high_unit)?,
    })
}

fn duration(value: &str, unit: &str) -> Option<Duration> {
    let value: f64 = value.parse().ok()?;
    let seconds = match unit {
        "ps" => value * 1e-12,
        "ns" => value * 1e-9,
        "µs" | "us" => value * 1e-6,
        "ms" => value * 1e-3,
        "s" => value,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

fn print_summary(figures: &[Figure], elapsed: Duration) {
    println!(
        "\n{:<58} {:>12} {:>25} {:>8}",
        "benchmark", "estimate", "95% interval", "target"
    );
    for f in figures {
        let target = match target_for(&f.id) {
            Some(t) if f.estimate <= t => format!("< {} ok", show(t)),
            Some(t) => format!("< {} OVER", show(t)),
            None => "-".to_string(),
        };
        println!(
            "{:<60} {:>11} {:>25}  {}",
            f.id,
            show(f.estimate),
            format!("[{} {}]", show(f.low), show(f.high)),
            target
        );
    }
    for (ours, peer, ratio) in peer_ratios(figures) {
        println!("{peer} / {ours}: {ratio:.1}x (qosd is {ratio:.1} times faster)");
    }
    println!(
        "{} benchmark(s) in {:.0} s",
        figures.len(),
        elapsed.as_secs_f64()
    );
}

/// (qosd's id, peer's id, peer time / qosd time) for every `X/qosd` with an `X/<peer>`.
fn peer_ratios(figures: &[Figure]) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for ours in figures {
        let Some(case) = ours.id.strip_suffix("/qosd") else {
            continue;
        };
        for peer in figures {
            if peer.id != ours.id
                && peer.id.starts_with(case)
                && peer.id[case.len()..].starts_with('/')
                && ours.estimate > Duration::ZERO
            {
                out.push((
                    ours.id.clone(),
                    peer.id.clone(),
                    peer.estimate.as_secs_f64() / ours.estimate.as_secs_f64(),
                ));
            }
        }
    }
    out
}

/// A duration in the largest unit it reaches.
fn show(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.2} µs", s * 1e6)
    } else {
        format!("{:.1} ns", s * 1e9)
    }
}

/// Builds the release `qosd` and measures its kernel programs against bpftrace.
fn overhead_section() -> Result<()> {
    crate::overhead::run(&release_qosd()?)
}

/// Builds the release `qosd` and measures its node-scale cost against node_exporter.
/// `QOSD_BENCH_BINARY` names another build to measure instead (an earlier commit's, for a
/// before/after comparison on the same machine).
fn node_section(rounds: Rounds) -> Result<()> {
    match std::env::var_os("QOSD_BENCH_BINARY") {
        Some(binary) => {
            setup::bench_tools()?;
            crate::node_bench::run(std::path::Path::new(&binary), rounds)
        }
        None => crate::node_bench::run(&release_qosd()?, rounds),
    }
}

/// Builds the release `qosd` and soaks it in pod churn for `minutes`.
pub(crate) fn soak(minutes: u64) -> Result<()> {
    crate::node_bench::soak::run(&release_qosd()?, minutes)
}

/// The release `qosd`, built with the benchmark tools installed.
fn release_qosd() -> Result<std::path::PathBuf> {
    build_release_qosd(&setup::bench_tools()?)
}

/// Builds the release `qosd` (`cargo build --release -p qosd`, bpf-linker first on PATH for
/// the eBPF object) and returns its path. Also used by `cargo xtask image`.
pub(crate) fn build_release_qosd(toolchain: &setup::Toolchain) -> Result<std::path::PathBuf> {
    setup::run(
        Command::new("cargo")
            .args(["build", "--release", "-p", "qosd"])
            .env("PATH", toolchain.path_env())
            .current_dir(crate::workspace_root()),
    )?;
    Ok(crate::target_dir().join("release/qosd"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_lines_are_parsed() {
        let same_line =
            "topology_merge/8numa_4providers_aligned time:   [1.5000 µs 1.6000 µs 1.7000 µs]";
        let f = parse_line(same_line, "").unwrap();
        assert_eq!(f.id, "topology_merge/8numa_4providers_aligned");
        assert_eq!(f.estimate, Duration::from_nanos(1600));
        let f = parse_line(
            "                        time:   [2.0 ms 2.5 ms 3.0 ms]",
            "topology_merge/34numa_4providers_all_pairs_none_preferred",
        )
        .unwrap();
        assert_eq!(
            f.id,
            "topology_merge/34numa_4providers_all_pairs_none_preferred"
        );
        assert_eq!(f.high, Duration::from_millis(3));
        assert!(parse_line("Benchmarking x: Warming up for 300.00 ms", "").is_none());
        assert!(parse_line("change: [-1.0% +0.5% +2.0%] (p = 0.50 > 0.05)", "").is_none());
    }

    #[test]
    fn targets_apply_by_prefix() {
        assert_eq!(
            target_for("topology_merge/34numa_4providers_aligned"),
            Some(Duration::from_millis(10))
        );
        assert_eq!(
            target_for("cpu_manager_allocate_release/256cpus_8numa_packed"),
            Some(Duration::from_millis(1))
        );
        assert_eq!(target_for("cpu_allocate/256cpus"), None);
        assert_eq!(show(Duration::from_micros(1500)), "1.500 ms");
    }

    #[test]
    fn peers_measured_in_the_same_run_give_ratios() {
        let figure = |id: &str, micros| Figure {
            id: id.to_owned(),
            low: Duration::from_micros(micros),
            estimate: Duration::from_micros(micros),
            high: Duration::from_micros(micros),
        };
        let figures = [
            figure("m/4numa/qosd", 10),
            figure("m/4numa/kubelet_enumeration", 250),
            figure("m/4numa_other", 1),
        ];
        let ratios = peer_ratios(&figures);
        assert_eq!(ratios.len(), 1);
        assert_eq!(ratios[0].1, "m/4numa/kubelet_enumeration");
        assert!((ratios[0].2 - 25.0).abs() < 1e-9);
    }
}
