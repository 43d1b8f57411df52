//! The feedback on kubelet's pods: the policies' interventions written onto kubelet's cgroups,
//! only the files the policies own (the writer refuses anything else). Before the first write to
//! a file, kubelet's value is read and kept, and it is what the file gets back when the
//! intervention is lifted, when its pod is being deleted, and when qosd stops. kubelet (or
//! anyone) writing a file back while an intervention holds is seen at the next check, counted
//! in `qosd_feedback_reverted_total{policy}` and written again.
use std::collections::BTreeMap;

use crate::cgroup::CpuSet;
use crate::cgroup::backend::{CgroupError, CgroupReader, CgroupWriter};
use crate::cgroup::files::Setting;
use crate::cgroup::name::CgroupName;
use crate::cgroup::resources::{Limit, ResourceConfig};
use crate::feedback::{ContainerRef, besteffort, burst, numa_align};

/// What an intervention is laid on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    BestEffortTier,
    Container(ContainerRef),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BestEffortTier => f.write_str("besteffort tier"),
            Self::Container(c) => write!(f, "{c}"),
        }
    }
}

/// The policy that owns a setting (for `qosd_feedback_reverted_total{policy}`).
#[must_use]
pub fn policy_of(setting: Setting) -> &'static str {
    match setting {
        Setting::CpuBurst => burst::POLICY,
        Setting::CpusetMems | Setting::CpusetMemoryMigrate => numa_align::POLICY,
        _ => besteffort::POLICY,
    }
}

/// One intervention in force: where, and the values written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InForce {
    pub cgroup: CgroupName,
    pub config: ResourceConfig,
}

/// What a check of the interventions found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reverted {
    /// (target, setting, the value found instead) of every intervention written again.
    pub rewritten: Vec<(Target, Setting, String)>,
}

/// The interventions in force and kubelet's values under them.
#[derive(Debug, Default)]
pub struct Interventions {
    in_force: BTreeMap<Target, InForce>,
    /// kubelet's value of each setting an intervention holds, read before the first write.
    originals: BTreeMap<(Target, Setting), ResourceConfig>,
}

impl Interventions {
    /// The interventions in force.
    #[must_use]
    pub fn in_force(&self) -> &BTreeMap<Target, InForce> {
        &self.in_force
    }

    /// Brings cgroupfs to `wanted` (target -> cgroup and values): new and changed
    /// interventions are written (kubelet's value read first), lifted ones get kubelet's value
    /// back. A target whose cgroup is gone is forgotten. Errors are returned per target; the
    /// others are still written.
    pub fn apply(
        &mut self,
        writer: &dyn CgroupWriter,
        wanted: &BTreeMap<Target, InForce>,
    ) -> Vec<(Target, CgroupError)> {
        let mut errors = Vec::new();
        let targets: Vec<Target> = self
            .in_force
            .keys()
            .chain(wanted.keys())
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for target in targets {
            let old = self.in_force.get(&target).cloned();
            let new = wanted.get(&target).cloned();
            if old == new {
                continue;
            }
            let result = match (&old, &new) {
                (_, Some(new)) => self.put(writer, &target, old.as_ref(), new),
                (Some(old), None) => self.lift(writer, &target, old),
                (None, None) => Ok(()),
            };
            match result {
                Ok(()) => match new {
                    Some(new) => {
                        self.in_force.insert(target, new);
                    }
                    None => {
                        self.in_force.remove(&target);
                    }
                },
                Err(e) => {
                    if !writer
                        .exists(
                            old.as_ref()
                                .or(new.as_ref())
                                .map_or(&CgroupName::root(), |i| &i.cgroup),
                        )
                        .unwrap_or(true)
                    {
                        // The cgroup went with its pod: nothing to restore.
                        self.forget(&target);
                    } else {
                        errors.push((target, e));
                    }
                }
            }
        }
        errors
    }

