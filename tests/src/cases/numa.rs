//! Cross-NUMA memory: qosd's per-cgroup NUMA series against the kernel's own accounting.
//!
//! One placement measurement serves the memory, hinting-fault and page-allocation checks. With
//! two or more nodes, two memory workloads run side by side in their own cgroups, both on the
//! CPUs of the first node: "remote" with its memory bound to the second node, "local" with its
//! memory bound to the first. With one node (the host), only "local" runs.
//!
//! How the memory is bound matters for the hinting faults: NUMA balancing skips memory under an
//! explicit policy unless the policy carries `MPOL_F_NUMA_BALANCING` (`numactl --balancing`,
//! Linux 5.12+). Measured on the 5.10 guest: `numactl -b --membind=1` is accepted there but the
//! kernel takes no hinting fault at all (the flag is unknown to it), whereas the cgroup's own
//! `cpuset.mems` leaves the task's default policy in place and the faults come (all remote;
//! balancing cannot move the pages off the allowed node). So kernels from 5.12 on use
//! `numactl --balancing --cpunodebind=A --membind=B`; older ones `cpuset.cpus` of node A and
//! `cpuset.mems = B` on the workload's cgroup. Either way the cgroup's `cpuset.cpus` is node
//! A's, which is what `qosd_numa_memory_bytes` judges locality against.
//!
//! Kernel references: `memory.numa_stat` (per node, and its total against the workload's
//! `RssAnon`), `/proc/vmstat` `numa_hint_faults` / `numa_hint_faults_local` read around each scrape
//! (system-wide, so compared with qosd's sum over every cgroup), the cgroup's resident pages
//! (allocations must cover them), and `/proc/<pid>/sched` `se.nr_migrations` for migrations.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use qosd::cgroup::CgroupLayout;

use crate::agent::{Agent, sample_value, sum_where};
use crate::cgroup_fixture::TestCgroups;
use crate::harness::{Context, Outcome, fail};
use crate::workload::{NumaBalancing, node_cpus, pin, proc_value, vmstat, wait_exec};

/// Size of each memory workload.
const WORKLOAD_MIB: u64 = 64;
/// The workloads run longer than the measurement and are killed after it.
const WORKLOAD_SECS: &str = "120";
/// How long hinting faults and allocations are counted once the memory is resident.
const WINDOW: Duration = Duration::from_secs(8);
/// The remote workload must be at least this remote, the local one at most 1 - this.
const REMOTE_SHARE: f64 = 0.90;
/// qosd's `memory.numa_stat` bytes against the file read a moment later.
const NUMA_STAT_TOLERANCE: f64 = 0.02;
/// qosd's hinting faults (all cgroups) against `/proc/vmstat` over the same window.
const VMSTAT_TOLERANCE: f64 = 0.10;
/// Fewer hinting faults than this in a workload's cgroup cannot judge a share.
const MIN_HINT_FAULTS: f64 = 10.0;
/// Affinity flips per migration phase.
const FLIPS: u64 = 20;
const HINT_PROBE: &str = "numa_hint_fault";
const PAGE: u64 = 4096;

/// One workload's numbers.
#[derive(Debug)]
struct Run {
    /// `remote` or `local`: the child cgroup's name.
    name: &'static str,
    /// The node its memory is bound to.
    mem_node: u32,
    /// qosd_numa_memory_bytes by locality (local, remote).
    memory: (f64, f64),
    /// memory.numa_stat resident bytes, per node.
    kernel_bytes: BTreeMap<u32, u64>,
    /// The workload's RssAnon, bytes.
    rss_anon: u64,
    /// qosd_numa_hint_faults_total (local, remote).
    hints: (f64, f64),
    /// qosd_numa_page_allocations_total (local, remote), pages.
    allocs: (f64, f64),
}

/// The whole placement measurement.
#[derive(Debug)]
struct Placement {
    runs: Vec<Run>,
    /// How the memory was placed, for messages.
    method: String,
    nodes: usize,
    /// The hinting-fault probe's `qosd check` line when it is not attached.
    hint_unavailable: Option<String>,
    /// qosd's hinting faults of every cgroup over the window, against the kernel's.
    window: Option<HintWindow>,
    /// Whether the counters of the removed test cgroups left the maps and the exposition.
    cleanup: Result<String, String>,
}

