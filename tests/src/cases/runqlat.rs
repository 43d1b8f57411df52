//! Run-queue latency and preemption pairs against the kernel's own per-task accounting
//! (`/proc/<pid>/schedstat`, field 2: nanoseconds spent waiting on a run queue).
use std::time::Duration;

use crate::agent::{Agent, sample_value};
use crate::cgroup_fixture::TestCgroups;
use crate::harness::{Context, Outcome, fail};
use crate::workload::{last_allowed_cpu, pin, wait_asleep, wait_exec};

/// Allowed relative difference between qosd's wait sum and schedstat's.
const TOLERANCE: f64 = 0.20;
/// How long the pinned workloads spin.
const SPIN_SECONDS: &str = "5";
/// The idle cgroup's sleeper sleeps well past the measurement and is killed after it: a
/// sleeper that woke inside the window (start-up under emulation can take most of the
/// spinners' 5 s) would preempt or be preempted like any task.
const SLEEP_SECONDS: &str = "300";

/// Two busy processes in one cgroup and a third in another, all pinned to one CPU: the crowded
/// cgroup's wait histogram has a count and a sum, the sum agrees with the processes'
/// schedstat run-queue time within 20 % over the same window, and an idle sleeper's cgroup
/// waits about nothing.
pub(crate) fn waits_match_schedstat(ctx: &Context) -> Outcome {
    waits_outcome(run_waits(ctx, None))
}

/// The same with the handlers forced onto their raw_tracepoint fallback.
pub(crate) fn waits_match_schedstat_raw_tracepoint(ctx: &Context) -> Outcome {
    waits_outcome(run_waits(ctx, Some("raw_tracepoint")))
}

fn waits_outcome(result: Result<Option<String>, String>) -> Outcome {
    match result {
        Ok(Some(detail)) => Outcome::Pass(detail),
        Ok(None) => Outcome::Skip(
            "/proc/<pid>/schedstat is missing (CONFIG_SCHED_INFO off): no kernel reference".into(),
        ),
        Err(e) => fail(e),
    }
}

/// A victim in cgroup A and a preemptor in cgroup B on one CPU show up as the pair (A, B), and
/// the waits attributed to A's preemptions agree with A's schedstat run-queue time.
pub(crate) fn preemption_pairs(ctx: &Context) -> Outcome {
    match run_pairs(ctx) {
        Ok(Some(detail)) => Outcome::Pass(detail),
        Ok(None) => Outcome::Skip(
            "/proc/<pid>/schedstat is missing (CONFIG_SCHED_INFO off): no kernel reference".into(),
        ),
        Err(e) => fail(e),
    }
}

fn run_waits(ctx: &Context, mode: Option<&str>) -> Result<Option<String>, String> {
    let args: Vec<String> = mode
        .map(|m| vec!["--cpu-time-mode".to_owned(), m.replace('_', "-")])
        .unwrap_or_default();
    let agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    let live = agent.scrape()?;
    if let Some(mode) = mode
        && sample_value(
            &live,
            "qosd_probe_info",
            &format!("mode=\"{mode}\",probe=\"runqlat\""),
        ) != Some(1.0)
    {
        return Err(format!(
            "asked for {mode}, qosd_probe_info does not show it:\n{live}"
        ));
    }
    let mut cgroups = TestCgroups::create("qosd-systest-runq")?;
    for child in ["crowded", "other", "idle", "napper"] {
        cgroups.mkdir(child)?;
    }
    let exe = ctx.self_exe.clone();
    let a1 = cgroups.spawn_in("crowded", &exe, &["spin", SPIN_SECONDS])?;
    let a2 = cgroups.spawn_in("crowded", &exe, &["spin", SPIN_SECONDS])?;
    let b = cgroups.spawn_in("other", &exe, &["spin", SPIN_SECONDS])?;
    let sleeper = cgroups.spawn_in("idle", &exe, &["sleep", SLEEP_SECONDS])?;
    // Woken every few ms onto the crowded CPU: its waits start at wakeups, not preemptions.
    let napper = cgroups.spawn_in("napper", &exe, &["nap", "4", SPIN_SECONDS])?;
    let cpu = last_allowed_cpu()?;
    for pid in [a1, a2, b, napper] {
        // After the exec the shell has joined its cgroup: pinning earlier would be undone by
        // cgroup v2's cpuset, which resets a task's affinity when it attaches.
        wait_exec(pid)?;
        pin(pid, cpu)?;
    }
    std::thread::sleep(Duration::from_secs(1));
    let Some(before) = Reading::take(&agent, &cgroups, &[a1, a2], napper)? else {
        return Ok(None);
    };
    std::thread::sleep(Duration::from_secs(3));
    let after =
        Reading::take(&agent, &cgroups, &[a1, a2], napper)?.ok_or("schedstat vanished mid-test")?;
    cgroups.stop(sleeper)?;
    cgroups.wait_all()?;

    let kernel = after.crowded_kernel - before.crowded_kernel;
    let qosd = after.crowded.1 - before.crowded.1;
    let count = after.crowded.0 - before.crowded.0;
    let idle_sum = after.idle.1 - before.idle.1;
    if kernel < 0.5 {
        return Err(format!(
            "the pinned processes waited only {kernel:.3}s by schedstat; the test cannot judge"
        ));
    }
    let relative = (qosd - kernel).abs() / kernel;
    let napper_kernel = after.napper_kernel - before.napper_kernel;
    let napper_qosd = after.napper.1 - before.napper.1;
    let napper_count = after.napper.0 - before.napper.0;
    let napper_relative = (napper_qosd - napper_kernel).abs() / napper_kernel.max(1e-9);
    let summary = format!(
        "crowded cgroup on CPU {cpu}: qosd {qosd:.4}s over {count} waits vs schedstat {kernel:.4}s ({:.1}% apart); napper woken {napper_count} times: qosd {napper_qosd:.4}s vs schedstat {napper_kernel:.4}s ({:.1}% apart); idle cgroup waited {idle_sum:.6}s",
        relative * 100.0,
        napper_relative * 100.0
    );
    if count <= 0.0 || relative > TOLERANCE {
        return Err(format!(
            "{summary}: expected a count and at most {:.0}% apart",
            TOLERANCE * 100.0
        ));
    }
    if napper_count <= 0.0 || napper_kernel < 0.01 || napper_relative > TOLERANCE {
        return Err(format!(
            "{summary}: expected the napper's wakeup waits (at least 10 ms by schedstat) within {:.0}%",
            TOLERANCE * 100.0
        ));
    }
    if idle_sum > 0.01 {
        return Err(format!("{summary}: the sleeper's cgroup should wait ~0"));
    }
    Ok(Some(summary))
}

