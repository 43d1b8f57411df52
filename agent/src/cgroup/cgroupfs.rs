//! [`CgroupfsBackend`]: the [`CgroupReader`] and [`CgroupWriter`] on the cgroup filesystems,
//! v1 (a directory per managed controller hierarchy, as on hybrid hosts) and v2 (one unified
//! directory). Mount points come from [`Hierarchies`] and every name must lie under the root
//! given at construction, or be one of the reserved cgroups it was given (updated, never
//! created or removed), so nothing here assumes `/sys/fs/cgroup` or touches other cgroups
//! (except enabling controllers in v2 ancestors, which a v2 cgroup cannot work without).
//!
//! Writes are idempotent: each planned file is read first and written only when its value
//! differs, and the writes made are returned. The same code runs on plain directory trees
//! (unit-test fixtures), where control files do not pre-exist: writing creates them, and
//! directories holding files are emptied before removal.
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::backend::{
    CgroupError, CgroupJoin, CgroupJoiner, CgroupReader, CgroupStats, CgroupWriter, CreateReport,
    DestroyReport, Difference, NameStyle, Skipped, StatKinds, UpdateReport, Written,
};
use super::files::{self, CgroupVersion, Controller, PlannedWrite, Setting, file_spec};
use super::layout::{CgroupLayout, LayoutKind};
use super::name::CgroupName;
use super::resources::ResourceConfig;
use super::{stats, v1, v2, walk};

/// How long [`CgroupWriter::destroy`] retries a directory the kernel reports busy (its last
/// tasks are still exiting).
const BUSY_RETRY_FOR: Duration = Duration::from_secs(2);

/// Where the managed hierarchies are mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hierarchies {
    /// v1: mount point of each managed controller that is mounted (co-mounted controllers
    /// share one).
    V1(BTreeMap<Controller, PathBuf>),
    /// v2: the unified mount point.
    V2(PathBuf),
}

impl Hierarchies {
    /// The managed hierarchies of a detected layout: v1 controllers on v1 and hybrid hosts
    /// (hybrid hosts' cgroup2 mount holds no controllers), the unified mount otherwise.
    pub fn from_layout(layout: &CgroupLayout) -> Result<Self, CgroupError> {
        match layout.kind {
            LayoutKind::V1 | LayoutKind::Hybrid => Ok(Self::V1(
                Controller::ALL
                    .into_iter()
                    .filter_map(|c| layout.v1.get(c.name()).map(|p| (c, p.clone())))
                    .collect(),
            )),
            LayoutKind::Unified => {
                layout
                    .unified
                    .clone()
                    .map(Self::V2)
                    .ok_or_else(|| CgroupError::NoHierarchy {
                        what: "the layout is unified but names no cgroup2 mount".to_owned(),
                    })
            }
        }
    }

    /// The version these hierarchies speak.
    #[must_use]
    pub fn version(&self) -> CgroupVersion {
        match self {
            Self::V1(_) => CgroupVersion::V1,
            Self::V2(_) => CgroupVersion::V2,
        }
    }

    /// Where a controller's hierarchy is mounted, if it is.
    #[must_use]
    pub fn mount(&self, controller: Controller) -> Option<&Path> {
        match self {
            Self::V1(mounts) => mounts.get(&controller).map(PathBuf::as_path),
            Self::V2(mount) => Some(mount),
        }
    }

    /// Managed controllers without a mount (always empty on v2).
    #[must_use]
    pub fn unmounted(&self) -> Vec<Controller> {
        match self {
            Self::V1(mounts) => Controller::ALL
                .into_iter()
                .filter(|c| !mounts.contains_key(c))
                .collect(),
            Self::V2(_) => Vec::new(),
        }
    }

    /// Each distinct mount point once, in controller order.
    fn distinct_mounts(&self) -> Vec<&Path> {
        match self {
            Self::V1(mounts) => {
                let mut seen = BTreeSet::new();
                mounts
                    .values()
                    .filter(|p| seen.insert(p.as_path()))
                    .map(PathBuf::as_path)
                    .collect()
            }
            Self::V2(mount) => vec![mount.as_path()],
        }
    }
}

/// Planned writes with their files, and the settings skipped.
type Resolved = (Vec<(PathBuf, PlannedWrite)>, Vec<Skipped>);

/// The cgroup backend over cgroupfs mounts.
#[derive(Clone, Debug)]
pub struct CgroupfsBackend {
    hierarchies: Hierarchies,
    root: CgroupName,
    /// Cgroups outside the root that may be read and updated, never created or removed
    /// (kubelet's `systemReservedCgroup` and `kubeReservedCgroup`).
    reserved: Vec<CgroupName>,
    style: NameStyle,
    page_size: u64,
}

impl CgroupfsBackend {
    /// A backend for the cgroups at or below `root` in `hierarchies`, names spelled in `style`.
    #[must_use]
    pub fn new(hierarchies: Hierarchies, root: CgroupName, style: NameStyle) -> Self {
        Self {
            hierarchies,
            root,
            reserved: Vec::new(),
            style,
            page_size: crate::numa::node_layout::page_size(),
        }
    }

    /// Also allows reading and updating these existing cgroups outside the root.
    #[must_use]
    pub fn with_reserved(mut self, reserved: Vec<CgroupName>) -> Self {
        self.reserved = reserved;
        self
    }

    /// The hierarchies managed.
    #[must_use]
    pub fn hierarchies(&self) -> &Hierarchies {
        &self.hierarchies
    }

    /// Names this backend may read and update: under the root, or a reserved cgroup.
    fn check(&self, name: &CgroupName) -> Result<(), CgroupError> {
        if name.starts_with(&self.root) || self.reserved.contains(name) {
            Ok(())
        } else {
            self.check_owned(name)
        }
    }

