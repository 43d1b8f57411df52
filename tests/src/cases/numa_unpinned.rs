//! Cross-NUMA truth for pods that are not pinned: their cpuset covers every node, so where
//! their memory is remote depends on where their tasks ran. Four Burstable pods (no cpuset of
//! their own) run the memory workload (64 MiB touched continuously) in the guests with two
//! nodes, placed with numactl inside the container:
//!
//! - `interleaved`: CPUs of node A, memory interleaved over both nodes (about half remote);
//! - `far`: CPUs of node A, memory bound to node B (almost all remote);
//! - `near`: CPUs of node A, memory bound to node A (almost none remote);
//! - `moving`: memory bound to node A, the task first on node A's CPUs, then moved to node B's
//!   (none remote, then almost all).
//!
//! Each is checked against the kernel: the share of its `memory.numa_stat` bytes on nodes
//! other than the ones its task ran on, weighted by where it ran (sampled from
//! `/proc/<pid>/stat`'s `processor` field through the window), against qosd's
//! `qosd_numa_memory_bytes{locality="remote"}` share of the same container. Also: the
//! per-node CPU family says where each ran, `qosd inspect`'s NUMA PLACEMENT table lists them,
//! and the feedback reports (never moves) the `far` pod.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::agent::{http_get, sum_where};
use crate::harness::{Context, Outcome, fail};
use crate::workload::{last_cpu, node_cpus, pin_to};

use super::feedback::{Scenario, pod};
use super::numa::{kernel_numa_stat, which};

/// qosd's remote share against the kernel's, at most this far apart.
const TOLERANCE: f64 = 0.10;
/// How long each measuring window lasts (qosd weighs by at least 10 s of CPU time).
const WINDOW: Duration = Duration::from_secs(12);

/// One pod of the case.
struct Placed {
    name: &'static str,
    uid: &'static str,
    /// What the kernel files should make of it, for the bounds: (lowest, highest) remote share.
    bounds: (f64, f64),
}

const PODS: [Placed; 4] = [
    Placed {
        name: "interleaved",
        uid: "0f0e0d0c-0000-4000-8000-0000000000a1",
        bounds: (0.30, 0.70),
    },
    Placed {
        name: "far",
        uid: "0f0e0d0c-0000-4000-8000-0000000000a2",
        bounds: (0.90, 1.0),
    },
    Placed {
        name: "near",
        uid: "0f0e0d0c-0000-4000-8000-0000000000a3",
        bounds: (0.0, 0.10),
    },
    Placed {
        name: "moving",
        uid: "0f0e0d0c-0000-4000-8000-0000000000a4",
        bounds: (0.0, 0.10),
    },
];

