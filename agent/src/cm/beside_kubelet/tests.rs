//! The manager beside kubelet on a fixture tree laid out as kubelet (systemd driver, cgroup
//! v2) and containerd lay it out; the test plays kubelet, writing kubelet's values with the
//! standalone backend.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::cgroup::files::Setting;
use crate::cgroup::resources::{Limit, ResourceConfig};
use crate::cgroup::settings_writer::SettingsOnlyWriter;
use crate::cgroup::{CgroupfsBackend, Hierarchies, NameStyle};
use crate::cm::pod_resources::{PodCgroupPolicy, pod_config};
use crate::feedback::{Mode, Preemptions};
use crate::pods::kubernetes::decode::decode_pod;
use crate::pods::source::SourcedPod;
use fake_kubernetes::pod_object;

const WEB_UID: &str = "11111111-2222";
const NOISY_UID: &str = "33333333-4444";
const WEB: &str =
    "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod11111111_2222.slice";
const NOISY: &str =
    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod33333333_4444.slice";
const BESTEFFORT: &str = "kubepods.slice/kubepods-besteffort.slice";

fn policy() -> PodCgroupPolicy {
    PodCgroupPolicy {
        enforce_cpu_limits: true,
        cpu_period_us: 100_000,
        memory_qos: false,
        pod_pids_limit: -1,
    }
}

fn pods() -> Vec<Pod> {
    let web = pod_object(
        "shop",
        "web",
        WEB_UID,
        "node-a",
        &[(
            "app",
            &[("cpu", "100m")],
            &[("cpu", "200m")],
            Some("containerd://aaa"),
        )],
    );
    let noisy = pod_object(
        "batch",
        "noisy",
        NOISY_UID,
        "node-a",
        &[("c", &[], &[], Some("containerd://bbb"))],
    );
    vec![
        decode_pod(web, "web").expect("web"),
        decode_pod(noisy, "noisy").expect("noisy"),
    ]
}

/// kubelet's and containerd's tree with their values, and a stray pod cgroup.
fn kubelet_tree(root: &Path) {
    let kubelet = CgroupfsBackend::new(
        Hierarchies::V2(root.to_owned()),
        CgroupName::root(),
        NameStyle::Systemd,
    );
    let tiers = QosTiers::new(&CgroupName::root()).expect("tiers");
    for dir in [
        format!("{WEB}/cri-containerd-aaa.scope"),
        format!("{WEB}/cri-containerd-sandbox1.scope"),
        format!("{NOISY}/cri-containerd-bbb.scope"),
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod99.slice".to_owned(),
    ] {
        std::fs::create_dir_all(root.join(dir)).expect("mkdir");
    }
    // Files the kernel would have (the feedback's capabilities come from kubepods).
    for (dir, file, value) in [
        ("kubepods.slice", "cpu.max.burst", "0"),
        ("kubepods.slice", "cpu.idle", "0"),
        (BESTEFFORT, "cpu.max", "max 100000"),
        (BESTEFFORT, "cpu.idle", "0"),
        (
            &format!("{WEB}/cri-containerd-aaa.scope") as &str,
            "cpu.max.burst",
            "0",
        ),
    ] {
        std::fs::write(root.join(dir).join(file), value).expect("file");
    }
    // kubelet's values (the standalone code is pinned to kubelet's own test vectors).
    let pods = pods();
    for pod in &pods {
        let qos = pod_qos(&pod.spec);
        let pod_cgroup = tiers.pod_cgroup(qos, &pod.metadata.uid).expect("name");
        kubelet
            .update(&pod_cgroup, &pod_config(&pod.spec, policy()))
            .expect("pod values");
        let id = pod.status.container_statuses[0]
            .runtime_id()
            .expect("id")
            .1
            .to_owned();
        let container = pod_cgroup
            .child(&format!("cri-containerd-{id}.scope"))
            .expect("name");
        kubelet
            .update(
                &container,
                &container_config(&pod.spec.containers[0], policy()),
            )
            .expect("container values");
    }
    let settings = crate::cm::qos_tiers::tier_settings(
        pods.iter().map(|p| (pod_qos(&p.spec), &p.spec)),
        false,
    );
    kubelet
        .update(&tiers.burstable, &settings.burstable)
        .expect("tier");
    kubelet
        .update(&tiers.besteffort, &settings.besteffort)
        .expect("tier");
}

