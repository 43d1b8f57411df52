//! `cargo xtask test`: every tier CI runs, in order, with the time each took and a summary.
//!
//! 1. lint: `cargo fmt --check`; clippy `-D warnings` on user space and on the eBPF crate.
//! 2. unit: `cargo test` of every package that needs no privileges (the fuzz harnesses replay
//!    their seeds and regressions here).
//! 3. fuzz: every libFuzzer target for `--fuzz-seconds` (15 s) from its seeds ([`crate::fuzz`]).
//! 4. deploy: `deploy/` against Kubernetes' schemas, the alert rules through promtool, and the
//!    OCI image built and run (a release build; see [`crate::deploy_check`]).
//! 5. host: `qosd-systests` on this machine (needs root; reported as skipped otherwise).
//! 6. vm: `qosd-systests` inside each guest kernel (5.10, 6.1, 6.12; cgroup v2, 2 NUMA nodes),
//!    then the `systemd_*` cases with systemd as PID 1 ([`SYSTEMD_GUESTS`]: 6.12 and 6.1 on
//!    cgroup v2, 6.1 on the hybrid layout).
//!
//! The binaries are built once (dev profile, shared with the unit tier's build) and the same
//! eBPF object runs on the host and in every guest. The last line is
//! `N passed, N failed, N skipped` over all tiers; the exit status is non-zero on any failure.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::setup::{self, Toolchain};
use crate::vm::{self, GuestExit};

/// Per-guest time limit: boot plus every case under TCG emulation.
const GUEST_TIMEOUT: Duration = Duration::from_secs(900);
/// SIGKILLs of the kill storm in its guest (10 on the host): under emulation every restart
/// and its settling take seconds, and the CI budget is shared by every tier.
const GUEST_CHAOS_KILLS: u32 = 4;
/// Slow cases each guest kernel series runs alone (the others report them skipped, naming
/// this): the capability test on the oldest kernel, the kernel surprises on 6.1, the kill
/// storm on the newest. The host runs all three.
const ONE_GUEST_ONLY: [(&str, &str); 3] = [
    ("listed_capabilities_suffice_for_every_probe", "5.10"),
    ("kernel_surprises_degrade_one_part", "6.1"),
    ("kill_storm_leaves_node_consistent", "6.12"),
];

/// Which tiers to run.
#[derive(Clone, Copy, Debug, clap::Args)]
pub(crate) struct TestArgs {
    /// Skip the lint tier (fmt, clippy).
    #[arg(long)]
    pub no_lint: bool,
    /// Skip the VM tier.
    #[arg(long)]
    pub no_vm: bool,
    /// Seconds each fuzz target runs in the fuzz tier (0 leaves the tier out, reported as
    /// skipped).
    #[arg(long, default_value_t = 15)]
    pub fuzz_seconds: u64,
    /// Leave the image build (a release build, a few minutes) out of the deploy tier.
    #[arg(long)]
    pub no_image: bool,
}

/// One row of the summary.
struct TierResult {
    tier: &'static str,
    target: String,
    counts: CaseCounts,
    took: Duration,
    note: String,
}

impl TierResult {
    /// A tier that could not run at all: one failure, with the reason.
    fn broken(
        tier: &'static str,
        target: impl Into<String>,
        took: Duration,
        error: &anyhow::Error,
    ) -> Self {
        Self {
            tier,
            target: target.into(),
            counts: CaseCounts::one_failure(),
            took,
            note: format!("{error:#}"),
        }
    }
}

/// Runs the tiers and prints the summary.
pub(crate) fn run(args: TestArgs) -> Result<()> {
    let started = Instant::now();
    let toolchain = if args.no_vm {
        setup::build_tools()?
    } else {
        setup::all()?
    };
    let mut results = Vec::new();

    if !args.no_lint {
        results.push(lint(&toolchain));
    }
    results.push(unit(&toolchain));
    results.push(fuzz(&toolchain, args.fuzz_seconds));
    results.push(deploy(!args.no_image));

    let built = build_test_binaries(&toolchain);
    match &built {
        Ok(bins) => {
            results.push(host(bins));
            results.push(leftovers());
            if !args.no_vm {
                results.extend(vms(&toolchain, bins));
            }
        }
        Err(e) => results.push(TierResult::broken(
            "build",
            "qosd + qosd-systests",
            Duration::ZERO,
            e,
        )),
    }

    print_summary(&results, started.elapsed());
    let failed: usize = results.iter().map(|r| r.counts.failed).sum();
    if failed > 0 {
        bail!("{failed} test(s) failed");
    }
    Ok(())
}

