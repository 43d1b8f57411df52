//! What kubelet should have written, from the pod specs and the node's KubeletConfiguration,
//! with the same code that writes it in standalone mode: the kubepods cgroup (node allocatable
//! enforcement), the QoS tiers (kubelet's QoS container manager), each pod cgroup
//! (`ResourceConfigForPod`), and each container cgroup (the runtime's values from kubelet's
//! request: CPU shares, CFS quota and period, memory limit; the CPU manager's `cpuset.cpus`
//! and the memory manager's `cpuset.mems` read from kubelet's own `cpu_manager_state` and
//! `memory_manager_state`, never written).
use std::path::PathBuf;

use crate::cgroup::CpuSet;
use crate::cgroup::name::CgroupName;
use crate::cgroup::resources::ResourceConfig;
use crate::cm::checkpoint::Restored;
use crate::cm::cpu::CPU_MANAGER_STATE_FILE;
use crate::cm::memory::MEMORY_MANAGER_STATE_FILE;
use crate::cm::pod_resources::{PodCgroupPolicy, container_config, pod_config};
use crate::cm::qos_tiers::{QosTiers, tier_settings};
use crate::pods::model::Pod;
use crate::pods::qos::QosClass;

/// The KubeletConfiguration, as far as the expected values depend on it.
#[derive(Clone, Debug)]
pub struct KubeletView {
    pub policy: PodCgroupPolicy,
    pub memory_qos: bool,
    /// The kubepods cgroup's values (node allocatable enforcement); `None`: not checked.
    pub kubepods: Option<ResourceConfig>,
    /// `cpuManagerPolicy` (`none`, `static`).
    pub cpu_manager_policy: String,
    /// `memoryManagerPolicy` (`None`, `Static`).
    pub memory_manager_policy: String,
    /// kubelet's root directory (`/var/lib/kubelet`), where its checkpoints are.
    pub kubelet_root: PathBuf,
    /// kubelet's systemd driver: runc writes a quota exactly, systemd writes it again rounded
    /// up to a whole percent of a CPU at every reload; either is kubelet's value.
    pub systemd_driver: bool,
}

/// Where a checked cgroup sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Kubepods,
    Tier,
    Pod,
    Container,
}

impl Level {
    /// The metric label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Kubepods => "kubepods",
            Self::Tier => "tier",
            Self::Pod => "pod",
            Self::Container => "container",
        }
    }
}

/// One cgroup and the values kubelet should have given it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expectation {
    pub level: Level,
    pub cgroup: CgroupName,
    pub config: ResourceConfig,
    /// (pod uid, container) it belongs to, when it is a pod's or a container's.
    pub owner: Option<(String, Option<String>)>,
}

/// A pod as the expectations need it: spec, the class it lives under, its cgroups.
#[derive(Clone, Debug)]
pub struct CheckedPod<'a> {
    pub uid: &'a str,
    pub pod: &'a Pod,
    pub qos: QosClass,
    pub cgroup: CgroupName,
    /// (container name, its cgroup).
    pub containers: Vec<(&'a str, CgroupName)>,
}

/// The CPU and memory managers' placements kubelet checkpointed, read-only.
#[derive(Clone, Debug, Default)]
pub struct Placements {
    cpu: Option<crate::cm::cpu::state::CpuState>,
    memory: Option<crate::cm::memory::state::MemoryState>,
    /// Why a checkpoint could not be used (logged by the caller once per change).
    pub problems: Vec<String>,
}

impl Placements {
    /// Reads kubelet's checkpoints for the configured policies (a missing file: nothing is
    /// placed yet). Nothing is written or removed: the files are kubelet's.
    #[must_use]
    pub fn read(view: &KubeletView) -> Self {
        let mut placements = Self::default();
        if view.cpu_manager_policy == "static" {
            placements.cpu = read_kubelet_checkpoint(
                &view.kubelet_root.join(CPU_MANAGER_STATE_FILE),
                |bytes| crate::cm::cpu::state::decode(bytes, "static"),
                &mut placements.problems,
            );
        }
        if view.memory_manager_policy == "Static" {
            placements.memory = read_kubelet_checkpoint(
                &view.kubelet_root.join(MEMORY_MANAGER_STATE_FILE),
                |bytes| crate::cm::memory::state::decode(bytes, "Static"),
                &mut placements.problems,
            );
        }
        placements
    }

