//! The cgroup backend interface, kubelet's `CgroupManager` split in two: [`CgroupReader`]
//! (paths, existence, children, processes, kernel ids, settings and statistics) for everything
//! that only looks (probes, metrics, feedback, `inspect`, discovery), and [`CgroupWriter`]
//! (create, update, destroy, move a process, open a join handle, kill) that only the
//! container manager holds. Both work by [`CgroupName`], independent of the cgroup version and
//! of the name spelling (cgroupfs or systemd slices). [`super::cgroupfs::CgroupfsBackend`]
//! implements them on the cgroup filesystems (v1, hybrid, v2); [`super::systemd`] asks systemd
//! over D-Bus for the writes and reads through the cgroupfs backend.
//!
//! Every backend is confined to a root name given at construction (plus the reserved cgroups
//! it is told about, which it may update but never create or remove): names outside are
//! refused, so it never alters cgroups it was not given.
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
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
    #[error("opening {path} to join the cgroup: {source}")]
    Join {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("killing process {pid} of cgroup {name}: {source}")]
    Kill {
        name: String,
        pid: u32,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Stats(#[from] StatsError),
    #[error("cgroup {name}: {source}")]
    Systemd {
        name: String,
        #[source]
        source: Box<super::systemd::BusError>,
    },
    /// A writer confined to some settings was asked for something else.
    #[error(
        "cgroup {name}: not permitted here: {what} (qosd writes only its feedback's settings of cgroups kubelet owns)"
    )]
    NotPermitted { name: String, what: String },
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

/// What [`CgroupWriter::update`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpdateReport {
    /// The writes performed, in order; empty when everything already matched.
    pub written: Vec<Written>,
    pub skipped: Vec<Skipped>,
}

/// A setting whose file does not hold the value asked for ([`CgroupReader::compare`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub setting: Setting,
    pub path: PathBuf,
    /// What the file would be written with.
    pub expected: String,
    /// What it holds (trimmed); `None` when the file does not exist.
    pub actual: Option<String>,
}

/// What [`CgroupWriter::create`] did.
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

/// What [`CgroupWriter::destroy`] removed, deepest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DestroyReport {
    pub removed: Vec<PathBuf>,
}

/// Which statistics [`CgroupReader::stats_of`] reads (each costs its files' reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatKinds {
    /// `cpu.stat` (and v1 `cpuacct.usage`).
    pub cpu: bool,
    /// `memory.stat`.
    pub memory: bool,
    /// `memory.numa_stat`.
    pub numa: bool,
    /// The effective cpuset.
    pub cpuset: bool,
}

impl StatKinds {
    /// Every statistic.
    pub const ALL: Self = Self {
        cpu: true,
        memory: true,
        numa: true,
        cpuset: true,
    };
}

/// Statistics of one cgroup; `None` where the controller is not available for it (or the
/// statistic was not asked for).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupStats {
    pub cpu: Option<CpuStats>,
    /// `memory.stat`, every key.
    pub memory: Option<BTreeMap<String, u64>>,
    pub numa: Option<NumaStat>,
    pub cpuset: Option<EffectiveCpuset>,
}

/// An opened way into a cgroup for a process about to start: one `cgroup.procs` file per
/// hierarchy, opened for writing by the backend (the runtime never builds a cgroup path).
/// Between fork and exec the child writes `0` ("the writing process") to each, so not one
/// instruction of the workload runs outside the cgroup. The descriptors are close-on-exec.
///
/// Where the cgroup cannot be joined from inside (a systemd scope exists only once systemd
/// has put a process in it), the handle carries a [`Placement`] instead: the child waits
/// between fork and exec until the placement, given its pid, has put it there.
pub struct CgroupJoin {
    files: Vec<(PathBuf, OwnedFd)>,
    placement: Option<Box<dyn Placement>>,
}

/// Puts a process that waits before exec into its cgroup from outside.
pub trait Placement: Send {
    /// Places process `pid`; it runs the workload only after this returned `Ok`.
    fn place(self: Box<Self>, pid: u32) -> Result<(), CgroupError>;
    /// What it does, for messages.
    fn describe(&self) -> String;
}

impl fmt::Debug for CgroupJoin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl CgroupJoin {
    /// A handle over files already opened for writing.
    #[must_use]
    pub fn new(files: Vec<(PathBuf, OwnedFd)>) -> Self {
        Self {
            files,
            placement: None,
        }
    }