    /// Writes `new` over `target` (in place of `old`, whose settings `new` no longer holds get
    /// kubelet's value back).
    fn put(
        &mut self,
        writer: &dyn CgroupWriter,
        target: &Target,
        old: Option<&InForce>,
        new: &InForce,
    ) -> Result<(), CgroupError> {
        for setting in new.config.settings() {
            if let std::collections::btree_map::Entry::Vacant(slot) =
                self.originals.entry((target.clone(), setting))
            {
                slot.insert(original(writer, &new.cgroup, setting)?);
            }
        }
        let mut config = new.config.clone();
        if let Some(old) = old {
            for setting in old.config.settings() {
                if !new.config.settings().contains(&setting)
                    && let Some(original) = self.originals.remove(&(target.clone(), setting))
                {
                    config = config.overlaid(&original);
                }
            }
        }
        writer.update(&new.cgroup, &config).map(|_| ())
    }

    /// Writes kubelet's values back under `old`.
    fn lift(
        &mut self,
        writer: &dyn CgroupWriter,
        target: &Target,
        old: &InForce,
    ) -> Result<(), CgroupError> {
        let mut config = ResourceConfig::default();
        for setting in old.config.settings() {
            if let Some(original) = self.originals.get(&(target.clone(), setting)) {
                config = config.overlaid(original);
            }
        }
        writer.update(&old.cgroup, &config)?;
        for setting in old.config.settings() {
            self.originals.remove(&(target.clone(), setting));
        }
        Ok(())
    }

    fn forget(&mut self, target: &Target) {
        self.in_force.remove(target);
        self.originals.retain(|(t, _), _| t != target);
    }

    /// Finds interventions written back (by kubelet or anyone) and writes them again.
    pub fn check(&mut self, writer: &dyn CgroupWriter) -> (Reverted, Vec<(Target, CgroupError)>) {
        let mut reverted = Reverted::default();
        let mut errors = Vec::new();
        let mut gone = Vec::new();
        for (target, in_force) in &self.in_force {
            let differences = match writer.compare(&in_force.cgroup, &in_force.config) {
                Ok(d) => d,
                Err(e) => {
                    if writer.exists(&in_force.cgroup).is_ok_and(|exists| !exists) {
                        gone.push(target.clone());
                    } else {
                        errors.push((target.clone(), e));
                    }
                    continue;
                }
            };
            if differences.is_empty() {
                continue;
            }
            match writer.update(&in_force.cgroup, &in_force.config) {
                Ok(_) => reverted.rewritten.extend(differences.into_iter().map(|d| {
                    (
                        target.clone(),
                        d.setting,
                        d.actual.unwrap_or_else(|| "(missing)".to_owned()),
                    )
                })),
                Err(e) => errors.push((target.clone(), e)),
            }
        }
        for target in gone {
            self.forget(&target);
        }
        (reverted, errors)
    }

    /// Lifts every intervention (kubelet's values back), for shutdown.
    pub fn restore_all(&mut self, writer: &dyn CgroupWriter) -> Vec<(Target, CgroupError)> {
        self.apply(writer, &BTreeMap::new())
    }
}

/// kubelet's value of `setting` in `cgroup`, read before an intervention replaces it.
fn original(
    reader: &dyn CgroupReader,
    cgroup: &CgroupName,
    setting: Setting,
) -> Result<ResourceConfig, CgroupError> {
    let text = reader
        .setting(cgroup, setting)?
        .map(|(_, text)| text)
        .unwrap_or_default();
    let mut config = ResourceConfig::default();
    match setting {
        // kubelet and the runtimes never set these: their value is the kernel's default.
        Setting::CpuBurst => config.cpu_burst = Some(0),
        Setting::CpuIdle => config.cpu_idle = Some(false),
        Setting::CpuQuota => {
            // v1 `cpu.cfs_quota_us` (-1: none), v2 `cpu.max` ("max 100000").
            let first = text.split_whitespace().next().unwrap_or("max");
            config.cpu_quota = Some(match first.parse::<i64>() {
                Ok(quota) if quota > 0 => Limit::from_signed(quota),
                _ => Limit::Max,
            });
        }
        Setting::CpusetMems => config.cpuset_mems = CpuSet::parse(&text).ok(),
        Setting::CpusetMemoryMigrate => config.cpuset_memory_migrate = Some(text.trim() == "1"),
        // The writer refuses every other setting; reading it back would be a guess.
        _ => {}
    }
    Ok(config)
}
