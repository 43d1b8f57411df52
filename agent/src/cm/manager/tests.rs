use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;
use crate::cgroup::{CgroupfsBackend, Hierarchies, Limit, NameStyle};
use crate::cm::allocatable::Reservation;
use crate::cm::metrics::ResourceMetrics;
use crate::cm::resource_managers::ResourceManagersConfig;
use crate::config::kubelet::KubeletConfiguration;
use crate::feedback::{FeedbackConfig, PreemptionSource};
use crate::pods::manifest::{ManifestFormat, parse_manifest};
use crate::pods::quantity::Quantity;
use crate::pods::source::PodEvent;

const GUARANTEED: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: g, uid: aaaa}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {limits: {cpu: '1', memory: 128Mi}}\n";
const BURSTABLE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: b, uid: bbbb}\nspec:\n  initContainers:\n  - name: init\n    command: [/bin/true]\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {requests: {cpu: 500m}}\n";
const TOO_BIG: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: big, uid: cccc}\nspec:\n  containers:\n  - name: c\n    command: [/bin/true]\n    resources: {requests: {cpu: '8'}}\n";

fn sourced(yaml: &str) -> SourcedPod {
    let mut parsed = parse_manifest(yaml, ManifestFormat::Yaml);
    let pod = parsed.remove(0).expect("valid manifest").pod;
    SourcedPod {
        pod,
        origin: Origin::Manifest {
            file: PathBuf::from("fixture.yaml"),
            document: 1,
        },
    }
}

/// Resource managers with kubelet's default policies (none, None, none).
fn default_resources() -> ResourceManagers {
    resources(&KubeletConfiguration::default(), None)
}

/// Resource managers for `config` on the test guests' shape (two NUMA nodes of two CPUs).
fn resources(config: &KubeletConfiguration, state_dir: Option<&Path>) -> ResourceManagers {
    let reservation = Reservation {
        milli_cpu: config.system_reserved.milli_cpu() + config.kube_reserved.milli_cpu(),
        memory_bytes: config.system_reserved.memory_bytes(),
        pids: 0,
    };
    let machine = crate::machine::synthetic::vm_two_numa_four_cpus().expect("topology");
    let metrics = ResourceMetrics::register(&prometheus::Registry::new()).expect("metrics");
    ResourceManagers::new(
        &ResourceManagersConfig::from_kubelet(
            config,
            &reservation,
            state_dir.map(Path::to_path_buf),
        )
        .expect("config"),
        &machine,
        metrics,
    )
    .expect("resource managers")
}

/// A v2-shaped fixture tree (plain directories; the manager creates the files it writes).
fn manager(dir: &Path) -> (ContainerManager, CmMetrics, WorkloadIndex) {
    manager_with(dir, default_resources())
}

fn manager_with(
    dir: &Path,
    resources: ResourceManagers,
) -> (ContainerManager, CmMetrics, WorkloadIndex) {
    manager_reserving(dir, resources, Vec::new())
}

/// A manager that also enforces `reserved` (cgroups outside its root).
fn manager_reserving(
    dir: &Path,
    resources: ResourceManagers,
    reserved: Vec<(CgroupName, ResourceConfig)>,
) -> (ContainerManager, CmMetrics, WorkloadIndex) {
    let cgroups = CgroupfsBackend::new(
        Hierarchies::V2(dir.to_owned()),
        CgroupName::new(["qosd"]).expect("name"),
        NameStyle::Cgroupfs,
    )
    .with_reserved(reserved.iter().map(|(name, _)| name.clone()).collect());
    manager_on(dir, Box::new(cgroups), resources, reserved).expect("start")
}

/// A manager on `cgroups` (a fixture backend, or one wrapped in the fault layer).
fn manager_on(
    dir: &Path,
    cgroups: Writer,
    resources: ResourceManagers,
    reserved: Vec<(CgroupName, ResourceConfig)>,
) -> Result<(ContainerManager, CmMetrics, WorkloadIndex), ManagerError> {
    let root = CgroupName::new(["qosd"]).expect("name");
    let metrics = CmMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let index = WorkloadIndex::new();
    let options = ManagerOptions {
        root,
        policy: PodCgroupPolicy::default(),
        kubepods: ResourceConfig::default(),
        allocatable: NodeAllocatable {
            milli_cpu: 4000,
            memory_bytes: 4 << 30,
            hugepages: BTreeMap::new(),
            pids: None,
            pods: 110,
        },
        log_dir: None,
        state_dir: Some(dir.join("state")),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            reset_after: Duration::from_secs(600),
        },
        reserved,
    };
    let manager =
        ContainerManager::start(cgroups, options, resources, index.clone(), metrics.clone())?;
    Ok((manager, metrics, index))
}

