//! `cargo xtask fuzz`: every libFuzzer target of `fuzz/` (cargo-fuzz), each run for a while
//! from its seed corpus, with executions, new inputs and crashes printed per target. The fuzz
//! tier of `cargo xtask test` runs the same with a short time per target.
//!
//! The targets are built once with cargo-fuzz (nightly, `--sanitizer none`: qosd's parsers are
//! safe Rust, so the fuzzers look for panics, overflows the debug assertions catch, and
//! unbounded time or memory, which libFuzzer's `-timeout` and `-malloc_limit_mb` turn into
//! crashes). Each binary then runs directly, its new inputs kept in a working corpus under the
//! target directory (the repository's seeds are never written), its crashes in an artifacts
//! directory beside it.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::setup::Toolchain;

/// cargo-fuzz, pinned: the version this was written and tested with.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// The targets (binaries of `fuzz/Cargo.toml`, harnesses in `fuzz/src/lib.rs`) and the longest
/// input each is given: a few bytes of quantity, whole files elsewhere.
const TARGETS: &[(&str, usize)] = &[
    ("quantity", 128),
    ("manifest", 65_536),
    ("kubelet_config", 16_384),
    ("checkpoint", 16_384),
    ("kubernetes_pod", 16_384),
    ("cgroup_stat", 16_384),
    ("cpu_list", 512),
    ("mountinfo", 16_384),
    ("sysfs_numa", 4096),
    ("btf", 65_536),
];

/// An input that runs longer than this is a crash (`-timeout`).
const INPUT_TIMEOUT_SECS: u32 = 10;

/// A single allocation above this is a crash (`-malloc_limit_mb`): qosd reads files of
/// kilobytes; a parser that asks for this much from one is unbounded.
const MALLOC_LIMIT_MB: u32 = 256;

/// What one target did.
pub(crate) struct TargetRun {
    pub name: &'static str,
    pub executions: u64,
    pub new_inputs: u64,
    pub corpus: u64,
    pub took: Duration,
    /// Crash inputs written by libFuzzer, with the panic message when one was printed.
    pub crashes: Vec<String>,
    /// Why the target could not run (a failure too).
    pub error: Option<String>,
}

impl TargetRun {
    /// `target: first crash (or the error)` when the target crashed or could not run.
    pub(crate) fn failure(&self) -> Option<String> {
        let first = self.crashes.first().or(self.error.as_ref())?;
        Some(format!("{}: {first}", self.name))
    }
}

/// `cargo xtask fuzz`: builds and runs every target (or those whose name contains `only`).
pub(crate) fn run_alone(seconds: u64, only: Option<&str>) -> Result<()> {
    let toolchain = crate::setup::build_tools()?;
    let runs = run_targets(&toolchain, seconds, only)?;
    print_table(&runs);
    let failures: Vec<String> = runs.iter().filter_map(TargetRun::failure).collect();
    if !failures.is_empty() {
        bail!(
            "targets with crashes or errors: {}. Fix the parser, add a unit test named after the bug, and keep the input in fuzz/regressions/<target>/",
            failures.join("; ")
        );
    }
    Ok(())
}

/// Builds the targets and runs each for `seconds`.
pub(crate) fn run_targets(
    toolchain: &Toolchain,
    seconds: u64,
    only: Option<&str>,
) -> Result<Vec<TargetRun>> {
    let cargo_fuzz = ensure_cargo_fuzz(&toolchain.cache)?;
    let target_dir = fuzz_target_dir();
    build(toolchain, &cargo_fuzz, &target_dir)?;
    let bin_dir = target_dir.join("x86_64-unknown-linux-gnu/release");
    let work = target_dir.join("work");
    let seeds = crate::workspace_root().join("fuzz/corpus");
    let mut runs = Vec::new();
    for (name, max_len) in TARGETS {
        if only.is_some_and(|o| !name.contains(o)) {
            continue;
        }
        println!("\n== fuzz: {name} for {seconds} s");
        runs.push(run_target(
            name,
            *max_len,
            seconds,
            &bin_dir.join(name),
            &work,
            &seeds.join(name),
        ));
    }
    if runs.is_empty() {
        bail!("no fuzz target matches {only:?}");
    }
    Ok(runs)
}