fn cargo(toolchain: &Toolchain) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.env("PATH", toolchain.path_env())
        .current_dir(crate::workspace_root());
    cmd
}

fn lint(toolchain: &Toolchain) -> TierResult {
    let started = Instant::now();
    let steps: [(&str, Vec<&str>); 3] = [
        ("fmt", vec!["fmt", "--all", "--check"]),
        (
            "clippy user space",
            vec![
                "clippy",
                "--workspace",
                "--exclude",
                "qosd-ebpf",
                "--all-targets",
                // The benchmarks need the synthetic topologies.
                "--features",
                "qosd/testing",
                "--",
                "-D",
                "warnings",
            ],
        ),
        (
            "clippy eBPF",
            vec![
                "+nightly",
                "clippy",
                "--package",
                "qosd-ebpf",
                "--bins",
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--",
                "-D",
                "warnings",
            ],
        ),
    ];
    let (mut passed, mut failed, mut notes) = (0, 0, Vec::new());
    for (name, args) in steps {
        println!("\n== lint: {name}");
        let mut cmd = cargo(toolchain);
        cmd.args(&args);
        if name == "clippy user space" {
            // Lint needs no kernel object; skipping its build saves a nested eBPF build.
            cmd.env("AYA_BUILD_SKIP", "1");
        }
        if name == "clippy eBPF" {
            // Same cfg the eBPF build gets from aya-build.
            cmd.env("CARGO_CFG_BPF_TARGET_ARCH", "x86_64")
                .env("RUSTFLAGS", "--cfg=bpf_target_arch=\"x86_64\"");
        }
        match cmd.status() {
            Ok(s) if s.success() => passed += 1,
            Ok(s) => {
                failed += 1;
                notes.push(format!("{name}: {s}"));
            }
            Err(e) => {
                failed += 1;
                notes.push(format!("{name}: {e}"));
            }
        }
    }
    TierResult {
        tier: "lint",
        target: "fmt, clippy (user, eBPF)".into(),
        counts: CaseCounts {
            passed,
            failed,
            ..CaseCounts::default()
        },
        took: started.elapsed(),
        note: notes.join("; "),
    }
}

fn unit(toolchain: &Toolchain) -> TierResult {
    let started = Instant::now();
    println!("\n== unit: cargo test");
    let mut cmd = cargo(toolchain);
    cmd.args([
        "test",
        "-p",
        "qosd",
        "-p",
        "qosd-common",
        "-p",
        "xtask",
        "-p",
        "qosd-systests",
        "-p",
        "qosd-fuzz",
    ]);
    let (status, out) = match tee(&mut cmd) {
        Ok(r) => r,
        Err(e) => {
            return TierResult::broken("unit", "cargo test", started.elapsed(), &e);
        }
    };
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for line in out.lines().filter(|l| l.starts_with("test result:")) {
        passed += count_before(line, " passed");
        failed += count_before(line, " failed");
        skipped += count_before(line, " ignored");
    }
    let mut note = String::new();
    if !status && failed == 0 {
        failed = 1;
        note = "cargo test failed before running tests (build error?)".into();
    }
    let failures = out
        .lines()
        .filter(|l| l.starts_with("test ") && l.ends_with(" FAILED"))
        .map(str::to_owned)
        .collect();
    TierResult {
        tier: "unit",
        target: "cargo test".into(),
        counts: CaseCounts {
            passed,
            failed,
            skipped,
            failures,
        },
        took: started.elapsed(),
        note,
    }
}

