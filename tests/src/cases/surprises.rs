//! Kernel surprises, met on the real kernel: a map that fills, a program the verifier refuses,
//! a kernel without BTF, tracefs that cannot be mounted. Each time qosd must lose only the part
//! that failed, say so (`qosd check`, its log, `qosd_probe_info`, the dropped-events counter)
//! and keep the rest.
//!
//! The map and the verifier are made to fail by `QOSD_TEST_FAULTS` (qosd's `probes::fault`):
//! the kernel creates `CGROUP_CPU_NS` with one entry, and loads the BTF-typed sched_switch
//! program against `sched_wakeup`, whose one argument the program's reads overrun. BTF and
//! tracefs are hidden in a private mount namespace of qosd's own (`agent::Hidden`); for tracefs
//! qosd also lacks `CAP_SYS_ADMIN`, so it cannot mount one itself. With the whole list of
//! capabilities in the same namespace it does, which shows the list covers a host that mounts
//! no tracefs at boot.
use std::time::{Duration, Instant};

use super::capabilities::{CAP_SYS_ADMIN, listed_here};
use crate::agent::{
    Agent, Hidden, Launch, check_output, probe_info_modes, sample_value, standalone_args,
    standalone_inputs,
};
use crate::cgroup_fixture::TestCgroups;
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{Hierarchies, TempPaths, wait_for};

/// Least time between two diagnostics of one kind on one CPU (`DIAG_INTERVAL_NS`).
const DIAG_INTERVAL: Duration = Duration::from_secs(10);