/// The fuzz builds' own directory: instrumented code never mixes with the tiers' builds.
fn fuzz_target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| crate::workspace_root().join("target"), PathBuf::from)
        .join("fuzz")
}

/// cargo-fuzz from crates.io into the cache, once.
fn ensure_cargo_fuzz(cache: &Path) -> Result<PathBuf> {
    let root = cache.join("cargo-fuzz");
    let binary = root.join("bin/cargo-fuzz");
    let stamp = root.join("version");
    if binary.exists() && std::fs::read_to_string(&stamp).is_ok_and(|v| v == CARGO_FUZZ_VERSION) {
        return Ok(binary);
    }
    println!("setup: installing cargo-fuzz {CARGO_FUZZ_VERSION} (about 30 s, once)");
    let status = Command::new("cargo")
        .args([
            "install",
            "cargo-fuzz",
            "--locked",
            "--force",
            "--version",
            CARGO_FUZZ_VERSION,
        ])
        .arg("--root")
        .arg(&root)
        .status()
        .context("running cargo install cargo-fuzz")?;
    if !status.success() {
        bail!(
            "cargo install cargo-fuzz {CARGO_FUZZ_VERSION} failed ({status}); it needs crates.io"
        );
    }
    std::fs::write(&stamp, CARGO_FUZZ_VERSION)
        .with_context(|| format!("writing {}", stamp.display()))?;
    Ok(binary)
}

fn build(toolchain: &Toolchain, cargo_fuzz: &Path, target_dir: &Path) -> Result<()> {
    println!(
        "\n== fuzz: building the targets (cargo fuzz build, nightly, no sanitizer, debug assertions)"
    );
    // `cargo fuzz` finds the subcommand on PATH, the cache's copy first.
    let mut path = vec![cargo_fuzz.parent().map(Path::to_owned).unwrap_or_default()];
    path.extend(std::env::split_paths(&toolchain.path_env()));
    let path = std::env::join_paths(path).context("PATH with cargo-fuzz")?;
    let status = Command::new("cargo")
        .args([
            "+nightly",
            "fuzz",
            "build",
            "--sanitizer",
            "none",
            "--debug-assertions",
            "--fuzz-dir",
        ])
        .arg(crate::workspace_root().join("fuzz"))
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(crate::workspace_root())
        .env("PATH", path)
        // The harnesses parse; they never load the kernel object.
        .env("AYA_BUILD_SKIP", "1")
        .status()
        .context("running cargo fuzz build")?;
    if !status.success() {
        bail!("cargo fuzz build failed ({status})");
    }
    Ok(())
}

