//! The cgroup manager interface, kubelet's `CgroupManager`: create, update, destroy and inspect
//! cgroups by [`CgroupName`], independent of the cgroup version and of the name spelling
//! (cgroupfs or systemd slices). [`super::cgroupfs::CgroupfsManager`] implements it by writing
//! the cgroup filesystems directly.
//!
//! Every manager is confined to a root name given at construction: names outside it are refused,
//! so it never alters cgroups it was not given.
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use super::files::{CgroupVersion, Controller, FilesError, Setting};
use super::name::{CgroupName, NameError};
use super::resources::ResourceConfig;
use super::stats::{CpuStats, EffectiveCpuset, NumaStat, StatsError};

/// Errors of the cgroup managers. Every variant names the cgroup, file or directory concerned;
/// I/O failures carry the `io::Error` as their source.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("cgroup {name} is outside this manager's root {root}")]
    OutsideRoot { name: String, root: String },
    #[error("refusing to remove the hierarchy root {path}")]
    HierarchyRoot { path: PathBuf },
    #[error("cgroup {name} does not exist (no {path})")]
    Missing { name: String, path: PathBuf },
    #[error("{what}")]
    NoHierarchy { what: String },
    #[error("creating cgroup directory {path}: {source}")]
    Mkdir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("removing cgroup directory {path}: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cgroup {name}: {source}")]
    Files {
        name: String,
        #[source]
        source: FilesError,
    },
    #[error("cgroup {name}: {setting} needs the {controller} controller, which is {reason}")]
    ControllerMissing {
        name: String,
        setting: Setting,
        controller: Controller,
        reason: String,
    },
    #[error("{path}: {line:?} is not a process id")]
    Procs { path: PathBuf, line: String },
    #[error(transparent)]
    Stats(#[from] StatsError),
}

/// How cgroup names are spelled on disk (kubelet's `--cgroup-driver`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NameStyle {
    /// `/kubepods/burstable/pod<uid>`.
    #[default]
    Cgroupfs,
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`.
    Systemd,
}

impl NameStyle {
    /// The name's path relative to a hierarchy root, starting with `/` (kubelet's `Name`).
    pub fn spell(self, name: &CgroupName) -> Result<String, NameError> {
        match self {
            Self::Cgroupfs => Ok(name.to_cgroupfs()),
            Self::Systemd => name.to_systemd(),
        }
    }

    /// Reads a path back into a name (kubelet's `CgroupName`).
    pub fn parse(self, path: &str) -> Result<CgroupName, NameError> {
        match self {
            Self::Cgroupfs => CgroupName::parse_cgroupfs(path),
            Self::Systemd => CgroupName::parse_systemd(path),
        }
    }
}

/// One file write that was performed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub path: PathBuf,
    pub value: String,
}

/// A setting that was not applied because its controller is unavailable (only for controllers
/// kubelet treats as optional: cpuset, pids, hugetlb).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub setting: Setting,
    pub controller: Controller,
    pub reason: String,
}

/// What [`CgroupManager::update`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpdateReport {
    /// The writes performed, in order; empty when everything already matched.
    pub written: Vec<Written>,
    pub skipped: Vec<Skipped>,
}

/// What [`CgroupManager::create`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateReport {
    /// Directories created, outermost first (existing ones are not listed).
    pub created: Vec<PathBuf>,
    /// Managed v1 controllers not mounted on this host: no directory was made for them.
    pub unmounted: Vec<Controller>,
    /// Writes made: inherited cpusets (v1), enabled controllers (v2), then the config.
    pub written: Vec<Written>,
    pub skipped: Vec<Skipped>,
}

/// What [`CgroupManager::destroy`] removed, deepest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DestroyReport {
    pub removed: Vec<PathBuf>,
}

/// Statistics of one cgroup; `None` where the controller is not available for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupStats {
    pub cpu: Option<CpuStats>,
    /// `memory.stat`, every key.
    pub memory: Option<BTreeMap<String, u64>>,
    pub numa: Option<NumaStat>,
    pub cpuset: Option<EffectiveCpuset>,
}

/// kubelet's `CgroupManager`.
pub trait CgroupManager: Send + Sync {
    /// The cgroup version written.
    fn version(&self) -> CgroupVersion;

    /// The name everything this manager touches lives under.
    fn root(&self) -> &CgroupName;

    /// The name's path relative to each hierarchy root in this manager's spelling
    /// (kubelet's `Name`), e.g. `/kubepods/burstable`.
    fn name(&self, name: &CgroupName) -> Result<String, CgroupError>;

    /// Reads a path in this manager's spelling back into a name (kubelet's `CgroupName`).
    fn cgroup_name(&self, path: &str) -> Result<CgroupName, CgroupError>;

    /// The directory holding each managed controller's files for `name` (on v2 the same
    /// directory for all). v1 controllers that are not mounted are absent.
    fn paths(&self, name: &CgroupName) -> Result<BTreeMap<Controller, PathBuf>, CgroupError>;

    /// True when the cgroup exists in every hierarchy it is managed in.
    fn exists(&self, name: &CgroupName) -> Result<bool, CgroupError>;

    /// Creates the cgroup (and any missing ancestor below the root) in every managed
    /// hierarchy, makes it usable (v1 cpusets inherited, v2 controllers enabled in the
    /// ancestors), then applies `config` as [`Self::update`] does.
    fn create(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<CreateReport, CgroupError>;

    /// Writes the settings of `config` whose files do not already hold an equivalent value;
    /// reports exactly the writes made.
    fn update(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<UpdateReport, CgroupError>;

    /// Removes the cgroup and everything below it in every hierarchy, deepest first; succeeds
    /// if it is already gone.
    fn destroy(&self, name: &CgroupName) -> Result<DestroyReport, CgroupError>;

    /// Processes in the cgroup or any cgroup below it, in any hierarchy (kubelet's `Pids`),
    /// sorted.
    fn pids(&self, name: &CgroupName) -> Result<Vec<u32>, CgroupError>;

    /// Moves process `pid` into the cgroup in every hierarchy; returns the `cgroup.procs`
    /// files written.
    fn attach(&self, name: &CgroupName, pid: u32) -> Result<Vec<PathBuf>, CgroupError>;

    /// The cgroup's CPU, memory and cpuset statistics.
    fn stats(&self, name: &CgroupName) -> Result<CgroupStats, CgroupError>;
}