/// Every fuzz target for `seconds` from its seeds: a target passes when it ran without a crash.
fn fuzz(toolchain: &Toolchain, seconds: u64) -> TierResult {
    let started = Instant::now();
    let target = format!("libFuzzer, {seconds} s per target");
    if seconds == 0 {
        return TierResult {
            tier: "fuzz",
            target,
            counts: CaseCounts {
                skipped: 1,
                ..CaseCounts::default()
            },
            took: Duration::ZERO,
            note: "--fuzz-seconds 0".into(),
        };
    }
    match crate::fuzz::run_targets(toolchain, seconds, None) {
        Ok(runs) => {
            crate::fuzz::print_table(&runs);
            let bad: Vec<String> = runs.iter().filter_map(|r| r.failure()).collect();
            TierResult {
                tier: "fuzz",
                target,
                counts: CaseCounts {
                    passed: runs.len() - bad.len(),
                    failed: bad.len(),
                    skipped: 0,
                    failures: bad.clone(),
                },
                took: started.elapsed(),
                note: bad.join("; "),
            }
        }
        Err(e) => TierResult::broken("fuzz", target, started.elapsed(), &e),
    }
}

fn deploy(with_image: bool) -> TierResult {
    let started = Instant::now();
    println!(
        "\n== deploy: manifests, alert rules{}",
        if with_image { ", image" } else { "" }
    );
    let report = crate::deploy_check::run(with_image);
    TierResult {
        tier: "deploy",
        target: "deploy/: schemas, promtool, image".into(),
        counts: CaseCounts {
            passed: report.passed,
            failed: report.failed,
            skipped: report.skipped,
            failures: report.failures,
        },
        took: started.elapsed(),
        note: report.note,
    }
}

/// `N` from "... N passed; ..." style text.
fn count_before(line: &str, word: &str) -> usize {
    line.find(word)
        .and_then(|end| line[..end].rsplit(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The binaries the privileged tiers run, and the image the Kubernetes case has containerd
/// run (`None`: it could not be built; the case then says so as a skip).
pub(crate) struct TestBinaries {
    pub(crate) qosd: PathBuf,
    pub(crate) systests: PathBuf,
    test_image: Option<PathBuf>,
}

pub(crate) fn build_test_binaries(toolchain: &Toolchain) -> Result<TestBinaries> {
    println!("\n== build: qosd and qosd-systests");
    let mut cmd = cargo(toolchain);
    cmd.args(["build", "-p", "qosd", "-p", "qosd-systests"]);
    setup::run(&mut cmd)?;
    let dir = crate::target_dir().join("debug");
    let test_image = crate::test_image::ensure(&toolchain.cache)
        .inspect_err(|e| println!("test image not built ({e:#}); the Kubernetes case will skip"))
        .ok();
    Ok(TestBinaries {
        qosd: dir.join("qosd"),
        systests: dir.join("qosd-systests"),
        test_image,
    })
}

fn host(bins: &TestBinaries) -> TierResult {
    let started = Instant::now();
    let target = format!(
        "{} ({})",
        read_trimmed("/proc/sys/kernel/osrelease"),
        host_layout()
    );
    println!("\n== host: {target}");
    let mut cmd = Command::new(&bins.systests);
    cmd.arg("--qosd").arg(&bins.qosd);
    if let Some(image) = &bins.test_image {
        cmd.env(crate::test_image::ENV, image);
    }
    let (note, counts) = match tee(&mut cmd) {
        Ok((ok, out)) => {
            let mut counts = parse_results(&out);
            let note = if !ok && counts.failed == 0 {
                counts.failed = 1;
                "qosd-systests failed without a failing case".to_owned()
            } else {
                String::new()
            };
            (note, counts)
        }
        Err(e) => (format!("{e:#}"), CaseCounts::one_failure()),
    };
    TierResult {
        tier: "host",
        target,
        counts,
        took: started.elapsed(),
        note,
    }
}

/// The prefixes of every cgroup the host cases make (cgroupfs and systemd spellings).
const TEST_CGROUP_PREFIXES: [&str; 2] = ["qosd-systest", "qosd_systest"];

/// After the host tier: nothing of the cases is left in the host's cgroupfs (every case
/// removes what it made, also when it fails). Each cgroup mount is searched three levels
/// deep (a test root sits at the top, a systemd-spelled one in a slice).
fn leftovers() -> TierResult {
    let started = Instant::now();
    println!("\n== leftovers: the host's cgroupfs after the host tier");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut found = Vec::new();
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_), Some(mount), Some(kind)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if kind == "cgroup" || kind == "cgroup2" {
            find_test_cgroups(Path::new(mount), 3, &mut found);
        }
    }
    found.sort();
    found.dedup();
    let mut counts = CaseCounts::default();
    let note = if found.is_empty() {
        counts.passed = 1;
        String::new()
    } else {
        counts.failed = 1;
        let listed: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
        let line = format!("test cgroups left behind: {}", listed.join(", "));
        counts.failures.push(line.clone());
        line
    };
    println!(
        "{}",
        if note.is_empty() {
            "RESULT no_test_cgroup_left_in_cgroupfs PASS"
        } else {
            note.as_str()
        }
    );
    TierResult {
        tier: "host",
        target: "leftovers in cgroupfs".to_owned(),
        counts,
        took: started.elapsed(),
        note,
    }
}

fn find_test_cgroups(dir: &Path, depth: u32, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if TEST_CGROUP_PREFIXES.iter().any(|p| name.starts_with(p)) {
            found.push(entry.path());
        } else if depth > 1 {
            find_test_cgroups(&entry.path(), depth - 1, found);
        }
    }
}

