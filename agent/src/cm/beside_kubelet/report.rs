//! `qosd inspect` beside kubelet: the pod source, the node's pods with the cgroups found for
//! them and their containers (limits in effect, processes), kubelet's values that cgroupfs does
//! not hold (drift), cgroups under kubepods of no pod, the interventions in force and the
//! feedback's decisions.
use serde_json::json;

use super::BesideKubelet;
use crate::cm::tree::Shown;
use crate::report::{Report, Section};

impl BesideKubelet {
    /// The report `qosd inspect` prints.
    #[must_use]
    pub fn report(&self) -> Report {
        let reader = self.reader();
        let (describe, reachable, synced) = &self.source;
        let state = match (reachable, synced) {
            (_, false) => "waiting for the first list",
            (Some(false), true) => "unreachable; known pods kept",
            _ => "in sync",
        };
        let mut pods = Section::new(
            "PODS",
            &[
                "namespace",
                "name",
                "qos",
                "phase",
                "containers",
                "procs",
                "cgroup",
                "limits",
            ],
        );
        let mut containers = Section::new(
            "CONTAINERS",
            &[
                "pod",
                "container",
                "runtime id",
                "procs",
                "cgroup",
                "limits",
            ],
        );
        let mut pods_json = Vec::new();
        for (uid, tracked) in &self.pods {
            let found = self.found.pods.get(uid);
            let pod_cgroup = found.and_then(|f| f.pod.as_ref());
            let shown = pod_cgroup.map(|(c, _)| Shown::read(reader, &c.name));
            let qos = if tracked.qos == tracked.computed {
                tracked.qos.to_string()
            } else {
                format!("{} (qosd: {})", tracked.qos, tracked.computed)
            };
            let phase = if tracked.pod.metadata.deletion_timestamp.is_some() {
                "Terminating".to_owned()
            } else {
                tracked.pod.status.phase.clone()
            };
            let n_containers = tracked.pod.spec.containers.len();
            let n_found = found.map_or(0, |f| f.containers.len());
            pods.row([
                tracked.pod.metadata.namespace.clone(),
                tracked.pod.metadata.name.clone(),
                qos.clone(),
                phase.clone(),
                format!("{n_found}/{n_containers} found"),
                shown
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), Shown::procs_text),
                shown
                    .as_ref()
                    .map_or_else(|| "(not found)".to_owned(), |s| s.path.clone()),
                shown.as_ref().map(Shown::limits_text).unwrap_or_default(),
            ]);
            let mut containers_json = Vec::new();
            for status in tracked
                .pod
                .status
                .container_statuses
                .iter()
                .chain(&tracked.pod.status.init_container_statuses)
            {
                let cgroup = found.and_then(|f| f.containers.get(&status.name));
                let shown = cgroup.map(|c| Shown::read(reader, &c.name));
                let id = status
                    .runtime_id()
                    .map(|(runtime, id)| format!("{runtime}://{}", &id[..id.len().min(12)]))
                    .unwrap_or_else(|| "-".to_owned());
                containers.row([
                    tracked.pod.full_name(),
                    status.name.clone(),
                    id,
                    shown
                        .as_ref()
                        .map_or_else(|| "-".to_owned(), Shown::procs_text),
                    shown
                        .as_ref()
                        .map_or_else(|| "(not found)".to_owned(), |s| s.path.clone()),
                    shown.as_ref().map(Shown::limits_text).unwrap_or_default(),
                ]);
                containers_json.push(json!({
                    "name": status.name,
                    "container_id": status.container_id,
                    "cgroup": shown.as_ref().map(Shown::json),
                }));
            }
            pods_json.push(json!({
                "namespace": tracked.pod.metadata.namespace,
                "name": tracked.pod.metadata.name,
                "uid": uid,
                "qos_class": tracked.qos.as_str(),
                "qosd_qos_class": tracked.computed.as_str(),
                "phase": phase,
                "source": tracked.origin.to_string(),
                "modelled": tracked.unmodelled.is_none(),
                "unmodelled_reason": tracked.unmodelled,
                "cgroup": shown.as_ref().map(Shown::json),
                "containers": containers_json,
                "sandbox_cgroups": found.map(|f| f.others.iter().map(|o| o.path.clone()).collect::<Vec<_>>()).unwrap_or_default(),
            }));
        }
        let mut drift = Section::new(
            "KUBELET DRIFT (kubelet's value not in cgroupfs; reported, never corrected)",
            &[
                "level",
                "pod",
                "container",
                "file",
                "expected",
                "actual",
                "cgroup",
            ],
        );
        for d in &self.drifts {
            let pod = if d.pod.is_empty() {
                "-".to_owned()
            } else {
                format!("{}/{}", d.namespace, d.pod)
            };
            drift.row([
                d.level.label().to_owned(),
                pod,
                if d.container.is_empty() {
                    "-".to_owned()
                } else {
                    d.container.clone()
                },
                d.file.clone(),
                d.expected.clone(),
                d.actual.clone().unwrap_or_else(|| "(missing)".to_owned()),
                d.cgroup.clone(),
            ]);
        }
        let mut unattributed = Section::new(
            "UNATTRIBUTED CGROUPS (under kubepods, of no pod of this node)",
            &["cgroup", "reason"],
        );
        for (path, reason) in &self.found.unattributed {
            unattributed.row([path.clone(), reason.label().to_owned()]);
        }
        let mut in_force = Section::new(
            "FEEDBACK INTERVENTIONS IN FORCE",
            &["target", "cgroup", "values"],
        );
        for (target, i) in self.interventions.in_force() {
            in_force.row([
                target.to_string(),
                reader.name(&i.cgroup).unwrap_or_default(),
                i.config.to_string(),
            ]);
        }
        let mut sections = vec![pods, containers, drift, unattributed, in_force];
        let decisions = match self.decisions() {
            Some(log) => {
                sections.push(log.section());
                log.to_json()
            }
            None => json!([]),
        };
        let drift_json: Vec<_> = self
            .drifts
            .iter()
            .map(|d| {
                json!({"level": d.level.label(), "cgroup": d.cgroup, "file": d.file,
                       "expected": d.expected, "actual": d.actual, "namespace": d.namespace,
                       "pod": d.pod, "container": d.container, "qos_class": d.qos_class})
            })
            .collect();
        Report {
            mode: "kubernetes".to_owned(),
            summary: vec![
                ("pod source".to_owned(), format!("{describe} ({state})")),
                (
                    "cgroup driver".to_owned(),
                    format!(
                        "{} (kubepods at {})",
                        if reader
                            .name(&self.options.tiers.kubepods)
                            .is_ok_and(|p| p.ends_with(".slice"))
                        {
                            "systemd"
                        } else {
                            "cgroupfs"
                        },
                        reader
                            .name(&self.options.tiers.kubepods)
                            .unwrap_or_default()
                    ),
                ),
                ("pods".to_owned(), self.pods.len().to_string()),
                (
                    "drift".to_owned(),
                    format!(
                        "{} files ({} differences not yet seen {} times)",
                        self.drifts.len(),
                        self.drift.pending(),
                        super::drift::DRIFT_CHECKS
                    ),
                ),
            ],
            sections,
            data: json!({
                "mode": "kubernetes",
                "source": {"describe": describe, "reachable": reachable, "synced": synced},
                "pods": pods_json,
                "drift": drift_json,
                "unattributed": self.found.unattributed.iter().map(|(p, r)| json!({"cgroup": p, "reason": r.label()})).collect::<Vec<_>>(),
                "interventions": self.interventions.in_force().iter().map(|(t, i)| json!({"target": t.to_string(), "cgroup": reader.name(&i.cgroup).unwrap_or_default()})).collect::<Vec<_>>(),
                "decisions": decisions,
            }),
        }
    }
}