/// qosd's hinting faults of every cgroup between two scrapes, and the kernel's counters read
/// just before and just after each scrape. qosd reads its maps at some instant inside each
/// scrape, so its delta lies between the kernel's inner delta (after the first scrape to before
/// the second) and its outer delta (before the first to after the second); under emulation a
/// scrape takes long enough for a burst of faults to land inside it.
#[derive(Debug)]
struct HintWindow {
    /// qosd_numa_hint_faults_total (local, remote).
    qosd: (f64, f64),
    /// `/proc/vmstat` (`numa_hint_faults`, `numa_hint_faults_local`), inner delta.
    kernel_inner: (f64, f64),
    /// The same, outer delta.
    kernel_outer: (f64, f64),
}

/// One agent run serves every case but the raw_tracepoint one (each agent start costs about
/// ten seconds under emulation): its `qosd_probe_info` lines, the placement measurement and
/// the migration measurement, each with its own result.
struct Session {
    probe_info: String,
    placement: Result<Placement, String>,
    migrations: Result<Option<String>, String>,
}

static SESSION: OnceLock<Result<Session, String>> = OnceLock::new();

fn session(ctx: &Context) -> Result<&'static Session, String> {
    SESSION
        .get_or_init(|| {
            let agent = Agent::start(&ctx.qosd, Duration::from_secs(60))?;
            let probe_info = agent
                .scrape()?
                .lines()
                .filter(|l| l.starts_with("qosd_probe_info{"))
                .collect::<Vec<_>>()
                .join("\n");
            let placement = measure_placement(ctx, &agent, &probe_info);
            let migrations = measure_migrations(ctx, &agent, "tp_btf");
            Ok(Session {
                probe_info,
                placement,
                migrations,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn placement(ctx: &Context) -> Result<&'static Placement, String> {
    session(ctx)?.placement.as_ref().map_err(Clone::clone)
}

fn share(local: f64, remote: f64) -> f64 {
    if local + remote > 0.0 {
        remote / (local + remote)
    } else {
        0.0
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// Checks one workload's remote share against its placement.
fn share_ok(run: &Run, remote: f64) -> bool {
    if run.name == "remote" {
        remote >= REMOTE_SHARE
    } else {
        remote <= 1.0 - REMOTE_SHARE
    }
}

/// `qosd_numa_memory_bytes`: the remote workload's memory at least 90 % remote, the local one's
/// at most 10 %; each cgroup's sum within 2 % of its `memory.numa_stat` and close to the
/// workload's resident anonymous memory.
pub(crate) fn memory_bytes(ctx: &Context) -> Outcome {
    judge(ctx, |p, lines, bad| {
        for run in &p.runs {
            let qosd = run.memory.0 + run.memory.1;
            let kernel = run.kernel_bytes.values().sum::<u64>() as f64;
            let remote = share(run.memory.0, run.memory.1);
            let rss = run.rss_anon as f64;
            let stat_apart = (qosd - kernel).abs() / kernel.max(1.0);
            lines.push(format!(
            "{}: {} remote of {:.1} MiB; memory.numa_stat {:.1} MiB ({} apart) {:?}; RssAnon {:.1} MiB",
            run.name,
            pct(remote),
            qosd / 1048576.0,
            kernel / 1048576.0,
            pct(stat_apart),
            run.kernel_bytes,
            rss / 1048576.0
        ));
            if !share_ok(run, remote) {
                bad.push(format!("{} has {} remote", run.name, pct(remote)));
            }
            if stat_apart > NUMA_STAT_TOLERANCE {
                bad.push(format!("{} differs from memory.numa_stat", run.name));
            }
            // The cgroup holds the workload's anonymous memory plus a little (page cache it
            // touched first, the shell before exec); it cannot hold less than the workload.
            if qosd < rss * 0.95 || qosd > rss * 1.10 + 4.0 * 1048576.0 {
                bad.push(format!("{} is not the workload's resident size", run.name));
            }
            if p.nodes == 1 && run.memory.1 > 0.0 {
                bad.push("one node, yet memory counted remote".into());
            }
        }
        None
    })
}

/// Once the test cgroups are gone, their entries leave the NUMA maps and their series the
/// exposition (the maps stay bounded by the cgroups that exist).
pub(crate) fn removed_cgroups_forgotten(ctx: &Context) -> Outcome {
    match placement(ctx).and_then(|p| p.cleanup.clone()) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// `qosd_numa_hint_faults_total`: the remote workload's faults at least 90 % remote, the local
/// one's at most 10 %; qosd's sum over every cgroup against `/proc/vmstat` over the same window.
pub(crate) fn hint_faults(ctx: &Context) -> Outcome {
    judge(ctx, |p, lines, bad| {
        if let Some(reason) = &p.hint_unavailable {
            return Some(Outcome::Skip(format!(
                "hinting-fault check not run, the probe is unavailable here: {reason}"
            )));
        }
        if p.nodes < 2 {
            return Some(Outcome::Skip(
                "one NUMA node: NUMA balancing takes no hinting faults, nothing to judge".into(),
            ));
        }
        for run in &p.runs {
            let total = run.hints.0 + run.hints.1;
            let remote = share(run.hints.0, run.hints.1);
            lines.push(format!(
                "{}: {total} faults, {} remote",
                run.name,
                pct(remote)
            ));
            if total < MIN_HINT_FAULTS {
                bad.push(format!(
                    "{} took only {total} hinting faults; the check cannot judge",
                    run.name
                ));
            } else if !share_ok(run, remote) {
                bad.push(format!("{} has {} remote", run.name, pct(remote)));
            }
        }
        if let Some(w) = &p.window {
            let q_total = w.qosd.0 + w.qosd.1;
            let (low, high) = (w.kernel_inner.0, w.kernel_outer.0);
            let q_share = share(w.qosd.0, w.qosd.1);
            let k_share = share(w.kernel_outer.1, w.kernel_outer.0 - w.kernel_outer.1);
            lines.push(format!(
                "window, every cgroup: qosd {q_total} faults ({} remote) vs /proc/vmstat numa_hint_faults {low} inside the scrapes, {high} around them ({} remote by numa_hint_faults_local)",
                pct(q_share),
                pct(k_share),
            ));
            if high <= 0.0 {
                bad.push("the kernel counted no hinting faults in the window".into());
            } else if q_total < low * (1.0 - VMSTAT_TOLERANCE) - 5.0
                || q_total > high * (1.0 + VMSTAT_TOLERANCE) + 5.0
            {
                bad.push(format!(
                    "qosd's total is outside /proc/vmstat's bounds [{low}, {high}] by more than {}",
                    pct(VMSTAT_TOLERANCE)
                ));
            }
            if (q_share - k_share).abs() > VMSTAT_TOLERANCE {
                bad.push("qosd's remote share differs from /proc/vmstat's".into());
            }
        }
        None
    })
}

/// `qosd_numa_page_allocations_total`: the remote workload's pages at least 90 % remote, the
/// local one's at most 10 % (with one node: none remote); every cgroup allocated at least the
/// pages `memory.numa_stat` shows resident.
pub(crate) fn page_allocations(ctx: &Context) -> Outcome {
    judge(ctx, |p, lines, bad| {
        for run in &p.runs {
            let total = run.allocs.0 + run.allocs.1;
            let remote = share(run.allocs.0, run.allocs.1);
            let resident = (run.kernel_bytes.values().sum::<u64>() / PAGE) as f64;
            lines.push(format!(
            "{}: {total} pages allocated, {} remote; {resident} pages resident by memory.numa_stat",
            run.name,
            pct(remote)
        ));
            if total < resident {
                bad.push(format!("{} allocated fewer pages than it holds", run.name));
            }
            if !share_ok(run, remote) || (p.nodes == 1 && run.allocs.1 > 0.0) {
                bad.push(format!("{} has {} remote", run.name, pct(remote)));
            }
        }
        None
    })
}

/// Runs `check` on the placement measurement: it adds summary lines and problems, or returns
/// an outcome of its own (a skip). No problem is a pass.
fn judge(
    ctx: &Context,
    check: impl FnOnce(&Placement, &mut Vec<String>, &mut Vec<String>) -> Option<Outcome>,
) -> Outcome {
    let p = match placement(ctx) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let (mut lines, mut bad) = (Vec::new(), Vec::new());
    if let Some(outcome) = check(p, &mut lines, &mut bad) {
        return outcome;
    }
    let summary = format!("{}; {}", p.method, lines.join("; "));
    if bad.is_empty() {
        Outcome::Pass(summary)
    } else {
        fail(format!("{}: {summary}", bad.join("; ")))
    }
}

/// (major, minor) of the running kernel.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The qosd check line of a probe.
fn check_line(ctx: &Context, probe: &str) -> Option<String> {
    let out = std::process::Command::new(&ctx.qosd)
        .arg("check")
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{probe} ")))
        .map(|l| l.trim().to_owned())
}

fn write(path: &std::path::Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value} to {}: {e}", path.display()))
}

/// Resident bytes per node from `memory.numa_stat`: v2 `anon` + `file` lines (bytes), v1 the
/// `hierarchical_total` line (pages).
pub(super) fn kernel_numa_stat(dir: &std::path::Path) -> Result<BTreeMap<u32, u64>, String> {
    let file = dir.join("memory.numa_stat");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let key = fields.next().unwrap_or_default();
        let scale = match key.split_once('=').map_or(key, |(k, _)| k) {
            "anon" | "file" if !key.contains('=') => 1,
            "hierarchical_total" => PAGE,
            _ => continue,
        };
        for field in fields {
            if let Some((node, value)) = field.strip_prefix('N').and_then(|f| f.split_once('='))
                && let (Ok(node), Ok(value)) = (node.parse::<u32>(), value.parse::<u64>())
            {
                *out.entry(node).or_default() += value * scale;
            }
        }
    }
    Ok(out)
}

fn measure_placement(ctx: &Context, agent: &Agent, probe_info: &str) -> Result<Placement, String> {
    let nodes = node_cpus()?;
    let layout = CgroupLayout::detect().map_err(|e| e.to_string())?;
    let memory_root: PathBuf = layout
        .v1
        .get("memory")
        .or(layout.unified.as_ref())
        .ok_or("no memory hierarchy")?
        .clone();
    let v2 = !layout.v1.contains_key("memory");
    let hint_live = sample_value(
        probe_info,
        "qosd_probe_info",
        &format!("mode=\"fentry\",probe=\"{HINT_PROBE}\""),
    ) == Some(1.0);
    let hint_unavailable = (!hint_live).then(|| {
        check_line(ctx, HINT_PROBE).unwrap_or_else(|| format!("{HINT_PROBE} not attached"))
    });
    let mut node_ids = nodes.keys().copied();
    let cpu_node = node_ids.next().ok_or("no NUMA node")?;
    let far_node = node_ids.next();
    let cpu_list = nodes[&cpu_node]
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let _balancing = if hint_live && far_node.is_some() {
        Some(NumaBalancing::set(true)?)
    } else {
        None
    };
    let with_balancing_flag = kernel_version() >= (5, 12);
    let method = match (far_node, with_balancing_flag) {
        (None, _) => format!("one node: workload on node {cpu_node} (no binding)"),
        (Some(_), true) => format!(
            "numactl --balancing --cpunodebind={cpu_node} --membind=N, cgroup cpuset.cpus {cpu_list}"
        ),
        (Some(_), false) => format!(
            "cgroup cpuset.cpus {cpu_list} and cpuset.mems N (kernel < 5.12: no MPOL_F_NUMA_BALANCING, a --membind policy takes no hinting faults)"
        ),
    };
    let mut cgroups = TestCgroups::create_with_memory("qosd-systest-numa")?;
    let placements: Vec<(&'static str, u32)> = match far_node {
        Some(far) => vec![("remote", far), ("local", cpu_node)],
        None => vec![("local", cpu_node)],
    };
    let exe = ctx.self_exe.to_string_lossy().into_owned();
    let mib = WORKLOAD_MIB.to_string();
    let mut pids = Vec::new();
    for &(name, mem_node) in &placements {
        cgroups.mkdir(name)?;
        let dir = cgroups.dir_in(&memory_root, name);
        let mut numactl_args: Vec<String> = Vec::new();
        if far_node.is_some() && v2 {
            write(&dir.join("cpuset.cpus"), &cpu_list)?;
            if with_balancing_flag {
                numactl_args = vec![
                    "--balancing".to_owned(),
                    format!("--cpunodebind={cpu_node}"),
                    format!("--membind={mem_node}"),
                ];
            } else {
                write(&dir.join("cpuset.mems"), &mem_node.to_string())?;
            }
        }
        let workload = [
            exe.clone(),
            "memory".into(),
            mib.clone(),
            WORKLOAD_SECS.into(),
        ];
        let pid = if numactl_args.is_empty() {
            let args: Vec<&str> = workload[1..].iter().map(String::as_str).collect();
            cgroups.spawn_in(name, &ctx.self_exe, &args)?
        } else {
            numactl_args.extend(workload);
            let args: Vec<&str> = numactl_args.iter().map(String::as_str).collect();
            cgroups.spawn_in(name, &which("numactl")?, &args)?
        };
        pids.push(pid);
    }
    // Wait until each workload's memory is resident.
    let want = WORKLOAD_MIB * 1048576 * 9 / 10;
    let deadline = Instant::now() + Duration::from_secs(60);
    for &(name, _) in &placements {
        let dir = cgroups.dir_in(&memory_root, name);
        loop {
            let resident: u64 = kernel_numa_stat(&dir)?.values().sum();
            if resident >= want {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{name}: only {resident} bytes resident after 60 s (want {want})"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let hint_sums = |text: &str| {
        (
            sum_where(
                text,
                "qosd_numa_hint_faults_total",
                &[("locality", "local")],
            ),
            sum_where(
                text,
                "qosd_numa_hint_faults_total",
                &[("locality", "remote")],
            ),
        )
    };
    let vm = || {
        (
            vmstat("numa_hint_faults").unwrap_or(0) as f64,
            vmstat("numa_hint_faults_local").unwrap_or(0) as f64,
        )
    };
    let vm_outer_before = vm();
    let before = hint_sums(&agent.scrape()?);
    let vm_inner_before = vm();
    std::thread::sleep(WINDOW);
    let vm_inner_after = vm();
    let text = agent.scrape()?;
    let vm_outer_after = vm();
    let after = hint_sums(&text);
    let mut runs = Vec::new();
    for (&(name, mem_node), &pid) in placements.iter().zip(&pids) {
        let label = cgroups.label(name);
        let pair = |metric: &str| {
            (
                sum_where(&text, metric, &[("cgroup", &label), ("locality", "local")]),
                sum_where(&text, metric, &[("cgroup", &label), ("locality", "remote")]),
            )
        };
        runs.push(Run {
            name,
            mem_node,
            memory: pair("qosd_numa_memory_bytes"),
            kernel_bytes: kernel_numa_stat(&cgroups.dir_in(&memory_root, name))?,
            rss_anon: proc_value(pid, "status", "RssAnon").unwrap_or(0) * 1024,
            hints: pair("qosd_numa_hint_faults_total"),
            allocs: pair("qosd_numa_page_allocations_total"),
        });
    }
    let subtree = format!("/{}/", cgroups.name);
    let entries = |text: &str| {
        sample_value(text, "qosd_bpf_map_entries", "map=\"NUMA_PAGE_ALLOCS\"").unwrap_or(0.0)
    };
    let entries_before = entries(&text);
    drop(cgroups);
    // The first scrape after the removal finds the ids gone and removes their map entries;
    // the second shows the map without them.
    agent.scrape()?;
    let text = agent.scrape()?;
    let entries_after = entries(&text);
    let leftovers = text
        .lines()
        .filter(|l| l.starts_with("qosd_numa_") && l.contains(&subtree))
        .count();
    let cleanup = if leftovers == 0 && entries_after < entries_before {
        Ok(format!(
            "after the test cgroups were removed: no qosd_numa_* series of them, NUMA_PAGE_ALLOCS entries {entries_before} -> {entries_after}"
        ))
    } else {
        Err(format!(
            "after the test cgroups were removed: {leftovers} qosd_numa_* series of them remain, NUMA_PAGE_ALLOCS entries {entries_before} -> {entries_after}"
        ))
    };
    let delta = |from: (f64, f64), to: (f64, f64)| (to.0 - from.0, to.1 - from.1);
    let window = hint_live.then_some(HintWindow {
        qosd: delta(before, after),
        kernel_inner: delta(vm_inner_before, vm_inner_after),
        kernel_outer: delta(vm_outer_before, vm_outer_after),
    });
    let method = match runs.iter().find(|r| r.name == "remote") {
        Some(remote) => format!(
            "{method}; memory of 'remote' on node {}, of 'local' on node {cpu_node}",
            remote.mem_node
        ),
        None => method,
    };
    Ok(Placement {
        runs,
        method,
        nodes: nodes.len(),
        hint_unavailable,
        window,
        cleanup,
    })
}

/// A program on PATH.
pub(super) fn which(program: &str) -> Result<PathBuf, String> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{program} not found on PATH (cargo xtask setup installs it)"))
}

/// `qosd check` and `qosd_probe_info` agree on each NUMA probe's mode, and the mode is the
/// expected one for this kernel: hinting faults by fentry where tracing programs load (else
/// unavailable, with the kernel's reason), page allocations by the classic tracepoint,
/// migrations by tp_btf.
pub(crate) fn probe_modes(ctx: &Context) -> Outcome {
    match run_modes(ctx) {
        Ok(summary) => Outcome::Pass(summary),
        Err(e) => fail(e),
    }
}

fn run_modes(ctx: &Context) -> Result<String, String> {
    let out = std::process::Command::new(&ctx.qosd)
        .arg("check")
        .output()
        .map_err(|e| format!("qosd check: {e}"))?;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let fentry = report
        .lines()
        .any(|l| l.starts_with("fentry ") && l.contains(" yes"));
    let expected = [
        (HINT_PROBE, if fentry { "fentry" } else { "unavailable" }),
        ("numa_page_alloc", "tracepoint"),
        ("numa_migration", "tp_btf"),
        ("numa_memory", "cgroupfs"),
    ];
    let text = &session(ctx)?.probe_info;
    let mut found = Vec::new();
    for (probe, want) in expected {
        let line = report
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(&format!("{probe} ")))
            .ok_or_else(|| format!("qosd check has no {probe} line:\n{report}"))?;
        let mode = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        if mode != want {
            return Err(format!("{probe}: mode {mode}, expected {want}: {line}"));
        }
        // An unavailable probe names the hook the kernel refused and why.
        if want == "unavailable" && !line.contains("(fentry on task_numa_fault: ") {
            return Err(format!("{probe} unavailable without the reason: {line}"));
        }
        if probe != "numa_memory"
            && sample_value(
                text,
                "qosd_probe_info",
                &format!("mode=\"{want}\",probe=\"{probe}\""),
            ) != Some(1.0)
        {
            return Err(format!(
                "qosd_probe_info does not show {probe} in {want}:\n{text}"
            ));
        }
        found.push(if want == "unavailable" {
            line.to_owned()
        } else {
            format!("{probe} {mode}")
        });
    }
    Ok(found.join("; "))
}

/// `qosd_numa_task_migrations_total` against the task's own `se.nr_migrations`: a pinned busy
/// task moved back and forth between CPUs of two nodes (counted cross-node) and of one node
/// (counted within a node).
pub(crate) fn migrations(ctx: &Context) -> Outcome {
    migrations_outcome(session(ctx).and_then(|s| s.migrations.clone()))
}

/// The same with the migration probe forced onto its raw_tracepoint fallback.
pub(crate) fn migrations_raw_tracepoint(ctx: &Context) -> Outcome {
    let args = ["--cpu-time-mode".to_owned(), "raw-tracepoint".to_owned()];
    migrations_outcome(
        Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))
            .and_then(|agent| measure_migrations(ctx, &agent, "raw_tracepoint")),
    )
}

fn migrations_outcome(result: Result<Option<String>, String>) -> Outcome {
    match result {
        Ok(Some(detail)) => Outcome::Pass(detail),
        Ok(None) => Outcome::Skip(
            "/proc/<pid>/sched has no se.nr_migrations (CONFIG_SCHED_DEBUG off): no kernel reference"
                .into(),
        ),
        Err(e) => fail(e),
    }
}

/// What one phase of affinity flips measured.
struct Phase {
    kernel: u64,
    within: f64,
    cross: f64,
}

fn measure_migrations(
    ctx: &Context,
    agent: &Agent,
    want_mode: &str,
) -> Result<Option<String>, String> {
    if sample_value(
        &agent.scrape()?,
        "qosd_probe_info",
        &format!("mode=\"{want_mode}\",probe=\"numa_migration\""),
    ) != Some(1.0)
    {
        return Err(format!(
            "qosd_probe_info does not show numa_migration in {want_mode}"
        ));
    }
    let nodes = node_cpus()?;
    let mut per_node = nodes.values();
    let first = per_node.next().ok_or("no NUMA node")?;
    let second = per_node.next();
    let mut cgroups = TestCgroups::create("qosd-systest-migrate")?;
    cgroups.mkdir("mig")?;
    let pid = cgroups.spawn_in("mig", &ctx.self_exe, &["spin", WORKLOAD_SECS])?;
    wait_exec(pid)?;
    let cpu_a = first[0];
    pin(pid, cpu_a)?;
    std::thread::sleep(Duration::from_millis(200));
    if proc_value(pid, "sched", "se.nr_migrations").is_none() {
        return Ok(None);
    }
    let label = cgroups.label("mig");
    let phase = |other: usize| -> Result<Phase, String> {
        let read = || -> Result<(u64, f64, f64), String> {
            let text = agent.scrape()?;
            let value = |cross: &str| {
                sum_where(
                    &text,
                    "qosd_numa_task_migrations_total",
                    &[("cgroup", &label), ("cross_node", cross)],
                )
            };
            Ok((
                proc_value(pid, "sched", "se.nr_migrations").ok_or("se.nr_migrations vanished")?,
                value("false"),
                value("true"),
            ))
        };
        let before = read()?;
        for i in 0..FLIPS {
            pin(pid, if i % 2 == 0 { other } else { cpu_a })?;
            std::thread::sleep(Duration::from_millis(30));
        }
        let after = read()?;
        Ok(Phase {
            kernel: after.0 - before.0,
            within: after.1 - before.1,
            cross: after.2 - before.2,
        })
    };
    let close = |qosd: f64, kernel: u64| (qosd - kernel as f64).abs() <= 1.0;
    let mut lines = Vec::new();
    let mut bad = Vec::new();
    if let Some(second) = second {
        let p = phase(second[0])?;
        lines.push(format!(
            "CPUs {cpu_a}<->{} (two nodes): se.nr_migrations +{}, qosd cross_node=true +{}, false +{}",
            second[0], p.kernel, p.cross, p.within
        ));
        if p.kernel < FLIPS || !close(p.cross, p.kernel) || p.within > 1.0 {
            bad.push("cross-node migrations differ from se.nr_migrations");
        }
    } else {
        lines.push("one NUMA node: no cross-node migration possible".to_owned());
    }
    if let Some(&cpu_b) = first.get(1) {
        let p = phase(cpu_b)?;
        lines.push(format!(
            "CPUs {cpu_a}<->{cpu_b} (one node): se.nr_migrations +{}, qosd cross_node=false +{}, true +{}",
            p.kernel, p.within, p.cross
        ));
        if p.kernel < FLIPS || !close(p.within, p.kernel) || p.cross > 1.0 {
            bad.push("migrations within a node differ from se.nr_migrations");
        }
    } else {
        lines.push(format!(
            "node has one CPU ({cpu_a}): no migration within it"
        ));
    }
    cgroups.kill_all();
    let summary = format!("{want_mode}: {}", lines.join("; "));
    if bad.is_empty() {
        Ok(Some(summary))
    } else {
        Err(format!("{}: {summary}", bad.join("; ")))
    }
}
