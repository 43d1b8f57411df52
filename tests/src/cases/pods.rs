//! The container manager end to end against real cgroupfs: manifests dropped into a watched
//! directory become pod and container cgroups with kubelet's values, their processes run inside
//! them, hand edits are corrected, a malformed manifest leaves the others running, and after
//! SIGTERM nothing qosd created is left.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::agent::{Agent, sample_value};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{Hierarchies, TempPaths, wait_for};

const RECONCILE_SECONDS: u64 = 2;

const GUARANTEED: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: guaranteed, namespace: systest, uid: 0f0e0d0c-0000-4000-8000-000000000001}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: spin
    command: ["/bin/sh", "-c", "while :; do :; done"]
    resources:
      limits: {cpu: "1", memory: 128Mi}
"#;

const BURSTABLE: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: burstable, namespace: systest, uid: 0f0e0d0c-0000-4000-8000-000000000002}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: nap
    command: ["/bin/sh", "-c", "while :; do sleep 1; done"]
    resources:
      requests: {cpu: 250m, memory: 64Mi}
      limits: {cpu: 500m, memory: 128Mi}
"#;

const BEST_EFFORT: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: besteffort, namespace: systest, uid: 0f0e0d0c-0000-4000-8000-000000000003}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: nap
    command: ["/bin/sh", "-c", "while :; do sleep 1; done"]
"#;

const MALFORMED: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: broken, namespace: systest}
spec:
  containers:
  - name: c
    command: ["/bin/true"]
    resources:
      limits: {cpu: "5x"}
"#;

