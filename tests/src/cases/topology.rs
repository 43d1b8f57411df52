//! The topology, CPU and memory managers against the real kernel: a Guaranteed pod gets
//! exclusive CPUs and memory on one NUMA node (its cgroup's `cpuset.cpus` / `cpuset.mems`,
//! the kernel's `Cpus_allowed_list` / `Mems_allowed_list` of its process and the cgroup's
//! `memory.numa_stat` agree), a shared pod runs on the rest, a pod that cannot be aligned is
//! rejected with kubelet's reason, and after qosd is killed and both checkpoints are
//! corrupted, the restarted qosd rebuilds them from cgroupfs and keeps the running pods where
//! they are, processes included.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use qosd::cgroup::cpuset::CpuSet;

use crate::agent::{Agent, sample_value};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{Hierarchies, TempPaths, wait_for};

const PINNED_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000a1";
const SHARED_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000a2";
const MISFIT_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000a3";
/// What the pinned container keeps resident.
const WORKLOAD_MIB: u64 = 64;

/// A Guaranteed pod pinned to one NUMA node, checked against the kernel, surviving a qosd
/// crash with corrupt checkpoints.
pub(crate) fn guaranteed_pod_pinned_to_one_numa_node(ctx: &Context) -> Outcome {
    match run(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// NUMA node -> its CPUs, from sysfs.
fn numa_nodes() -> Result<BTreeMap<u32, CpuSet>, String> {
    let mut nodes = BTreeMap::new();
    let dir = Path::new("/sys/devices/system/node");
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cpulist = std::fs::read_to_string(entry.path().join("cpulist"))
            .map_err(|e| format!("{name}/cpulist: {e}"))?;
        nodes.insert(id, CpuSet::parse(&cpulist).map_err(|e| e.to_string())?);
    }
    Ok(nodes)
}

fn pod(uid: &str, name: &str, command: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: systest, uid: {uid}}}\n\
         spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    \
         command: {command}\n    resources: {resources}\n"
    )
}

/// The value of `key` (`Cpus_allowed_list`, `Mems_allowed_list`) in /proc/<pid>/status.
fn proc_status(pid: u32, key: &str) -> Result<CpuSet, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(':')))
        .ok_or(format!("no {key} in /proc/{pid}/status"))?;
    CpuSet::parse(value).map_err(|e| e.to_string())
}

/// Anonymous memory per NUMA node in bytes from a `memory.numa_stat` (v2: bytes, v1: pages).
fn anon_per_node(numa_stat: &str, v2: bool) -> Result<BTreeMap<u32, u64>, String> {
    let line = numa_stat
        .lines()
        .find(|l| l.starts_with("anon ") || l.starts_with("anon="))
        .ok_or("no anon line in memory.numa_stat")?;
    let unit = if v2 { 1 } else { 4096 };
    Ok(line
        .split_whitespace()
        .filter_map(|field| {
            let (node, value) = field.strip_prefix('N')?.split_once('=')?;
            Some((node.parse().ok()?, value.parse::<u64>().ok()? * unit))
        })
        .collect())
}