    /// Names this backend may create and remove: under the root only.
    fn check_owned(&self, name: &CgroupName) -> Result<(), CgroupError> {
        if name.starts_with(&self.root) {
            Ok(())
        } else {
            Err(CgroupError::OutsideRoot {
                name: name.to_string(),
                root: self.root.to_string(),
            })
        }
    }

    /// The cgroup's directory under `mount`.
    fn dir_in(&self, mount: &Path, name: &CgroupName) -> Result<PathBuf, CgroupError> {
        let spelled = self.style.spell(name)?;
        let relative = spelled.trim_start_matches('/');
        Ok(if relative.is_empty() {
            mount.to_path_buf()
        } else {
            mount.join(relative)
        })
    }

    /// The directory of the cpu hierarchy (the unified one on v2), else the first mounted.
    fn primary_dir(&self, name: &CgroupName) -> Result<Option<PathBuf>, CgroupError> {
        let mount = self
            .hierarchies
            .mount(Controller::Cpu)
            .or_else(|| self.hierarchies.distinct_mounts().into_iter().next());
        mount.map(|m| self.dir_in(m, name)).transpose()
    }

    /// The names from the root (excluded when it is the hierarchy root) down to `name`.
    fn owned_chain(&self, name: &CgroupName) -> Result<Vec<CgroupName>, CgroupError> {
        let mut chain = Vec::new();
        let mut current = self.root.clone();
        if !current.is_root() {
            chain.push(current.clone());
        }
        for component in &name.components()[self.root.len()..] {
            current = current.child(component)?;
            chain.push(current.clone());
        }
        Ok(chain)
    }

    fn plan(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<Vec<PlannedWrite>, CgroupError> {
        files::plan(config, self.hierarchies.version(), self.page_size).map_err(|source| {
            CgroupError::Files {
                name: name.to_string(),
                source,
            }
        })
    }

    /// Resolves each planned write to its file, or to a skip; fails for a missing required
    /// controller before anything is written.
    fn resolve(
        &self,
        name: &CgroupName,
        planned: Vec<PlannedWrite>,
    ) -> Result<Resolved, CgroupError> {
        let mut targets = Vec::new();
        let mut skipped = Vec::new();
        let available = match &self.hierarchies {
            Hierarchies::V2(mount) => {
                let dir = self.dir_in(mount, name)?;
                v2::read_controllers(&dir.join("cgroup.controllers"))?
            }
            Hierarchies::V1(_) => None,
        };
        for write in planned {
            let unavailable = match (&self.hierarchies, self.hierarchies.mount(write.controller)) {
                (Hierarchies::V1(_), None) => Some("not mounted".to_owned()),
                (Hierarchies::V2(_), _)
                    if available
                        .as_ref()
                        .is_some_and(|a| !a.contains(write.controller.name())) =>
                {
                    Some("not enabled in the parent's cgroup.subtree_control".to_owned())
                }
                _ => None,
            };
            if let Some(reason) = unavailable {
                if write.controller.is_required() {
                    return Err(CgroupError::ControllerMissing {
                        name: name.to_string(),
                        setting: write.setting,
                        controller: write.controller,
                        reason,
                    });
                }
                skipped.push(Skipped {
                    setting: write.setting,
                    controller: write.controller,
                    reason,
                });
                continue;
            }
            let Some(mount) = self.hierarchies.mount(write.controller) else {
                continue;
            };
            let path = self.dir_in(mount, name)?.join(&write.file);
            targets.push((path, write));
        }
        Ok((targets, skipped))
    }
}

impl CgroupReader for CgroupfsBackend {
    fn version(&self) -> CgroupVersion {
        self.hierarchies.version()
    }

    fn root(&self) -> &CgroupName {
        &self.root
    }

    fn name(&self, name: &CgroupName) -> Result<String, CgroupError> {
        Ok(self.style.spell(name)?)
    }

    fn cgroup_name(&self, path: &str) -> Result<CgroupName, CgroupError> {
        Ok(self.style.parse(path)?)
    }

    fn paths(&self, name: &CgroupName) -> Result<BTreeMap<Controller, PathBuf>, CgroupError> {
        self.check(name)?;
        let mut paths = BTreeMap::new();
        for controller in Controller::ALL {
            if let Some(mount) = self.hierarchies.mount(controller) {
                paths.insert(controller, self.dir_in(mount, name)?);
            }
        }
        Ok(paths)
    }