fn vms(toolchain: &Toolchain, bins: &TestBinaries) -> Vec<TierResult> {
    let kernels = match vm::ensure_kernels(&toolchain.cache) {
        Ok(k) => k,
        Err(e) => {
            return vec![TierResult::broken(
                "vm",
                "guest kernels",
                Duration::ZERO,
                &e,
            )];
        }
    };
    let work = vm::work_dir();
    let payload = match stripped_payload(bins, &work) {
        Ok(p) => p,
        Err(e) => {
            return vec![TierResult::broken(
                "vm",
                "initramfs payload",
                Duration::ZERO,
                &e,
            )];
        }
    };
    let mut results = Vec::new();
    for kernel in &kernels {
        let started = Instant::now();
        let target = format!("{} (v2, 4 vCPU, 2 NUMA)", kernel.release);
        println!("\n== vm: {target}");
        let image = if bins.test_image.is_some() {
            format!("{}={GUEST_TEST_IMAGE} ", crate::test_image::ENV)
        } else {
            String::new()
        };
        let elsewhere: Vec<&str> = ONE_GUEST_ONLY
            .iter()
            .filter(|(_, series)| *series != kernel.series)
            .map(|(case, _)| *case)
            .collect();
        let command = format!(
            "{image}QOSD_CHAOS_KILLS={GUEST_CHAOS_KILLS} QOSD_SYSTESTS_ELSEWHERE={} /bin/qosd-systests --qosd /bin/qosd",
            elsewhere.join(",")
        );
        let run = vm::run_in_guest(
            kernel,
            &payload,
            &command,
            GUEST_TIMEOUT,
            &work,
            vm::GuestInit::Shell,
        );
        let result = match run {
            Ok(run) => {
                print!("{}", run.output);
                guest_result(&run, target, started)
            }
            Err(e) => TierResult::broken("vm", target, started.elapsed(), &e),
        };
        results.push(result);
    }
    for (series, init, elsewhere) in SYSTEMD_GUESTS {
        if let Some(kernel) = kernels.iter().find(|k| k.series == series) {
            results.push(systemd_guest(kernel, init, elsewhere, &payload, &work));
        }
    }
    results
}

/// Kernel series booted again with systemd as PID 1, for the systemd driver's cases: on
/// cgroup v2, and once on the hybrid layout (v1 controllers, as on the host); with the cases
/// each leaves to the others (reported skipped there). The dashboard case, a minute or more
/// per guest, runs once per cgroup layout: its queries depend on the layout and the probe
/// modes, which the standalone dashboard case already checks on every kernel.
const SYSTEMD_GUESTS: [(&str, vm::GuestInit, &[&str]); 3] = [
    ("6.12", vm::GuestInit::Systemd, &[]),
    (
        "6.1",
        vm::GuestInit::Systemd,
        &["systemd_driver_dashboard_queries_answer"],
    ),
    ("6.1", vm::GuestInit::SystemdHybrid, &[]),
];
/// The cases the systemd guest runs (their names start with it).
const SYSTEMD_CASES: &str = "systemd_";

