//! The feedback on kubelet's pods: the policies' interventions written onto kubelet's cgroups,
//! only the files the policies own (the writer refuses anything else). Before the first write to
//! a file, kubelet's value is read and kept, and it is what the file gets back when the
//! intervention is lifted, when its pod is being deleted, and when qosd stops. kubelet (or
//! anyone) writing a file back while an intervention holds is seen at the next check, counted
//! in `qosd_feedback_reverted_total{policy}` and written again.
//!
//! An idle intervention also holds the cgroup's weight: the kernel runs an idle group at the
//! idle weight and resets its weight to the default when it stops being idle, so kubelet's
//! weight is recorded with `cpu.idle` and written back after it.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::cgroup::CpuSet;
use crate::cgroup::backend::{CgroupError, CgroupReader, CgroupWriter};
use crate::cgroup::files::{CgroupVersion, Setting};
use crate::cgroup::name::CgroupName;
use crate::cgroup::resources::{Limit, ResourceConfig, cpu_weight_to_shares};
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
    /// kubelet's value of each setting an intervention holds, read before the first write:
    /// as a config, and as the file's text (for the record).
    originals: BTreeMap<(Target, Setting), Original>,
    /// Where the originals are recorded (the state directory), so that a qosd that did not
    /// stop cleanly has the next one put kubelet's values back; `None`: not recorded.
    record: Option<PathBuf>,
}

/// kubelet's value of one setting.
#[derive(Clone, Debug)]
struct Original {
    config: ResourceConfig,
    text: String,
    /// The cgroup's path in the driver's spelling.
    cgroup: String,
}

/// The file of [`Interventions`]' record in the state directory.
pub const RECORD_FILE: &str = "feedback_interventions.json";

/// What the record holds: kubelet's value of every setting under an intervention.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    entries: Vec<RecordEntry>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordEntry {
    /// The cgroup, in the driver's spelling (`/kubepods/burstable/pod<uid>/<id>`).
    cgroup: String,
    /// [`setting_key`].
    setting: String,
    /// The file's text before the intervention.
    kubelet_value: String,
}

/// The record's name of a feedback setting.
fn setting_key(setting: Setting) -> &'static str {
    match setting {
        Setting::CpuBurst => "cpu_burst",
        Setting::CpuIdle => "cpu_idle",
        Setting::CpuShares => "cpu_shares",
        Setting::CpuQuota => "cpu_quota",
        Setting::CpusetMems => "cpuset_mems",
        Setting::CpusetMemoryMigrate => "cpuset_memory_migrate",
        _ => "other",
    }
}

fn setting_of_key(key: &str) -> Option<Setting> {
    [
        Setting::CpuBurst,
        Setting::CpuIdle,
        Setting::CpuShares,
        Setting::CpuQuota,
        Setting::CpusetMems,
        Setting::CpusetMemoryMigrate,
    ]
    .into_iter()
    .find(|s| setting_key(*s) == key)
}