fn run_pairs(ctx: &Context) -> Result<Option<String>, String> {
    let agent = Agent::start(&ctx.qosd, Duration::from_secs(60))?;
    let mut cgroups = TestCgroups::create("qosd-systest-preempt")?;
    for child in ["victim", "preemptor", "idle"] {
        cgroups.mkdir(child)?;
    }
    let exe = ctx.self_exe.clone();
    let victim = cgroups.spawn_in("victim", &exe, &["spin", SPIN_SECONDS])?;
    let preemptor = cgroups.spawn_in("preemptor", &exe, &["spin", SPIN_SECONDS])?;
    let sleeper = cgroups.spawn_in("idle", &exe, &["sleep", SLEEP_SECONDS])?;
    let cpu = last_allowed_cpu()?;
    for pid in [victim, preemptor] {
        // After the exec the shell has joined its cgroup: pinning earlier would be undone by
        // cgroup v2's cpuset, which resets a task's affinity when it attaches.
        wait_exec(pid)?;
        pin(pid, cpu)?;
    }
    // The sleeper's pairs are counted from here: it must be past its start-up (6.1 under
    // emulation showed a few pairs from a sleeper still starting).
    wait_exec(sleeper)?;
    wait_asleep(sleeper)?;
    std::thread::sleep(Duration::from_secs(1));
    let Some(before_kernel) = schedstat_wait(&[victim]) else {
        return Ok(None);
    };
    let preemptor_before = schedstat_wait(&[preemptor]).unwrap_or_default();
    let before = scrape_pair(&agent, &cgroups, "victim", "preemptor")?;
    let idle_label = cgroups.label("idle");
    let idle_before = idle_pairs(&agent.scrape()?, &idle_label);
    std::thread::sleep(Duration::from_secs(3));
    let after_kernel = schedstat_wait(&[victim]).ok_or("schedstat vanished mid-test")?;
    let preemptor_waited = schedstat_wait(&[preemptor])
        .unwrap_or_default()
        .saturating_sub(preemptor_before) as f64
        / 1e9;
    let after = scrape_pair(&agent, &cgroups, "victim", "preemptor")?;
    let text = agent.scrape()?;
    cgroups.stop(sleeper)?;
    cgroups.wait_all()?;

    let count = after.0 - before.0;
    let wait = after.1 - before.1;
    let kernel = (after_kernel - before_kernel) as f64 / 1e9;
    let reverse = sample_value(
        &text,
        "qosd_cgroup_preemptions_total",
        &format!(
            "preemptor_cgroup=\"{}\",victim_cgroup=\"{}\"",
            cgroups.label("victim"),
            cgroups.label("preemptor")
        ),
    )
    .unwrap_or(0.0);
    let idle_pairs = idle_pairs(&text, &idle_label) - idle_before;
    if kernel < 0.5 {
        return Err(format!(
            "the victim waited only {kernel:.3}s by schedstat (the preemptor {preemptor_waited:.3}s; qosd: {count} preemptions, {wait:.3}s); the test cannot judge"
        ));
    }
    let relative = (wait - kernel).abs() / kernel;
    let summary = format!(
        "(victim, preemptor) on CPU {cpu}: {count} preemptions, {wait:.4}s waited vs victim's schedstat {kernel:.4}s ({:.1}% apart); reverse pair {reverse} in total; pairs with the idle cgroup in the window: {idle_pairs}",
        relative * 100.0
    );
    if count <= 0.0 || relative > TOLERANCE {
        return Err(format!(
            "{summary}: expected preemptions and waits within {:.0}%",
            TOLERANCE * 100.0
        ));
    }
    if idle_pairs > 2.0 {
        return Err(format!("{summary}: the sleeper preempts or is preempted"));
    }
    // The busy cgroups were moved from the hashes to counter slots after their first scrape
    // (so most of the counts above went through slots), within the slots' capacity.
    let quiet = agent.scrape()?;
    let slots = sample_value(&quiet, "qosd_bpf_map_entries", "map=\"RUNQ_BY_SLOT\"");
    let capacity = sample_value(&quiet, "qosd_bpf_map_capacity", "map=\"RUNQ_BY_SLOT\"");
    match (slots, capacity) {
        (Some(n), Some(c)) if n >= 2.0 && n <= c && (c - 1024.0).abs() < 0.5 => {}
        other => {
            return Err(format!(
                "{summary}; RUNQ_BY_SLOT (slots used, capacity) after the workload = {other:?}, want at least the victim's and the preemptor's of 1024"
            ));
        }
    }
    Ok(Some(format!(
        "{summary}; {} counter slots in use",
        slots.unwrap_or_default()
    )))
}