fn manager(root: &Path) -> (BesideKubelet, BesideKubeletMetrics, WorkloadIndex) {
    let backend = CgroupfsBackend::new(
        Hierarchies::V2(root.to_owned()),
        CgroupName::root(),
        NameStyle::Systemd,
    );
    let tiers = QosTiers::new(&CgroupName::root()).expect("tiers");
    let writer = SettingsOnlyWriter::new(Box::new(backend), write_rule(&tiers));
    let metrics = BesideKubeletMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let index = WorkloadIndex::new();
    let manager = BesideKubelet::new(
        Box::new(writer),
        BesideKubeletOptions {
            view: KubeletView {
                systemd_driver: false,
                policy: policy(),
                memory_qos: false,
                kubepods: None,
                cpu_manager_policy: "none".into(),
                memory_manager_policy: "None".into(),
                kubelet_root: PathBuf::from("/nonexistent/qosd-test"),
            },
            tiers,
            id_root: root.to_owned(),
            state_dir: Some(root.join("state")),
        },
        Arc::new(CgroupTrees::new()),
        index.clone(),
        metrics.clone(),
    );
    (manager, metrics, index)
}

fn feed(manager: &mut BesideKubelet) {
    for pod in pods() {
        manager.handle(PodEvent::Added(SourcedPod {
            pod,
            origin: Origin::ApiServer {
                node: "node-a".into(),
            },
        }));
    }
}

fn ino(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).expect("stat"))
}

fn read(root: &Path, relative: &str) -> String {
    std::fs::read_to_string(root.join(relative))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("<{relative}: {e}>"))
}

#[test]
fn kubelets_cgroups_are_found_labelled_and_strays_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    kubelet_tree(root);
    let (mut m, metrics, index) = manager(root);
    feed(&mut m);
    m.tick();
    let web = index
        .get(ino(&root.join(WEB).join("cri-containerd-aaa.scope")))
        .expect("the web container is indexed");
    assert_eq!(
        (
            web.namespace.as_str(),
            web.pod.as_str(),
            web.container.as_deref(),
            web.qos_class
        ),
        ("shop", "web", Some("app"), QosClass::Burstable)
    );
    let sandbox = index
        .get(ino(&root.join(WEB).join("cri-containerd-sandbox1.scope")))
        .expect("the sandbox is indexed");
    assert_eq!(sandbox.container.as_deref(), Some(SANDBOX_CONTAINER));
    let pod = index.get(ino(&root.join(NOISY))).expect("pod cgroup");
    assert_eq!((pod.container, pod.qos_class), (None, QosClass::BestEffort));
    assert_eq!(
        metrics
            .unattributed
            .with_label_values(&["unknown_pod"])
            .get(),
        1
    );
    assert_eq!(metrics.pods.with_label_values(&["burstable"]).get(), 1);

    // A container restarted: a new id in the status and a new cgroup; the old one is gone.
    std::fs::remove_dir_all(root.join(WEB).join("cri-containerd-aaa.scope")).expect("rmdir");
    std::fs::create_dir(root.join(WEB).join("cri-containerd-ccc.scope")).expect("mkdir");
    let mut web_pod = pods().remove(0);
    web_pod.status.container_statuses[0].container_id = "containerd://ccc".into();
    m.handle(PodEvent::Updated(SourcedPod {
        pod: web_pod,
        origin: Origin::ApiServer {
            node: "node-a".into(),
        },
    }));
    m.tick();
    let web = index
        .get(ino(&root.join(WEB).join("cri-containerd-ccc.scope")))
        .expect("the new container is indexed");
    assert_eq!(web.container.as_deref(), Some("app"));

    // The pod is gone from the source: its cgroups are no longer its.
    m.handle(PodEvent::Removed {
        uid: NOISY_UID.into(),
        namespace: "batch".into(),
        name: "noisy".into(),
    });
    m.tick();
    assert!(index.get(ino(&root.join(NOISY))).is_none());
    assert_eq!(
        metrics
            .unattributed
            .with_label_values(&["unknown_pod"])
            .get(),
        2,
        "its cgroup, still there, is reported"
    );
}

