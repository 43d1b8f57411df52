//! kubelet's QoS container manager: the `kubepods` root and its `burstable` and `besteffort`
//! tiers (Guaranteed pods live directly under `kubepods`), and the values kubelet keeps on
//! them (pkg/kubelet/cm/qos_container_manager_linux.go): burstable CPU shares follow the sum
//! of burstable pods' CPU requests, besteffort gets the minimum shares, and with MemoryQoS the
//! tiers' `memory.min` protects the requested memory of the pods below them.
use crate::cgroup::name::{CgroupName, NameError};
use crate::cgroup::resources::{MIN_SHARES, ResourceConfig, milli_cpu_to_shares};
use crate::pods::model::PodSpec;
use crate::pods::qos::QosClass;

/// The tier cgroups under a cgroup root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QosTiers {
    pub kubepods: CgroupName,
    pub burstable: CgroupName,
    pub besteffort: CgroupName,
}

impl QosTiers {
    /// Tiers under `root` (kubelet: `<cgroupRoot>/kubepods/{burstable,besteffort}`).
    pub fn new(root: &CgroupName) -> Result<Self, NameError> {
        let kubepods = root.child("kubepods")?;
        Ok(Self {
            burstable: kubepods.child("burstable")?,
            besteffort: kubepods.child("besteffort")?,
            kubepods,
        })
    }

    /// The tier a pod of class `qos` lives in.
    #[must_use]
    pub fn tier(&self, qos: QosClass) -> &CgroupName {
        match qos {
            QosClass::Guaranteed => &self.kubepods,
            QosClass::Burstable => &self.burstable,
            QosClass::BestEffort => &self.besteffort,
        }
    }

    /// The pod cgroup: `pod<uid>` in its tier.
    pub fn pod_cgroup(&self, qos: QosClass, uid: &str) -> Result<CgroupName, NameError> {
        self.tier(qos).child(&format!("pod{uid}"))
    }
}

/// Desired settings of the burstable and besteffort tiers, and the `memory.min` of kubepods
/// (MemoryQoS only), for the admitted pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierSettings {
    pub burstable: ResourceConfig,
    pub besteffort: ResourceConfig,
    pub kubepods_memory_min: Option<u64>,
}

/// kubelet's `setCPUCgroupConfig` and `setMemoryQoS` over the admitted pods.
pub fn tier_settings<'a>(
    pods: impl IntoIterator<Item = (QosClass, &'a PodSpec)>,
    memory_qos: bool,
) -> TierSettings {
    let (mut burstable_cpu, mut burstable_memory, mut guaranteed_memory) = (0i64, 0i64, 0i64);
    for (qos, spec) in pods {
        let requests = spec.effective_requests();
        match qos {
            QosClass::Burstable => {
                burstable_cpu += requests.cpu_millis;
                burstable_memory += requests.memory_bytes;
            }
            QosClass::Guaranteed => guaranteed_memory += requests.memory_bytes,
            QosClass::BestEffort => {}
        }
    }
    let mut settings = TierSettings {
        burstable: ResourceConfig {
            cpu_shares: Some(milli_cpu_to_shares(burstable_cpu)),
            ..ResourceConfig::default()
        },
        besteffort: ResourceConfig {
            cpu_shares: Some(MIN_SHARES),
            ..ResourceConfig::default()
        },
        kubepods_memory_min: None,
    };
    if memory_qos {
        settings.burstable.memory_min = u64::try_from(burstable_memory).ok();
        settings.kubepods_memory_min = u64::try_from(burstable_memory + guaranteed_memory).ok();
    }
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> PodSpec {
        serde_yaml_ng::from_str(yaml).expect("pod spec")
    }

    #[test]
    fn pods_live_in_their_tier() {
        let tiers = QosTiers::new(&CgroupName::new(["qosd"]).expect("name")).expect("tiers");
        assert_eq!(
            tiers
                .pod_cgroup(QosClass::Guaranteed, "u1")
                .expect("name")
                .to_cgroupfs(),
            "/qosd/kubepods/podu1"
        );
        assert_eq!(
            tiers
                .pod_cgroup(QosClass::Burstable, "u2")
                .expect("name")
                .to_cgroupfs(),
            "/qosd/kubepods/burstable/podu2"
        );
        assert_eq!(
            tiers
                .pod_cgroup(QosClass::BestEffort, "u3")
                .expect("name")
                .to_cgroupfs(),
            "/qosd/kubepods/besteffort/podu3"
        );
        assert!(
            tiers.pod_cgroup(QosClass::BestEffort, "../x").is_err(),
            "a uid cannot escape the tier"
        );
    }

    /// kubelet's TestQoSContainerCgroup-style expectations: burstable shares are the sum of
    /// burstable requests; besteffort keeps the minimum; guaranteed pods do not count.
    #[test]
    fn burstable_shares_follow_burstable_requests() {
        let b1 = spec("containers: [{name: a, resources: {requests: {cpu: 250m, memory: 64Mi}}}]");
        let b2 = spec("containers: [{name: a, resources: {requests: {cpu: 500m}}}]");
        let g = spec("containers: [{name: a, resources: {limits: {cpu: '2', memory: 1Gi}}}]");
        let settings = tier_settings(
            [
                (QosClass::Burstable, &b1),
                (QosClass::Burstable, &b2),
                (QosClass::Guaranteed, &g),
            ],
            true,
        );
        assert_eq!(settings.burstable.cpu_shares, Some(768));
        assert_eq!(settings.besteffort.cpu_shares, Some(2));
        assert_eq!(settings.burstable.memory_min, Some(64 << 20));
        assert_eq!(settings.kubepods_memory_min, Some((64 << 20) + (1 << 30)));
        let none = tier_settings(std::iter::empty(), false);
        assert_eq!(
            none.burstable.cpu_shares,
            Some(2),
            "no burstable pods: minimum shares"
        );
        assert_eq!(none.kubepods_memory_min, None);
    }
}
