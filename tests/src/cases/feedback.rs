//! The feedback policies against the real kernel, each judged by the kernel's own accounting:
//!
//! - a Burstable container with a CPU limit that runs in spikes is throttled (`cpu.stat`);
//!   qosd gives it a CFS burst of its quota, after which the kernel reports the burst used
//!   (`nr_bursts`) and the throttled share of periods falls by more than half;
//! - BestEffort spinners share a CPU with a Burstable spinner whose small request gives its
//!   tier little weight; qosd caps the BestEffort tier at half what it used (and makes it
//!   idle where the kernel has `cpu.idle`), after which the tier's own CPU accounting stays
//!   within the cap, the Burstable task runs more (schedstat) and qosd sees it wait less
//!   behind BestEffort;
//! - a pinned container's memory is moved to the other NUMA node (`migratepages`); qosd sets
//!   its `cpuset.mems` to its CPUs' node, after which `memory.numa_stat` shows the memory back
//!   there.
//!
//! qosd runs with `--feedback-period 1s` (decisions within seconds) and a long hold (no
//! release during the case; release is covered by the unit tests).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use qosd::cgroup::cpuset::CpuSet;

use crate::agent::{Agent, http_get, sample_value, sum_where};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{Hierarchies, TempPaths, wait_for};
use crate::workload::{NumaBalancing, last_allowed_cpu, node_cpus, pin};

const BURST_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000f1";
const VICTIM_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000f2";
const NOISY_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000f3";
const PINNED_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000f4";
/// How long each case measures after the decision.
const AFTER: Duration = Duration::from_secs(8);

/// qosd in standalone mode on a test root with the given pods and KubeletConfiguration
/// lines, with a fast feedback and the `extra` arguments. Everything is removed on drop: qosd first (fields drop in
/// declaration order), then its cgroups, which a running qosd would otherwise make again.
pub(super) struct Scenario {
    pub(super) agent: Agent,
    pub(super) h: Hierarchies,
    _files: TempPaths,
}

impl Scenario {
    pub(super) fn start(
        ctx: &Context,
        prefix: &str,
        kubelet: &str,
        pods: &[(&str, String)],
        extra: &[&str],
    ) -> Result<Self, String> {
        let h = Hierarchies::new(prefix)?;
        let scratch = std::env::temp_dir().join(format!("{}-files", h.root_name));
        let files = TempPaths(vec![scratch.clone()]);
        let (manifests, config) = crate::agent::standalone_inputs(
            &scratch,
            &format!("cgroupRoot: /{}\n{kubelet}", h.root_name),
        )?;
        for (name, text) in pods {
            std::fs::write(manifests.join(name), text).map_err(|e| format!("{name}: {e}"))?;
        }
        let mut options = vec!["--feedback-period", "1s", "--feedback-hold", "600s"];
        options.extend_from_slice(extra);
        let args = crate::agent::standalone_args(&scratch, &manifests, &config, &options);
        let agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
        Ok(Self {
            h,
            agent,
            _files: files,
        })
    }