#[test]
fn kubelets_values_are_checked_and_a_hand_edit_is_drift_never_corrected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    kubelet_tree(root);
    let (mut m, metrics, _) = manager(root);
    feed(&mut m);
    for _ in 0..drift::DRIFT_CHECKS {
        m.reconcile();
    }
    assert!(m.drifts().is_empty(), "{:?}", m.drifts());
    let container = format!("{WEB}/cri-containerd-aaa.scope");
    std::fs::write(root.join(&container).join("cpu.weight"), "100").expect("hand edit");
    m.reconcile();
    m.reconcile();
    assert!(m.drifts().is_empty(), "not yet: seen twice");
    m.reconcile();
    let drifts = m.drifts();
    assert_eq!(drifts.len(), 1, "{drifts:?}");
    assert_eq!(
        (
            drifts[0].level,
            drifts[0].file.as_str(),
            drifts[0].expected.as_str(),
            drifts[0].actual.as_deref(),
            drifts[0].pod.as_str(),
            drifts[0].container.as_str()
        ),
        (
            expected::Level::Container,
            "cpu.weight",
            "4",
            Some("100"),
            "web",
            "app"
        )
    );
    assert_eq!(
        metrics
            .drift
            .with_label_values(&["container", "cpu.weight", "shop", "web", "app", "burstable"])
            .get(),
        1
    );
    assert_eq!(
        read(root, &format!("{container}/cpu.weight")),
        "100",
        "never corrected"
    );
    let report = m.report();
    assert_eq!(report.data["drift"][0]["file"], "cpu.weight");
    assert!(report.to_text().contains("KUBELET DRIFT"));
}

/// Cumulative preemptions the test sets, by (victim, preemptor) cgroup id.
#[derive(Clone, Default)]
struct FakePreemptions(Arc<Mutex<HashMap<(u64, u64), Preemptions>>>);

impl PreemptionSource for FakePreemptions {
    fn preemptions(
        &mut self,
    ) -> Result<HashMap<(u64, u64), Preemptions>, crate::metrics::SampleError> {
        Ok(self.0.lock().expect("lock").clone())
    }
}