/// Manifests in, cgroups with kubelet's values out, processes inside, drift corrected, bad
/// manifest isolated, everything removed after SIGTERM.
pub(crate) fn manifests_become_cgroups(ctx: &Context) -> Outcome {
    match run(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run(ctx: &Context) -> Result<String, String> {
    let h = Hierarchies::new("qosd-systest-pods")?;
    let manifests = std::env::temp_dir().join(format!("{}-manifests", h.root_name));
    let _cleanup = TempPaths(vec![
        manifests.clone(),
        PathBuf::from(format!("{}-logs", manifests.display())),
        PathBuf::from(format!("{}-state", manifests.display())),
    ]);
    std::fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
    let write = |name: &str, text: &str| {
        std::fs::write(manifests.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    write("guaranteed.yaml", GUARANTEED)?;
    write("burstable.yaml", BURSTABLE)?;

    let args: Vec<String> = [
        "--manifest-dir",
        &manifests.display().to_string(),
        "--cgroup-root",
        &format!("/{}", h.root_name),
        "--reconcile-period",
        &format!("{RECONCILE_SECONDS}s"),
        "--container-log-dir",
        &format!("{}-logs", manifests.display()),
        // The case's checkpoints stay in its scratch space, not the host's /var/lib/qosd.
        "--state-dir",
        &format!("{}-state", manifests.display()),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    let fail_with_log = |e: String, agent: &Agent| format!("{e}\n{}", agent.log_tail());

    let guaranteed = "kubepods/pod0f0e0d0c-0000-4000-8000-000000000001";
    let burstable = "kubepods/burstable/pod0f0e0d0c-0000-4000-8000-000000000002";
    let besteffort = "kubepods/besteffort/pod0f0e0d0c-0000-4000-8000-000000000003";
    let mib128 = 128 * 1024 * 1024;
    let checks = || -> Result<(), String> {
        let mut problems = h.check(guaranteed, &h.expected(1024, Some(100_000), Some(mib128)));
        problems.extend(h.check(
            &format!("{guaranteed}/spin"),
            &h.expected(1024, Some(100_000), Some(mib128)),
        ));
        problems.extend(h.check(burstable, &h.expected(256, Some(50_000), Some(mib128))));
        problems.extend(h.check("kubepods/burstable", &h.expected(256, None, None)[..1]));
        problems.extend(h.check("kubepods/besteffort", &h.expected(2, None, None)[..1]));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    };
    wait_for(
        "pod cgroups with kubelet's values",
        Duration::from_secs(30),
        checks,
    )
    .map_err(|e| fail_with_log(e, &agent))?;

    // Processes land in their container cgroups.
    let procs_in = |relative: &str| -> Result<Vec<u32>, String> {
        let text = h.read("cpu", relative, "cgroup.procs")?;
        let pids: Vec<u32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            Err(format!("no process in {relative}"))
        } else {
            Ok(pids)
        }
    };
    let spin_pids = wait_for(
        "guaranteed container process",
        Duration::from_secs(20),
        || procs_in(&format!("{guaranteed}/spin")),
    )
    .map_err(|e| fail_with_log(e, &agent))?;
    wait_for(
        "burstable container process",
        Duration::from_secs(20),
        || procs_in(&format!("{burstable}/nap")),
    )
    .map_err(|e| fail_with_log(e, &agent))?;

    // Drift: a hand-edited limit is put back within one reconcile period (plus slack).
    let (drift_file, drift_value) = if h.v2() {
        ("cpu.max", "80000 100000")
    } else {
        ("cpu.cfs_quota_us", "80000")
    };
    let drift_path = h.path("cpu", burstable).join(drift_file);
    std::fs::write(&drift_path, drift_value)
        .map_err(|e| format!("{}: {e}", drift_path.display()))?;
    let drift_started = Instant::now();
    wait_for(
        "drift corrected",
        Duration::from_secs(RECONCILE_SECONDS * 3),
        || {
            let problems = h.check(burstable, &h.expected(256, Some(50_000), Some(mib128)));
            if problems.is_empty() {
                Ok(())
            } else {
                Err(problems.join("; "))
            }
        },
    )
    .map_err(|e| fail_with_log(e, &agent))?;
    let drift_took = drift_started.elapsed();

    // Drift: an (empty) tier removed by hand is recreated within a period.
    let besteffort_tier = h.path("cpu", "kubepods/besteffort");
    for mount in h.mounts() {
        let dir = mount.join(&h.root_name).join("kubepods/besteffort");
        std::fs::remove_dir(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    wait_for(
        "removed tier recreated",
        Duration::from_secs(RECONCILE_SECONDS * 3),
        || {
            if besteffort_tier.exists() {
                Ok(())
            } else {
                Err(format!("{} still missing", besteffort_tier.display()))
            }
        },
    )
    .map_err(|e| fail_with_log(e, &agent))?;

    // A malformed manifest is reported and admitted pods keep running; a new good one lands.
    write("broken.yaml", MALFORMED)?;
    write("besteffort.yaml", BEST_EFFORT)?;
    wait_for("besteffort pod", Duration::from_secs(30), || {
        procs_in(&format!("{besteffort}/nap"))
    })
    .map_err(|e| fail_with_log(e, &agent))?;
    // The pod's process is visible before the admission pass that started it has published
    // the pod counts, so the gauge is waited for too.
    let count_started = Instant::now();
    wait_for(
        "qosd_manifest_errors_total counts the malformed manifest and qosd_pods the new pod",
        Duration::from_secs(10),
        || {
            let text = agent.scrape()?;
            let errors = sample_value(&text, "qosd_manifest_errors_total", "");
            let pods = sample_value(&text, "qosd_pods", "qos_class=\"besteffort\"");
            match (errors, pods) {
                (Some(e), Some(p)) if e >= 1.0 && p >= 1.0 => Ok(()),
                _ => Err(format!(
                    "qosd_manifest_errors_total = {errors:?}, qosd_pods{{qos_class=\"besteffort\"}} = {pods:?}"
                )),
            }
        },
    )
    .map_err(|e| fail_with_log(e, &agent))?;
    let counted_after = count_started.elapsed();
    let still: Vec<u32> = procs_in(&format!("{guaranteed}/spin"))?;
    if !spin_pids.iter().all(|p| still.contains(p)) {
        return Err(format!(
            "guaranteed container restarted after an unrelated bad manifest: {spin_pids:?} -> {still:?}"
        ));
    }

    // Removing a manifest removes its pod's processes and cgroups.
    std::fs::remove_file(manifests.join("burstable.yaml")).map_err(|e| e.to_string())?;
    wait_for("burstable pod removed", Duration::from_secs(30), || {
        if h.path("cpu", burstable).exists() {
            Err("still there".into())
        } else {
            Ok(())
        }
    })
    .map_err(|e| fail_with_log(e, &agent))?;

    // SIGTERM: containers stopped, every cgroup qosd created removed.
    let (status, took) = agent.stop(libc::SIGTERM, Duration::from_secs(30))?;

    let left = h.leftovers();
    if !status.success() || !left.is_empty() {
        return Err(format!(
            "after SIGTERM ({status}, {} ms): left behind {left:?}",
            took.as_millis()
        ));
    }
    for pid in &spin_pids {
        if Path::new(&format!("/proc/{pid}")).exists() {
            return Err(format!("container process {pid} survived qosd's shutdown"));
        }
    }
    Ok(format!(
        "3 pods placed with kubelet's values; drift corrected in {} ms; removed tier recreated; bad manifest counted; new pod counted {} ms after its process appeared; removal and shutdown left nothing ({} ms)",
        drift_took.as_millis(),
        counted_after.as_millis(),
        took.as_millis()
    ))
}

/// MemTotal minus huge pages, in bytes, from /proc/meminfo (what kubelet calls memory capacity).
fn memory_capacity() -> Result<u64, String> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(|e| e.to_string())?;
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let total = kib("MemTotal:").ok_or("no MemTotal in /proc/meminfo")?;
    Ok((total - kib("Hugetlb:").unwrap_or(0)) * 1024)
}

/// The KubeletConfiguration from the design notes (with test cgroup paths and reservations
/// small enough for a 2 GiB guest): reserved cgroups get their reservations, kubepods gets
/// capacity minus both, `qosd_node_allocatable` also takes the default eviction threshold out,
/// and a pod that does not fit is rejected with `OutOfcpu` and gets no cgroup.
pub(crate) fn node_allocatable_enforced(ctx: &Context) -> Outcome {
    match allocatable(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

const TOO_BIG: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: too-big, namespace: systest, uid: 0f0e0d0c-0000-4000-8000-00000000000b}
spec:
  containers:
  - name: c
    command: ["/bin/sh", "-c", "sleep 100"]
    resources:
      requests: {cpu: "64", memory: 1Mi}
"#;

fn allocatable(ctx: &Context) -> Result<String, String> {
    let h = Hierarchies::new("qosd-systest-alloc")?;
    for mount in h.mounts() {
        if h.v2() {
            // Like systemd for its slices: the parent delegates the controllers the
            // reservations need before qosd enforces them.
            let parent = mount.join(&h.root_name);
            std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {e}", parent.display()))?;
            std::fs::write(parent.join("cgroup.subtree_control"), "+cpu +memory +pids")
                .map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        for slice in ["system.slice", "kubelet.slice"] {
            let dir = mount.join(&h.root_name).join(slice);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    let reserved = 128u64 << 20;
    let config = std::env::temp_dir().join(format!("{}-kubelet.yaml", h.root_name));
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             systemReserved: {{cpu: \"500m\", memory: \"128Mi\"}}\n\
             kubeReserved: {{cpu: \"500m\", memory: \"128Mi\"}}\n\
             enforceNodeAllocatable: [pods, kube-reserved, system-reserved]\n\
             systemReservedCgroup: /{root}/system.slice\n\
             kubeReservedCgroup: /{root}/kubelet.slice\n\
             cgroupRoot: /{root}/pods\n",
            root = h.root_name
        ),
    )
    .map_err(|e| e.to_string())?;
    let manifests = std::env::temp_dir().join(format!("{}-manifests", h.root_name));
    let _cleanup = TempPaths(vec![
        manifests.clone(),
        PathBuf::from(format!("{}-logs", manifests.display())),
        PathBuf::from(format!("{}-state", manifests.display())),
        config.clone(),
    ]);
    std::fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
    std::fs::write(manifests.join("too-big.yaml"), TOO_BIG).map_err(|e| e.to_string())?;

    let args: Vec<String> = [
        "--manifest-dir",
        &manifests.display().to_string(),
        "--kubelet-config",
        &config.display().to_string(),
        "--container-log-dir",
        &format!("{}-logs", manifests.display()),
        // The case's checkpoints stay in its scratch space, not the host's /var/lib/qosd.
        "--state-dir",
        &format!("{}-state", manifests.display()),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    let with_log = |e: String, agent: &Agent| format!("{e}\n{}", agent.log_tail());

    let capacity = memory_capacity()?;
    let mut problems = Vec::new();
    for slice in ["system.slice", "kubelet.slice"] {
        problems.extend(h.check(slice, &h.expected(512, None, Some(reserved))));
    }
    let kubepods_memory = capacity - 2 * reserved;
    let kubepods_file = if h.v2() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    match h.read("memory", "pods/kubepods", kubepods_file) {
        Ok(v) if v == kubepods_memory.to_string() => {}
        Ok(v) => problems.push(format!(
            "kubepods {kubepods_file} = {v}, want capacity {capacity} - 256Mi = {kubepods_memory}"
        )),
        Err(e) => problems.push(e),
    }
    let rejected = wait_for("OutOfcpu rejection", Duration::from_secs(20), || {
        let text = agent.scrape()?;
        match sample_value(
            &text,
            "qosd_pod_admission_rejections_total",
            "reason=\"OutOfcpu\"",
        ) {
            Some(v) if v >= 1.0 => Ok(text),
            other => Err(format!(
                "qosd_pod_admission_rejections_total{{reason=\"OutOfcpu\"}} = {other:?}"
            )),
        }
    })
    .map_err(|e| with_log(e, &agent))?;
    let eviction = 100u64 << 20;
    let want_allocatable = capacity - 2 * reserved - eviction;
    match sample_value(&rejected, "qosd_node_allocatable", "resource=\"memory\"") {
        #[expect(
            clippy::cast_precision_loss,
            reason = "memory sizes are far below 2^53"
        )]
        Some(v) if (v - want_allocatable as f64).abs() < 1.0 => {}
        other => problems.push(format!(
            "qosd_node_allocatable{{resource=\"memory\"}} = {other:?}, want {want_allocatable}"
        )),
    }
    if h.path(
        "cpu",
        "pods/kubepods/burstable/pod0f0e0d0c-0000-4000-8000-00000000000b",
    )
    .exists()
    {
        problems.push("the rejected pod got a cgroup".to_owned());
    }
    let (status, _) = agent.stop(libc::SIGTERM, Duration::from_secs(30))?;

    if !status.success() {
        problems.push(format!("qosd exited {status}"));
    }
    if h.path("cpu", "pods").exists() {
        problems.push("qosd left its cgroup root behind".to_owned());
    }
    if problems.is_empty() {
        Ok(format!(
            "reserved cgroups hold 500m/128Mi; kubepods {kubepods_memory} bytes; allocatable memory {want_allocatable}; OutOfcpu rejected"
        ))
    } else {
        Err(problems.join("; "))
    }
}