pub(crate) fn unpinned_memory_is_judged_by_where_it_ran(ctx: &Context) -> Outcome {
    let nodes = match node_cpus() {
        Ok(n) => n,
        Err(e) => return fail(e),
    };
    if nodes.len() < 2 {
        return Outcome::Skip(
            "one NUMA node: every page is local wherever a task runs (the guests have two)".into(),
        );
    }
    match run(ctx, &nodes) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// What one window measured for one pod.
struct Measured {
    qosd_remote: f64,
    kernel_remote: f64,
    memory: BTreeMap<u32, u64>,
    ran: BTreeMap<u32, f64>,
}

fn run(ctx: &Context, nodes: &BTreeMap<u32, Vec<usize>>) -> Result<String, String> {
    let mut ids = nodes.keys().copied();
    let (a, b) = (ids.next().ok_or("no node")?, ids.next().ok_or("one node")?);
    let numactl = which("numactl")?.display().to_string();
    let exe = ctx.self_exe.display().to_string();
    let workload = format!("\"{exe}\", \"memory\", \"64\", \"300\"");
    let command = |args: &str| format!("[\"{numactl}\", {args}, {workload}]");
    let pods: Vec<(String, String)> = PODS
        .iter()
        .map(|p| {
            let args = match p.name {
                "interleaved" => format!("\"--cpunodebind={a}\", \"--interleave={a},{b}\""),
                "far" => format!("\"--cpunodebind={a}\", \"--membind={b}\""),
                "near" => format!("\"--cpunodebind={a}\", \"--membind={a}\""),
                _ => format!("\"--membind={a}\""),
            };
            (
                format!("{}.yaml", p.name),
                pod(
                    p.uid,
                    p.name,
                    &command(&args),
                    "{requests: {cpu: 100m, memory: 80Mi}}",
                ),
            )
        })
        .collect();
    let pods: Vec<(&str, String)> = pods.iter().map(|(f, t)| (f.as_str(), t.clone())).collect();
    let s = Scenario::start(ctx, "qosd-systest-unpinned", "", &pods, &[])?;
    let relative = |p: &Placed| format!("kubepods/burstable/pod{}/c", p.uid);
    let mut pids = BTreeMap::new();
    for p in &PODS {
        pids.insert(p.name, s.wait_pids(&relative(p), 1)?[0]);
    }
    pin_to(pids["moving"], &nodes[&a])?;
    // Every workload's memory resident.
    let want = 64 * 1_048_576 * 9 / 10;
    for p in &PODS {
        let dir = s.h.path("memory", &relative(p));
        crate::pod_tree::wait_for(
            &format!("{}'s memory resident", p.name),
            Duration::from_secs(90),
            || {
                let resident: u64 = kernel_numa_stat(&dir)?.values().sum();
                if resident >= want {
                    Ok(())
                } else {
                    Err(format!("{resident} bytes"))
                }
            },
        )
        .map_err(|e| s.with_log(e))?;
    }

    let first = measure(&s, nodes, &pids, &relative)?;
    // The moving task goes to the other node; its memory stays where it is bound.
    pin_to(pids["moving"], &nodes[&b])?;
    let second = measure(&s, nodes, &pids, &relative)?;

    let mut problems = Vec::new();
    let mut lines = Vec::new();
    let mut judge = |label: &str, m: &Measured, bounds: (f64, f64)| {
        lines.push(format!(
            "{label}: qosd {:.0}% remote, kernel {:.0}% (memory.numa_stat {}, ran {})",
            m.qosd_remote * 100.0,
            m.kernel_remote * 100.0,
            mib_by_node(&m.memory),
            shares(&m.ran)
        ));
        if (m.qosd_remote - m.kernel_remote).abs() > TOLERANCE {
            problems.push(format!("{label}: qosd and the kernel files differ"));
        }
        if m.kernel_remote < bounds.0 || m.kernel_remote > bounds.1 {
            problems.push(format!(
                "{label}: the kernel's remote share is outside {bounds:?}: the placement did not happen"
            ));
        }
    };
    for p in &PODS {
        judge(p.name, &first[p.name], p.bounds);
    }
    judge("moving, after the move", &second["moving"], (0.90, 1.0));

    // Where each ran, by qosd's per-node CPU family.
    let text = s.agent.scrape()?;
    let far_on_a = sum_where(
        &text,
        "qosd_cgroup_node_cpu_seconds_total",
        &[("pod", "far"), ("numa_node", &a.to_string())],
    );
    let far_on_b = sum_where(
        &text,
        "qosd_cgroup_node_cpu_seconds_total",
        &[("pod", "far"), ("numa_node", &b.to_string())],
    );
    if far_on_a <= 0.0 || far_on_b > far_on_a * 0.1 {
        problems.push(format!(
            "qosd_cgroup_node_cpu_seconds_total of far: node {a} {far_on_a} s, node {b} {far_on_b} s; it runs on node {a}"
        ));
    }
    // The feedback reports the far pod (not merely some pod), and writes nothing for it.
    let reported = s.decision_where(
        "numa_align's report of the far pod in /inspect",
        Duration::from_secs(30),
        |d| {
            d["policy"] == "numa_align"
                && d["action"] == "report"
                && d["target"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("systest/far/"))
        },
    );
    let decision = reported.clone().unwrap_or_default();
    match reported {
        Ok(_) => {
            // Nothing written: no single node in its cpuset.mems (a file that is not there
            // was not written either).
            let mems =
                s.h.read("cpuset", &relative(&PODS[1]), "cpuset.mems")
                    .unwrap_or_default();
            if [a, b].iter().any(|n| mems.trim() == n.to_string()) {
                problems.push(format!("far's cpuset.mems was written: {mems}"));
            }
        }
        Err(e) => problems.push(e),
    }
    // inspect's table.
    let inspect: serde_json::Value =
        serde_json::from_str(&http_get(s.agent.addr, "/inspect")?).map_err(|e| e.to_string())?;
    let rows = inspect["data"]["numa_placement"]
        .as_array()
        .map_or(0, Vec::len);
    if rows < PODS.len() {
        problems.push(format!(
            "qosd inspect's numa_placement has {rows} rows, want the {} pods: {}",
            PODS.len(),
            inspect["data"]["numa_placement"]
        ));
    }
    let detail = format!(
        "{}; far's CPU by node {a}: {far_on_a:.1} s, {b}: {far_on_b:.1} s; {rows} inspect rows; {decision}",
        lines.join("; ")
    );
    if problems.is_empty() {
        Ok(detail)
    } else {
        Err(s.with_log(format!("{}: {detail}", problems.join("; "))))
    }
}

/// One window: the tasks' CPUs sampled every 200 ms, then qosd's view and the kernel files
/// read at the end (two scrapes: the first records the window's last CPU reading).
fn measure(
    s: &Scenario,
    nodes: &BTreeMap<u32, Vec<usize>>,
    pids: &BTreeMap<&'static str, u32>,
    relative: &dyn Fn(&Placed) -> String,
) -> Result<BTreeMap<&'static str, Measured>, String> {
    let node_of = |cpu: usize| {
        nodes
            .iter()
            .find(|(_, c)| c.contains(&cpu))
            .map(|(n, _)| *n)
    };
    s.agent.scrape()?;
    let mut seen: BTreeMap<&'static str, BTreeMap<u32, u32>> = BTreeMap::new();
    let started = Instant::now();
    while started.elapsed() < WINDOW {
        for (name, pid) in pids {
            if let Some(node) = node_of(last_cpu(*pid)?) {
                *seen.entry(name).or_default().entry(node).or_default() += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    s.agent.scrape()?;
    let text = s.agent.scrape()?;
    let mut out = BTreeMap::new();
    for p in &PODS {
        let memory = kernel_numa_stat(&s.h.path("memory", &relative(p)))?;
        let samples = seen.get(p.name).cloned().unwrap_or_default();
        let total_samples: u32 = samples.values().sum();
        let ran: BTreeMap<u32, f64> = samples
            .iter()
            .map(|(n, c)| (*n, f64::from(*c) / f64::from(total_samples.max(1))))
            .collect();
        let bytes: u64 = memory.values().sum();
        #[expect(clippy::cast_precision_loss, reason = "byte counts as shares")]
        let kernel_remote = memory
            .iter()
            .map(|(n, b)| *b as f64 * (1.0 - ran.get(n).copied().unwrap_or(0.0)))
            .sum::<f64>()
            / (bytes.max(1) as f64);
        let label = format!("/{}/{}", s.h.root_name, relative(p));
        let local = sum_where(
            &text,
            "qosd_numa_memory_bytes",
            &[("cgroup", &label), ("locality", "local")],
        );
        let remote = sum_where(
            &text,
            "qosd_numa_memory_bytes",
            &[("cgroup", &label), ("locality", "remote")],
        );
        if local + remote <= 0.0 {
            return Err(format!("no qosd_numa_memory_bytes of {label}"));
        }
        out.insert(
            p.name,
            Measured {
                qosd_remote: remote / (local + remote),
                kernel_remote,
                memory,
                ran,
            },
        );
    }
    Ok(out)
}

#[expect(clippy::cast_precision_loss, reason = "MiB for a message")]
fn mib_by_node(memory: &BTreeMap<u32, u64>) -> String {
    memory
        .iter()
        .map(|(n, b)| format!("node {n} {:.1} MiB", *b as f64 / 1_048_576.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn shares(ran: &BTreeMap<u32, f64>) -> String {
    ran.iter()
        .map(|(n, s)| format!("node {n} {:.0}%", s * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}