    /// The processes of the cgroup `relative` (under the test root).
    pub(super) fn pids(&self, relative: &str) -> Result<Vec<u32>, String> {
        Ok(self
            .h
            .read("cpu", relative, "cgroup.procs")?
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// Waits for at least `count` processes in `relative`.
    pub(super) fn wait_pids(&self, relative: &str, count: usize) -> Result<Vec<u32>, String> {
        wait_for(relative, Duration::from_secs(30), || {
            let pids = self.pids(relative)?;
            if pids.len() >= count {
                Ok(pids)
            } else {
                Err(format!("{} of {count} processes", pids.len()))
            }
        })
        .map_err(|e| self.with_log(e))
    }

    /// `cpu.stat` of `relative` as key -> value.
    fn cpu_stat(&self, relative: &str) -> Result<BTreeMap<String, u64>, String> {
        Ok(self
            .h
            .read("cpu", relative, "cpu.stat")?
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_owned(), v.trim().parse().ok()?))
            })
            .collect())
    }

    /// Waits for `policy`'s first decision: `Ok(true)` applied, `Ok(false)` unavailable.
    pub(super) fn wait_decision(&self, policy: &str, within: Duration) -> Result<bool, String> {
        wait_for(&format!("a {policy} decision"), within, || {
            let text = self.agent.scrape()?;
            let count = |action: &str| {
                sample_value(
                    &text,
                    "qosd_feedback_decisions_total",
                    &format!("action=\"{action}\",policy=\"{policy}\""),
                )
                .unwrap_or(0.0)
            };
            if count("apply") >= 1.0 {
                Ok(true)
            } else if count("unavailable") >= 1.0 {
                Ok(false)
            } else {
                Err("none yet".to_owned())
            }
        })
        .map_err(|e| self.with_log(e))
    }

    /// The first decision of `policy` in `/inspect`'s report, as one line (published within a
    /// second of the decision; emulated guests are slower).
    pub(super) fn decision_line(&self, policy: &str) -> Result<String, String> {
        self.decision_where(
            &format!("a {policy} line in /inspect"),
            Duration::from_secs(15),
            |d| d["policy"] == policy,
        )
    }

    /// The first decision in `/inspect`'s report that `matches`, as one line, waited for up to
    /// `within`.
    pub(super) fn decision_where(
        &self,
        what: &str,
        within: Duration,
        matches: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<String, String> {
        wait_for(what, within, || {
            let text = http_get(self.agent.addr, "/inspect")?;
            let report: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
            report["data"]["decisions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|d| matches(d))
                .map(|d| {
                    format!(
                        "{} {} {} {}: {} ({})",
                        d["time"].as_str().unwrap_or_default(),
                        d["policy"].as_str().unwrap_or_default(),
                        d["action"].as_str().unwrap_or_default(),
                        d["target"].as_str().unwrap_or_default(),
                        d["change"].as_str().unwrap_or_default(),
                        d["reason"].as_str().unwrap_or_default()
                    )
                })
                .ok_or_else(|| text.clone())
        })
        .map_err(|e| self.with_log(e))
    }

    pub(super) fn with_log(&self, e: impl std::fmt::Display) -> String {
        format!("{e}\n{}", self.agent.log_tail())
    }
}

pub(super) fn pod(uid: &str, name: &str, command: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: systest, uid: {uid}}}\n\
         spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    \
         command: {command}\n    resources: {resources}\n"
    )
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, key: &str) -> u64 {
    after
        .get(key)
        .copied()
        .unwrap_or(0)
        .saturating_sub(before.get(key).copied().unwrap_or(0))
}

