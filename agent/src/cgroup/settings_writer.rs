//! A writer confined to some settings of some cgroups that exist: what qosd holds beside
//! kubelet, where kubelet and the container runtime own the cgroups and their values. It may
//! update only what its rule allows (beside kubelet: the feedback's CFS burst and `cpuset.mems`
//! of containers, the BestEffort tier's quota and `cpu.idle`), and refuses everything else
//! (creating, removing, moving or killing, any other setting or cgroup) with
//! [`CgroupError::NotPermitted`], so that "never correct kubelet's own values" holds by
//! construction, not by care.
use std::path::PathBuf;

use super::backend::{
    CgroupError, CgroupJoin, CgroupJoiner, CgroupWriter, CreateReport, DestroyReport, UpdateReport,
};
use super::files::Setting;
use super::name::CgroupName;
use super::resources::ResourceConfig;

/// Which settings of which cgroup may be written.
pub type Rule = Box<dyn Fn(&CgroupName, Setting) -> bool + Send + Sync>;

/// A backend's write side narrowed to what `rule` allows, of existing cgroups.
pub struct SettingsOnlyWriter {
    inner: Box<dyn CgroupWriter>,
    rule: Rule,
}

impl SettingsOnlyWriter {
    /// `inner` may update only what `rule` allows.
    #[must_use]
    pub fn new(inner: Box<dyn CgroupWriter>, rule: Rule) -> Self {
        Self { inner, rule }
    }

    /// `inner` may update only `allowed`, of any cgroup.
    #[must_use]
    pub fn with_settings(inner: Box<dyn CgroupWriter>, allowed: &[Setting]) -> Self {
        let allowed = allowed.to_vec();
        Self::new(inner, Box::new(move |_, s| allowed.contains(&s)))
    }

    fn refuse(name: &CgroupName, what: &str) -> CgroupError {
        CgroupError::NotPermitted {
            name: name.to_string(),
            what: what.to_owned(),
        }
    }
}

super::backend::forward_cgroup_reader!(SettingsOnlyWriter, inner);

impl CgroupJoiner for SettingsOnlyWriter {
    fn join(&self, name: &CgroupName) -> Result<CgroupJoin, CgroupError> {
        Err(Self::refuse(name, "placing a process in it"))
    }
}

impl CgroupWriter for SettingsOnlyWriter {
    fn create(
        &self,
        name: &CgroupName,
        _config: &ResourceConfig,
    ) -> Result<CreateReport, CgroupError> {
        Err(Self::refuse(name, "creating it"))
    }

    fn update(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<UpdateReport, CgroupError> {
        if let Some(setting) = config
            .settings()
            .into_iter()
            .find(|s| !(self.rule)(name, *s))
        {
            return Err(Self::refuse(name, &format!("writing its {setting}")));
        }
        if !self.inner.exists(name)? {
            return Err(Self::refuse(name, "writing a cgroup that does not exist"));
        }
        self.inner.update(name, config)
    }

    fn destroy(&self, name: &CgroupName) -> Result<DestroyReport, CgroupError> {
        Err(Self::refuse(name, "removing it"))
    }

    fn attach(&self, name: &CgroupName, _pid: u32) -> Result<Vec<PathBuf>, CgroupError> {
        Err(Self::refuse(name, "moving a process into it"))
    }

    fn kill(&self, name: &CgroupName) -> Result<usize, CgroupError> {
        Err(Self::refuse(name, "killing its processes"))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cgroup::NameStyle;
    use crate::cgroup::cgroupfs::{CgroupfsBackend, Hierarchies};
    use crate::cgroup::name::CgroupName;

    #[test]
    fn only_the_allowed_settings_of_existing_cgroups_are_written() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("kubepods/burstable/podx/ctr");
        std::fs::create_dir_all(&dir).expect("mkdir");
        for (file, value) in [
            ("cpu.max.burst", "0"),
            ("cpu.weight", "39"),
            ("cgroup.controllers", "cpu cpuset memory pids"),
        ] {
            std::fs::write(dir.join(file), value).expect("file");
        }
        for parent in ["kubepods", "kubepods/burstable", "kubepods/burstable/podx"] {
            std::fs::write(
                root.path().join(parent).join("cgroup.controllers"),
                "cpu cpuset memory pids",
            )
            .expect("file");
        }
        std::fs::write(
            root.path().join("cgroup.controllers"),
            "cpu cpuset memory pids",
        )
        .expect("file");
        let backend = CgroupfsBackend::new(
            Hierarchies::V2(root.path().to_owned()),
            CgroupName::root(),
            NameStyle::Cgroupfs,
        );
        let writer = SettingsOnlyWriter::with_settings(
            Box::new(backend),
            &[Setting::CpuBurst, Setting::CpuIdle],
        );
        let ctr = CgroupName::new(["kubepods", "burstable", "podx", "ctr"]).expect("name");

        let burst = ResourceConfig {
            cpu_burst: Some(20_000),
            ..ResourceConfig::default()
        };
        let report = writer.update(&ctr, &burst).expect("allowed");
        assert_eq!(report.written.len(), 1);
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.max.burst")).expect("read"),
            "20000"
        );

        let shares = ResourceConfig {
            cpu_shares: Some(512),
            ..ResourceConfig::default()
        };
        let err = writer.update(&ctr, &shares).expect_err("kubelet's value");
        assert!(err.to_string().contains("writing its cpu shares"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.weight")).expect("read"),
            "39"
        );

        let gone = ctr.parent().expect("pod").child("gone").expect("name");
        assert!(writer.update(&gone, &burst).is_err(), "never creates");
        assert!(!root.path().join("kubepods/burstable/podx/gone").exists());
        for refused in [
            writer.create(&gone, &burst).map(|_| ()),
            writer.destroy(&ctr).map(|_| ()),
            writer.attach(&ctr, 1).map(|_| ()),
            writer.kill(&ctr).map(|_| ()),
            writer.join(&ctr).map(|_| ()),
        ] {
            assert!(
                matches!(refused, Err(CgroupError::NotPermitted { .. })),
                "{refused:?}"
            );
        }
        assert!(dir.exists());
    }

    #[test]
    fn every_field_of_a_config_is_named() {
        let all = ResourceConfig {
            cpu_shares: Some(2),
            cpu_quota: Some(crate::cgroup::Limit::Max),
            cpu_period: Some(100_000),
            cpu_burst: Some(0),
            cpu_idle: Some(false),
            cpuset_cpus: Some(crate::cgroup::CpuSet::default()),
            cpuset_mems: Some(crate::cgroup::CpuSet::default()),
            cpuset_memory_migrate: Some(true),
            memory_limit: Some(crate::cgroup::Limit::Max),
            memory_min: Some(0),
            memory_low: Some(0),
            memory_high: Some(crate::cgroup::Limit::Max),
            pids_limit: Some(crate::cgroup::Limit::Max),
            hugetlb_limits: BTreeMap::from([(2 << 20, crate::cgroup::Limit::Max)]),
        };
        assert_eq!(all.settings().len(), 14);
        assert!(ResourceConfig::default().settings().is_empty());
    }
}
