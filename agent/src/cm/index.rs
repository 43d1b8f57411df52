//! The index from kernel cgroup id to the workload that owns the cgroup: namespace, pod,
//! container and QoS class. The container manager fills it; probes and metrics read it to
//! label per-cgroup numbers.
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::pods::qos::QosClass;

/// Who owns a cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub pod: String,
    /// `None` for the pod-level cgroup.
    pub container: Option<String>,
    pub qos_class: QosClass,
}

/// A shared, cheaply clonable index.
#[derive(Clone, Debug, Default)]
pub struct WorkloadIndex {
    inner: Arc<RwLock<HashMap<u64, Workload>>>,
}

impl WorkloadIndex {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The workload owning cgroup `id`, if it is managed.
    #[must_use]
    pub fn get(&self, id: u64) -> Option<Workload> {
        self.inner.read().ok().and_then(|map| map.get(&id).cloned())
    }

    /// Records that cgroup `id` belongs to `workload`.
    pub fn insert(&self, id: u64, workload: Workload) {
        if let Ok(mut map) = self.inner.write() {
            map.insert(id, workload);
        }
    }

    /// Forgets every cgroup of the pod.
    pub fn remove_pod(&self, namespace: &str, pod: &str) {
        if let Ok(mut map) = self.inner.write() {
            map.retain(|_, w| !(w.namespace == namespace && w.pod == pod));
        }
    }

    /// Replaces everything indexed with `entries` (a complete new view of the cgroups).
    pub fn replace_all(&self, entries: HashMap<u64, Workload>) {
        if let Ok(mut map) = self.inner.write() {
            *map = entries;
        }
    }

    /// Number of indexed cgroups.
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.read().map_or(0, |map| map.len())
    }

    /// True when nothing is indexed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(pod: &str, container: Option<&str>) -> Workload {
        Workload {
            namespace: "default".into(),
            pod: pod.into(),
            container: container.map(Into::into),
            qos_class: QosClass::Burstable,
        }
    }

    #[test]
    fn clones_share_one_index_and_pods_are_removed_whole() {
        let index = WorkloadIndex::new();
        let reader = index.clone();
        index.insert(10, w("a", None));
        index.insert(11, w("a", Some("c")));
        index.insert(20, w("b", None));
        assert_eq!(reader.get(11), Some(w("a", Some("c"))));
        index.remove_pod("default", "a");
        assert_eq!(reader.get(10), None);
        assert_eq!(reader.get(11), None);
        assert_eq!(reader.len(), 1);
    }
}
