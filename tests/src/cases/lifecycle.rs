//! Start-up report, info metrics, and clean shutdown of a real `qosd` process.
use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::agent::{Agent, sample_value};
use crate::harness::{Context, Outcome, fail};
use qosd_common::names;

/// Kernel program names of the sched_switch handler (cpu_time and runqlat), both flavours.
const PROGRAM_NAMES: [&str; 2] = [names::SWITCH_TP_BTF, names::SWITCH_RAW_TP];
const ATTACH_MODES: [&str; 2] = ["tp_btf", "raw_tracepoint"];

/// `qosd check` names the running kernel, the cgroup layout (judged here from the mount table
/// independently of qosd's parser), BTF, and a working mode for the sched_switch probes:
/// `tp_btf` on a kernel with BTF (every kernel qosd is tested on), so a program the verifier
/// starts refusing shows here instead of hiding behind the raw_tracepoint fallback (which
/// the `*_raw_tracepoint` tests exercise on purpose).
pub(crate) fn check_report(ctx: &Context) -> Outcome {
    let output = match Command::new(&ctx.qosd).arg("check").output() {
        Ok(output) => output,
        Err(e) => return fail(format!("running qosd check: {e}")),
    };
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return fail(format!("qosd check exited {}: {report}", output.status));
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let expected_layout = layout_from_mounts();
    let btf = if std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        "yes"
    } else {
        "no"
    };
    let mut problems = Vec::new();
    if !report.contains(&format!("kernel            {}", release.trim())) {
        problems.push(format!("kernel release {} missing", release.trim()));
    }
    if !report.contains(&format!("cgroup layout     {expected_layout}\n")) {
        problems.push(format!("layout {expected_layout} missing"));
    }
    if !report.contains(&format!("BTF               {btf}")) {
        problems.push(format!("BTF {btf} missing"));
    }
    let expected_modes: &[&str] = if btf == "yes" {
        &ATTACH_MODES[..1]
    } else {
        &ATTACH_MODES
    };
    let mode_of = |probe: &str| {
        report
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(&format!("{probe} ")))
            .map(|rest| {
                rest.split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
    };
    let mode = mode_of("cpu_time");
    for (probe, found) in [("cpu_time", &mode), ("runqlat", &mode_of("runqlat"))] {
        match found.as_deref() {
            Some(m) if expected_modes.contains(&m) => {}
            other => problems.push(format!(
                "{probe} mode is {other:?}, expected one of {expected_modes:?} (BTF {btf})"
            )),
        }
    }
    for feature in ["fentry ", "kprobes "] {
        if !report
            .lines()
            .any(|l| l.starts_with(feature) && (l.contains(" yes") || l.contains(" no (")))
        {
            problems.push(format!("no {feature}line with yes or no (reason)"));
        }
    }
    if problems.is_empty() {
        Outcome::Pass(format!(
            "layout {expected_layout}, cpu_time {}",
            mode.unwrap_or_default()
        ))
    } else {
        fail(format!("{}\n--- report ---\n{report}", problems.join("; ")))
    }
}

/// v2 when only cgroup2 is mounted, hybrid when both kinds are, v1 when only v1 is.
fn layout_from_mounts() -> &'static str {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let has = |fstype: &str| {
        mounts
            .lines()
            .any(|l| l.split_whitespace().nth(2) == Some(fstype))
    };
    match (has("cgroup"), has("cgroup2")) {
        (true, true) => "hybrid",
        (true, false) => "v1",
        (false, _) => "v2",
    }
}

/// `/metrics` carries `qosd_build_info{version}` and `qosd_probe_info{probe="cpu_time",mode}`.
pub(crate) fn metrics_info(ctx: &Context) -> Outcome {
    let agent = match Agent::start(&ctx.qosd, Duration::from_secs(60)) {
        Ok(agent) => agent,
        Err(e) => return fail(e),
    };
    let text = match agent.scrape() {
        Ok(text) => text,
        Err(e) => return fail(e),
    };
    if !text
        .lines()
        .any(|l| l.starts_with("qosd_build_info{version=\"") && l.ends_with("} 1"))
    {
        return fail(format!("no qosd_build_info in\n{text}"));
    }
    let live: Vec<_> = ATTACH_MODES
        .iter()
        .filter(|m| {
            sample_value(
                &text,
                "qosd_probe_info",
                &format!("mode=\"{m}\",probe=\"cpu_time\""),
            ) == Some(1.0)
        })
        .collect();
    match live.as_slice() {
        [mode] => Outcome::Pass(format!("cpu_time mode {mode}")),
        _ => fail(format!(
            "expected exactly one live cpu_time mode, found {live:?} in\n{text}"
        )),
    }
}