    /// The container's `cpuset.cpus` under the static CPU manager: its exclusive CPUs, else
    /// the shared pool; `None` when kubelet sets none (policy `none`, or no checkpoint).
    #[must_use]
    pub fn cpus(&self, uid: &str, container: &str) -> Option<CpuSet> {
        let state = self.cpu.as_ref()?;
        let cpus = state.get_or_default(uid, container);
        CpuSet::parse(&cpus.to_string()).ok()
    }

    /// Whether the container has CPUs of its own.
    #[must_use]
    pub fn exclusive(&self, uid: &str, container: &str) -> bool {
        self.cpu
            .as_ref()
            .is_some_and(|s| s.get(uid, container).is_some())
    }

    /// The container's `cpuset.mems` under the Static memory manager.
    #[must_use]
    pub fn mems(&self, uid: &str, container: &str) -> Option<CpuSet> {
        let blocks = self.memory.as_ref()?.blocks(uid, container)?;
        let nodes: CpuSet = blocks
            .iter()
            .flat_map(|b| b.numa_affinity.iter().copied())
            .collect();
        (!nodes.is_empty()).then_some(nodes)
    }
}

/// One of kubelet's checkpoints, decoded; `None` when it does not exist (nothing placed yet)
/// or cannot be used (the reason goes to `problems`). Read only: temporary files kubelet may
/// have left are its own.
fn read_kubelet_checkpoint<T>(
    path: &std::path::Path,
    decode: impl FnOnce(&[u8]) -> Restored<T>,
    problems: &mut Vec<String>,
) -> Option<T> {
    match std::fs::read(path) {
        Ok(bytes) => match decode(&bytes) {
            Restored::State(state) => Some(state),
            Restored::Rebuild { detail, .. } => {
                problems.push(format!("{}: {detail}", path.display()));
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            problems.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

/// Every expectation for `pods` (the node's pods that run and that qosd can model), the tiers
/// and kubepods. `complete` says whether every running pod could be modelled: the burstable
/// tier's shares sum all of them, so without that the tiers are not checked.
#[must_use]
pub fn expectations(
    view: &KubeletView,
    tiers: &QosTiers,
    pods: &[CheckedPod<'_>],
    complete: bool,
    placements: &Placements,
) -> Vec<Expectation> {
    let mut out = Vec::new();
    if let Some(kubepods) = &view.kubepods {
        out.push(Expectation {
            level: Level::Kubepods,
            cgroup: tiers.kubepods.clone(),
            config: kubepods.clone(),
            owner: None,
        });
    }
    if complete {
        let settings = tier_settings(pods.iter().map(|p| (p.qos, &p.pod.spec)), view.memory_qos);
        out.push(Expectation {
            level: Level::Tier,
            cgroup: tiers.burstable.clone(),
            config: settings.burstable,
            owner: None,
        });
        out.push(Expectation {
            level: Level::Tier,
            cgroup: tiers.besteffort.clone(),
            config: settings.besteffort,
            owner: None,
        });
    }
    for checked in pods {
        out.push(Expectation {
            level: Level::Pod,
            cgroup: checked.cgroup.clone(),
            config: pod_config(&checked.pod.spec, view.policy),
            owner: Some((checked.uid.to_owned(), None)),
        });
        for (name, cgroup) in &checked.containers {
            let Some(container) = checked.pod.spec.all_containers().find(|c| c.name == *name)
            else {
                continue;
            };
            let mut config = container_config(container, view.policy);
            config.cpuset_cpus = placements.cpus(checked.uid, name);
            config.cpuset_mems = placements.mems(checked.uid, name);
            out.push(Expectation {
                level: Level::Container,
                cgroup: cgroup.clone(),
                config,
                owner: Some((checked.uid.to_owned(), Some((*name).to_owned()))),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::resources::Limit;
    use crate::pods::model::{ObjectMeta, PodStatus};

    fn view() -> KubeletView {
        KubeletView {
            systemd_driver: false,
            policy: PodCgroupPolicy {
                enforce_cpu_limits: true,
                cpu_period_us: 100_000,
                memory_qos: false,
                pod_pids_limit: -1,
            },
            memory_qos: false,
            kubepods: None,
            cpu_manager_policy: "static".into(),
            memory_manager_policy: "None".into(),
            kubelet_root: PathBuf::from("/nonexistent/qosd-test"),
        }
    }

    fn pod(yaml: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: "web".into(),
                namespace: "ns".into(),
                uid: "u1".into(),
                ..ObjectMeta::default()
            },
            spec: serde_yaml_ng::from_str(yaml).expect("spec"),
            status: PodStatus::default(),
        }
    }

    #[test]
    fn pods_containers_and_tiers_get_kubelets_values() {
        let tiers = QosTiers::new(&CgroupName::root()).expect("tiers");
        let web = pod(
            "containers: [{name: app, resources: {requests: {cpu: 250m, memory: 64Mi}, limits: {cpu: 500m, memory: 128Mi}}}]",
        );
        let pod_cgroup = tiers.pod_cgroup(QosClass::Burstable, "u1").expect("name");
        let checked = [CheckedPod {
            uid: "u1",
            pod: &web,
            qos: QosClass::Burstable,
            cgroup: pod_cgroup.clone(),
            containers: vec![("app", pod_cgroup.child("abc").expect("name"))],
        }];
        let all = expectations(&view(), &tiers, &checked, true, &Placements::default());
        let levels: Vec<Level> = all.iter().map(|e| e.level).collect();
        assert_eq!(
            levels,
            [Level::Tier, Level::Tier, Level::Pod, Level::Container]
        );
        // Burstable tier: the sum of burstable requests (250m -> 256 shares).
        assert_eq!(all[0].config.cpu_shares, Some(256));
        assert_eq!(all[1].config.cpu_shares, Some(2));
        // Pod: ResourceConfigForPod; container: the runtime's values, no cpuset without a
        // checkpoint.
        assert_eq!(all[2].config.cpu_quota, Some(Limit::Value(50_000)));
        assert_eq!(all[3].config.cpu_shares, Some(256));
        assert_eq!(all[3].config.memory_limit, Some(Limit::Value(128 << 20)));
        assert_eq!(all[3].config.cpuset_cpus, None);
        assert_eq!(all[3].owner, Some(("u1".into(), Some("app".into()))));

        let partial = expectations(&view(), &tiers, &checked, false, &Placements::default());
        assert!(
            partial.iter().all(|e| e.level != Level::Tier),
            "tiers need every pod"
        );
    }

    #[test]
    fn the_cpu_managers_placement_comes_from_kubelets_checkpoint() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A checkpoint as kubelet writes it (format v2 with its checksum, from the CPU
        // manager's own encoder, which the checkpoint tests pin to kubelet's vectors).
        let mut state = crate::cm::cpu::state::CpuState {
            default_cpus: crate::cm::cpu::Cpus::parse("0,3").expect("cpus"),
            ..Default::default()
        };
        state.set(
            "u1",
            "app",
            crate::cm::cpu::Cpus::parse("1-2").expect("cpus"),
        );
        let bytes = crate::cm::cpu::state::encode("static", &state).expect("encode");
        std::fs::write(dir.path().join(CPU_MANAGER_STATE_FILE), bytes).expect("write");
        let mut view = view();
        view.kubelet_root = dir.path().to_owned();
        let placements = Placements::read(&view);
        assert!(placements.problems.is_empty(), "{:?}", placements.problems);
        assert_eq!(
            placements.cpus("u1", "app"),
            Some(CpuSet::parse("1-2").expect("set"))
        );
        assert!(placements.exclusive("u1", "app"));
        assert_eq!(
            placements.cpus("u2", "app"),
            Some(CpuSet::parse("0,3").expect("set"))
        );
        assert!(!placements.exclusive("u2", "app"));

        std::fs::write(dir.path().join(CPU_MANAGER_STATE_FILE), b"{not json").expect("write");
        let broken = Placements::read(&view);
        assert_eq!(broken.cpus("u1", "app"), None);
        assert!(
            broken.problems[0].contains(CPU_MANAGER_STATE_FILE),
            "{:?}",
            broken.problems
        );
        assert!(
            dir.path().join(CPU_MANAGER_STATE_FILE).exists(),
            "kubelet's file is left alone"
        );
    }
}
