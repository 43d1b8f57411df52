//! kubelet's cgroups found, not guessed: for each pod of the node, its pod cgroup (kubelet's
//! naming for the cgroup driver: `/kubepods/burstable/pod<uid>` or
//! `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`) and its
//! containers' cgroups, matched by the runtime ids of the pod's status against what is on
//! disk under the pod cgroup:
//!
//! | runtime | cgroupfs driver | systemd driver |
//! |---|---|---|
//! | containerd | `<id>` | `cri-containerd-<id>.scope` |
//! | CRI-O | `crio-<id>` | `crio-<id>.scope` (and `crio-conmon-<id>.scope`) |
//! | Docker (cri-dockerd) | `<id>` | `docker-<id>.scope` |
//!
//! Other cgroups under a known pod's (the sandbox's pause process, CRI-O's conmon) belong to
//! the pod and are labelled `container="POD"`, as kubelet's cAdvisor labels the sandbox.
//! Pod-level cgroups under kubepods that belong to no known pod are reported as unattributed,
//! with the reason, never dropped silently.
//!
//! Discovery reads nothing from the kernel: it works on a tree of the hierarchy that qosd
//! keeps live from inotify ([`crate::cgroup::trees`]), so it runs whenever that tree changes.
use std::collections::{BTreeMap, HashMap};

use crate::cgroup::backend::CgroupReader;
use crate::cgroup::name::CgroupName;
use crate::cgroup::walk::Walk;
use crate::cm::qos_tiers::QosTiers;
use crate::pods::model::Pod;
use crate::pods::qos::QosClass;

/// The label of a pod's cgroups that are not one of its containers (the sandbox).
pub const SANDBOX_CONTAINER: &str = "POD";

/// The annotation of a mirror pod naming its static pod's uid (kubelet's
/// `kubernetes.io/config.mirror`): the static pod's cgroup is named after that uid.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// One cgroup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub name: CgroupName,
    /// Its path relative to the hierarchy root, in the driver's spelling.
    pub path: String,
    /// The kernel's cgroup id.
    pub id: u64,
}

/// What was found of one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCgroups {
    /// The pod cgroup, with the QoS tier it was found in.
    pub pod: Option<(Found, QosClass)>,
    /// Container name -> its cgroup.
    pub containers: BTreeMap<String, Found>,
    /// Cgroups under the pod's that match none of its containers (the sandbox).
    pub others: Vec<Found>,
    /// Containers whose status has a runtime id with no cgroup under the pod's.
    pub missing: Vec<String>,
}

/// Why a pod-level cgroup under kubepods is attributed to no pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Unattributed {
    /// Named like a pod cgroup (`pod<uid>`), but no pod of this node has that uid.
    UnknownPod,
    /// Not named like a pod cgroup at all.
    NotAPod,
}

impl Unattributed {
    /// The metric label.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::UnknownPod => "unknown_pod",
            Self::NotAPod => "not_a_pod",
        }
    }
}

/// Everything found in one tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Discovery {
    /// By pod uid.
    pub pods: BTreeMap<String, PodCgroups>,
    /// Pod-level cgroups of no known pod: (path, reason).
    pub unattributed: Vec<(String, Unattributed)>,
}

/// The uid a pod's cgroup is named after: a mirror pod's static pod uid, else its own.
#[must_use]
pub fn cgroup_uid(pod: &Pod) -> &str {
    pod.metadata
        .annotations
        .get(MIRROR_ANNOTATION)
        .filter(|uid| !uid.is_empty())
        .unwrap_or(&pod.metadata.uid)
}

/// The runtime id a container cgroup's last path element carries (see the module table);
/// `None` for CRI-O's conmon scopes.
#[must_use]
pub fn runtime_id_of(leaf: &str) -> Option<&str> {
    let unit = leaf.strip_suffix(".scope").unwrap_or(leaf);
    if unit.starts_with("crio-conmon-") {
        return None;
    }
    Some(
        ["cri-containerd-", "crio-", "docker-"]
            .iter()
            .find_map(|prefix| unit.strip_prefix(prefix))
            .unwrap_or(unit),
    )
}