fn run_target(
    name: &'static str,
    max_len: usize,
    seconds: u64,
    binary: &Path,
    work: &Path,
    seeds: &Path,
) -> TargetRun {
    let started = Instant::now();
    let mut run = TargetRun {
        name,
        executions: 0,
        new_inputs: 0,
        corpus: 0,
        took: Duration::ZERO,
        crashes: Vec::new(),
        error: None,
    };
    let corpus = work.join("corpus").join(name);
    let artifacts = work.join("artifacts").join(name);
    // Crashes of an earlier run are kept in fuzz/regressions once fixed; here they go.
    let _ = std::fs::remove_dir_all(&artifacts);
    for dir in [&corpus, &artifacts] {
        if let Err(e) = std::fs::create_dir_all(dir) {
            run.error = Some(format!("{}: {e}", dir.display()));
            return run;
        }
    }
    let output = Command::new(binary)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-max_len={max_len}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .arg(format!("-malloc_limit_mb={MALLOC_LIMIT_MB}"))
        .arg("-rss_limit_mb=2048")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(&corpus)
        .arg(seeds)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    run.took = started.elapsed();
    let output = match output {
        Ok(o) => o,
        Err(e) => {
            run.error = Some(format!("{}: {e}", binary.display()));
            return run;
        }
    };
    let log = String::from_utf8_lossy(&output.stderr);
    let stats = FinalStats::parse(&log);
    run.executions = stats.executions;
    run.new_inputs = stats.new_units;
    run.corpus = std::fs::read_dir(&corpus).map_or(0, |d| d.count() as u64);
    let panic = log
        .lines()
        .find(|l| l.contains("panicked at"))
        .map(|l| l.trim().to_owned());
    if let Ok(entries) = std::fs::read_dir(&artifacts) {
        for entry in entries.flatten() {
            run.crashes.push(format!(
                "{}{}",
                entry.path().display(),
                panic
                    .as_deref()
                    .map(|p| format!(" ({p})"))
                    .unwrap_or_default()
            ));
        }
    }
    if !output.status.success() && run.crashes.is_empty() {
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        run.error = Some(format!(
            "exited {} without a crash input: {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    run
}

/// The counters of libFuzzer's `-print_final_stats=1`.
#[derive(Debug, Default, PartialEq, Eq)]
struct FinalStats {
    executions: u64,
    new_units: u64,
}

impl FinalStats {
    fn parse(log: &str) -> Self {
        let stat = |key: &str| {
            log.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        Self {
            executions: stat("stat::number_of_executed_units:"),
            new_units: stat("stat::new_units_added:"),
        }
    }
}

/// One line per target: executions, rate, new inputs, corpus size, crashes.
pub(crate) fn print_table(runs: &[TargetRun]) {
    println!(
        "\n{:<16} {:>12} {:>10} {:>6} {:>7} {:>8} {:>7}",
        "target", "executions", "per s", "new", "corpus", "crashes", "took"
    );
    for run in runs {
        let secs = run.took.as_secs_f64().max(0.001);
        #[expect(
            clippy::cast_precision_loss,
            reason = "a rate for people to read; exact to 2^53 executions"
        )]
        let rate = run.executions as f64 / secs;
        println!(
            "{:<16} {:>12} {:>10.0} {:>6} {:>7} {:>8} {:>6.0}s",
            run.name,
            run.executions,
            rate,
            run.new_inputs,
            run.corpus,
            run.crashes.len(),
            secs
        );
        for crash in &run.crashes {
            println!("  crash: {crash}");
        }
        if let Some(error) = &run.error {
            println!("  error: {error}");
        }
    }
    let total: u64 = runs.iter().map(|r| r.executions).sum();
    let crashes: usize = runs.iter().map(|r| r.crashes.len()).sum();
    println!(
        "{} targets, {total} executions, {crashes} crashes",
        runs.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_stats_are_read_from_libfuzzers_log() {
        let log = "#2\tINITED cov: 10\nDone 1234 runs in 2 second(s)\n\
                   stat::number_of_executed_units: 1234\nstat::average_exec_per_sec:     617\n\
                   stat::new_units_added:          7\nstat::slowest_unit_time_sec:     0\n";
        assert_eq!(
            FinalStats::parse(log),
            FinalStats {
                executions: 1234,
                new_units: 7
            }
        );
        assert_eq!(FinalStats::parse("no stats"), FinalStats::default());
    }

    #[test]
    fn every_target_has_a_binary_and_seeds() {
        let root = crate::workspace_root();
        let manifest =
            std::fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
        for (name, _) in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{name}\"")),
                "{name} is not a binary of fuzz/Cargo.toml"
            );
            assert!(
                root.join("fuzz/corpus").join(name).is_dir(),
                "{name} has no seed corpus"
            );
        }
        let binaries = manifest.matches("[[bin]]").count();
        assert_eq!(
            binaries,
            TARGETS.len(),
            "fuzz/Cargo.toml has targets xtask does not run"
        );
    }
}