    fn exists(&self, name: &CgroupName) -> Result<bool, CgroupError> {
        self.check(name)?;
        let mounts = self.hierarchies.distinct_mounts();
        if mounts.is_empty() {
            return Ok(false);
        }
        for mount in mounts {
            if !self.dir_in(mount, name)?.is_dir() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn children(&self, name: &CgroupName) -> Result<Vec<CgroupName>, CgroupError> {
        self.check(name)?;
        let Some(dir) = self.primary_dir(name)? else {
            return Ok(Vec::new());
        };
        let spelled = self.style.spell(name)?;
        let found = walk::walk(&dir, Some(1)).map_err(|source| CgroupError::Read {
            path: dir.clone(),
            source,
        })?;
        Ok(found
            .dirs
            .iter()
            .filter(|d| d.depth == 1)
            .filter_map(|d| {
                let child = format!("{}{}", spelled.trim_end_matches('/'), d.relative);
                self.style.parse(&child).ok()
            })
            .collect())
    }

    fn id(&self, name: &CgroupName) -> Result<Option<u64>, CgroupError> {
        use std::os::unix::fs::MetadataExt as _;
        self.check(name)?;
        let Some(dir) = self.primary_dir(name)? else {
            return Ok(None);
        };
        match std::fs::metadata(&dir) {
            Ok(meta) => Ok(Some(meta.ino())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(CgroupError::Read { path: dir, source }),
        }
    }

    fn setting(
        &self,
        name: &CgroupName,
        setting: Setting,
    ) -> Result<Option<(&'static str, String)>, CgroupError> {
        self.check(name)?;
        let row = file_spec(setting);
        let file = match self.hierarchies.version() {
            CgroupVersion::V1 => row.v1,
            CgroupVersion::V2 => row.v2,
        };
        let (Some(file), Some(mount)) = (file, self.hierarchies.mount(row.controller)) else {
            return Ok(None);
        };
        let path = self.dir_in(mount, name)?.join(file);
        Ok(read_optional(&path)?.map(|text| (file, text.trim().to_owned())))
    }

    fn pids(&self, name: &CgroupName) -> Result<Vec<u32>, CgroupError> {
        self.check(name)?;
        let mut pids = BTreeSet::new();
        for mount in self.hierarchies.distinct_mounts() {
            for dir in collect_dirs(&self.dir_in(mount, name)?)? {
                let path = dir.path.join("cgroup.procs");
                let Some(text) = read_optional(&path)? else {
                    continue;
                };
                for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                    let pid = line.parse::<u32>().map_err(|_| CgroupError::Procs {
                        path: path.clone(),
                        line: line.to_owned(),
                    })?;
                    pids.insert(pid);
                }
            }
        }
        Ok(pids.into_iter().collect())
    }

    fn compare(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<Vec<Difference>, CgroupError> {
        self.check(name)?;
        let planned = self.plan(name, config)?;
        let (targets, _skipped) = self.resolve(name, planned)?;
        let mut out = Vec::new();
        for (path, write) in targets {
            let current = read_optional(&path)?;
            if current.as_deref().is_some_and(|c| write.is_satisfied_by(c)) {
                continue;
            }
            out.push(Difference {
                setting: write.setting,
                path,
                expected: write.value,
                actual: current.map(|c| c.trim().to_owned()),
            });
        }
        Ok(out)
    }

    fn stats_of(&self, name: &CgroupName, wanted: StatKinds) -> Result<CgroupStats, CgroupError> {
        let paths = self.paths(name)?;
        let dir = |c: Controller, want: bool| paths.get(&c).map(PathBuf::as_path).filter(|_| want);
        let stats = match &self.hierarchies {
            Hierarchies::V1(_) => CgroupStats {
                cpu: if wanted.cpu {
                    stats::read_cpu_v1(dir(Controller::Cpu, true), dir(Controller::Cpuacct, true))?
                } else {
                    None
                },
                memory: dir(Controller::Memory, wanted.memory)
                    .map(stats::read_memory_stat)
                    .transpose()?
                    .flatten(),
                numa: dir(Controller::Memory, wanted.numa)
                    .map(stats::read_numa_stat)
                    .transpose()?
                    .flatten(),
                cpuset: dir(Controller::Cpuset, wanted.cpuset)
                    .map(stats::read_effective_cpuset_v1)
                    .transpose()?
                    .flatten(),
            },
            Hierarchies::V2(mount) => {
                let dir = self.dir_in(mount, name)?;
                let read = |want: bool| want.then_some(dir.as_path());
                CgroupStats {
                    cpu: read(wanted.cpu)
                        .map(stats::read_cpu_v2)
                        .transpose()?
                        .flatten(),
                    memory: read(wanted.memory)
                        .map(stats::read_memory_stat)
                        .transpose()?
                        .flatten(),
                    numa: read(wanted.numa)
                        .map(stats::read_numa_stat)
                        .transpose()?
                        .flatten(),
                    cpuset: read(wanted.cpuset)
                        .map(stats::read_effective_cpuset_v2)
                        .transpose()?
                        .flatten(),
                }
            }
        };
        // A file that is not there reads as nothing; only then is it asked whether the cgroup
        // itself is gone (so a cgroup with all its files costs no stat).
        let lacking = (wanted.cpu && stats.cpu.is_none())
            || (wanted.memory && stats.memory.is_none())
            || (wanted.numa && stats.numa.is_none())
            || (wanted.cpuset && stats.cpuset.is_none());
        if lacking && let Some(missing) = paths.values().find(|p| !p.is_dir()) {
            return Err(CgroupError::Missing {
                name: name.to_string(),
                path: missing.clone(),
            });
        }
        Ok(stats)
    }
}

impl CgroupJoiner for CgroupfsBackend {
    fn join(&self, name: &CgroupName) -> Result<CgroupJoin, CgroupError> {
        self.check_owned(name)?;
        let mut files = Vec::new();
        for mount in self.hierarchies.distinct_mounts() {
            let path = self.dir_in(mount, name)?.join("cgroup.procs");
            files.push(open_procs(&path)?);
        }
        Ok(CgroupJoin::new(files))
    }
}

impl CgroupWriter for CgroupfsBackend {
    fn create(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<CreateReport, CgroupError> {
        self.check_owned(name)?;
        // Refuse unsupported settings before touching anything.
        self.plan(name, config)?;
        let chain = self.owned_chain(name)?;
        let mut report = CreateReport {
            unmounted: self.hierarchies.unmounted(),
            ..CreateReport::default()
        };
        for mount in self.hierarchies.distinct_mounts() {
            for link in &chain {
                let dir = self.dir_in(mount, link)?;
                match std::fs::create_dir(&dir) {
                    Ok(()) => report.created.push(dir),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                    Err(source) => return Err(CgroupError::Mkdir { path: dir, source }),
                }
            }
        }
        match &self.hierarchies {
            Hierarchies::V1(mounts) => {
                if let Some(cpuset) = mounts.get(&Controller::Cpuset) {
                    let dirs = chain
                        .iter()
                        .map(|link| self.dir_in(cpuset, link))
                        .collect::<Result<Vec<_>, _>>()?;
                    report.written.extend(v1::inherit_cpusets(&dirs)?);
                }
            }
            Hierarchies::V2(mount) => {
                let target = self.dir_in(mount, name)?;
                report
                    .written
                    .extend(v2::enable_controllers(mount, &target)?);
            }
        }
        let update = self.update(name, config)?;
        report.written.extend(update.written);
        report.skipped = update.skipped;
        Ok(report)
    }

    fn update(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<UpdateReport, CgroupError> {
        self.check(name)?;
        let planned = self.plan(name, config)?;
        let (targets, skipped) = self.resolve(name, planned)?;
        let mut written = Vec::new();
        // The kernel rejects some values until a related file changes (a quota below the
        // current burst, a period that makes the current quota invalid), so writes refused
        // with EINVAL are retried once after all others.
        let mut deferred = Vec::new();
        for (path, write) in targets {
            if let Some(current) = read_optional(&path)?
                && write.is_satisfied_by(&current)
            {
                continue;
            }
            match write_file(&path, &write.value) {
                Ok(()) => written.push(Written {
                    path,
                    value: write.value,
                }),
                Err(CgroupError::Write { source, .. })
                    if source.raw_os_error() == Some(libc::EINVAL) =>
                {
                    deferred.push((path, write));
                }
                Err(e) => return Err(e),
            }
        }
        for (path, write) in deferred {
            write_file(&path, &write.value)?;
            written.push(Written {
                path,
                value: write.value,
            });
        }
        Ok(UpdateReport { written, skipped })
    }

    fn destroy(&self, name: &CgroupName) -> Result<DestroyReport, CgroupError> {
        self.check_owned(name)?;
        let mut report = DestroyReport::default();
        let mut first_error = None;
        for mount in self.hierarchies.distinct_mounts() {
            let dir = self.dir_in(mount, name)?;
            if dir == mount {
                return Err(CgroupError::HierarchyRoot { path: dir });
            }
            let mut dirs = collect_dirs(&dir)?;
            // Deepest first.
            dirs.sort_by_key(|d| std::cmp::Reverse(d.depth));
            for walk::CgroupDir { path, .. } in dirs {
                match remove_cgroup_dir(&path) {
                    Ok(true) => report.removed.push(path),
                    Ok(false) => {}
                    Err(e) => {
                        // Keep going in the other hierarchies; report the first failure.
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    fn attach(&self, name: &CgroupName, pid: u32) -> Result<Vec<PathBuf>, CgroupError> {
        self.check_owned(name)?;
        let mut written = Vec::new();
        for mount in self.hierarchies.distinct_mounts() {
            let path = self.dir_in(mount, name)?.join("cgroup.procs");
            write_file(&path, &pid.to_string())?;
            written.push(path);
        }
        Ok(written)
    }

    fn kill(&self, name: &CgroupName) -> Result<usize, CgroupError> {
        self.check_owned(name)?;
        let mut signalled = 0;
        for pid in self.pids(name)? {
            let Ok(raw) = libc::pid_t::try_from(pid) else {
                continue;
            };
            // SAFETY: kill(2) on a process listed in a cgroup this backend owns; no memory is
            // involved.
            if unsafe { libc::kill(raw, libc::SIGKILL) } == 0 {
                signalled += 1;
            } else {
                let source = io::Error::last_os_error();
                if source.raw_os_error() != Some(libc::ESRCH) {
                    return Err(CgroupError::Kill {
                        name: name.to_string(),
                        pid,
                        source,
                    });
                }
            }
        }
        Ok(signalled)
    }
}

/// Reads a file; `None` when it does not exist.
pub(super) fn read_optional(path: &Path) -> Result<Option<String>, CgroupError> {
    stats::read_kernel_file(path).map_err(|source| CgroupError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Whether a write may create the file. cgroupfs makes a cgroup's files itself when the
/// directory is made, so qosd never creates one: a missing file is the kernel's answer
/// (`ENOENT`: no such controller or setting here; with `O_CREAT` kernfs would answer a
/// misleading `EACCES`), and a cgroup root that is not cgroupfs gets no stray files. Only unit
/// tests' fixture trees, plain directories, need their files created.
const CREATE_MISSING_FILES: bool = cfg!(test);

/// Writes `value` with a single write (cgroup files take one value per write). An empty value
/// is written as a newline, which the kernel reads as "clear". The file must exist
/// ([`CREATE_MISSING_FILES`]).
pub(super) fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    let data = if value.is_empty() { "\n" } else { value };
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create(CREATE_MISSING_FILES)
        .truncate(true)
        .open(path)
        .and_then(|mut file| file.write_all(data.as_bytes()));
    result.map_err(|source| CgroupError::Write {
        path: path.to_owned(),
        value: value.to_owned(),
        source,
    })
}

/// `dir` and every directory below it ([`walk::walk`]); nothing when `dir` does not exist, an
/// error when any of them cannot be listed.
fn collect_dirs(dir: &Path) -> Result<Vec<walk::CgroupDir>, CgroupError> {
    let found = walk::walk(dir, None).map_err(|source| CgroupError::Read {
        path: dir.to_owned(),
        source,
    })?;
    if let Some((path, source)) = found.unreadable.into_iter().next() {
        return Err(CgroupError::Read { path, source });
    }
    Ok(found.dirs)
}

/// Opens a `cgroup.procs` file for writing, close-on-exec. The file must exist
/// ([`CREATE_MISSING_FILES`]).
fn open_procs(path: &Path) -> Result<(PathBuf, OwnedFd), CgroupError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(CREATE_MISSING_FILES)
        .truncate(false)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map(|file| (path.to_owned(), OwnedFd::from(file)))
        .map_err(|source| CgroupError::Join {
            path: path.to_owned(),
            source,
        })
}

/// Removes one cgroup directory: `Ok(false)` if it was already gone. EBUSY (tasks still being
/// reaped) is retried for [`BUSY_RETRY_FOR`]. ENOTEMPTY happens only in fixture trees (cgroupfs
/// answers EBUSY for child cgroups and ignores control files): their plain files are removed
/// and the removal retried.
fn remove_cgroup_dir(path: &Path) -> Result<bool, CgroupError> {
    let deadline = Instant::now() + BUSY_RETRY_FOR;
    let mut delay = Duration::from_millis(10);
    let mut emptied = false;
    loop {
        let error = match std::fs::remove_dir(path) {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => e,
        };
        match error.raw_os_error() {
            Some(libc::ENOTEMPTY) if !emptied => {
                remove_plain_files(path)?;
                emptied = true;
            }
            Some(libc::EBUSY) if Instant::now() < deadline => {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(100));
            }
            _ => {
                return Err(CgroupError::Remove {
                    path: path.to_owned(),
                    source: error,
                });
            }
        }
    }
}

fn remove_plain_files(dir: &Path) -> Result<(), CgroupError> {
    let remove_error = |path: &Path, source| CgroupError::Remove {
        path: path.to_owned(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(|e| remove_error(dir, e))? {
        let entry = entry.map_err(|e| remove_error(dir, e))?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| remove_error(&path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;

    use super::*;
    use crate::cgroup::cpuset::CpuSet;
    use crate::cgroup::files::{FilesError, Setting};
    use crate::cgroup::resources::{Limit, milli_cpu_to_quota, milli_cpu_to_shares};

    const PAGE: u64 = 4096;
    const MB2: u64 = 2 << 20;

    fn name(components: &[&str]) -> CgroupName {
        CgroupName::new(components.iter().copied()).unwrap()
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    fn written(pairs: &[(&Path, &str, &str)]) -> Vec<Written> {
        pairs
            .iter()
            .map(|(dir, file, value)| Written {
                path: dir.join(file),
                value: (*value).to_owned(),
            })
            .collect()
    }

    /// A v1 fixture like this host's: separate cpu, cpuacct, cpuset, memory and pids
    /// hierarchies, no hugetlb; the cpuset root lists CPUs 0-3 and node 0.
    struct V1Fixture {
        _dir: tempfile::TempDir,
        mounts: BTreeMap<Controller, PathBuf>,
    }

    impl V1Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let mut mounts = BTreeMap::new();
            for c in [
                Controller::Cpu,
                Controller::Cpuacct,
                Controller::Cpuset,
                Controller::Memory,
                Controller::Pids,
            ] {
                let mount = dir.path().join(c.name());
                fs::create_dir(&mount).unwrap();
                mounts.insert(c, mount);
            }
            fs::write(mounts[&Controller::Cpuset].join("cpuset.cpus"), "0-3\n").unwrap();
            fs::write(mounts[&Controller::Cpuset].join("cpuset.mems"), "0\n").unwrap();
            Self { _dir: dir, mounts }
        }

        fn manager(&self, root: &CgroupName, style: NameStyle) -> CgroupfsBackend {
            let mut m =
                CgroupfsBackend::new(Hierarchies::V1(self.mounts.clone()), root.clone(), style);
            m.page_size = PAGE;
            m
        }

        fn mount(&self, c: Controller) -> &Path {
            &self.mounts[&c]
        }
    }

    fn pod_config() -> ResourceConfig {
        let period = 100_000;
        ResourceConfig {
            cpu_shares: Some(milli_cpu_to_shares(250)),
            cpu_quota: Some(Limit::Value(
                u64::try_from(milli_cpu_to_quota(500, period)).unwrap(),
            )),
            cpu_period: Some(period),
            cpuset_cpus: Some(CpuSet::parse("1").unwrap()),
            memory_limit: Some(Limit::Value(64 << 20)),
            pids_limit: Some(Limit::Value(64)),
            hugetlb_limits: BTreeMap::from([(MB2, Limit::Value(4 << 20))]),
            ..ResourceConfig::default()
        }
    }

    #[test]
    fn v1_create_makes_every_hierarchy_inherits_cpusets_and_writes_the_config() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Cgroupfs);
        let pod = root.join(["kubepods", "burstable", "pod-1"]).unwrap();
        let report = m.create(&pod, &pod_config()).unwrap();

        assert_eq!(report.unmounted, vec![Controller::Hugetlb]);
        assert_eq!(report.created.len(), 4 * 5, "{:#?}", report.created);
        for mount in fx.mounts.values() {
            assert!(mount.join("qosd-test/kubepods/burstable/pod-1").is_dir());
        }
        assert_eq!(
            report.skipped,
            vec![Skipped {
                setting: Setting::HugetlbLimit,
                controller: Controller::Hugetlb,
                reason: "not mounted".to_owned(),
            }]
        );
        let cs = fx.mount(Controller::Cpuset);
        let d = |mount: &Path, rel: &str| mount.join(rel);
        let (r, k, b, p) = (
            d(cs, "qosd-test"),
            d(cs, "qosd-test/kubepods"),
            d(cs, "qosd-test/kubepods/burstable"),
            d(cs, "qosd-test/kubepods/burstable/pod-1"),
        );
        let cpu = d(
            fx.mount(Controller::Cpu),
            "qosd-test/kubepods/burstable/pod-1",
        );
        let mem = d(
            fx.mount(Controller::Memory),
            "qosd-test/kubepods/burstable/pod-1",
        );
        let pids = d(
            fx.mount(Controller::Pids),
            "qosd-test/kubepods/burstable/pod-1",
        );
        assert_eq!(
            report.written,
            written(&[
                (&r, "cpuset.cpus", "0-3"),
                (&r, "cpuset.mems", "0"),
                (&k, "cpuset.cpus", "0-3"),
                (&k, "cpuset.mems", "0"),
                (&b, "cpuset.cpus", "0-3"),
                (&b, "cpuset.mems", "0"),
                (&p, "cpuset.cpus", "0-3"),
                (&p, "cpuset.mems", "0"),
                (&p, "cpuset.cpus", "1"),
                (&cpu, "cpu.shares", "256"),
                (&cpu, "cpu.cfs_period_us", "100000"),
                (&cpu, "cpu.cfs_quota_us", "50000"),
                (&mem, "memory.limit_in_bytes", "67108864"),
                (&pids, "pids.max", "64"),
            ])
        );
        assert_eq!(read(&cpu.join("cpu.shares")), "256");
        assert_eq!(read(&p.join("cpuset.cpus")), "1");
        assert_eq!(read(&b.join("cpuset.cpus")), "0-3");
        assert!(m.exists(&pod).unwrap());
        assert!(!m.exists(&pod.child("ctr").unwrap()).unwrap());
        let paths = m.paths(&pod).unwrap();
        assert_eq!(paths.len(), 5);
        assert_eq!(paths[&Controller::Memory], mem);
        assert_eq!(m.name(&pod).unwrap(), "/qosd-test/kubepods/burstable/pod-1");
    }

    #[test]
    fn update_writes_only_what_differs() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Cgroupfs);
        let pod = root.child("pod-1").unwrap();
        m.create(&pod, &pod_config()).unwrap();

        let again = m.update(&pod, &pod_config()).unwrap();
        assert_eq!(again.written, vec![], "an unchanged config writes nothing");

        // Drift: someone edits two files; exactly those are rewritten.
        let pids_max = fx.mount(Controller::Pids).join("qosd-test/pod-1/pids.max");
        let shares = fx.mount(Controller::Cpu).join("qosd-test/pod-1/cpu.shares");
        fs::write(&pids_max, "100\n").unwrap();
        fs::write(&shares, "1024\n").unwrap();
        let repaired = m.update(&pod, &pod_config()).unwrap();
        assert_eq!(
            repaired.written,
            vec![
                Written {
                    path: shares,
                    value: "256".to_owned()
                },
                Written {
                    path: pids_max.clone(),
                    value: "64".to_owned()
                },
            ]
        );
        assert_eq!(read(&pids_max), "64");

        // The kernel's own spellings of equal values are not drift.
        let limit = fx
            .mount(Controller::Memory)
            .join("qosd-test/pod-1/memory.limit_in_bytes");
        let cpus = fx
            .mount(Controller::Cpuset)
            .join("qosd-test/pod-1/cpuset.cpus");
        fs::write(&cpus, "1\n").unwrap();
        let unlimited = ResourceConfig {
            memory_limit: Some(Limit::Max),
            ..ResourceConfig::default()
        };
        assert_eq!(m.update(&pod, &unlimited).unwrap().written.len(), 1);
        fs::write(&limit, "9223372036854771712\n").unwrap();
        assert_eq!(m.update(&pod, &unlimited).unwrap().written, vec![]);
        let unaligned = ResourceConfig {
            memory_limit: Some(Limit::Value(1_000_000)),
            ..ResourceConfig::default()
        };
        fs::write(&limit, "999424\n").unwrap();
        assert_eq!(m.update(&pod, &unaligned).unwrap().written, vec![]);
    }

    #[test]
    fn v1_memory_protection_is_refused_before_anything_is_created() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Cgroupfs);
        let config = ResourceConfig {
            memory_min: Some(1 << 20),
            ..ResourceConfig::default()
        };
        let err = m.create(&root, &config).unwrap_err();
        assert!(
            matches!(
                &err,
                CgroupError::Files {
                    source: FilesError::Unsupported {
                        setting: Setting::MemoryMin,
                        version: CgroupVersion::V1,
                        ..
                    },
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("/qosd-test"), "{err}");
        assert!(!fx.mount(Controller::Cpu).join("qosd-test").exists());
    }

    #[test]
    fn a_missing_required_controller_fails_and_optional_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let cpuset = dir.path().join("cpuset");
        fs::create_dir(&cpuset).unwrap();
        let root = name(&["t"]);
        let m = CgroupfsBackend::new(
            Hierarchies::V1(BTreeMap::from([(Controller::Cpuset, cpuset)])),
            root.clone(),
            NameStyle::Cgroupfs,
        );
        let pids_only = ResourceConfig {
            pids_limit: Some(Limit::Value(5)),
            ..ResourceConfig::default()
        };
        let report = m.create(&root, &pids_only).unwrap();
        assert_eq!(report.skipped.len(), 1);
        assert_eq!(report.skipped[0].controller, Controller::Pids);
        let memory = ResourceConfig {
            memory_limit: Some(Limit::Value(1 << 20)),
            ..ResourceConfig::default()
        };
        let err = m.update(&root, &memory).unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::ControllerMissing {
                    controller: Controller::Memory,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("memory controller, which is not mounted"),
            "{err}"
        );
    }

    #[test]
    fn names_outside_the_root_and_the_hierarchy_root_are_refused() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Cgroupfs);
        let other = name(&["machine-owned"]);
        fs::create_dir(fx.mount(Controller::Memory).join("machine-owned")).unwrap();
        for result in [
            m.create(&other, &ResourceConfig::default()).map(|_| ()),
            m.update(&other, &ResourceConfig::default()).map(|_| ()),
            m.destroy(&other).map(|_| ()),
            m.pids(&other).map(|_| ()),
            m.attach(&other, 1).map(|_| ()),
        ] {
            let err = result.unwrap_err();
            assert!(matches!(err, CgroupError::OutsideRoot { .. }), "{err}");
            assert!(err.to_string().contains("/machine-owned"), "{err}");
        }
        assert!(fx.mount(Controller::Memory).join("machine-owned").is_dir());

        let unconfined = fx.manager(&CgroupName::root(), NameStyle::Cgroupfs);
        let err = unconfined.destroy(&CgroupName::root()).unwrap_err();
        assert!(matches!(err, CgroupError::HierarchyRoot { .. }), "{err}");
        assert!(fx.mount(Controller::Cpu).is_dir());
    }

    #[test]
    fn destroy_removes_everything_deepest_first_and_is_idempotent() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Cgroupfs);
        let pod = root.join(["kubepods", "pod-1"]).unwrap();
        m.create(&pod, &pod_config()).unwrap();
        // A container cgroup made by someone else below the pod is removed too.
        fs::create_dir(
            fx.mount(Controller::Cpu)
                .join("qosd-test/kubepods/pod-1/ctr"),
        )
        .unwrap();
        let report = m.destroy(&root).unwrap();
        assert_eq!(report.removed.len(), 3 * 5 + 1);
        let cpu = fx.mount(Controller::Cpu);
        let order: Vec<_> = report
            .removed
            .iter()
            .filter(|p| p.starts_with(cpu))
            .cloned()
            .collect();
        assert_eq!(
            order,
            vec![
                cpu.join("qosd-test/kubepods/pod-1/ctr"),
                cpu.join("qosd-test/kubepods/pod-1"),
                cpu.join("qosd-test/kubepods"),
                cpu.join("qosd-test"),
            ]
        );
        for mount in fx.mounts.values() {
            assert!(!mount.join("qosd-test").exists(), "{}", mount.display());
        }
        assert_eq!(
            read(&fx.mount(Controller::Cpuset).join("cpuset.cpus")),
            "0-3"
        );
        assert_eq!(m.destroy(&root).unwrap(), DestroyReport::default());
        assert!(!m.exists(&root).unwrap());
    }

    #[test]
    fn pids_are_the_union_over_hierarchies_and_descendants() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Cgroupfs);
        let pod = root.child("pod-1").unwrap();
        m.create(&pod, &ResourceConfig::default()).unwrap();
        let cpu_pod = fx.mount(Controller::Cpu).join("qosd-test/pod-1");
        fs::create_dir(cpu_pod.join("ctr")).unwrap();
        fs::write(cpu_pod.join("cgroup.procs"), "42\n7\n").unwrap();
        fs::write(cpu_pod.join("ctr/cgroup.procs"), "99\n").unwrap();
        fs::write(
            fx.mount(Controller::Memory)
                .join("qosd-test/pod-1/cgroup.procs"),
            "7\n42\n1000\n",
        )
        .unwrap();
        assert_eq!(m.pids(&pod).unwrap(), vec![7, 42, 99, 1000]);
        assert_eq!(
            m.pids(&root.child("gone").unwrap()).unwrap(),
            Vec::<u32>::new()
        );

        let written = m.attach(&pod, 4242).unwrap();
        assert_eq!(written.len(), 5);
        assert_eq!(read(&written[0]), "4242");

        fs::write(cpu_pod.join("cgroup.procs"), "12x\n").unwrap();
        let err = m.pids(&pod).unwrap_err();
        assert!(err.to_string().contains("12x"), "{err}");
        assert!(err.to_string().contains("cgroup.procs"), "{err}");
    }

    #[test]
    fn write_errors_name_the_file_and_carry_the_io_error() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Cgroupfs);
        m.create(&root, &ResourceConfig::default()).unwrap();
        let shares = fx.mount(Controller::Cpu).join("qosd-test/cpu.shares");
        fs::create_dir(&shares).unwrap();
        let config = ResourceConfig {
            cpu_shares: Some(512),
            ..ResourceConfig::default()
        };
        let err = m.update(&root, &config).unwrap_err();
        assert!(
            err.to_string().contains(&shares.display().to_string()),
            "{err}"
        );
        assert!(std::error::Error::source(&err).is_some(), "{err:?}");
        // A missing parent cgroup: mkdir fails and names the directory.
        let orphan = CgroupfsBackend::new(
            Hierarchies::V1(BTreeMap::from([(
                Controller::Cpu,
                fx._dir.path().join("not-mounted"),
            )])),
            root.clone(),
            NameStyle::Cgroupfs,
        );
        let err = orphan
            .create(&root, &ResourceConfig::default())
            .unwrap_err();
        assert!(matches!(err, CgroupError::Mkdir { .. }), "{err}");
        assert!(err.to_string().contains("not-mounted/qosd-test"), "{err}");
    }