fn read(dir: &Path, relative: &str) -> String {
    std::fs::read_to_string(dir.join(relative))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("<{relative}: {e}>"))
}

fn tick_until(
    m: &mut ContainerManager,
    what: &str,
    mut done: impl FnMut(&ContainerManager) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(m) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        m.tick();
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pods_get_kubelet_cgroups_tiers_follow_and_everything_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut m, metrics, index) = manager(dir.path());
    m.handle(PodEvent::Added(sourced(GUARANTEED)));
    m.handle(PodEvent::Added(sourced(BURSTABLE)));
    let d = dir.path();
    assert_eq!(
        read(d, "qosd/kubepods/podaaaa/cpu.weight"),
        "39",
        "1 CPU = 1024 shares = weight 39"
    );
    assert_eq!(read(d, "qosd/kubepods/podaaaa/cpu.max"), "100000 100000");
    assert_eq!(read(d, "qosd/kubepods/podaaaa/memory.max"), "134217728");
    assert_eq!(read(d, "qosd/kubepods/podaaaa/c/memory.max"), "134217728");
    assert_eq!(
        read(d, "qosd/kubepods/burstable/cpu.weight"),
        "20",
        "burstable tier: 500m = 512 shares"
    );
    assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.weight"), "1");
    assert_eq!(metrics.pods.with_label_values(&["guaranteed"]).get(), 1);
    assert!(index.len() >= 4, "pod and container cgroups are indexed");

    // The burstable pod's init container runs to completion before its app container.
    tick_until(&mut m, "burstable app container", |m| {
        matches!(
            m.container_state("bbbb", "c"),
            Some((ContainerState::Running { .. }, _))
        )
    });
    assert!(matches!(
        m.container_state("bbbb", "init"),
        Some((ContainerState::Terminated { exit_code: 0 }, _))
    ));

    // Does not fit: rejected with kubelet's reason, nothing created.
    m.handle(PodEvent::Added(sourced(TOO_BIG)));
    assert_eq!(
        metrics
            .admission_rejections
            .with_label_values(&["OutOfcpu"])
            .get(),
        1
    );
    assert!(!d.join("qosd/kubepods/burstable/podcccc").exists());

    // Drift: a hand edit is put back by reconcile, and counted.
    std::fs::write(d.join("qosd/kubepods/podaaaa/cpu.max"), "5000 100000").expect("edit");
    m.reconcile();
    assert_eq!(read(d, "qosd/kubepods/podaaaa/cpu.max"), "100000 100000");
    assert!(metrics.drift_corrections.get() >= 1);

    // Removal stops the containers, then removes the pod cgroup; the tier shrinks back.
    m.handle(PodEvent::Removed {
        uid: "bbbb".into(),
        namespace: "default".into(),
        name: "b".into(),
    });
    tick_until(&mut m, "burstable pod removed", |_| {
        !d.join("qosd/kubepods/burstable/podbbbb").exists()
    });
    assert_eq!(read(d, "qosd/kubepods/burstable/cpu.weight"), "1");
    let tree = m.render_tree().to_text();
    assert!(
        tree.lines().any(|l| l.starts_with("default    g ")
            && l.contains(" guaranteed ")
            && l.contains(" Running ")),
        "{tree}"
    );

    // An updated manifest restarts the pod with its new values (same uid, same cgroup).
    let first_pid = match m.container_state("aaaa", "c") {
        Some((ContainerState::Running { pid }, _)) => *pid,
        other => panic!("guaranteed container not running: {other:?}"),
    };
    m.handle(PodEvent::Updated(sourced(
        &GUARANTEED.replace("cpu: '1'", "cpu: '2'"),
    )));
    tick_until(
        &mut m,
        "updated pod running again",
        |m| matches!(m.container_state("aaaa", "c"), Some((ContainerState::Running { pid }, _)) if *pid != first_pid),
    );
    assert_eq!(read(d, "qosd/kubepods/podaaaa/cpu.max"), "200000 100000");

    m.shutdown(Duration::from_secs(5));
    assert!(
        !d.join("qosd").exists(),
        "the root the manager created is gone"
    );
}

