//! qosd's per-cgroup CPU seconds against the kernel's own accounting (`cpuacct.usage` on v1,
//! `cpu.stat` `usage_usec` on v2).
use std::time::Duration;

use crate::agent::{Agent, sample_value};
use crate::cgroup_fixture::TestCgroups;
use crate::harness::{Context, Outcome, fail};

const METRIC: &str = "qosd_cgroup_cpu_seconds_total";
/// Switches whose outgoing task's switch in the probe did not see: at least each CPU's first
/// after attach.
const UNCHAINED: &str = "qosd_cpu_unchained_switches_total";
/// Allowed relative difference between qosd and the kernel.
const TOLERANCE: f64 = 0.05;
/// Allowed absolute difference for the sleeping workload. Its shell starts in the parent's
/// cgroup and then moves itself in; when the start-up and the move fall in one slice, qosd
/// charges the whole slice to the cgroup the task is in when it leaves the CPU, while the
/// kernel splits it at the move. Under emulation that start-up is 20 to 35 ms.
const IDLE_SLACK_SECONDS: f64 = 0.06;
/// How long the busy workload spins.
const BUSY_SECONDS: &str = "3";

/// A busy and an idle cgroup side by side: the busy one's CPU seconds agree with the kernel
/// within 5 %, the idle one stays near zero in both.
pub(crate) fn matches_kernel_accounting(ctx: &Context) -> Outcome {
    match run(ctx, None) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// The same with the probe forced onto its raw_tracepoint fallback (what kernels without
/// BTF-typed tracepoints get), so the fallback is proven on every kernel too.
pub(crate) fn matches_kernel_accounting_raw_tracepoint(ctx: &Context) -> Outcome {
    match run(ctx, Some("raw_tracepoint")) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run(ctx: &Context, mode: Option<&str>) -> Result<String, String> {
    let args: Vec<String> = mode
        .map(|m| vec!["--cpu-time-mode".to_owned(), m.replace('_', "-")])
        .unwrap_or_default();
    let agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    if let Some(mode) = mode {
        let text = agent.scrape()?;
        let live = sample_value(
            &text,
            "qosd_probe_info",
            &format!("mode=\"{mode}\",probe=\"cpu_time\""),
        );
        if live != Some(1.0) {
            return Err(format!(
                "asked for {mode}, but qosd_probe_info does not show it:\n{text}"
            ));
        }
    }
    let mut cgroups = TestCgroups::create("qosd-systest-cpu")?;
    cgroups.mkdir("busy")?;
    cgroups.mkdir("idle")?;
    let self_exe = ctx.self_exe.clone();
    cgroups.spawn_in("busy", &self_exe, &["spin", BUSY_SECONDS])?;
    cgroups.spawn_in("idle", &self_exe, &["sleep", BUSY_SECONDS])?;
    cgroups.wait_all()?;

    let text = agent.scrape()?;
    let value = |child: &str| {
        let labels = format!("cgroup=\"{}\"", cgroups.label(child));
        sample_value(&text, METRIC, &labels)
    };
    let busy_qosd =
        value("busy").ok_or_else(|| format!("no {METRIC} for {}", cgroups.label("busy")))?;
    let busy_kernel = cgroups.kernel_cpu_seconds("busy")?;
    let idle_qosd = value("idle").unwrap_or(0.0);
    let idle_kernel = cgroups.kernel_cpu_seconds("idle")?;
    let source = cgroups.accounting_source();
    let unchained = sample_value(&text, UNCHAINED, "")
        .ok_or_else(|| format!("no {UNCHAINED} in the scrape"))?;

    if busy_kernel < 0.5 {
        return Err(format!(
            "the busy workload got only {busy_kernel:.3}s of CPU by {source}; the test cannot judge"
        ));
    }
    let relative = (busy_qosd - busy_kernel).abs() / busy_kernel;
    let summary = format!(
        "busy: qosd {busy_qosd:.4}s vs {source} {busy_kernel:.4}s ({:.2}% apart); idle: qosd {idle_qosd:.4}s vs {idle_kernel:.4}s; {unchained} unchained switches",
        relative * 100.0
    );
    // Every CPU that switched at all had a first switch after attach, whose outgoing task
    // arrived before the probe: the counter that says how often the fallback charged a slice
    // cannot be zero.
    if unchained < 1.0 {
        return Err(format!(
            "{summary}: {UNCHAINED} is 0, but each CPU's first switch after attach is unchained"
        ));
    }
    if relative > TOLERANCE {
        return Err(format!(
            "{summary}: more than {:.0}% apart",
            TOLERANCE * 100.0
        ));
    }
    // The sleeper's only CPU is its start-up (tens of ms under emulation): qosd must agree with
    // the kernel there too, and stay far below the busy cgroup, or time leaked across cgroups.
    if (idle_qosd - idle_kernel).abs() > IDLE_SLACK_SECONDS || idle_qosd > busy_qosd * 0.1 {
        return Err(format!(
            "{summary}: the idle cgroup was charged CPU it did not use"
        ));
    }
    Ok(summary)
}