/// Once two busy cgroups are removed, the sched_switch object forgets them: their counter
/// slots are withdrawn (slots in use drop by at least two), their cpu-time hash entries are
/// deleted (`CGROUP_CPU_NS` entries drop by at least two), and no CPU-time, wait-histogram or
/// preemption series names them any more.
pub(crate) fn removed_cgroups_forgotten(ctx: &Context) -> Outcome {
    match forget_removed(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// Metric families whose series name a cgroup by path.
const PER_CGROUP_SERIES: [&str; 3] = [
    "qosd_cgroup_cpu_seconds_total{",
    "qosd_runqueue_latency_seconds_count{",
    "qosd_cgroup_preemptions_total{",
];

fn forget_removed(ctx: &Context) -> Result<String, String> {
    let agent = Agent::start(&ctx.qosd, Duration::from_secs(60))?;
    let mut cgroups = TestCgroups::create("qosd-systest-forget")?;
    let children = ["a", "b"];
    let cpu = last_allowed_cpu()?;
    let exe = ctx.self_exe.clone();
    for child in children {
        cgroups.mkdir(child)?;
        let pid = cgroups.spawn_in(child, &exe, &["spin", "2"])?;
        wait_exec(pid)?;
        pin(pid, cpu)?;
    }
    // The first scrape gives the cgroups counted in the hashes their slots; the second shows
    // them, with their waits and preemptions of each other.
    std::thread::sleep(Duration::from_secs(1));
    agent.scrape()?;
    cgroups.wait_all()?;
    let before = agent.scrape()?;
    let named = |text: &str, label: &str| -> Vec<String> {
        text.lines()
            .filter(|l| PER_CGROUP_SERIES.iter().any(|f| l.starts_with(f)))
            .filter(|l| l.contains(&format!("\"{label}\"")))
            .map(str::to_owned)
            .collect()
    };
    for child in children {
        let label = cgroups.label(child);
        let found = named(&before, &label);
        for family in PER_CGROUP_SERIES {
            if !found.iter().any(|l| l.starts_with(family)) {
                return Err(format!(
                    "before removal, no {family}...}} series of {label}: the check cannot judge"
                ));
            }
        }
    }
    let labels: Vec<String> = children.iter().map(|c| cgroups.label(c)).collect();
    drop(cgroups);
    // A scrape finds the cgroups gone and removes their counters; the next one shows it.
    agent.scrape()?;
    let after = agent.scrape()?;
    let entries = |text: &str, map: &str| {
        sample_value(text, "qosd_bpf_map_entries", &format!("map=\"{map}\""))
    };
    let slots = (
        entries(&before, "CPU_NS_BY_SLOT"),
        entries(&after, "CPU_NS_BY_SLOT"),
    );
    let hash = (
        entries(&before, "CGROUP_CPU_NS"),
        entries(&after, "CGROUP_CPU_NS"),
    );
    let runq_hist = (entries(&before, "RUNQ_HIST"), entries(&after, "RUNQ_HIST"));
    let left: Vec<String> = labels.iter().flat_map(|l| named(&after, l)).collect();
    let detail = format!(
        "slots in use {:?} -> {:?}; CGROUP_CPU_NS entries {:?} -> {:?}; RUNQ_HIST entries {:?} -> {:?}; series of the removed cgroups left: {}",
        slots.0,
        slots.1,
        hash.0,
        hash.1,
        runq_hist.0,
        runq_hist.1,
        left.len()
    );
    let dropped_by_two =
        |(b, a): (Option<f64>, Option<f64>)| matches!((b, a), (Some(b), Some(a)) if a <= b - 2.0);
    if !left.is_empty() || !dropped_by_two(slots) || !dropped_by_two(hash) {
        return Err(format!(
            "{detail}; expected no series and both counts down by at least 2: {left:?}"
        ));
    }
    Ok(detail)
}

/// Preemptions in which the cgroup `label` took part, either way.
fn idle_pairs(text: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with("qosd_cgroup_preemptions_total{") && l.contains(&format!("\"{label}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// (count, sum in seconds) of a child cgroup's wait histogram; zeros before the first wait.
/// The kernel's and qosd's wait totals at one moment: one scrape for every cgroup, between two
/// schedstat readings whose mean stands for the moment of the scrape (in an emulated guest a
/// scrape takes hundreds of milliseconds, while the napper keeps waiting about half the time).
struct Reading {
    /// schedstat run-queue seconds of the crowded tasks and of the napper.
    crowded_kernel: f64,
    napper_kernel: f64,
    /// (count, sum) of qosd's run-queue latency histogram per cgroup.
    crowded: (f64, f64),
    idle: (f64, f64),
    napper: (f64, f64),
}

impl Reading {
    /// `None` when the kernel has no schedstat.
    fn take(
        agent: &Agent,
        cgroups: &TestCgroups,
        crowded: &[u32],
        napper: u32,
    ) -> Result<Option<Self>, String> {
        let (Some(crowded_before), Some(napper_before)) =
            (schedstat_wait(crowded), schedstat_wait(&[napper]))
        else {
            return Ok(None);
        };
        let text = agent.scrape()?;
        let (Some(crowded_after), Some(napper_after)) =
            (schedstat_wait(crowded), schedstat_wait(&[napper]))
        else {
            return Ok(None);
        };
        let mean = |a: u64, b: u64| (a as f64 + b as f64) / 2e9;
        Ok(Some(Self {
            crowded_kernel: mean(crowded_before, crowded_after),
            napper_kernel: mean(napper_before, napper_after),
            crowded: histogram(&text, cgroups, "crowded"),
            idle: histogram(&text, cgroups, "idle"),
            napper: histogram(&text, cgroups, "napper"),
        }))
    }
}

/// (count, sum) of the run-queue latency histogram of `child` in one scrape.
fn histogram(text: &str, cgroups: &TestCgroups, child: &str) -> (f64, f64) {
    let labels = format!("cgroup=\"{}\"", cgroups.label(child));
    (
        sample_value(text, "qosd_runqueue_latency_seconds_count", &labels).unwrap_or(0.0),
        sample_value(text, "qosd_runqueue_latency_seconds_sum", &labels).unwrap_or(0.0),
    )
}

/// (preemptions, wait seconds) of the pair (victim, preemptor).
fn scrape_pair(
    agent: &Agent,
    cgroups: &TestCgroups,
    victim: &str,
    preemptor: &str,
) -> Result<(f64, f64), String> {
    let text = agent.scrape()?;
    let labels = format!(
        "preemptor_cgroup=\"{}\",victim_cgroup=\"{}\"",
        cgroups.label(preemptor),
        cgroups.label(victim)
    );
    Ok((
        sample_value(&text, "qosd_cgroup_preemptions_total", &labels).unwrap_or(0.0),
        sample_value(&text, "qosd_cgroup_preemption_wait_seconds_total", &labels).unwrap_or(0.0),
    ))
}

/// Sum of `/proc/<pid>/schedstat` field 2 (run-queue wait, ns) over `pids`; `None` when the
/// kernel has no schedstat.
fn schedstat_wait(pids: &[u32]) -> Option<u64> {
    let mut total = 0;
    for pid in pids {
        let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
        total += text.split_whitespace().nth(1)?.parse::<u64>().ok()?;
    }
    Some(total)
}