/// The static CPU policy with CPU 0 reserved, the Static memory policy with 128 MiB
/// reserved on node 0, `single-numa-node`.
fn pinning_config() -> KubeletConfiguration {
    let mut config = KubeletConfiguration {
        cpu_manager_policy: "static".to_owned(),
        memory_manager_policy: "Static".to_owned(),
        topology_manager_policy: "single-numa-node".to_owned(),
        ..KubeletConfiguration::default()
    };
    config.system_reserved.cpu = Some(Quantity::parse("1").expect("quantity"));
    config.system_reserved.memory = Some(Quantity::parse("128Mi").expect("quantity"));
    config.reserved_memory = vec![crate::config::kubelet::MemoryReservation {
        numa_node: 0,
        limits: BTreeMap::from([(
            "memory".to_owned(),
            Quantity::parse("128Mi").expect("quantity"),
        )]),
    }];
    config
}

const PINNED: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: pinned, uid: pppp}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {limits: {cpu: '2', memory: 256Mi}}\n";
const SHARED: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: shared, uid: ssss}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {requests: {cpu: 100m}}\n";
const SECOND: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: second, uid: tttt}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {limits: {cpu: '2', memory: 64Mi}}\n";

#[test]
fn exclusive_cpus_and_memory_nodes_are_written_and_the_shared_pool_follows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("state dir");
    let (mut m, metrics, _) =
        manager_with(dir.path(), resources(&pinning_config(), Some(state.path())));
    m.resume(vec![PodEvent::Added(sourced(SHARED))]);
    let d = dir.path();
    assert_eq!(
        read(d, "qosd/kubepods/burstable/podssss/c/cpuset.cpus"),
        "0-3"
    );

    m.handle(PodEvent::Added(sourced(PINNED)));
    assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.cpus"), "2-3");
    assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.mems"), "1");
    assert_eq!(
        read(d, "qosd/kubepods/burstable/podssss/c/cpuset.cpus"),
        "0-1",
        "the shared container left the exclusive CPUs"
    );
    let checkpoint = std::fs::read_to_string(state.path().join("cpu_manager_state"))
        .expect("checkpoint written");
    assert!(
        checkpoint.contains("\"pppp\":{\"c\":\"2-3\"}"),
        "{checkpoint}"
    );

    // No node has two free CPUs left: kubelet's reason, nothing created, nothing moved.
    m.handle(PodEvent::Added(sourced(SECOND)));
    assert_eq!(
        metrics
            .admission_rejections
            .with_label_values(&["TopologyAffinityError"])
            .get(),
        1
    );
    assert!(!d.join("qosd/kubepods/podtttt").exists());
    assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.cpus"), "2-3");

    // Deletion releases: the shared container gets every CPU back.
    m.handle(PodEvent::Removed {
        uid: "pppp".into(),
        namespace: "default".into(),
        name: "pinned".into(),
    });
    tick_until(&mut m, "pinned pod removed", |_| {
        !d.join("qosd/kubepods/podpppp").exists()
    });
    assert_eq!(
        read(d, "qosd/kubepods/burstable/podssss/c/cpuset.cpus"),
        "0-3"
    );
    m.shutdown(Duration::from_secs(5));
}

