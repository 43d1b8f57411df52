//! The standalone container manager's `qosd inspect` report: the QoS tiers, pods and
//! containers with their cgroup paths, the limits in effect (read back from cgroupfs, not from
//! the desired state) and process counts; then the feedback's decisions, when it runs.
use serde_json::json;

use crate::cgroup::backend::CgroupReader;
use crate::cgroup::files::Setting;
use crate::cgroup::name::CgroupName;
use crate::report::{Report, Section};
use crate::runtime::supervisor::ContainerState;

use super::manager::ContainerManager;

/// Limits shown, each under its file name in the cgroup version at hand (when it exists).
pub(crate) const LIMITS: &[Setting] = &[
    Setting::CpuShares,
    Setting::CpuQuota,
    Setting::CpuBurst,
    Setting::CpuIdle,
    Setting::MemoryLimit,
    Setting::MemoryMin,
    Setting::CpusetCpus,
    Setting::CpusetMems,
    Setting::PidsLimit,
];

/// A cgroup as the report shows it: its path in the driver's spelling, the limits in effect
/// (`file=value`) and its process count (`None`: the cgroup is missing).
pub(crate) struct Shown {
    pub path: String,
    pub limits: Vec<(&'static str, String)>,
    pub procs: Option<usize>,
}

impl Shown {
    pub(crate) fn read(reader: &dyn CgroupReader, name: &CgroupName) -> Self {
        let path = reader.name(name).unwrap_or_else(|_| name.to_cgroupfs());
        let limits = LIMITS
            .iter()
            .filter_map(|setting| reader.setting(name, *setting).ok().flatten())
            .collect();
        Self {
            path,
            limits,
            procs: reader.pids(name).ok().map(|p| p.len()),
        }
    }

    pub(crate) fn limits_text(&self) -> String {
        self.limits
            .iter()
            .map(|(file, value)| format!("{file}={value}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub(crate) fn procs_text(&self) -> String {
        self.procs
            .map_or_else(|| "missing".to_owned(), |n| n.to_string())
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        json!({
            "cgroup": self.path,
            "limits": self.limits.iter().map(|(f, v)| (f.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "procs": self.procs,
        })
    }
}

pub(super) fn render(manager: &ContainerManager) -> Report {
    let reader = manager.cgroup_driver();
    let tiers = manager.tiers();
    let mut tier_table = Section::new("QOS TIERS", &["tier", "procs", "cgroup", "limits"]);
    let mut tier_json = Vec::new();
    for (label, tier) in [
        ("kubepods", &tiers.kubepods),
        ("burstable", &tiers.burstable),
        ("besteffort", &tiers.besteffort),
    ] {
        let shown = Shown::read(reader, tier);
        tier_table.row([
            label.to_owned(),
            shown.procs_text(),
            shown.path.clone(),
            shown.limits_text(),
        ]);
        tier_json.push(json!({"tier": label, "cgroup": shown.json()}));
    }
    let mut pods = Section::new(
        "PODS",
        &[
            "namespace",
            "name",
            "qos",
            "phase",
            "procs",
            "cgroup",
            "limits",
            "source",
        ],
    );
    let mut containers = Section::new(
        "CONTAINERS",
        &[
            "pod",
            "container",
            "state",
            "restarts",
            "procs",
            "cgroup",
            "limits",
        ],
    );
    let mut pods_json = Vec::new();
    for view in manager.pod_views() {
        let shown = Shown::read(reader, view.cgroup);
        pods.row([
            view.pod.metadata.namespace.clone(),
            view.pod.metadata.name.clone(),
            view.qos.to_string(),
            view.phase.to_owned(),
            shown.procs_text(),
            shown.path.clone(),
            shown.limits_text(),
            view.origin.to_string(),
        ]);
        let mut containers_json = Vec::new();
        for container in view.pod.spec.all_containers() {
            let Ok(cgroup) = reader.container(view.cgroup, &container.name) else {
                continue;
            };
            let (state, restarts) = match manager.container_state(view.uid, &container.name) {
                Some((ContainerState::Running { pid }, restarts)) => {
                    (format!("running pid {pid}"), restarts)
                }
                Some((ContainerState::Terminated { exit_code }, restarts)) => {
                    (format!("terminated ({exit_code})"), restarts)
                }
                Some((ContainerState::Waiting { last_exit, .. }, restarts)) => {
                    (format!("waiting to restart (exit {last_exit})"), restarts)
                }
                Some((ContainerState::Stopping { pid, .. }, restarts)) => {
                    (format!("stopping pid {pid}"), restarts)
                }
                Some((ContainerState::StartFailed { error, .. }, restarts)) => {
                    (format!("start failed: {error}"), restarts)
                }
                None => ("not started".to_owned(), 0),
            };
            let shown = Shown::read(reader, &cgroup);
            containers.row([
                view.pod.full_name(),
                container.name.clone(),
                state.clone(),
                restarts.to_string(),
                shown.procs_text(),
                shown.path.clone(),
                shown.limits_text(),
            ]);
            containers_json.push(json!({
                "name": container.name, "state": state, "restarts": restarts,
                "cgroup": shown.json(),
            }));
        }
        pods_json.push(json!({
            "namespace": view.pod.metadata.namespace, "name": view.pod.metadata.name,
            "uid": view.uid, "qos_class": view.qos.as_str(), "phase": view.phase,
            "source": view.origin.to_string(), "cgroup": shown.json(),
            "containers": containers_json,
        }));
    }
    let mut sections = vec![tier_table, pods, containers];
    let decisions = match manager.feedback_log() {
        Some(log) => {
            sections.push(log.section());
            log.to_json()
        }
        None => json!([]),
    };
    Report {
        mode: "standalone".to_owned(),
        summary: vec![
            (
                "cgroup root".to_owned(),
                reader.name(reader.root()).unwrap_or_default(),
            ),
            ("pods".to_owned(), pods_json.len().to_string()),
        ],
        sections,
        data: json!({
            "mode": "standalone",
            "tiers": tier_json,
            "pods": pods_json,
            "decisions": decisions,
        }),
    }
}