    #[test]
    fn systemd_spelling_on_cgroupfs() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Systemd);
        let pod = root.join(["kubepods", "pod-12-34"]).unwrap();
        m.create(&pod, &ResourceConfig::default()).unwrap();
        let spelled =
            "/qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-pod_12_34.slice";
        assert_eq!(m.name(&pod).unwrap(), spelled);
        assert!(fx.mount(Controller::Memory).join(&spelled[1..]).is_dir());
        assert_eq!(m.cgroup_name(spelled).unwrap(), pod);
        assert_eq!(m.destroy(&root).unwrap().removed.len(), 3 * 5);
    }

    /// A v2 fixture: the mount root offers the controllers of the test guests.
    fn v2_fixture() -> (tempfile::TempDir, CgroupfsBackend, CgroupName) {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids\n",
        )
        .unwrap();
        fs::write(dir.path().join("cgroup.subtree_control"), "memory\n").unwrap();
        let root = name(&["qosd-test"]);
        let mut m = CgroupfsBackend::new(
            Hierarchies::V2(dir.path().to_owned()),
            root.clone(),
            NameStyle::Cgroupfs,
        );
        m.page_size = PAGE;
        (dir, m, root)
    }

    #[test]
    fn v2_create_enables_controllers_top_down_and_writes_unified_files() {
        let (dir, m, root) = v2_fixture();
        let mount = dir.path();
        let report = m.create(&root, &ResourceConfig::default()).unwrap();
        assert_eq!(report.unmounted, vec![]);
        assert_eq!(
            report.written,
            written(&[(
                mount,
                "cgroup.subtree_control",
                "+cpu +cpuset +pids +hugetlb"
            )])
        );
        // Play the kernel's part: the write added to the enabled set, and the root now offers
        // what its parent enables (hugetlb left out here, as if the guest lacked it).
        fs::write(
            mount.join("cgroup.subtree_control"),
            "cpuset cpu memory pids hugetlb\n",
        )
        .unwrap();
        fs::write(
            mount.join("qosd-test/cgroup.controllers"),
            "cpuset cpu memory pids\n",
        )
        .unwrap();

        let pod = root.join(["kubepods", "pod-1"]).unwrap();
        let mut config = pod_config();
        config.memory_min = Some(32 << 20);
        config.memory_high = Some(Limit::Max);
        let report = m.create(&pod, &config).unwrap();
        let r = mount.join("qosd-test");
        let p = mount.join("qosd-test/kubepods/pod-1");
        assert_eq!(
            report.written,
            written(&[
                (&r, "cgroup.subtree_control", "+cpu +cpuset +memory +pids"),
                (&p, "cpuset.cpus", "1"),
                (&p, "cpu.weight", "10"),
                (&p, "cpu.max", "50000 100000"),
                (&p, "memory.min", "33554432"),
                (&p, "memory.high", "max"),
                (&p, "memory.max", "67108864"),
                (&p, "pids.max", "64"),
                (&p, "hugetlb.2MB.max", "4194304"),
            ])
        );
        assert_eq!(read(&p.join("cpu.max")), "50000 100000");
        assert_eq!(m.update(&pod, &config).unwrap().written, vec![]);
        // Enabling is idempotent too.
        assert_eq!(
            m.create(&pod, &config).unwrap(),
            CreateReport::default(),
            "creating again changes nothing"
        );
        assert_eq!(m.paths(&pod).unwrap()[&Controller::Cpuacct], p);
    }

    #[test]
    fn v2_controllers_missing_from_the_cgroup_are_skipped_or_fatal() {
        let (dir, m, root) = v2_fixture();
        m.create(&root, &ResourceConfig::default()).unwrap();
        fs::write(
            dir.path().join("qosd-test/cgroup.controllers"),
            "cpu memory\n",
        )
        .unwrap();
        let config = ResourceConfig {
            cpuset_cpus: Some(CpuSet::parse("0").unwrap()),
            pids_limit: Some(Limit::Max),
            memory_limit: Some(Limit::Max),
            ..ResourceConfig::default()
        };
        let report = m.update(&root, &config).unwrap();
        let skipped: Vec<_> = report.skipped.iter().map(|s| s.controller).collect();
        assert_eq!(skipped, vec![Controller::Cpuset, Controller::Pids]);
        assert_eq!(
            report.written,
            written(&[(&dir.path().join("qosd-test"), "memory.max", "max")])
        );
        fs::write(dir.path().join("qosd-test/cgroup.controllers"), "pids\n").unwrap();
        let err = m.update(&root, &config).unwrap_err();
        assert!(
            matches!(err, CgroupError::ControllerMissing { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("subtree_control"), "{err}");
    }

    #[test]
    fn hierarchies_from_detected_layouts() {
        // This host: v1 controllers each on its own mount, no hugetlb, an empty cgroup2.
        let hybrid = CgroupLayout::parse_mountinfo(
            "\
41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd
",
        )
        .unwrap();
        let h = Hierarchies::from_layout(&hybrid).unwrap();
        assert_eq!(h.version(), CgroupVersion::V1);
        assert_eq!(h.unmounted(), vec![Controller::Hugetlb]);
        assert_eq!(
            h.mount(Controller::Cpuacct),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        assert_eq!(
            h.distinct_mounts().len(),
            5,
            "devices and name=systemd are not managed"
        );

        let comounted = CgroupLayout::parse_mountinfo(
            "28 25 0:25 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        )
        .unwrap();
        let h = Hierarchies::from_layout(&comounted).unwrap();
        assert_eq!(
            h.distinct_mounts(),
            vec![Path::new("/sys/fs/cgroup/cpu,cpuacct")]
        );

        let unified = CgroupLayout::parse_mountinfo(
            "7 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
        )
        .unwrap();
        let h = Hierarchies::from_layout(&unified).unwrap();
        assert_eq!(h, Hierarchies::V2(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(h.unmounted(), vec![]);
    }

    #[test]
    fn stats_from_fixture_trees() {
        let fx = V1Fixture::new();
        let root = name(&["qosd-test"]);
        let m = fx.manager(&root, NameStyle::Cgroupfs);
        let err = m.stats(&root).unwrap_err();
        assert!(matches!(err, CgroupError::Missing { .. }), "{err}");
        m.create(&root, &ResourceConfig::default()).unwrap();
        let at = |c: Controller, f: &str| fx.mount(c).join("qosd-test").join(f);
        fs::write(
            at(Controller::Cpu, "cpu.stat"),
            "nr_periods 10\nnr_throttled 2\nthrottled_time 5000\n",
        )
        .unwrap();
        fs::write(at(Controller::Cpuacct, "cpuacct.usage"), "123456789\n").unwrap();
        fs::write(
            at(Controller::Memory, "memory.stat"),
            "cache 4096\nrss 8192\n",
        )
        .unwrap();
        fs::write(
            at(Controller::Memory, "memory.numa_stat"),
            "total=3 N0=3\nhierarchical_total=3 N0=3\n",
        )
        .unwrap();
        fs::write(at(Controller::Cpuset, "cpuset.effective_cpus"), "0-1\n").unwrap();
        fs::write(at(Controller::Cpuset, "cpuset.effective_mems"), "0\n").unwrap();
        let stats = m.stats(&root).unwrap();
        let cpu = stats.cpu.unwrap();
        assert_eq!(cpu.usage_ns, Some(123_456_789));
        assert_eq!(cpu.throttled_ns, Some(5000));
        assert_eq!(stats.memory.unwrap()["rss"], 8192);
        assert_eq!(stats.numa.unwrap().entries.len(), 2);
        assert_eq!(stats.cpuset.unwrap().cpus, vec![0, 1]);

        let (dir, m2, root2) = v2_fixture();
        m2.create(&root2, &ResourceConfig::default()).unwrap();
        fs::write(
            dir.path().join("qosd-test/cpu.stat"),
            "usage_usec 7\nuser_usec 5\nsystem_usec 2\n",
        )
        .unwrap();
        let stats = m2.stats(&root2).unwrap();
        assert_eq!(stats.cpu.unwrap().usage_ns, Some(7000));
        assert_eq!(stats.memory, None);
    }
}