    /// A handle whose process is placed by `placement` while it waits before exec.
    #[must_use]
    pub fn placed_by(placement: Box<dyn Placement>) -> Self {
        Self {
            files: Vec::new(),
            placement: Some(placement),
        }
    }

    /// A handle that joins nothing (the process stays where qosd is; tests only).
    #[must_use]
    pub fn none() -> Self {
        Self::new(Vec::new())
    }

    /// The raw descriptors, for the child to write to between fork and exec; valid while
    /// `self` lives.
    #[must_use]
    pub fn raw_fds(&self) -> Vec<RawFd> {
        self.files.iter().map(|(_, fd)| fd.as_raw_fd()).collect()
    }

    /// The placement, once: the spawner runs it with the child's pid.
    pub fn take_placement(&mut self) -> Option<Box<dyn Placement>> {
        self.placement.take()
    }

    /// The files (or the placement), for messages.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .files
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect();
        if let Some(placement) = &self.placement {
            parts.push(placement.describe());
        }
        format!("[{}]", parts.join(", "))
    }
}

/// The read side of a cgroup backend: what probes, metrics, the feedback, `inspect` and
/// discovery get. Nothing here changes a cgroup.
pub trait CgroupReader: Send + Sync {
    /// The cgroup version.
    fn version(&self) -> CgroupVersion;

    /// The name everything this backend manages lives under.
    fn root(&self) -> &CgroupName;

    /// The name's path relative to each hierarchy root in this backend's spelling
    /// (kubelet's `Name`), e.g. `/kubepods/burstable`.
    fn name(&self, name: &CgroupName) -> Result<String, CgroupError>;

    /// Reads a path in this backend's spelling back into a name (kubelet's `CgroupName`).
    fn cgroup_name(&self, path: &str) -> Result<CgroupName, CgroupError>;

    /// The directory holding each managed controller's files for `name` (on v2 the same
    /// directory for all). v1 controllers that are not mounted are absent.
    fn paths(&self, name: &CgroupName) -> Result<BTreeMap<Controller, PathBuf>, CgroupError>;

    /// True when the cgroup exists in every hierarchy it is managed in.
    fn exists(&self, name: &CgroupName) -> Result<bool, CgroupError>;

    /// The cgroups directly below `name` (from the cpu hierarchy, else the first one), in no
    /// particular order; empty when `name` does not exist.
    fn children(&self, name: &CgroupName) -> Result<Vec<CgroupName>, CgroupError>;

    /// The kernel's id of the cgroup (what the eBPF programs record): the inode of its
    /// directory in the cpu hierarchy (the unified one on v2). `None` when it does not exist.
    fn id(&self, name: &CgroupName) -> Result<Option<u64>, CgroupError>;