#[test]
fn interventions_on_kubelets_cgroups_are_rewritten_when_reverted_and_restored_at_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    kubelet_tree(root);
    let (mut m, metrics, _) = manager(root);
    feed(&mut m);
    m.tick();
    let preemptions = FakePreemptions::default();
    let mut config =
        FeedbackConfig::with_defaults(Mode::On, Duration::from_millis(1), Duration::from_secs(600));
    config.besteffort.enter_wait = 0.001;
    config.besteffort.windows = 2;
    config.burst.windows = 2;
    config.numa.windows = 2;
    m.enable_feedback(config, None, Some(Box::new(preemptions.clone())), None);
    let web = format!("{WEB}/cri-containerd-aaa.scope");
    let pair = (
        ino(&root.join(&web)),
        ino(&root.join(NOISY).join("cri-containerd-bbb.scope")),
    );
    let mut last = Instant::now();
    for window in 0..4u64 {
        std::fs::write(
            root.join(&web).join("cpu.stat"),
            format!(
                "usage_usec 0\nnr_periods {}\nnr_throttled {}\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n",
                50 * window,
                20 * window
            ),
        )
        .expect("cpu.stat");
        std::fs::write(
            root.join(BESTEFFORT).join("cpu.stat"),
            format!("usage_usec {}\n", 1000 * window),
        )
        .expect("tier cpu.stat");
        preemptions.0.lock().expect("lock").insert(
            pair,
            Preemptions {
                count: 10 * window,
                wait_ns: 20_000_000 * window,
            },
        );
        while last.elapsed() < Duration::from_millis(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        last = Instant::now();
        m.tick();
    }
    assert_eq!(read(root, &format!("{web}/cpu.max.burst")), "20000");
    assert_eq!(read(root, &format!("{BESTEFFORT}/cpu.idle")), "1");
    assert_ne!(read(root, &format!("{BESTEFFORT}/cpu.max")), "max 100000");
    // kubelet's own values untouched.
    assert_eq!(read(root, &format!("{web}/cpu.max")), "20000 100000");

    // The kernel shows an idle group's weight as its own (played here): the tier's weight is
    // the intervention's, not kubelet's drift.
    std::fs::write(root.join(BESTEFFORT).join("cpu.weight"), "100").expect("weight");

    // Written back (as kubelet would): found at the next check, written again, counted.
    std::fs::write(root.join(&web).join("cpu.max.burst"), "0").expect("revert");
    m.reconcile();
    assert_eq!(read(root, &format!("{web}/cpu.max.burst")), "20000");
    assert_eq!(metrics.reverted.with_label_values(&["cpu_burst"]).get(), 1);
    for _ in 0..2 {
        m.reconcile();
    }
    let drift = m.report().data["drift"].clone();
    assert!(
        drift.as_array().is_none_or(|items| items
            .iter()
            .all(|d| d["cgroup"] != format!("/{BESTEFFORT}"))),
        "an intervention's settings are not kubelet drift: {drift}"
    );
    // The same report shows drift of kubelet's own values, so the check above can fail.
    std::fs::write(root.join(&web).join("cpu.max"), "30000 100000").expect("drift");
    for _ in 0..3 {
        m.reconcile();
    }
    let drift = m.report().data["drift"].clone();
    assert!(
        drift
            .as_array()
            .is_some_and(|items| items.iter().any(|d| d["cgroup"] == format!("/{web}"))),
        "kubelet's cpu.max changed by hand is drift: {drift}"
    );
    std::fs::write(root.join(&web).join("cpu.max"), "20000 100000").expect("restore");

    // Stop: kubelet's values back under every intervention.
    m.shutdown();
    assert_eq!(read(root, &format!("{web}/cpu.max.burst")), "0");
    assert_eq!(read(root, &format!("{BESTEFFORT}/cpu.idle")), "0");
    assert_eq!(
        read(root, &format!("{BESTEFFORT}/cpu.weight")),
        "1",
        "kubelet's weight back (the kernel resets an idle group's weight to 100 when idle goes)"
    );
    // The quota back to none ("max"; the kernel keeps the period a fixture file cannot).
    assert_eq!(
        read(root, &format!("{BESTEFFORT}/cpu.max"))
            .split_whitespace()
            .next(),
        Some("max")
    );
}

#[test]
fn a_pod_being_deleted_gets_kubelets_values_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    kubelet_tree(root);
    let (mut m, _, _) = manager(root);
    feed(&mut m);
    m.tick();
    let mut config =
        FeedbackConfig::with_defaults(Mode::On, Duration::from_millis(1), Duration::from_secs(600));
    config.burst.windows = 2;
    m.enable_feedback(config, None, None, None);
    let web = format!("{WEB}/cri-containerd-aaa.scope");
    for window in 0..4u64 {
        std::fs::write(
            root.join(&web).join("cpu.stat"),
            format!(
                "usage_usec 0\nnr_periods {}\nnr_throttled {}\nnr_bursts 0\n",
                50 * window,
                20 * window
            ),
        )
        .expect("cpu.stat");
        std::thread::sleep(Duration::from_millis(2));
        m.tick();
    }
    assert_eq!(read(root, &format!("{web}/cpu.max.burst")), "20000");
    let mut deleting = pods().remove(0);
    deleting.metadata.deletion_timestamp = Some("2026-12-06T12:00:00Z".into());
    m.handle(PodEvent::Updated(SourcedPod {
        pod: deleting,
        origin: Origin::ApiServer {
            node: "node-a".into(),
        },
    }));
    std::thread::sleep(Duration::from_millis(2));
    m.tick();
    assert_eq!(read(root, &format!("{web}/cpu.max.burst")), "0");
}