/// The case.
pub(crate) fn kernel_surprises_degrade(ctx: &Context) -> Outcome {
    match run(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run(ctx: &Context) -> Result<String, String> {
    let full = map_full(ctx)?;
    let refused = verifier_refuses(ctx)?;
    let btf = without_btf(ctx)?;
    let tracefs = without_tracefs(ctx)?;
    Ok(format!(
        "map full: {full}; verifier: {refused}; no BTF: {btf}; no tracefs: {tracefs}"
    ))
}

/// The mode `qosd_probe_info` gives `probe`.
fn mode_of(text: &str, probe: &str) -> Option<String> {
    probe_info_modes(text)
        .into_iter()
        .find_map(|(p, mode)| (p == probe).then_some(mode))
}

fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// `CGROUP_CPU_NS` with room for one cgroup: four busy cgroups that have no counter slot yet
/// (none is given before a scrape) overflow it. The cpu-time probe counts the drops and the
/// kernel program says which map is full, at most once per CPU per 10 s; the run-queue probe,
/// whose maps are whole, still records every one of the four.
fn map_full(ctx: &Context) -> Result<String, String> {
    let launch = Launch {
        env: &[("QOSD_TEST_FAULTS", "map-entries=CGROUP_CPU_NS:1")],
        ..Launch::default()
    };
    let agent = Agent::start_launched(&ctx.qosd, &[], &launch, Duration::from_secs(120))?;
    let started = Instant::now();
    let with_log = |e: String| format!("{e}\n{}", agent.log_tail());
    let mut cgroups = TestCgroups::create("qosd-systest-fill")?;
    let children = ["a", "b", "c", "d"];
    for child in children {
        cgroups.mkdir(child)?;
        cgroups.spawn_in(child, &ctx.self_exe, &["spin", "3"])?;
    }
    // No scrape meanwhile: a scrape hands slots to the cgroups it finds.
    cgroups.wait_all()?;
    let text = agent.scrape()?;
    let dropped = sample_value(
        &text,
        "qosd_probe_dropped_events_total",
        "probe=\"cpu_time\"",
    )
    .unwrap_or(0.0);
    if dropped < 1.0 {
        return Err(with_log(format!(
            "CGROUP_CPU_NS holds one entry and four new cgroups ran, yet the cpu-time probe dropped nothing:\n{}",
            text.lines()
                .filter(|l| l.contains("CGROUP_CPU_NS") || l.contains("dropped"))
                .collect::<Vec<_>>()
                .join("\n")
        )));
    }
    for child in children {
        let label = format!("cgroup=\"{}\"", cgroups.label(child));
        if sample_value(&text, "qosd_runqueue_latency_seconds_count", &label).unwrap_or(0.0) < 1.0 {
            return Err(with_log(format!(
                "the run-queue probe (its maps whole) recorded no wait of {}",
                cgroups.label(child)
            )));
        }
    }
    let message = "map CGROUP_CPU_NS is full";
    let lines = wait_for(
        "the kernel program's diagnostic in qosd's log",
        Duration::from_secs(10),
        || {
            let log = agent.log_text();
            let lines = log
                .lines()
                .filter(|l| l.contains("qosd::kernel") && l.contains(message))
                .count();
            if lines == 0 {
                Err(format!("no qosd::kernel line with {message:?}"))
            } else {
                Ok(lines)
            }
        },
    )
    .map_err(&with_log)?;
    let periods = started.elapsed().as_secs() / DIAG_INTERVAL.as_secs() + 1;
    let most = online_cpus() * usize::try_from(periods).unwrap_or(usize::MAX);
    if lines > most {
        return Err(with_log(format!(
            "{lines} diagnostics of a full map in {:.0?} on {} CPUs: more than one per CPU per {DIAG_INTERVAL:?} ({most})",
            started.elapsed(),
            online_cpus()
        )));
    }
    Ok(format!(
        "{dropped} cpu-time events dropped, run-queue waits of all 4 cgroups recorded, {lines} kernel diagnostic(s) {message:?} in qosd's log (at most {most} allowed)"
    ))
}

/// The verifier refuses the BTF-typed handler: qosd falls back to the raw tracepoint, and
/// `qosd check`, the log and `qosd_probe_info` say why.
fn verifier_refuses(ctx: &Context) -> Result<String, String> {
    let fault = [("QOSD_TEST_FAULTS", "tp-btf-target=sched_wakeup")];
    let launch = Launch {
        env: &fault,
        ..Launch::default()
    };
    let plain = check_output(&ctx.qosd, &Launch::default())?;
    if !plain
        .lines()
        .any(|l| l.trim_start().starts_with("cpu_time") && l.contains("tp_btf"))
    {
        return Err(format!(
            "without faults this kernel gives the sched_switch handler no tp_btf mode, so no refusal of it can be shown:\n{plain}"
        ));
    }
    let check = check_output(&ctx.qosd, &launch)?;
    let refusal = check
        .lines()
        .find(|l| l.contains("not tp_btf: sched_wakeup"))
        .ok_or_else(|| format!("qosd check names no refused tp_btf mode:\n{check}"))?;
    if !check.contains("invalid bpf_context access") || !check.contains("test faults") {
        return Err(format!(
            "qosd check should show the verifier's words and the test-faults warning:\n{check}"
        ));
    }
    let agent = Agent::start_launched(&ctx.qosd, &[], &launch, Duration::from_secs(120))?;
    let text = agent.scrape()?;
    let with_log = |e: String| format!("{e}\n{}", agent.log_tail());
    for probe in ["cpu_time", "runqlat"] {
        if mode_of(&text, probe).as_deref() != Some("raw_tracepoint") {
            return Err(with_log(format!(
                "{probe}: qosd_probe_info mode {:?}, want raw_tracepoint after the refusal",
                mode_of(&text, probe)
            )));
        }
    }
    if !text.contains("qosd_cgroup_cpu_seconds_total{") {
        return Err(with_log(
            "no CPU time exported in raw_tracepoint mode".into(),
        ));
    }
    let log = agent.log_text();
    if !log
        .lines()
        .any(|l| l.contains("mode refused by the kernel") && l.contains("invalid bpf_context"))
    {
        return Err(with_log(
            "qosd's log does not give the verifier's refusal of tp_btf".into(),
        ));
    }
    let verdict: Vec<&str> = refusal
        .split(" | ")
        .filter(|part| part.contains("doesn't have") || part.contains("invalid bpf_context"))
        .collect();
    Ok(format!(
        "tp_btf refused by the verifier ({}), cpu_time and runqlat on raw_tracepoint, CPU time exported",
        verdict.join(" | ")
    ))
}

/// A BestEffort sleeper pod: its manifest (uid fixed per case) and the process's command.
fn sleeper_manifest(ctx: &Context, uid: &str, seconds: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: sleeper, namespace: systest, uid: {uid}}}\n\
         spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    \
         command: [{}, sleep, \"{seconds}\"]\n",
        ctx.self_exe.display()
    )
}