#[test]
fn a_restart_with_a_corrupt_checkpoint_keeps_placement_and_adopts_the_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = tempfile::tempdir().expect("state dir");
    let d = dir.path();
    let (mut first, _, _) = manager_with(d, resources(&pinning_config(), Some(state.path())));
    first.resume(vec![PodEvent::Added(sourced(PINNED))]);
    let pid = match first.container_state("pppp", "c") {
        Some((ContainerState::Running { pid }, _)) => *pid,
        other => panic!("not running: {other:?}"),
    };
    assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.cpus"), "2-3");
    // qosd dies without cleaning up (the container keeps running); in this fixture tree
    // the kernel's cgroup.procs is played by hand. A stray pod cgroup is left too.
    std::mem::forget(first);
    std::fs::write(
        d.join("qosd/kubepods/podpppp/c/cgroup.procs"),
        format!("{pid}\n"),
    )
    .expect("procs");
    std::fs::create_dir_all(d.join("qosd/kubepods/besteffort/podgone/c")).expect("mkdir");
    std::fs::write(state.path().join("cpu_manager_state"), "{garbage").expect("corrupt");

    let (mut second, _, _) = manager_with(d, resources(&pinning_config(), Some(state.path())));
    second.resume(vec![PodEvent::Added(sourced(PINNED))]);
    assert_eq!(
        second.container_state("pppp", "c").map(|(s, _)| s.clone()),
        Some(ContainerState::Running { pid }),
        "the running process was adopted, not started again"
    );
    assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.cpus"), "2-3");
    assert_eq!(read(d, "qosd/kubepods/podpppp/c/cpuset.mems"), "1");
    assert!(
        !d.join("qosd/kubepods/besteffort/podgone").exists(),
        "the orphaned pod cgroup is removed"
    );
    let checkpoint = std::fs::read_to_string(state.path().join("cpu_manager_state"))
        .expect("checkpoint rewritten");
    assert!(
        checkpoint.contains("\"pppp\":{\"c\":\"2-3\"}"),
        "{checkpoint}"
    );
    second.shutdown(Duration::from_secs(5));
    assert!(
        !d.join("qosd").exists(),
        "the root the first run created is removed by the second"
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists() || {
            // Our own child (spawned by `first`) lingers as a zombie until reaped.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
        }
    );
}

/// Cumulative preemptions the test sets, by (victim, preemptor) cgroup id.
#[derive(Clone, Default)]
struct FakePreemptions(
    std::sync::Arc<std::sync::Mutex<HashMap<(u64, u64), crate::feedback::Preemptions>>>,
);

impl PreemptionSource for FakePreemptions {
    fn preemptions(
        &mut self,
    ) -> Result<HashMap<(u64, u64), crate::feedback::Preemptions>, crate::metrics::SampleError>
    {
        Ok(self.0.lock().expect("lock").clone())
    }
}

const LIMITED: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: wwww}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {requests: {cpu: 100m}, limits: {cpu: 200m}}\n";
const NOISY: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: noisy, uid: nnnn}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n";