/// Throttled periods per period between two `cpu.stat` readings.
#[expect(clippy::cast_precision_loss, reason = "period counts of seconds")]
fn throttled_share(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> f64 {
    let periods = delta(before, after, "nr_periods");
    if periods == 0 {
        return 0.0;
    }
    delta(before, after, "nr_throttled") as f64 / periods as f64
}

/// A spiky Burstable container is throttled, gets a CFS burst of its quota from qosd, and is
/// then throttled in less than half the share of periods while using the burst.
pub(crate) fn throttled_burstable_gets_a_burst(ctx: &Context) -> Outcome {
    match run_burst(ctx) {
        Ok(outcome) => outcome,
        Err(e) => fail(e),
    }
}

fn run_burst(ctx: &Context) -> Result<Outcome, String> {
    // 30 ms of CPU every 310 ms: 10% on average, half the 20% limit, yet each spike needs
    // more than one period's quota of 20 ms (and fits in the quota plus a burst of it). 310,
    // not 300: a spike train in step with the 100 ms CFS periods keeps its phase, and a
    // spike that starts 80 to 90 ms into a period is split into two halves under the quota,
    // every time (never throttled); 310 ms moves each spike 10 ms along the periods.
    let command = format!(
        "[\"{}\", \"pulse\", \"30\", \"310\", \"600\"]",
        ctx.self_exe.display()
    );
    let s = Scenario::start(
        ctx,
        "qosd-systest-burst",
        "",
        &[(
            "pulse.yaml",
            pod(
                BURST_UID,
                "pulse",
                &command,
                "{requests: {cpu: 100m}, limits: {cpu: 200m}}",
            ),
        )],
        &[],
    )?;
    let c = format!("kubepods/burstable/pod{BURST_UID}/c");
    s.wait_pids(&c, 1)?;
    let start = s.cpu_stat(&c)?;
    let applied = s
        .wait_decision("cpu_burst", Duration::from_secs(40))
        .map_err(|e| match s.cpu_stat(&c) {
            Ok(now) => format!(
                "{e}\n(cpu.stat since the pod started: throttled in {} of {} periods)",
                delta(&start, &now, "nr_throttled"),
                delta(&start, &now, "nr_periods")
            ),
            Err(_) => e,
        })?;
    let decided = s.cpu_stat(&c)?;
    let burst_file = if s.h.v2() {
        "cpu.max.burst"
    } else {
        "cpu.cfs_burst_us"
    };
    let line = s.decision_line("cpu_burst")?;
    if !applied {
        if s.h.path("cpu", &c).join(burst_file).exists() {
            return Err(format!(
                "qosd said CFS burst is unavailable, yet {burst_file} exists: {line}"
            ));
        }
        return Ok(Outcome::Skip(format!(
            "this kernel has no CFS burst ({burst_file}, Linux 5.14+); qosd reported it: {line}"
        )));
    }
    let burst = s.h.read("cpu", &c, burst_file)?;
    if burst != "20000" {
        return Err(format!(
            "{burst_file} = {burst}, want the quota 20000 ({line})"
        ));
    }
    std::thread::sleep(AFTER);
    let end = s.cpu_stat(&c)?;
    let before = throttled_share(&start, &decided);
    let after = throttled_share(&decided, &end);
    let bursts = delta(&decided, &end, "nr_bursts");
    let detail = format!(
        "throttled in {:.0}% of periods before the burst ({} of {}), {:.0}% after ({} of {}); nr_bursts +{bursts}; {line}",
        before * 100.0,
        delta(&start, &decided, "nr_throttled"),
        delta(&start, &decided, "nr_periods"),
        after * 100.0,
        delta(&decided, &end, "nr_throttled"),
        delta(&decided, &end, "nr_periods"),
    );
    if before < 0.1 || bursts == 0 || after > before / 2.0 {
        return Err(format!(
            "{detail}: want at least 10% before, bursts used after, and less than half the share"
        ));
    }
    Ok(Outcome::Pass(detail))
}

/// BestEffort spinners on the CPU of a spinning Burstable task with a small request take a
/// real share of it; qosd caps the BestEffort tier (and makes it idle where the kernel
/// allows), after which the kernel's accounting shows the tier held to its cap and the
/// Burstable task running more, and qosd's attribution shows less waiting behind BestEffort.
pub(crate) fn besteffort_crowding_burstable_is_suppressed(ctx: &Context) -> Outcome {
    match run_besteffort(ctx) {
        Ok(outcome) => outcome,
        Err(e) => fail(e),
    }
}

/// One reading: when, the spinner's CPU time (schedstat), the BestEffort tier's CPU time and
/// throttled periods (cpu.stat / cpuacct), and qosd's burstable <- besteffort wait.
struct Crowding {
    at: Instant,
    victim_ns: u64,
    tier_ns: u64,
    tier_throttled: u64,
    qosd_wait: f64,
}

fn crowding(s: &Scenario, victim: u32) -> Result<Crowding, String> {
    let schedstat = std::fs::read_to_string(format!("/proc/{victim}/schedstat"))
        .map_err(|e| format!("/proc/{victim}/schedstat: {e}"))?;
    let victim_ns = schedstat
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or(format!("schedstat of {victim}: {schedstat}"))?;
    let tier = "kubepods/besteffort";
    let stat = s.cpu_stat(tier)?;
    let tier_ns = if s.h.v2() {
        stat.get("usage_usec").copied().unwrap_or(0) * 1000
    } else {
        s.h.read("cpuacct", tier, "cpuacct.usage")?
            .parse()
            .map_err(|e| format!("cpuacct.usage: {e}"))?
    };
    let text = s.agent.scrape()?;
    let qosd_wait = sum_where(
        &text,
        "qosd_preemption_wait_seconds_total",
        &[
            ("victim_qos_class", "burstable"),
            ("preemptor_qos_class", "besteffort"),
        ],
    );
    Ok(Crowding {
        at: Instant::now(),
        victim_ns,
        tier_ns,
        tier_throttled: stat.get("nr_throttled").copied().unwrap_or(0),
        qosd_wait,
    })
}

/// (spinner CPUs, tier CPUs, qosd's wait per second) between two readings.
#[expect(clippy::cast_precision_loss, reason = "nanoseconds of seconds")]
fn rates(a: &Crowding, b: &Crowding) -> (f64, f64, f64) {
    let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
    (
        b.victim_ns.saturating_sub(a.victim_ns) as f64 / 1e9 / secs,
        b.tier_ns.saturating_sub(a.tier_ns) as f64 / 1e9 / secs,
        (b.qosd_wait - a.qosd_wait) / secs,
    )
}

fn run_besteffort(ctx: &Context) -> Result<Outcome, String> {
    let exe = ctx.self_exe.display().to_string();
    let spinner = format!("[\"{exe}\", \"spin\", \"600\"]");
    let spinners =
        format!("[\"/bin/sh\", \"-c\", \"for i in 1 2 3 4; do {exe} spin 600 & done; wait\"]");
    // The burstable tier weighs its pods' requests: 10m gives it 10 shares against the
    // besteffort tier's 2, so besteffort takes about a sixth of a shared CPU.
    let s = Scenario::start(
        ctx,
        "qosd-systest-crowd",
        "",
        &[
            (
                "victim.yaml",
                pod(VICTIM_UID, "victim", &spinner, "{requests: {cpu: 10m}}"),
            ),
            ("noisy.yaml", pod(NOISY_UID, "noisy", &spinners, "{}")),
        ],
        &[],
    )?;
    let victim_cgroup = format!("kubepods/burstable/pod{VICTIM_UID}/c");
    let noisy_cgroup = format!("kubepods/besteffort/pod{NOISY_UID}/c");
    let cpu = last_allowed_cpu()?;
    let victim = s.wait_pids(&victim_cgroup, 1)?[0];
    // The shell and its four spinners, all on the victim's CPU.
    for pid in s.wait_pids(&noisy_cgroup, 5)?.into_iter().chain([victim]) {
        pin(pid, cpu)?;
    }
    let start = crowding(&s, victim)?;
    let applied = s.wait_decision("besteffort_cpu", Duration::from_secs(40))?;
    let line = s.decision_line("besteffort_cpu")?;
    if !applied {
        return Err(format!(
            "qosd could not judge the crowding (the run-queue probe runs everywhere qosd is tested): {line}"
        ));
    }
    let decided = crowding(&s, victim)?;
    let tier = "kubepods/besteffort";
    let quota_us: u64 = if s.h.v2() {
        s.h.read("cpu", tier, "cpu.max")?
            .split_whitespace()
            .next()
            .and_then(|q| q.parse().ok())
            .ok_or(format!("besteffort cpu.max has no quota ({line})"))?
    } else {
        s.h.read("cpu", tier, "cpu.cfs_quota_us")?
            .parse()
            .map_err(|e| format!("besteffort cpu.cfs_quota_us: {e} ({line})"))?
    };
    let idle = if s.h.path("cpu", tier).join("cpu.idle").exists() {
        let idle = s.h.read("cpu", tier, "cpu.idle")?;
        if idle != "1" {
            return Err(format!("besteffort cpu.idle = {idle}, want 1 ({line})"));
        }
        "cpu.idle 1"
    } else {
        "no cpu.idle on this kernel"
    };
    std::thread::sleep(AFTER);
    let end = crowding(&s, victim)?;
    let (victim_before, tier_before, wait_before) = rates(&start, &decided);
    let (victim_after, tier_after, wait_after) = rates(&decided, &end);
    #[expect(clippy::cast_precision_loss, reason = "a quota in µs")]
    let cap = quota_us as f64 / 100_000.0;
    let detail = format!(
        "besteffort tier used {tier_before:.3} CPUs before, {tier_after:.3} after (cap {cap:.3}, {idle}, nr_throttled +{}); spinner ran {victim_before:.3} CPUs before, {victim_after:.3} after; qosd: waited behind besteffort {:.1} ms/s before, {:.1} ms/s after; {line}",
        end.tier_throttled.saturating_sub(decided.tier_throttled),
        wait_before * 1e3,
        wait_after * 1e3,
    );
    // Where the idle group's weight already holds the tier below its cap, the quota never
    // throttles it (6.1: weight 1 against the idle weight 3); held is what counts.
    let held = tier_after <= cap * 1.15 + 0.01 && tier_after < tier_before * 0.75;
    if !held || victim_after <= victim_before || wait_after > wait_before * 0.75 {
        return Err(format!(
            "{detail}: want the tier held to its cap, the spinner running more and qosd seeing less waiting"
        ));
    }
    Ok(Outcome::Pass(detail))
}

/// A pinned container's memory moved to the far node comes back to its CPUs' node once qosd
/// sets its `cpuset.mems`.
pub(crate) fn misplaced_memory_follows_the_cpus(ctx: &Context) -> Outcome {
    match run_numa(ctx) {
        Ok(outcome) => outcome,
        Err(e) => fail(e),
    }
}

/// Resident bytes per node of the container from `memory.numa_stat` (v2 `anon` + `file` in
/// bytes; v1 `total` in pages).
fn memory_per_node(s: &Scenario, relative: &str) -> Result<BTreeMap<u32, u64>, String> {
    let text = s.h.read("memory", relative, "memory.numa_stat")?;
    let (lines, unit): (&[&str], u64) = if s.h.v2() {
        (&["anon", "file"], 1)
    } else {
        (&["total"], 4096)
    };
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(key) = fields.next() else { continue };
        if !lines
            .iter()
            .any(|l| key == *l || key.starts_with(&format!("{l}=")))
        {
            continue;
        }
        for field in line.split_whitespace() {
            if let Some((node, value)) = field.strip_prefix('N').and_then(|f| f.split_once('='))
                && let (Ok(node), Ok(value)) = (node.parse::<u32>(), value.parse::<u64>())
            {
                *out.entry(node).or_default() += value * unit;
            }
        }
    }
    Ok(out)
}