    /// The file that holds `setting` in this version and its trimmed content; `None` when
    /// the file does not exist (the controller is not there, or the kernel lacks the file).
    fn setting(
        &self,
        name: &CgroupName,
        setting: Setting,
    ) -> Result<Option<(&'static str, String)>, CgroupError>;

    /// Processes in the cgroup or any cgroup below it, in any hierarchy (kubelet's `Pids`),
    /// sorted.
    fn pids(&self, name: &CgroupName) -> Result<Vec<u32>, CgroupError>;

    /// The settings of `config` whose files do not hold an equivalent value (what
    /// [`CgroupWriter::update`] would write), without writing anything; settings whose
    /// controller is unavailable are left out, as `update` skips them.
    fn compare(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<Vec<Difference>, CgroupError>;

    /// The cgroup's statistics of the kinds `wanted`; the others are `None`.
    fn stats_of(&self, name: &CgroupName, wanted: StatKinds) -> Result<CgroupStats, CgroupError>;

    /// The cgroup of container `container` in the pod cgroup `pod`: the container's name
    /// below the pod's on cgroupfs; the systemd backend names a scope.
    fn container(&self, pod: &CgroupName, container: &str) -> Result<CgroupName, CgroupError> {
        Ok(pod.child(container)?)
    }

    /// The cgroup's CPU, memory and cpuset statistics.
    fn stats(&self, name: &CgroupName) -> Result<CgroupStats, CgroupError> {
        self.stats_of(name, StatKinds::ALL)
    }
}

/// Implements [`CgroupReader`] for a wrapper around another backend (field `$inner`) by
/// forwarding every method, the provided ones too, so the wrapped backend's own answers (the
/// systemd backend's scope for a container) are kept. The wrappers (the settings-only writer,
/// the tests' fault layer) differ only in what they write.
macro_rules! forward_cgroup_reader {
    ($wrapper:ty, $inner:ident) => {
        impl $crate::cgroup::backend::CgroupReader for $wrapper {
            fn version(&self) -> $crate::cgroup::files::CgroupVersion {
                self.$inner.version()
            }
            fn root(&self) -> &$crate::cgroup::name::CgroupName {
                self.$inner.root()
            }
            fn name(
                &self,
                name: &$crate::cgroup::name::CgroupName,
            ) -> Result<String, $crate::cgroup::backend::CgroupError> {
                self.$inner.name(name)
            }
            fn cgroup_name(
                &self,
                path: &str,
            ) -> Result<$crate::cgroup::name::CgroupName, $crate::cgroup::backend::CgroupError>
            {
                self.$inner.cgroup_name(path)
            }
            fn paths(
                &self,
                name: &$crate::cgroup::name::CgroupName,
            ) -> Result<
                std::collections::BTreeMap<$crate::cgroup::files::Controller, std::path::PathBuf>,
                $crate::cgroup::backend::CgroupError,
            > {
                self.$inner.paths(name)
            }
            fn exists(
                &self,
                name: &$crate::cgroup::name::CgroupName,
            ) -> Result<bool, $crate::cgroup::backend::CgroupError> {
                self.$inner.exists(name)
            }
            fn children(
                &self,
                name: &$crate::cgroup::name::CgroupName,
            ) -> Result<Vec<$crate::cgroup::name::CgroupName>, $crate::cgroup::backend::CgroupError>
            {
                self.$inner.children(name)
            }
            fn id(
                &self,
                name: &$crate::cgroup::name::CgroupName,
            ) -> Result<Option<u64>, $crate::cgroup::backend::CgroupError> {
                self.$inner.id(name)
            }
            fn setting(
                &self,
                name: &$crate::cgroup::name::CgroupName,
                setting: $crate::cgroup::files::Setting,
            ) -> Result<Option<(&'static str, String)>, $crate::cgroup::backend::CgroupError> {
                self.$inner.setting(name, setting)
            }
            fn pids(
                &self,
                name: &$crate::cgroup::name::CgroupName,
            ) -> Result<Vec<u32>, $crate::cgroup::backend::CgroupError> {
                self.$inner.pids(name)
            }
            fn compare(
                &self,
                name: &$crate::cgroup::name::CgroupName,
                config: &$crate::cgroup::resources::ResourceConfig,
            ) -> Result<
                Vec<$crate::cgroup::backend::Difference>,
                $crate::cgroup::backend::CgroupError,
            > {
                self.$inner.compare(name, config)
            }
            fn stats_of(
                &self,
                name: &$crate::cgroup::name::CgroupName,
                wanted: $crate::cgroup::backend::StatKinds,
            ) -> Result<$crate::cgroup::backend::CgroupStats, $crate::cgroup::backend::CgroupError>
            {
                self.$inner.stats_of(name, wanted)
            }
            fn container(
                &self,
                pod: &$crate::cgroup::name::CgroupName,
                container: &str,
            ) -> Result<$crate::cgroup::name::CgroupName, $crate::cgroup::backend::CgroupError>
            {
                self.$inner.container(pod, container)
            }
            fn stats(
                &self,
                name: &$crate::cgroup::name::CgroupName,
            ) -> Result<$crate::cgroup::backend::CgroupStats, $crate::cgroup::backend::CgroupError>
            {
                self.$inner.stats(name)
            }
        }
    };
}
pub(crate) use forward_cgroup_reader;

/// Opens the way into a cgroup for a process about to start: the one write capability the
/// runtime gets (from the container manager, at each start), so it never builds a cgroup path.
pub trait CgroupJoiner {
    /// Opens the cgroup's `cgroup.procs` files for a process about to start in it.
    fn join(&self, name: &CgroupName) -> Result<CgroupJoin, CgroupError>;
}

/// The write side of a cgroup backend. Only the container manager holds one.
pub trait CgroupWriter: CgroupReader + CgroupJoiner {
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

    /// Moves process `pid` into the cgroup in every hierarchy; returns the `cgroup.procs`
    /// files written.
    fn attach(&self, name: &CgroupName, pid: u32) -> Result<Vec<PathBuf>, CgroupError>;

    /// Sends SIGKILL to every process in the cgroup and below; returns how many were
    /// signalled (processes already gone are not errors).
    fn kill(&self, name: &CgroupName) -> Result<usize, CgroupError>;
}