/// The manager writes what the feedback decides, over kubelet's values: a throttled
/// Burstable container (its cpu.stat as the kernel would report it) gets a CFS burst of
/// its quota, the BestEffort tier becomes idle once its tasks preempt the Burstable ones,
/// reconcile keeps both, and `inspect` lists the decisions.
#[test]
fn feedback_decisions_are_written_over_kubelets_values_and_kept_by_reconcile() {
    use std::os::unix::fs::MetadataExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (mut m, _, _) = manager(d);
    m.handle(PodEvent::Added(sourced(LIMITED)));
    m.handle(PodEvent::Added(sourced(NOISY)));
    let web = "qosd/kubepods/burstable/podwwww/c";
    let noisy = "qosd/kubepods/besteffort/podnnnn/c";
    assert_eq!(read(d, &format!("{web}/cpu.max")), "20000 100000");
    // A kernel with CFS burst and cpu.idle: the files exist in kubepods.
    for file in ["cpu.max.burst", "cpu.idle"] {
        std::fs::write(d.join("qosd/kubepods").join(file), "0").expect("write");
    }
    let preemptions = FakePreemptions::default();
    let mut config = FeedbackConfig::with_defaults(
        crate::feedback::Mode::On,
        Duration::from_millis(1),
        Duration::from_secs(600),
    );
    config.besteffort.enter_wait = 0.001;
    // 1 ms windows would need a second of them: two windows are the evidence here.
    config.besteffort.windows = 2;
    config.burst.windows = 2;
    config.numa.windows = 2;
    m.enable_feedback(config, None, Some(Box::new(preemptions.clone())), None);

    let id = |relative: &str| std::fs::metadata(d.join(relative)).expect("cgroup").ino();
    let pair = (id(web), id(noisy));
    let mut last = Instant::now();
    for window in 0..4u64 {
        // 50 periods per window, 20 of them throttled; the besteffort container's tasks
        // preempt the burstable one's, which then wait 20 ms per window.
        std::fs::write(
            d.join(web).join("cpu.stat"),
            format!(
                "usage_usec 0\nnr_periods {}\nnr_throttled {}\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n",
                50 * window,
                20 * window
            ),
        )
        .expect("cpu.stat");
        // The BestEffort tier's own usage: 1 ms per window of at least 2 ms, so at most half
        // a CPU (its containers report none: only the tier's file can give its use).
        std::fs::write(
            d.join("qosd/kubepods/besteffort/cpu.stat"),
            format!(
                "usage_usec {}
",
                1000 * window
            ),
        )
        .expect("tier cpu.stat");
        preemptions.0.lock().expect("lock").insert(
            pair,
            crate::feedback::Preemptions {
                count: 10 * window,
                wait_ns: 20_000_000 * window,
            },
        );
        while last.elapsed() < Duration::from_millis(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        last = Instant::now();
        m.feedback_tick();
    }
    assert_eq!(read(d, &format!("{web}/cpu.max.burst")), "20000");
    assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.idle"), "1");
    // Capped at half what the tier used: at most a quarter CPU (windows of at least 2 ms), and
    // at least the 10m floor (a busy machine stretches the windows, and the rate falls).
    let tier_max = read(d, "qosd/kubepods/besteffort/cpu.max");
    let quota: u64 = tier_max
        .split_whitespace()
        .next()
        .and_then(|q| q.parse().ok())
        .unwrap_or_else(|| panic!("a quota in {tier_max}"));
    assert!((1_000..=25_000).contains(&quota), "tier cpu.max {tier_max}");
    // Reconcile corrects a hand edit back to the feedback's value, not kubelet's.
    std::fs::write(d.join(web).join("cpu.max.burst"), "0").expect("write");
    m.reconcile();
    assert_eq!(read(d, &format!("{web}/cpu.max.burst")), "20000");
    let report = m.render_tree();
    let decisions = report.data["decisions"].as_array().expect("decisions");
    assert_eq!(decisions.len(), 2, "{report:?}");
    let tree = report.to_text();
    assert!(
        tree.contains("cpu_burst       apply   default/web/c"),
        "{tree}"
    );
    assert!(
        tree.contains("besteffort_cpu  apply   besteffort tier  cpu.idle 1"),
        "{tree}"
    );
    m.shutdown(Duration::from_secs(5));
}

#[test]
fn reserved_cgroups_are_enforced_reconciled_and_never_created_or_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::create_dir(d.join("system.slice")).expect("an existing reserved cgroup");
    let system = CgroupName::new(["system.slice"]).expect("name");
    let missing = CgroupName::new(["kube.slice"]).expect("name");
    let reservation = ResourceConfig {
        cpu_shares: Some(512),
        memory_limit: Some(Limit::Value(128 << 20)),
        ..ResourceConfig::default()
    };
    let (mut m, metrics, _) = manager_reserving(
        d,
        default_resources(),
        vec![(system, reservation.clone()), (missing, reservation)],
    );
    assert_eq!(read(d, "system.slice/memory.max"), "134217728");
    let weight = read(d, "system.slice/cpu.weight");
    assert!(weight.parse::<u64>().is_ok(), "cpu.weight {weight}");
    // The missing one is an error, counted, and not created.
    assert!(!d.join("kube.slice").exists());
    let errors = metrics
        .cgroup_write_errors
        .with_label_values(&["reserved-cgroup"])
        .get();
    assert_eq!(errors, 1);

    // A hand edit is drift: reconcile puts the reservation back and counts it.
    std::fs::write(d.join("system.slice/memory.max"), "max").expect("edit");
    let before = metrics.drift_corrections.get();
    m.reconcile();
    assert_eq!(read(d, "system.slice/memory.max"), "134217728");
    assert_eq!(metrics.drift_corrections.get(), before + 1);
    assert!(!d.join("kube.slice").exists(), "reconcile never creates it");

    // Shutdown removes what the manager created, never a reserved cgroup.
    m.shutdown(Duration::from_secs(5));
    assert!(!d.join("qosd").exists());
    assert!(d.join("system.slice").is_dir());
}

const SLEEPER_V1: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper, uid: vvvv}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 30']\n    resources: {requests: {cpu: 100m}}\n";
const SLEEPER_V2: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper, uid: vvvv}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    command: [/bin/sh, -c, 'sleep 31']\n    resources: {requests: {cpu: 120m}}\n";

/// The running process of `uid`'s container `c`, once there is one.
fn running_pid(m: &ContainerManager, uid: &str) -> Option<u32> {
    match m.container_state(uid, "c") {
        Some((ContainerState::Running { pid }, _)) => Some(*pid),
        _ => None,
    }
}