/// No BTF: every eBPF probe is unavailable with the reason, and the container manager runs its
/// pod as it would anyway.
fn without_btf(ctx: &Context) -> Result<String, String> {
    let launch = Launch {
        hidden: Hidden::Btf,
        ..Launch::default()
    };
    let check = check_output(&ctx.qosd, &launch)?;
    if !check
        .lines()
        .any(|l| l.starts_with("BTF") && l.contains("no"))
    {
        return Err(format!("qosd check should say BTF is missing:\n{check}"));
    }
    let h = Hierarchies::new("qosd-systest-nobtf")?;
    // Manifests, state and container logs under the case's own scratch directory.
    let scratch = std::env::temp_dir().join(format!("{}-files", h.root_name));
    let _cleanup = TempPaths(vec![scratch.clone()]);
    let (manifests, config) =
        standalone_inputs(&scratch, &format!("cgroupRoot: /{}\n", h.root_name))?;
    let uid = "0f0e0d0c-0000-4000-8000-0000000000b1";
    std::fs::write(
        manifests.join("sleeper.yaml"),
        sleeper_manifest(ctx, uid, "300"),
    )
    .map_err(|e| format!("sleeper.yaml: {e}"))?;
    let args = standalone_args(&scratch, &manifests, &config, &[]);
    let mut agent = Agent::start_launched(&ctx.qosd, &args, &launch, Duration::from_secs(120))?;
    let with_log = |e: String, agent: &Agent| format!("{e}\n{}", agent.log_tail());
    let text = agent.scrape()?;
    let mut unavailable = Vec::new();
    for probe in [
        "cpu_time",
        "runqlat",
        "numa_hint_fault",
        "numa_page_alloc",
        "numa_migration",
    ] {
        match mode_of(&text, probe).as_deref() {
            Some("unavailable") => unavailable.push(probe),
            other => {
                return Err(with_log(
                    format!("{probe}: mode {other:?} without BTF, want unavailable"),
                    &agent,
                ));
            }
        }
    }
    if !agent.log_text().contains("BTF") {
        return Err(with_log(
            "qosd's log does not name BTF as the reason".into(),
            &agent,
        ));
    }
    let procs = h.path(
        "cpu",
        &format!("kubepods/besteffort/pod{uid}/c/cgroup.procs"),
    );
    let pid = wait_for(
        "the pod's container running",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&procs)
                .map_err(|e| format!("{}: {e}", procs.display()))?
                .split_whitespace()
                .next()
                .map(str::to_owned)
                .ok_or_else(|| format!("{} is empty", procs.display()))
        },
    )
    .map_err(|e| with_log(e, &agent))?;
    let pods = sample_value(&agent.scrape()?, "qosd_pods", "qos_class=\"besteffort\"");
    agent.stop(libc::SIGTERM, Duration::from_secs(30))?;
    if pods != Some(1.0) {
        return Err(format!(
            "qosd_pods{{qos_class=\"besteffort\"}} = {pods:?}, want 1"
        ));
    }
    Ok(format!(
        "{} unavailable (named BTF), the BestEffort pod's container running (pid {pid}) in its cgroup",
        unavailable.join(", ")
    ))
}

/// No tracefs mounted: with the listed capabilities qosd mounts one (in its own namespace) and
/// has the page-allocation probe; without `SYS_ADMIN` it cannot, loses that probe alone, and
/// says why.
fn without_tracefs(ctx: &Context) -> Result<String, String> {
    let (listed, unavailable) = listed_here()?;
    let modes = |keep: &[u32]| -> Result<(String, String, String), String> {
        let launch = Launch {
            keep: Some(keep),
            hidden: Hidden::Tracefs,
            ..Launch::default()
        };
        let agent = Agent::start_launched(&ctx.qosd, &[], &launch, Duration::from_secs(120))?;
        let text = agent.scrape()?;
        let page_alloc = mode_of(&text, "numa_page_alloc").unwrap_or_default();
        let cpu = mode_of(&text, "cpu_time").unwrap_or_default();
        Ok((page_alloc, cpu, agent.log_text()))
    };
    let (with_list, cpu_with, log_with) = modes(&listed)?;
    if with_list != "tracepoint" {
        return Err(format!(
            "with the listed capabilities and no tracefs mounted, numa_page_alloc is {with_list:?}, want tracepoint (qosd mounts tracefs itself)\n{log_with}"
        ));
    }
    let without: Vec<u32> = listed
        .iter()
        .copied()
        .filter(|c| *c != CAP_SYS_ADMIN)
        .collect();
    let (without_admin, cpu_without, log) = modes(&without)?;
    if without_admin != "unavailable" {
        return Err(format!(
            "without SYS_ADMIN and no tracefs, numa_page_alloc is {without_admin:?}, want unavailable\n{log}"
        ));
    }
    if cpu_without != cpu_with {
        return Err(format!(
            "cpu_time went from {cpu_with} to {cpu_without} without SYS_ADMIN: more than the tracefs part was lost\n{log}"
        ));
    }
    let reason = log
        .lines()
        .find(|l| l.contains("no tracefs mounted"))
        .ok_or_else(|| format!("qosd's log does not say tracefs could not be mounted\n{log}"))?;
    let untested = if unavailable.is_empty() {
        String::new()
    } else {
        format!(
            " ({} not in this machine's bounding set)",
            unavailable.join(", ")
        )
    };
    Ok(format!(
        "with the listed capabilities{untested} qosd mounted tracefs (numa_page_alloc tracepoint); without SYS_ADMIN numa_page_alloc unavailable, cpu_time still {cpu_without}; log: {}",
        reason
            .split("no tracefs mounted")
            .nth(1)
            .map_or("", str::trim)
            .chars()
            .take(100)
            .collect::<String>()
    ))
}