fn run_numa(ctx: &Context) -> Result<Outcome, String> {
    let nodes = node_cpus()?;
    if nodes.len() < 2 {
        return Ok(Outcome::Skip(format!(
            "one NUMA node here ({nodes:?}): no memory can be on another node than the CPUs"
        )));
    }
    let migratepages = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("migratepages"))
        .find(|p| p.is_file())
        .ok_or("migratepages is not on PATH (numactl, installed by setup)")?;
    // The kernel's own balancing must not move the pages instead of qosd.
    let _balancing = NumaBalancing::set(false)?;
    let workload = format!(
        "[\"{}\", \"memory\", \"64\", \"600\"]",
        ctx.self_exe.display()
    );
    let s = Scenario::start(
        ctx,
        "qosd-systest-realign",
        "systemReserved: {cpu: 500m, memory: 128Mi}\n\
         evictionHard: {memory.available: 100Mi}\n\
         cpuManagerPolicy: static\n\
         topologyManagerPolicy: single-numa-node\n",
        &[(
            "pinned.yaml",
            pod(
                PINNED_UID,
                "pinned",
                &workload,
                "{limits: {cpu: \"2\", memory: 256Mi}}",
            ),
        )],
        &[],
    )?;
    let c = format!("kubepods/pod{PINNED_UID}/c");
    let pid = s.wait_pids(&c, 1)?[0];
    let cpus = CpuSet::parse(&s.h.read("cpuset", &c, "cpuset.cpus")?).map_err(|e| e.to_string())?;
    let node = nodes
        .iter()
        .find(|(_, node_cpus)| cpus.iter().all(|c| node_cpus.contains(&(c as usize))))
        .map(|(n, _)| *n)
        .ok_or(format!(
            "cpuset.cpus {cpus} is not on one node of {nodes:?}"
        ))?;
    let far = nodes
        .keys()
        .copied()
        .find(|n| *n != node)
        .ok_or("no second node")?;
    wait_for("64 MiB resident", Duration::from_secs(60), || {
        let per_node = memory_per_node(&s, &c)?;
        let total: u64 = per_node.values().sum();
        if total >= 60 << 20 {
            Ok(())
        } else {
            Err(format!("{per_node:?}"))
        }
    })
    .map_err(|e| s.with_log(e))?;
    let out = std::process::Command::new(&migratepages)
        .args([pid.to_string(), node.to_string(), far.to_string()])
        .output()
        .map_err(|e| format!("migratepages: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "migratepages {pid} {node} {far}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let moved = memory_per_node(&s, &c)?;
    let applied = s.wait_decision("numa_align", Duration::from_secs(40))?;
    let line = s.decision_line("numa_align")?;
    if !applied {
        return Err(format!("numa_align cannot act here: {line}"));
    }
    let mems = s.h.read("cpuset", &c, "cpuset.mems")?;
    if mems != node.to_string() {
        return Err(format!("cpuset.mems = {mems}, want {node} ({line})"));
    }
    let back = wait_for(
        "memory back on the CPUs' node",
        Duration::from_secs(30),
        || {
            let per_node = memory_per_node(&s, &c)?;
            let total: u64 = per_node.values().sum();
            let local = per_node.get(&node).copied().unwrap_or(0);
            if total > 0 && local * 100 >= total * 90 {
                Ok(per_node)
            } else {
                Err(format!("{per_node:?}"))
            }
        },
    )
    .map_err(|e| s.with_log(e))?;
    let mib = |m: &BTreeMap<u32, u64>| -> String {
        m.iter()
            .map(|(n, b)| format!("node {n}: {} MiB", b >> 20))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Ok(Outcome::Pass(format!(
        "CPUs {cpus} on node {node}; after migratepages {}; after qosd set cpuset.mems {mems}: {}; {line}",
        mib(&moved),
        mib(&back)
    )))
}