#[test]
fn a_restart_after_the_manifest_changed_replaces_the_running_earlier_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (mut first, _, _) = manager(d);
    first.resume(vec![PodEvent::Added(sourced(SLEEPER_V1))]);
    let old = running_pid(&first, "vvvv").expect("v1 running");
    let environ = std::fs::read(format!("/proc/{old}/environ")).expect("environ");
    let fingerprint = sourced(SLEEPER_V1).pod.fingerprint();
    assert!(
        String::from_utf8_lossy(&environ).contains(&format!("{POD_FINGERPRINT_ENV}={fingerprint}")),
        "the container carries its pod version's fingerprint"
    );
    // qosd dies before it saw the manifest change; the container keeps running.
    std::mem::forget(first);
    let container = "qosd/kubepods/burstable/podvvvv/c";
    std::fs::write(d.join(container).join("cgroup.procs"), format!("{old}\n")).expect("procs");

    let (mut second, _, _) = manager(d);
    second.resume(vec![PodEvent::Added(sourced(SLEEPER_V2))]);
    tick_until(&mut second, "the new version running", |m| {
        running_pid(m, "vvvv").is_some_and(|pid| pid != old)
    });
    let new = running_pid(&second, "vvvv").expect("v2 running");
    let cmdline = std::fs::read(format!("/proc/{new}/cmdline")).expect("cmdline");
    assert!(String::from_utf8_lossy(&cmdline).contains("sleep 31"));
    assert_eq!(read(d, "qosd/kubepods/burstable/podvvvv/cpu.weight"), "5");
    // The earlier version got SIGTERM (sh exits on it): ended, a zombie of the forgotten
    // manager at most.
    let ended = || {
        std::fs::read_to_string(format!("/proc/{old}/stat")).map_or(true, |s| s.contains(") Z "))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ended() {
        assert!(Instant::now() < deadline, "the earlier version still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
    second.shutdown(Duration::from_secs(5));
}

#[test]
fn a_restart_with_the_same_manifest_adopts_the_running_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (mut first, _, _) = manager(d);
    first.resume(vec![PodEvent::Added(sourced(SLEEPER_V1))]);
    let old = running_pid(&first, "vvvv").expect("running");
    std::mem::forget(first);
    let container = "qosd/kubepods/burstable/podvvvv/c";
    std::fs::write(d.join(container).join("cgroup.procs"), format!("{old}\n")).expect("procs");
    let (mut second, _, _) = manager(d);
    second.resume(vec![PodEvent::Added(sourced(SLEEPER_V1))]);
    for _ in 0..10 {
        second.tick();
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        running_pid(&second, "vvvv"),
        Some(old),
        "adopted, not replaced"
    );
    second.shutdown(Duration::from_secs(5));
}

#[test]
fn an_intervention_left_by_a_killed_run_is_lifted_without_the_feedback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // An earlier qosd was killed while it held the BestEffort tier idle with a quota and a
    // container's CFS burst; this kernel has both settings (their files exist in kubepods).
    let besteffort = d.join("qosd/kubepods/besteffort");
    std::fs::create_dir_all(&besteffort).expect("mkdir");
    for file in ["cpu.max.burst", "cpu.idle"] {
        std::fs::write(d.join("qosd/kubepods").join(file), "0").expect("write");
    }
    std::fs::write(besteffort.join("cpu.idle"), "1").expect("write");
    std::fs::write(besteffort.join("cpu.max"), "9000 100000").expect("write");
    let (mut m, _, _) = manager(d);
    assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.idle"), "0");
    // What was written (the kernel shows it as `max 100000`).
    assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.max"), "max");
    assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.weight"), "1");
    m.handle(PodEvent::Added(sourced(LIMITED)));
    let web = "qosd/kubepods/burstable/podwwww/c";
    std::fs::write(d.join(web).join("cpu.max.burst"), "20000").expect("write");
    m.reconcile();
    assert_eq!(read(d, &format!("{web}/cpu.max.burst")), "0");
    m.shutdown(Duration::from_secs(5));
}

/// A fixture backend in the fault layer, and the handle that adds refusals.
fn faulty_backend(dir: &Path) -> (Writer, crate::cgroup::fault::Faults) {
    let inner = CgroupfsBackend::new(
        Hierarchies::V2(dir.to_owned()),
        CgroupName::new(["qosd"]).expect("name"),
        NameStyle::Cgroupfs,
    );
    let (writer, faults) = crate::cgroup::fault::FaultyWriter::new(Box::new(inner));
    (Box::new(writer), faults)
}