/// One systemd guest: the systemd driver's cases with systemd as PID 1.
fn systemd_guest(
    kernel: &vm::GuestKernel,
    init: vm::GuestInit,
    elsewhere: &[&str],
    payload: &[(PathBuf, String)],
    work: &Path,
) -> TierResult {
    let started = Instant::now();
    let layout = if init == vm::GuestInit::SystemdHybrid {
        "hybrid"
    } else {
        "v2"
    };
    let target = format!(
        "{} ({layout}, systemd PID 1, 4 vCPU, 2 NUMA)",
        kernel.release
    );
    println!("\n== vm: {target}");
    let command = format!(
        "QOSD_SYSTESTS_ELSEWHERE={} /bin/qosd-systests --qosd /bin/qosd {SYSTEMD_CASES}",
        elsewhere.join(",")
    );
    match vm::run_in_guest(kernel, payload, &command, GUEST_TIMEOUT, work, init) {
        Ok(run) => {
            print!("{}", run.output);
            guest_result(&run, target, started)
        }
        Err(e) => TierResult::broken("vm", target, started.elapsed(), &e),
    }
}

/// A guest run's cases and how the guest ended, as one tier result.
fn guest_result(run: &vm::GuestRun, target: String, started: Instant) -> TierResult {
    let mut counts = parse_results(&run.output);
    let failed = counts.failed;
    let (failed, note) = match &run.exit {
        GuestExit::Exited(0) => (failed, String::new()),
        GuestExit::Exited(code) => (failed.max(1), format!("qosd-systests exited {code}")),
        GuestExit::Panicked(line) => (failed + 1, format!("guest kernel panic: {line}")),
        GuestExit::TimedOut => (
            failed + 1,
            format!("guest hung: no result within {}s", GUEST_TIMEOUT.as_secs()),
        ),
        GuestExit::QemuFailed(why) => (failed + 1, format!("qemu failed: {why}")),
    };
    counts.failed = failed;
    TierResult {
        tier: "vm",
        target,
        counts,
        took: started.elapsed(),
        note,
    }
}

/// Host programs the guest cases run, copied with their shared libraries (installed by setup).
const GUEST_TOOLS: [(&str, &str); 8] = [
    (
        "/usr/bin/numactl",
        "numactl: NUMA placement of the cross-NUMA workloads",
    ),
    (
        "/usr/bin/containerd",
        "containerd: runs the Kubernetes case's pods (CRI)",
    ),
    (
        "/usr/bin/containerd-shim-runc-v2",
        "containerd: the shim between containerd and runc",
    ),
    ("/usr/bin/ctr", "containerd: imports the test image"),
    ("/usr/sbin/runc", "runc: creates the test containers"),
    (
        "/usr/bin/migratepages",
        "numactl: moves a workload's memory away for the NUMA realignment case",
    ),
    (
        "/usr/bin/prometheus",
        "prometheus: runs every dashboard query against the guest's qosd",
    ),
    (
        "/usr/bin/strace",
        "strace: traces qosd's system calls while /inspect is asked",
    ),
];

/// Where the guests find the test image (the Kubernetes case imports it into containerd).
const GUEST_TEST_IMAGE: &str = "/usr/share/qosd/test-image.tar";

/// Where the guests find the Grafana dashboards (the dashboard case reads them there).
const GUEST_DASHBOARD_DIR: &str = "/usr/share/qosd/dashboards";

/// Debug binaries carry hundreds of MB of debug info; the guests get stripped copies, plus the
/// [`GUEST_TOOLS`] and the dashboards.
pub(crate) fn stripped_payload(bins: &TestBinaries, work: &Path) -> Result<Vec<(PathBuf, String)>> {
    let dir = work.join("payload");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut payload = Vec::new();
    for (src, name) in [(&bins.qosd, "qosd"), (&bins.systests, "qosd-systests")] {
        let dst = dir.join(name);
        setup::run(
            Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(&dst)
                .arg(src),
        )
        .with_context(|| format!("stripping {}", src.display()))?;
        payload.push((dst, format!("/bin/{name}")));
    }
    for (tool, why) in GUEST_TOOLS {
        if !Path::new(tool).is_file() {
            bail!("{tool} is missing ({why}); `cargo xtask setup` installs it");
        }
        payload.push((PathBuf::from(tool), tool.to_owned()));
    }
    if let Some(image) = &bins.test_image {
        payload.push((image.clone(), GUEST_TEST_IMAGE.to_owned()));
    }
    let dashboards = crate::workspace_root().join("dashboards");
    for entry in std::fs::read_dir(&dashboards)
        .with_context(|| format!("reading {}", dashboards.display()))?
    {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json")
            && let Some(name) = path.file_name()
        {
            let guest = format!("{GUEST_DASHBOARD_DIR}/{}", name.to_string_lossy());
            payload.push((path, guest));
        }
    }
    Ok(payload)
}