pub(crate) fn sigterm_detaches(ctx: &Context) -> Outcome {
    detaches_on(ctx, libc::SIGTERM, "SIGTERM")
}

pub(crate) fn sigint_detaches(ctx: &Context) -> Outcome {
    detaches_on(ctx, libc::SIGINT, "SIGINT")
}

/// After `signal`, qosd exits 0 within [`SHUTDOWN_BUDGET`] and the programs it loaded leave the
/// kernel. Programs are told apart by id, so a program of an earlier agent still being released
/// by the kernel does not confuse the count.
///
/// The budget is the contract with whoever stops the agent (systemd's and Kubernetes' grace
/// periods are far longer), not a speed claim: on the host qosd exits in about 150 ms, in the
/// emulated guests about 1 s, nearly all of it the kernel unpatching a dozen attach points.
fn detaches_on(ctx: &Context, signal: i32, name: &str) -> Outcome {
    match detaches(ctx, signal, name) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// How long qosd may take from the signal to its exit.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(5);

fn detaches(ctx: &Context, signal: i32, name: &str) -> Result<String, String> {
    let (agent, ours) = started_with_programs(ctx)?;
    stops_and_detaches(agent, &ours, signal, name)
}

/// SIGHUP (a closed terminal) is said and ignored: qosd keeps serving. SIGQUIT then stops it
/// like SIGTERM.
pub(crate) fn sighup_is_ignored_and_sigquit_detaches(ctx: &Context) -> Outcome {
    let run = || -> Result<String, String> {
        let (agent, ours) = started_with_programs(ctx)?;
        let pid = agent.pid().ok_or("qosd has no process")?;
        let pid = i32::try_from(pid).map_err(|e| e.to_string())?;
        // SAFETY: kill(2) on qosd's own child process, with a valid signal number.
        if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
            return Err(format!("kill SIGHUP: {}", std::io::Error::last_os_error()));
        }
        std::thread::sleep(Duration::from_secs(1));
        agent.scrape().map_err(|e| {
            format!(
                "qosd stopped serving after SIGHUP: {e}\n{}",
                agent.log_tail()
            )
        })?;
        if !agent.log_tail().contains("SIGHUP") {
            return Err(format!(
                "qosd did not say it ignored SIGHUP:\n{}",
                agent.log_tail()
            ));
        }
        let detail = stops_and_detaches(agent, &ours, libc::SIGQUIT, "SIGQUIT")?;
        Ok(format!(
            "SIGHUP: still serving 1 s later, said in the log; {detail}"
        ))
    };
    match run() {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// qosd started, with the ids of the sched_switch programs it loaded.
fn started_with_programs(ctx: &Context) -> Result<(Agent, BTreeSet<u32>), String> {
    let before = probe_programs()?;
    let agent = Agent::start(&ctx.qosd, Duration::from_secs(60))?;
    let ours: BTreeSet<u32> = probe_programs()?.difference(&before).copied().collect();
    if ours.is_empty() {
        return Err(format!(
            "qosd (pid {:?}) loaded no sched_switch program",
            agent.pid()
        ));
    }
    Ok((agent, ours))
}

/// Sends `signal`; qosd must exit 0 within the budget with its programs `ours` gone.
fn stops_and_detaches(
    mut agent: Agent,
    ours: &BTreeSet<u32>,
    signal: i32,
    name: &str,
) -> Result<String, String> {
    let (status, took) = agent.stop(signal, SHUTDOWN_BUDGET * 2)?;
    // The kernel frees a program when its last link and fd are released, which it may finish
    // in a work item shortly after the process has exited.
    let released_by = Instant::now() + Duration::from_secs(3);
    let left = loop {
        let left: Vec<u32> = probe_programs()?.intersection(ours).copied().collect();
        if left.is_empty() || Instant::now() > released_by {
            break left;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let detail = format!(
        "{name}: exit {status} after {} ms; programs {ours:?} loaded, {left:?} left",
        took.as_millis()
    );
    if !status.success() || took > SHUTDOWN_BUDGET || !left.is_empty() {
        return Err(format!("{detail}\n{}", agent.log_tail()));
    }
    Ok(detail)
}

/// Ids of the sched_switch programs loaded in the kernel right now (by anyone).
fn probe_programs() -> Result<BTreeSet<u32>, String> {
    let mut ids = BTreeSet::new();
    for info in aya::programs::loaded_programs() {
        let info = info.map_err(|e| format!("listing BPF programs: {e}"))?;
        if info
            .name_as_str()
            .is_some_and(|n| PROGRAM_NAMES.contains(&n))
        {
            ids.insert(info.id());
        }
    }
    Ok(ids)
}