#[test]
fn only_the_feedbacks_settings_of_its_cgroups_can_be_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    kubelet_tree(root);
    let tiers = QosTiers::new(&CgroupName::root()).expect("tiers");
    let rule = write_rule(&tiers);
    let container =
        CgroupName::parse_systemd(&format!("/{WEB}/cri-containerd-aaa.scope")).expect("name");
    let pod = container.parent().expect("pod");
    assert!(rule(&container, Setting::CpuBurst));
    assert!(rule(&container, Setting::CpusetMems));
    assert!(!rule(&container, Setting::CpuShares), "kubelet's value");
    assert!(!rule(&container, Setting::CpuQuota), "kubelet's limit");
    assert!(!rule(&pod, Setting::CpuBurst), "a pod cgroup is kubelet's");
    assert!(rule(&tiers.besteffort, Setting::CpuQuota));
    assert!(rule(&tiers.besteffort, Setting::CpuIdle));
    assert!(
        rule(&tiers.besteffort, Setting::CpuShares),
        "kubelet's weight, written back after cpu.idle"
    );
    assert!(!rule(&tiers.burstable, Setting::CpuQuota));
    let backend = CgroupfsBackend::new(
        Hierarchies::V2(root.to_owned()),
        CgroupName::root(),
        NameStyle::Systemd,
    );
    let writer = SettingsOnlyWriter::new(Box::new(backend), rule);
    let quota = ResourceConfig {
        cpu_quota: Some(Limit::Value(1000)),
        ..ResourceConfig::default()
    };
    let refused = writer.update(&container, &quota).expect_err("refused");
    assert!(refused.to_string().contains("cpu quota"), "{refused}");
    assert_eq!(
        read(root, &format!("{WEB}/cri-containerd-aaa.scope/cpu.max")),
        "20000 100000"
    );
}

#[test]
fn a_qosd_killed_under_an_intervention_has_the_next_one_put_kubelets_value_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    kubelet_tree(root);
    let web = format!("{WEB}/cri-containerd-aaa.scope");
    {
        let (mut m, _, _) = manager(root);
        feed(&mut m);
        m.tick();
        let mut config = FeedbackConfig::with_defaults(
            Mode::On,
            Duration::from_millis(1),
            Duration::from_secs(600),
        );
        config.burst.windows = 2;
        m.enable_feedback(config, None, None, None);
        for window in 0..4u64 {
            std::fs::write(
                root.join(&web).join("cpu.stat"),
                format!(
                    "usage_usec 0\nnr_periods {}\nnr_throttled {}\nnr_bursts 0\n",
                    50 * window,
                    20 * window
                ),
            )
            .expect("cpu.stat");
            std::thread::sleep(Duration::from_millis(2));
            m.tick();
        }
        assert_eq!(read(root, &format!("{web}/cpu.max.burst")), "20000");
        let record = read(root, &format!("state/{}", interventions::RECORD_FILE));
        assert!(record.contains("cri-containerd-aaa.scope"), "{record}");
        // Killed: no shutdown.
    }
    let (_next, _, _) = manager(root);
    assert_eq!(
        read(root, &format!("{web}/cpu.max.burst")),
        "0",
        "the next qosd put kubelet's value back"
    );
    let record = read(root, &format!("state/{}", interventions::RECORD_FILE));
    assert!(
        !record.contains("cri-containerd"),
        "the record is emptied: {record}"
    );
}

/// kubelet's systemd driver: runc writes a 15m limit as 1500 µs, systemd writes it again as the
/// whole percent it keeps (2000 µs) at every reload; both are kubelet's value, anything else is
/// drift.
#[test]
fn on_the_systemd_driver_a_quota_systemd_rounded_is_kubelets() {
    let expected = ResourceConfig {
        cpu_quota: Some(Limit::Value(1500)),
        cpu_period: Some(100_000),
        ..ResourceConfig::default()
    };
    let found = |actual: &str| crate::cgroup::backend::Difference {
        setting: Setting::CpuQuota,
        path: PathBuf::from("cpu.max"),
        expected: "1500 100000".into(),
        actual: Some(actual.into()),
    };
    assert!(systemd_rounded(&expected, &found("2000 100000")));
    assert!(
        systemd_rounded(&expected, &found("2000")),
        "v1 cpu.cfs_quota_us"
    );
    assert!(!systemd_rounded(&expected, &found("3000 100000")));
    assert!(!systemd_rounded(&expected, &found("max 100000")));
}