fn run(ctx: &Context) -> Result<String, String> {
    let h = Hierarchies::new("qosd-systest-topo")?;
    let nodes = numa_nodes()?;
    let all_cpus: CpuSet = nodes.values().flat_map(CpuSet::iter).collect();
    // Two CPUs where there are two NUMA nodes (the guests: node 1 is the only one with two
    // free CPUs once CPU 0 is reserved), one on a single-node host with two CPUs.
    let want_cpus = if nodes.len() >= 2 { 2 } else { 1 };
    let scratch = std::env::temp_dir().join(format!("{}-files", h.root_name));
    let manifests = scratch.join("manifests");
    let state_dir = scratch.join("state");
    let config = scratch.join("kubelet.yaml");
    let _cleanup = TempPaths(vec![scratch.clone()]);
    std::fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cgroupRoot: /{root}\n\
             systemReserved: {{cpu: 500m, memory: 128Mi}}\n\
             evictionHard: {{memory.available: 100Mi}}\n\
             cpuManagerPolicy: static\n\
             memoryManagerPolicy: Static\n\
             reservedMemory:\n- numaNode: 0\n  limits: {{memory: 228Mi}}\n\
             topologyManagerPolicy: single-numa-node\n",
            root = h.root_name
        ),
    )
    .map_err(|e| e.to_string())?;
    let workload = format!(
        "[\"{}\", \"memory\", \"{WORKLOAD_MIB}\", \"600\"]",
        ctx.self_exe.display()
    );
    let write = |name: &str, text: &str| {
        std::fs::write(manifests.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    write(
        "pinned.yaml",
        &pod(
            PINNED_UID,
            "pinned",
            &workload,
            &format!("{{limits: {{cpu: \"{want_cpus}\", memory: 256Mi}}}}"),
        ),
    )?;
    write(
        "shared.yaml",
        &pod(
            SHARED_UID,
            "shared",
            "[\"/bin/sh\", \"-c\", \"while :; do sleep 1; done\"]",
            "{requests: {cpu: 100m, memory: 16Mi}}",
        ),
    )?;
    let args: Vec<String> = [
        "--manifest-dir",
        &manifests.display().to_string(),
        "--kubelet-config",
        &config.display().to_string(),
        "--state-dir",
        &state_dir.display().to_string(),
        "--container-log-dir",
        &scratch.join("logs").display().to_string(),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    let with_log = |e: String, agent: &Agent| format!("{e}\n{}", agent.log_tail());

    let pinned = format!("kubepods/pod{PINNED_UID}/c");
    let shared = format!("kubepods/burstable/pod{SHARED_UID}/c");
    let pid_in = |relative: &str| -> Result<u32, String> {
        h.read("cpu", relative, "cgroup.procs")?
            .split_whitespace()
            .find_map(|p| p.parse().ok())
            .ok_or(format!("no process in {relative}"))
    };
    let pinned_pid = wait_for("pinned container process", Duration::from_secs(30), || {
        pid_in(&pinned)
    })
    .map_err(|e| with_log(e, &agent))?;
    let shared_pid = wait_for("shared container process", Duration::from_secs(30), || {
        pid_in(&shared)
    })
    .map_err(|e| with_log(e, &agent))?;

    // The placement, as cgroupfs and the kernel's view of the process show it.
    let placement = |agent: &Agent| -> Result<(CpuSet, u32), String> {
        let cpus =
            CpuSet::parse(&h.read("cpuset", &pinned, "cpuset.cpus")?).map_err(|e| e.to_string())?;
        let mems =
            CpuSet::parse(&h.read("cpuset", &pinned, "cpuset.mems")?).map_err(|e| e.to_string())?;
        let node = match nodes
            .iter()
            .find(|(_, node_cpus)| cpus.is_subset(node_cpus))
        {
            Some((id, _)) if cpus.len() == want_cpus => *id,
            _ => {
                return Err(format!(
                    "pinned cpuset.cpus {cpus}: want {want_cpus} CPUs of one NUMA node ({nodes:?})"
                ));
            }
        };
        if cpus.contains(0) {
            return Err(format!(
                "pinned cpuset.cpus {cpus} holds the reserved CPU 0"
            ));
        }
        if mems.to_vec() != vec![node] {
            return Err(format!("pinned cpuset.mems {mems}, want node {node}"));
        }
        let allowed = proc_status(pinned_pid, "Cpus_allowed_list")?;
        let allowed_mems = proc_status(pinned_pid, "Mems_allowed_list")?;
        if allowed != cpus || allowed_mems != mems {
            return Err(format!(
                "kernel: pid {pinned_pid} may run on {allowed} with memory on {allowed_mems}; cgroup says {cpus} / {mems}"
            ));
        }
        let pool: CpuSet = all_cpus.iter().filter(|c| !cpus.contains(*c)).collect();
        let shared_cpus =
            CpuSet::parse(&h.read("cpuset", &shared, "cpuset.cpus")?).map_err(|e| e.to_string())?;
        let shared_allowed = proc_status(shared_pid, "Cpus_allowed_list")?;
        if shared_cpus != pool || shared_allowed != pool {
            return Err(format!(
                "shared container: cpuset.cpus {shared_cpus}, kernel {shared_allowed}; want the shared pool {pool}"
            ));
        }
        let text = agent.scrape()?;
        match sample_value(&text, "qosd_cpu_manager_exclusive_cpu_allocation_count", "") {
            Some(v) if (v - want_cpus as f64).abs() < 0.5 => Ok((cpus, node)),
            other => Err(format!(
                "qosd_cpu_manager_exclusive_cpu_allocation_count = {other:?}, want {want_cpus}"
            )),
        }
    };
    let (cpus, node) = wait_for("exclusive placement", Duration::from_secs(20), || {
        placement(&agent)
    })
    .map_err(|e| with_log(e, &agent))?;

    // Its memory is where cpuset.mems says: memory.numa_stat of the container's cgroup.
    let resident_on_node = || -> Result<(u64, u64), String> {
        let stat = h.read("memory", &pinned, "memory.numa_stat")?;
        let per_node = anon_per_node(&stat, h.v2())?;
        let total: u64 = per_node.values().sum();
        let local = per_node.get(&node).copied().unwrap_or(0);
        if total < (WORKLOAD_MIB - 4) << 20 {
            return Err(format!("only {total} bytes resident yet: {stat}"));
        }
        if local * 100 < total * 90 {
            return Err(format!(
                "{local} of {total} anonymous bytes on node {node} (want at least 90%): {stat}"
            ));
        }
        Ok((local, total))
    };
    let (local, total) = wait_for("memory on the pinned node", Duration::from_secs(60), || {
        resident_on_node()
    })
    .map_err(|e| with_log(e, &agent))?;

    // A pod no single node can hold is rejected with kubelet's reason; nothing moves.
    write(
        "misfit.yaml",
        &pod(
            MISFIT_UID,
            "misfit",
            "[\"/bin/sh\", \"-c\", \"sleep 100\"]",
            "{limits: {cpu: \"2\", memory: 64Mi}}",
        ),
    )?;
    wait_for("TopologyAffinityError", Duration::from_secs(20), || {
        let text = agent.scrape()?;
        match sample_value(
            &text,
            "qosd_pod_admission_rejections_total",
            "reason=\"TopologyAffinityError\"",
        ) {
            Some(v) if v >= 1.0 => Ok(()),
            other => Err(format!("rejections{{TopologyAffinityError}} = {other:?}")),
        }
    })
    .map_err(|e| with_log(e, &agent))?;
    if h.path("cpu", &format!("kubepods/pod{MISFIT_UID}")).exists() {
        return Err("the rejected pod got a cgroup".to_owned());
    }
    placement(&agent).map_err(|e| with_log(format!("after the rejection: {e}"), &agent))?;

    // qosd dies; both checkpoints are then corrupted; a new qosd starts.
    agent.stop(libc::SIGKILL, Duration::from_secs(10))?;
    let checkpoints: Vec<PathBuf> = ["cpu_manager_state", "memory_manager_state"]
        .iter()
        .map(|f| state_dir.join(f))
        .collect();
    for path in &checkpoints {
        if !path.is_file() {
            return Err(format!("{} was never written", path.display()));
        }
        std::fs::write(path, "{\"policyName\": \"sta").map_err(|e| e.to_string())?;
    }
    let mut agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    for file in ["cpu_manager_state", "memory_manager_state"] {
        wait_for(
            "checkpoint recovery counted",
            Duration::from_secs(20),
            || {
                let text = agent.scrape()?;
                match sample_value(
                    &text,
                    "qosd_checkpoint_recoveries_total",
                    &format!("checkpoint=\"{file}\",reason=\"corrupt\""),
                ) {
                    Some(v) if (v - 1.0).abs() < 0.5 => Ok(()),
                    other => Err(format!("recoveries{{{file}, corrupt}} = {other:?}")),
                }
            },
        )
        .map_err(|e| with_log(e, &agent))?;
    }
    let (cpus_after, node_after) =
        wait_for("placement after restart", Duration::from_secs(20), || {
            placement(&agent)
        })
        .map_err(|e| with_log(e, &agent))?;
    if cpus_after != cpus || node_after != node {
        return Err(with_log(
            format!(
                "placement moved across the restart: {cpus} on node {node} -> {cpus_after} on node {node_after}"
            ),
            &agent,
        ));
    }
    for (relative, pid) in [(&pinned, pinned_pid), (&shared, shared_pid)] {
        let now = pid_in(relative)?;
        if now != pid {
            return Err(with_log(
                format!(
                    "{relative}: process {pid} replaced by {now}: the running container was restarted, not adopted"
                ),
                &agent,
            ));
        }
    }
    let rebuilt = std::fs::read_to_string(&checkpoints[0]).map_err(|e| e.to_string())?;
    if !rebuilt.contains(PINNED_UID) || !rebuilt.contains(&format!("\"{cpus}\"")) {
        return Err(format!(
            "cpu_manager_state not rebuilt with the pod's CPUs: {rebuilt}"
        ));
    }
    // The memory node was rebuilt too: still enforced, and the memory still there.
    resident_on_node().map_err(|e| with_log(format!("after restart: {e}"), &agent))?;

    let (status, _) = agent.stop(libc::SIGTERM, Duration::from_secs(30))?;
    let left = h.leftovers();
    if !status.success() || !left.is_empty() {
        return Err(format!("after SIGTERM ({status}): left behind {left:?}"));
    }
    Ok(format!(
        "{want_cpus} exclusive CPU(s) {cpus} and memory on node {node} ({}% of {} MiB resident there); shared pool on the rest; TopologyAffinityError for a misfit; kill -9 + corrupt checkpoints: rebuilt, same CPUs, same processes",
        local * 100 / total.max(1),
        total >> 20
    ))
}