/// Errors of the interventions: a cgroup that could not be read or written, or the record.
#[derive(Debug, thiserror::Error)]
pub enum InterventionError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a record of qosd's interventions: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: entry {index}: unknown setting {setting:?}")]
    Setting {
        path: PathBuf,
        index: usize,
        setting: String,
    },
    #[error(transparent)]
    Write(#[from] crate::cm::checkpoint::CheckpointError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

impl Interventions {
    /// Interventions whose kubelet values are recorded in `state_dir` (see [`RECORD_FILE`]).
    #[must_use]
    pub fn recorded_in(state_dir: &Path) -> Self {
        Self {
            record: Some(state_dir.join(RECORD_FILE)),
            ..Self::default()
        }
    }

    /// Puts back kubelet's values an earlier qosd recorded and did not restore (it was killed
    /// or crashed): every recorded setting of a cgroup that still exists gets kubelet's value
    /// again (nothing is written where it already has it). Returns how many were written;
    /// the record is emptied.
    pub fn recover(&mut self, writer: &dyn CgroupWriter) -> Result<usize, InterventionError> {
        let Some(path) = self.record.clone() else {
            return Ok(0);
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(source) => return Err(InterventionError::Read { path, source }),
        };
        let record: Record =
            serde_json::from_str(&text).map_err(|source| InterventionError::Parse {
                path: path.clone(),
                source,
            })?;
        // One config per cgroup: its settings are written together, in the kernel's order
        // (an idle group's weight only after cpu.idle).
        let mut per_cgroup: BTreeMap<&str, (ResourceConfig, Vec<String>)> = BTreeMap::new();
        for (index, entry) in record.entries.iter().enumerate() {
            let setting =
                setting_of_key(&entry.setting).ok_or_else(|| InterventionError::Setting {
                    path: path.clone(),
                    index,
                    setting: entry.setting.clone(),
                })?;
            let (config, described) = per_cgroup.entry(&entry.cgroup).or_default();
            *config = config.clone().overlaid(&kubelet_value(
                setting,
                &entry.kubelet_value,
                writer.version(),
            ));
            described.push(format!("{setting}={}", entry.kubelet_value.trim()));
        }
        let mut restored = 0;
        for (cgroup_text, (config, described)) in per_cgroup {
            let cgroup = writer.cgroup_name(cgroup_text)?;
            if !writer.exists(&cgroup)? {
                continue;
            }
            let differences = writer.compare(&cgroup, &config)?;
            if differences.is_empty() {
                continue;
            }
            writer.update(&cgroup, &config)?;
            tracing::warn!(cgroup = %cgroup_text, kubelet_values = %described.join(" "), "an earlier qosd left an intervention: kubelet's values put back");
            restored += differences.len();
        }
        self.save()?;
        Ok(restored)
    }

    /// Writes the record (an empty one when nothing is in force).
    fn save(&self) -> Result<(), InterventionError> {
        let Some(path) = &self.record else {
            return Ok(());
        };
        let record = Record {
            entries: self
                .originals
                .iter()
                .map(|((_, setting), original)| RecordEntry {
                    cgroup: original.cgroup.clone(),
                    setting: setting_key(*setting).to_owned(),
                    kubelet_value: original.text.clone(),
                })
                .collect(),
        };
        let bytes =
            serde_json::to_vec_pretty(&record).map_err(|source| InterventionError::Parse {
                path: path.clone(),
                source,
            })?;
        crate::cm::checkpoint::write_atomic(path, &bytes)?;
        Ok(())
    }

    fn save_logged(&self) {
        if let Err(e) = self.save() {
            tracing::warn!(error = %e, "recording kubelet's values under the interventions; a qosd killed now would leave them");
        }
    }

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
    ) -> Vec<(Target, InterventionError)> {
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
        self.save_logged();
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
    ) -> Result<(), InterventionError> {
        for setting in held(&new.config) {
            if let std::collections::btree_map::Entry::Vacant(slot) =
                self.originals.entry((target.clone(), setting))
            {
                slot.insert(original(writer, &new.cgroup, setting)?);
                // Recorded before the intervention is written: a kill right after it still
                // finds kubelet's value.
                self.save()?;
            }
        }
        let mut config = new.config.clone();
        if let Some(old) = old {
            let still = held(&new.config);
            for setting in held(&old.config) {
                if !still.contains(&setting)
                    && let Some(original) = self.originals.remove(&(target.clone(), setting))
                {
                    config = config.overlaid(&original.config);
                }
            }
        }
        writer.update(&new.cgroup, &config)?;
        Ok(())
    }

    /// Writes kubelet's values back under `old`.
    fn lift(
        &mut self,
        writer: &dyn CgroupWriter,
        target: &Target,
        old: &InForce,
    ) -> Result<(), InterventionError> {
        let mut config = ResourceConfig::default();
        for setting in held(&old.config) {
            if let Some(original) = self.originals.get(&(target.clone(), setting)) {
                config = config.overlaid(&original.config);
            }
        }
        writer.update(&old.cgroup, &config)?;
        for setting in held(&old.config) {
            self.originals.remove(&(target.clone(), setting));
        }
        Ok(())
    }

    fn forget(&mut self, target: &Target) {
        self.in_force.remove(target);
        self.originals.retain(|(t, _), _| t != target);
    }

    /// Finds interventions written back (by kubelet or anyone) and writes them again.
    pub fn check(
        &mut self,
        writer: &dyn CgroupWriter,
    ) -> (Reverted, Vec<(Target, InterventionError)>) {
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
                        errors.push((target.clone(), e.into()));
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
                Err(e) => errors.push((target.clone(), e.into())),
            }
        }
        for target in gone {
            self.forget(&target);
        }
        if !errors.is_empty() || !reverted.rewritten.is_empty() {
            self.save_logged();
        }
        (reverted, errors)
    }

    /// Lifts every intervention (kubelet's values back), for shutdown.
    pub fn restore_all(&mut self, writer: &dyn CgroupWriter) -> Vec<(Target, InterventionError)> {
        self.apply(writer, &BTreeMap::new())
    }
}

/// The settings an intervention of `config` holds: its own, and the weight of a group it
/// makes idle (which the kernel resets when the group stops being idle).
#[must_use]
pub fn held(config: &ResourceConfig) -> Vec<Setting> {
    let mut settings = config.settings();
    if config.cpu_idle == Some(true) && !settings.contains(&Setting::CpuShares) {
        settings.push(Setting::CpuShares);
    }
    settings
}

/// kubelet's value of `setting` in `cgroup`, read before an intervention replaces it.
fn original(
    reader: &dyn CgroupReader,
    cgroup: &CgroupName,
    setting: Setting,
) -> Result<Original, CgroupError> {
    let text = reader
        .setting(cgroup, setting)?
        .map(|(_, text)| text)
        .unwrap_or_default();
    Ok(Original {
        config: kubelet_value(setting, &text, reader.version()),
        cgroup: reader.name(cgroup)?,
        text,
    })
}

/// The config that writes back `text`, a feedback setting's file content as kubelet (or the
/// kernel's default) left it.
fn kubelet_value(setting: Setting, text: &str, version: CgroupVersion) -> ResourceConfig {
    let mut config = ResourceConfig::default();
    match setting {
        // v1 `cpu.shares`, v2 `cpu.weight` (carried as the shares that give it).
        Setting::CpuShares => {
            config.cpu_shares = text.trim().parse::<u64>().ok().map(|v| match version {
                CgroupVersion::V1 => v,
                CgroupVersion::V2 => cpu_weight_to_shares(v),
            });
        }
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
        Setting::CpusetMems => config.cpuset_mems = CpuSet::parse(text).ok(),
        Setting::CpusetMemoryMigrate => config.cpuset_memory_migrate = Some(text.trim() == "1"),
        // The writer refuses every other setting; reading it back would be a guess.
        _ => {}
    }
    config
}