/// What a tier reported.
#[derive(Debug, Default, PartialEq, Eq)]
struct CaseCounts {
    passed: usize,
    failed: usize,
    skipped: usize,
    /// The failing cases, one line each as the tier reported them (`RESULT … FAIL`,
    /// `test … FAILED`), repeated at the end of the summary so the tail of a CI log names them.
    failures: Vec<String>,
}

impl CaseCounts {
    /// A tier that could not run: one failure, named in the tier's note.
    fn one_failure() -> Self {
        Self {
            failed: 1,
            ..Self::default()
        }
    }
}

/// Counts the `RESULT <case> PASS|FAIL|SKIP` lines of qosd-systests.
fn parse_results(output: &str) -> CaseCounts {
    let mut counts = CaseCounts::default();
    for line in output.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("RESULT") {
            continue;
        }
        match words.nth(1) {
            Some("PASS") => counts.passed += 1,
            Some("FAIL") => {
                counts.failed += 1;
                counts.failures.push(line.trim().to_owned());
            }
            Some("SKIP") => counts.skipped += 1,
            _ => {}
        }
    }
    counts
}

/// Runs a command with inherited stderr, echoing and capturing stdout.
pub(crate) fn tee(cmd: &mut Command) -> Result<(bool, String)> {
    use std::io::{BufRead as _, BufReader};
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let mut captured = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading output")?;
            println!("{line}");
            captured.push_str(&line);
            captured.push('\n');
        }
    }
    let status = child.wait().context("waiting")?;
    Ok((status.success(), captured))
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

fn host_layout() -> &'static str {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let has = |fstype: &str| {
        mounts
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(fstype))
    };
    match (has("cgroup"), has("cgroup2")) {
        (true, true) => "cgroup v1 hybrid",
        (true, false) => "cgroup v1",
        (false, _) => "cgroup v2",
    }
}

fn print_summary(results: &[TierResult], total: Duration) {
    println!("\n== qosd test summary ==");
    println!(
        "{:<6} {:<42} {:>6} {:>6} {:>7} {:>7}",
        "tier", "target", "passed", "failed", "skipped", "time"
    );
    for r in results {
        let c = &r.counts;
        let verdict = if c.failed > 0 {
            "FAIL"
        } else if c.passed == 0 && c.skipped > 0 {
            "SKIP"
        } else {
            "ok"
        };
        println!(
            "{:<6} {:<42} {:>6} {:>6} {:>7} {:>6}s  {verdict}{}",
            r.tier,
            r.target,
            c.passed,
            c.failed,
            c.skipped,
            r.took.as_secs(),
            if r.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.note)
            }
        );
    }
    let passed: usize = results.iter().map(|r| r.counts.passed).sum();
    let failed: usize = results.iter().map(|r| r.counts.failed).sum();
    let skipped: usize = results.iter().map(|r| r.counts.skipped).sum();
    let failures: Vec<_> = results
        .iter()
        .flat_map(|r| {
            r.counts
                .failures
                .iter()
                .map(move |f| (r.tier, &r.target, f))
        })
        .collect();
    if !failures.is_empty() {
        println!("failing cases:");
        for (tier, target, failure) in failures {
            println!("  {tier} {target}: {failure}");
        }
    }
    println!("total time {}s", total.as_secs());
    println!("{passed} passed, {failed} failed, {skipped} skipped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_test_result_lines_are_counted() {
        let line = "test result: ok. 12 passed; 3 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.01s";
        assert_eq!(count_before(line, " passed"), 12);
        assert_eq!(count_before(line, " failed"), 3);
        assert_eq!(count_before(line, " ignored"), 2);
    }

    #[test]
    fn systest_result_lines_are_counted_and_noise_ignored() {
        let out = "RUN    a\nRESULT a PASS (1.0s) fine\n[  1.0] kernel noise RESULT\nRESULT b FAIL (0.1s) bad\nRESULT c SKIP (0.0s) needs root\n";
        assert_eq!(
            parse_results(out),
            CaseCounts {
                passed: 1,
                failed: 1,
                skipped: 1,
                failures: vec!["RESULT b FAIL (0.1s) bad".to_owned()],
            }
        );
    }
}