fn write_errors(metrics: &CmMetrics, file: &str) -> u64 {
    metrics.cgroup_write_errors.with_label_values(&[file]).get()
}

#[test]
fn a_tier_setting_the_kernel_refuses_at_start_degrades_that_tier_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (cgroups, faults) = faulty_backend(d);
    let burstable = CgroupName::new(["qosd", "kubepods", "burstable"]).expect("name");
    faults.refuse(&burstable, crate::cgroup::Setting::CpuShares, libc::EINVAL);
    let (mut m, metrics, _) =
        manager_on(d, cgroups, default_resources(), Vec::new()).expect("a refusal is not fatal");
    assert_eq!(write_errors(&metrics, "cpu.weight"), 1, "counted");
    // Everything else is there: the BestEffort tier with its weight, and pods run.
    assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.weight"), "1");
    m.handle(PodEvent::Added(sourced(SLEEPER_V1)));
    tick_until(&mut m, "the pod running", |m| {
        running_pid(m, "vvvv").is_some()
    });
    // The kernel takes it again: the next reconcile writes it.
    faults.clear();
    m.reconcile();
    assert_eq!(read(d, "qosd/kubepods/burstable/cpu.weight"), "4");
    m.shutdown(Duration::from_secs(5));
}

/// Two tiers refused in one pass: each refusal is logged and counted, none is lost behind
/// the other.
#[test]
fn every_tier_refusal_of_one_pass_is_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (cgroups, faults) = faulty_backend(d);
    for tier in ["burstable", "besteffort"] {
        let name = CgroupName::new(["qosd", "kubepods", tier]).expect("name");
        faults.refuse(&name, crate::cgroup::Setting::CpuShares, libc::EINVAL);
    }
    let (mut m, metrics, _) =
        manager_on(d, cgroups, default_resources(), Vec::new()).expect("a refusal is not fatal");
    assert_eq!(
        write_errors(&metrics, "cpu.weight"),
        2,
        "the Burstable and the BestEffort tier's refusals"
    );
    // The kernel takes them again: the next reconcile writes both (no pods: kubelet's least
    // weight, 2 shares, in both tiers).
    faults.clear();
    m.reconcile();
    assert_eq!(read(d, "qosd/kubepods/burstable/cpu.weight"), "1");
    assert_eq!(read(d, "qosd/kubepods/besteffort/cpu.weight"), "1");
    m.shutdown(Duration::from_secs(5));
}

#[test]
fn a_container_setting_the_kernel_refuses_is_counted_and_other_pods_are_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (cgroups, faults) = faulty_backend(d);
    let web = CgroupName::new(["qosd", "kubepods", "burstable", "podwwww", "c"]).expect("name");
    for (setting, errno) in [
        (crate::cgroup::Setting::CpuQuota, libc::EBUSY),
        (crate::cgroup::Setting::CpuShares, libc::ENOSPC),
    ] {
        faults.refuse(&web, setting, errno);
    }
    let (mut m, metrics, _) =
        manager_on(d, cgroups, default_resources(), Vec::new()).expect("start");
    m.handle(PodEvent::Added(sourced(SLEEPER_V1)));
    m.handle(PodEvent::Added(sourced(LIMITED)));
    tick_until(&mut m, "the other pod running", |m| {
        running_pid(m, "vvvv").is_some()
    });
    let refused = write_errors(&metrics, "cpu.max") + write_errors(&metrics, "cpu.weight");
    assert!(refused >= 1, "the refusal is counted");
    assert_eq!(read(d, "qosd/kubepods/burstable/podvvvv/c/cpu.weight"), "4");
    m.reconcile();
    assert!(
        write_errors(&metrics, "cpu.max") + write_errors(&metrics, "cpu.weight") > refused,
        "reconcile tries again while the kernel refuses"
    );
    faults.clear();
    m.reconcile();
    assert_eq!(
        read(d, "qosd/kubepods/burstable/podwwww/c/cpu.max"),
        "20000 100000"
    );
    assert_eq!(read(d, "qosd/kubepods/burstable/podwwww/c/cpu.weight"), "4");
    m.shutdown(Duration::from_secs(5));
}