/// Finds the cgroups of `pods` (uid -> (pod, the QoS class kubelet gave it)) in `tree`, a
/// tree of the hierarchy the ids come from, spelled as `reader` spells names.
#[must_use]
pub fn discover<'a>(
    tree: &Walk,
    reader: &dyn CgroupReader,
    tiers: &QosTiers,
    pods: impl IntoIterator<Item = (&'a str, &'a Pod, QosClass)>,
) -> Discovery {
    let mut children: HashMap<&str, Vec<(&str, u64)>> = HashMap::new();
    let mut ids: HashMap<&str, u64> = HashMap::new();
    for dir in &tree.dirs {
        ids.insert(dir.relative.as_str(), dir.ino);
        if let Some((parent, leaf)) = dir.relative.rsplit_once('/') {
            let parent = if parent.is_empty() { "/" } else { parent };
            children.entry(parent).or_default().push((leaf, dir.ino));
        }
    }
    let spelled = |name: &CgroupName| reader.name(name).ok();
    let mut out = Discovery::default();
    let mut pod_paths: BTreeMap<String, String> = BTreeMap::new();
    for (uid, pod, qos) in pods {
        let mut found = PodCgroups::default();
        let cgroup_uid = cgroup_uid(pod);
        // kubelet's tier first; the others in case the class is not what it says.
        let order = std::iter::once(qos).chain(QosClass::ALL.into_iter().filter(|q| *q != qos));
        for tier in order {
            let Ok(name) = tiers.pod_cgroup(tier, cgroup_uid) else {
                continue;
            };
            let Some(path) = spelled(&name) else {
                continue;
            };
            if let Some(&id) = ids.get(path.as_str()) {
                pod_paths.insert(path.clone(), uid.to_owned());
                found.pod = Some((Found { name, path, id }, tier));
                break;
            }
        }
        if let Some((pod_found, _)) = &found.pod {
            let statuses: Vec<(&str, &str)> = pod
                .status
                .container_statuses
                .iter()
                .chain(&pod.status.init_container_statuses)
                .filter_map(|s| s.runtime_id().map(|(_, id)| (s.name.as_str(), id)))
                .collect();
            for &(leaf, id) in children.get(pod_found.path.as_str()).into_iter().flatten() {
                let Ok(name) = pod_found.name.child(leaf) else {
                    continue;
                };
                let path = format!("{}/{leaf}", pod_found.path);
                let cgroup = Found { name, path, id };
                match runtime_id_of(leaf)
                    .and_then(|rid| statuses.iter().find(|(_, sid)| *sid == rid))
                {
                    Some((container, _)) => {
                        found.containers.insert((*container).to_owned(), cgroup);
                    }
                    None => found.others.push(cgroup),
                }
            }
            found.missing = statuses
                .iter()
                .filter(|(name, _)| !found.containers.contains_key(*name))
                .map(|(name, _)| (*name).to_owned())
                .collect();
        }
        out.pods.insert(uid.to_owned(), found);
    }
    // Pod-level cgroups: below kubepods (but the tiers) and below each tier.
    let tier_paths: Vec<String> = [&tiers.burstable, &tiers.besteffort]
        .into_iter()
        .filter_map(&spelled)
        .collect();
    let mut parents: Vec<String> = tier_paths.clone();
    parents.extend(spelled(&tiers.kubepods));
    for parent in &parents {
        for &(leaf, _) in children.get(parent.as_str()).into_iter().flatten() {
            let path = if parent == "/" {
                format!("/{leaf}")
            } else {
                format!("{parent}/{leaf}")
            };
            if tier_paths.contains(&path) || pod_paths.contains_key(&path) {
                continue;
            }
            let reason = match reader.cgroup_name(&path) {
                Ok(name)
                    if name
                        .components()
                        .last()
                        .is_some_and(|c| c.starts_with("pod") && c.len() > 3) =>
                {
                    Unattributed::UnknownPod
                }
                _ => Unattributed::NotAPod,
            };
            out.unattributed.push((path, reason));
        }
    }
    out.unattributed.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::NameStyle;
    use crate::cgroup::cgroupfs::{CgroupfsBackend, Hierarchies};
    use crate::cgroup::walk::walk;
    use crate::pods::model::{ContainerStatus, ObjectMeta, PodSpec, PodStatus};

    fn pod(uid: &str, statuses: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: format!("p-{uid}"),
                namespace: "ns".into(),
                uid: uid.into(),
                ..ObjectMeta::default()
            },
            spec: PodSpec::default(),
            status: PodStatus {
                phase: "Running".into(),
                container_statuses: statuses
                    .iter()
                    .map(|(name, id)| ContainerStatus {
                        name: (*name).into(),
                        container_id: (*id).into(),
                        restart_count: 0,
                    })
                    .collect(),
                ..PodStatus::default()
            },
        }
    }

    fn tree(dirs: &[&str]) -> (tempfile::TempDir, Walk) {
        let root = tempfile::tempdir().expect("tempdir");
        for dir in dirs {
            std::fs::create_dir_all(root.path().join(dir.trim_start_matches('/'))).expect("mkdir");
        }
        let found = walk(root.path(), None).expect("walk");
        (root, found)
    }

    fn reader(root: &std::path::Path, style: NameStyle) -> CgroupfsBackend {
        CgroupfsBackend::new(Hierarchies::V2(root.to_owned()), CgroupName::root(), style)
    }

    #[test]
    fn containerd_on_the_systemd_driver() {
        let (root, found) = tree(&[
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod11_22.slice/cri-containerd-aaa.scope",
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod11_22.slice/cri-containerd-sandbox.scope",
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod99.slice",
            "/kubepods.slice/kubepods-pod33.slice/cri-containerd-ccc.scope",
            "/kubepods.slice/stray.slice",
            "/system.slice/containerd.service",
        ]);
        let reader = reader(root.path(), NameStyle::Systemd);
        let tiers = QosTiers::new(&CgroupName::root()).expect("tiers");
        let burstable = pod(
            "11-22",
            &[("app", "containerd://aaa"), ("late", "containerd://zzz")],
        );
        // Said to be Burstable, but its cgroup is in the Guaranteed place.
        let guaranteed = pod("33", &[("app", "containerd://ccc")]);
        let found = discover(
            &found,
            &reader,
            &tiers,
            [
                ("11-22", &burstable, QosClass::Burstable),
                ("33", &guaranteed, QosClass::Burstable),
            ],
        );
        let b = &found.pods["11-22"];
        let (pod_cgroup, tier) = b.pod.as_ref().expect("pod cgroup");
        assert_eq!(tier, &QosClass::Burstable);
        assert_eq!(
            pod_cgroup.path,
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod11_22.slice"
        );
        assert_eq!(
            b.containers["app"].path,
            format!("{}/cri-containerd-aaa.scope", pod_cgroup.path)
        );
        assert_eq!(b.others.len(), 1, "the sandbox");
        assert_eq!(b.missing, ["late"]);
        let id = std::fs::metadata(
            root.path()
                .join(b.containers["app"].path.trim_start_matches('/')),
        )
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .expect("stat");
        assert_eq!(b.containers["app"].id, id);
        assert_eq!(
            found.pods["33"].pod.as_ref().map(|p| p.1),
            Some(QosClass::Guaranteed)
        );
        assert!(found.pods["33"].containers.contains_key("app"));
        assert_eq!(
            found.unattributed,
            [
                (
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod99.slice"
                        .into(),
                    Unattributed::UnknownPod
                ),
                ("/kubepods.slice/stray.slice".into(), Unattributed::NotAPod),
            ]
        );
    }

    #[test]
    fn containerd_cri_o_and_docker_on_cgroupfs() {
        let (root, found) = tree(&[
            "/kubepods/burstable/poda/0123abcd",
            "/kubepods/burstable/poda/feed",
            "/kubepods/besteffort/podb/crio-4567",
            "/kubepods/besteffort/podb/crio-conmon-4567",
            "/kubepods/podc/89ab",
        ]);
        let reader = reader(root.path(), NameStyle::Cgroupfs);
        let tiers = QosTiers::new(&CgroupName::root()).expect("tiers");
        let a = pod("a", &[("app", "containerd://0123abcd")]);
        let b = pod("b", &[("app", "cri-o://4567")]);
        let c = pod("c", &[("app", "docker://89ab")]);
        let found = discover(
            &found,
            &reader,
            &tiers,
            [
                ("a", &a, QosClass::Burstable),
                ("b", &b, QosClass::BestEffort),
                ("c", &c, QosClass::Guaranteed),
            ],
        );
        assert_eq!(
            found.pods["a"].containers["app"].path,
            "/kubepods/burstable/poda/0123abcd"
        );
        assert_eq!(found.pods["a"].others.len(), 1);
        assert_eq!(
            found.pods["b"].containers["app"].path,
            "/kubepods/besteffort/podb/crio-4567"
        );
        assert_eq!(
            found.pods["b"].others[0].path,
            "/kubepods/besteffort/podb/crio-conmon-4567"
        );
        assert_eq!(
            found.pods["c"].containers["app"].path,
            "/kubepods/podc/89ab"
        );
        assert!(found.unattributed.is_empty(), "{:?}", found.unattributed);
    }

    #[test]
    fn a_mirror_pods_cgroup_is_its_static_pods() {
        let (root, found) = tree(&["/kubepods/burstable/podstatichash/abc"]);
        let reader = reader(root.path(), NameStyle::Cgroupfs);
        let tiers = QosTiers::new(&CgroupName::root()).expect("tiers");
        let mut mirror = pod("api-uid", &[("etcd", "containerd://abc")]);
        mirror
            .metadata
            .annotations
            .insert(MIRROR_ANNOTATION.into(), "statichash".into());
        let found = discover(
            &found,
            &reader,
            &tiers,
            [("api-uid", &mirror, QosClass::Burstable)],
        );
        assert!(found.pods["api-uid"].containers.contains_key("etcd"));
        assert!(found.unattributed.is_empty());
    }

    #[test]
    fn runtime_ids_from_cgroup_names() {
        assert_eq!(runtime_id_of("cri-containerd-ab12.scope"), Some("ab12"));
        assert_eq!(runtime_id_of("crio-ab12.scope"), Some("ab12"));
        assert_eq!(runtime_id_of("crio-ab12"), Some("ab12"));
        assert_eq!(runtime_id_of("docker-ab12.scope"), Some("ab12"));
        assert_eq!(runtime_id_of("ab12"), Some("ab12"));
        assert_eq!(runtime_id_of("crio-conmon-ab12.scope"), None);
    }
}
