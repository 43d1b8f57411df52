//! The systemd cgroup driver: kubelet's and runc's systemd managers, asking systemd instead of
//! writing its tree behind its back. Slices (the root, kubepods, the QoS tiers, pods) are
//! transient units started over the system bus with the properties that carry the
//! [`ResourceConfig`] ([`properties`]); a container is a scope (`qosd-pod<uid>-<name>.scope`)
//! started with its first process, which waits between fork and exec until systemd has put
//! it there ([`CgroupJoin::placed_by`]). Settings systemd has no property for are written to
//! the cgroup's own files by the cgroupfs backend, which also does every read: systemd names
//! the directories exactly as [`super::NameStyle::Systemd`] spells them.
//!
//! A value systemd holds survives `systemctl daemon-reload` (systemd applies its units'
//! properties again); a value written only to cgroupfs is re-written by reconcile when
//! systemd resets it, and counted as drift.
pub mod bus;
pub mod properties;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use self::properties::{Mapped, Property, PropertyValue};
use super::backend::{
    CgroupError, CgroupJoin, CgroupJoiner, CgroupReader, CgroupStats, CgroupWriter, CreateReport,
    DestroyReport, Difference, Placement, StatKinds, UpdateReport,
};
use super::cgroupfs::CgroupfsBackend;
use super::files::{CgroupVersion, Controller, Setting};
use super::name::{CgroupName, is_scope};
use super::resources::ResourceConfig;

pub use self::bus::BusError;

/// What the backend asks of systemd's manager: [`bus::SystemdBus`] over the system bus, a fake
/// that plays systemd on a fixture tree in the unit tests.
pub trait UnitManager: Send + Sync {
    /// systemd's version number (which properties it has).
    fn version(&self) -> u32;
    /// Starts a transient unit with its own `settings` and `resources` (a scope around
    /// `pids`) and waits for the job; an existing slice gets `resources` set instead.
    fn start_transient(
        &self,
        unit: &str,
        settings: &[Property],
        resources: &[Property],
        pids: &[u32],
    ) -> Result<(), BusError>;
    /// Sets properties on a unit for this boot.
    fn set_properties(&self, unit: &str, properties: &[Property]) -> Result<(), BusError>;
    /// Stops a unit (a slice with everything in it) and waits for the job.
    fn stop(&self, unit: &str) -> Result<(), BusError>;
}

/// How long each call to systemd, and each job it starts, may take (runc waits 30 s too).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long systemd gets to enable a started unit's controllers.
const CONTROLLERS_WITHIN: Duration = Duration::from_secs(5);

/// The prefix of the scopes qosd starts for containers.
pub const SCOPE_PREFIX: &str = "qosd";

/// The cgroup backend of `cgroupDriver: systemd`.
pub struct SystemdBackend {
    fs: CgroupfsBackend,
    bus: Arc<dyn UnitManager>,
    /// Configs of container scopes that have no process yet (a scope exists only while
    /// processes are in it), applied when the next process starts.
    pending: Mutex<HashMap<CgroupName, ResourceConfig>>,
}

impl SystemdBackend {
    /// A backend over `fs` (the same hierarchies and root, systemd spelling) and `bus`.
    #[must_use]
    pub fn new(fs: CgroupfsBackend, bus: Arc<dyn UnitManager>) -> Self {
        Self {
            fs,
            bus,
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// The cgroup name of container `container` in the pod cgroup `pod`: a scope named after
    /// the pod's last component and the container (unit names are global, container names
    /// only unique in their pod).
    pub fn container_scope(pod: &CgroupName, container: &str) -> Result<CgroupName, CgroupError> {
        let pod_part = pod.components().last().map_or("", String::as_str);
        Ok(pod.child(&format!("{SCOPE_PREFIX}-{pod_part}-{container}.scope"))?)
    }

    fn unit(&self, name: &CgroupName) -> Result<String, CgroupError> {
        let spelled = self.fs.name(name)?;
        match spelled.rsplit('/').next() {
            Some(unit) if !unit.is_empty() => Ok(unit.to_owned()),
            _ => Err(CgroupError::OutsideRoot {
                name: name.to_string(),
                root: self.fs.root().to_string(),
            }),
        }
    }

    /// The cgroup's directories, one per hierarchy (one on v2).
    fn dirs(&self, name: &CgroupName) -> Result<Vec<PathBuf>, CgroupError> {
        let mut dirs: Vec<PathBuf> = self.fs.paths(name)?.into_values().collect();
        dirs.sort();
        dirs.dedup();
        Ok(dirs)
    }

    fn owned(&self, name: &CgroupName) -> Result<(), CgroupError> {
        if name.starts_with(self.fs.root()) && *name != CgroupName::root() {
            Ok(())
        } else {
            Err(CgroupError::OutsideRoot {
                name: name.to_string(),
                root: self.fs.root().to_string(),
            })
        }
    }

    fn map(&self, config: &ResourceConfig) -> Mapped {
        properties::map(config, self.fs.version(), self.bus.version())
    }

    fn systemd(name: &CgroupName) -> impl Fn(BusError) -> CgroupError {
        let name = name.to_string();
        move |source| CgroupError::Systemd {
            name: name.clone(),
            source: Box::new(source),
        }
    }

    /// What every unit qosd starts carries besides its resources: a description, no default
    /// dependencies (it is not part of boot or shutdown ordering), accounting of the
    /// controllers qosd reads, so systemd enables them down to the unit.
    fn unit_properties(&self, name: &CgroupName, scope: bool) -> Vec<Property> {
        let v2 = self.fs.version() == CgroupVersion::V2;
        let mut props = vec![
            Property::new(
                "Description",
                PropertyValue::Str(format!("qosd cgroup {name}")),
            ),
            Property::new("DefaultDependencies", PropertyValue::Bool(false)),
            Property::new("CPUAccounting", PropertyValue::Bool(true)),
            Property::new("MemoryAccounting", PropertyValue::Bool(true)),
            Property::new("TasksAccounting", PropertyValue::Bool(true)),
            Property::new(
                if v2 {
                    "IOAccounting"
                } else {
                    "BlockIOAccounting"
                },
                PropertyValue::Bool(true),
            ),
        ];
        if scope {
            // The container's processes may make cgroups below (a nested runtime), and
            // qosd writes the settings systemd has no property for.
            props.push(Property::new("Delegate", PropertyValue::Bool(true)));
        }
        props
    }

    /// The unit properties and the rest of a container scope's start around one process.
    fn scope_start(&self, name: &CgroupName) -> Result<ScopeStart, CgroupError> {
        let config = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
            .unwrap_or_default();
        let mapped = self.map(&config);
        let parent = match name.parent() {
            Some(p) if p != CgroupName::root() => self.unit(&p)?,
            _ => "-.slice".to_owned(),
        };
        let mut settings = self.unit_properties(name, true);
        settings.push(Property::new("Slice", PropertyValue::Str(parent)));
        Ok(ScopeStart {
            name: name.clone(),
            unit: self.unit(name)?,
            settings,
            resources: mapped.properties,
            effective: mapped.effective,
            bus: Arc::clone(&self.bus),
            fs: self.fs.clone(),
        })
    }
}

/// Writes `effective` to the files of a cgroup systemd has just been given (or changed): on v2 what
/// differs (systemd writes the same values from the properties, qosd's write makes them
/// true before the call returns; the settings systemd has no property for are only
/// qosd's); on v1 after making the directories systemd does not (it manages no cpuset or
/// hugetlb hierarchy there).
fn write_files(
    fs: &CgroupfsBackend,
    name: &CgroupName,
    effective: &ResourceConfig,
) -> Result<UpdateReport, CgroupError> {
    if fs.version() == CgroupVersion::V2 {
        return update_when_enabled(fs, name, effective);
    }
    let created = fs.create(name, effective)?;
    Ok(UpdateReport {
        written: created.written,
        skipped: created.skipped,
    })
}

/// Writes `effective` to a v2 cgroup systemd has just been asked about. systemd answers (and
/// reports a job done) before its realize queue has enabled the unit's controllers in the
/// parents' `cgroup.subtree_control`: a required one not there yet is waited for.
fn update_when_enabled(
    fs: &CgroupfsBackend,
    name: &CgroupName,
    effective: &ResourceConfig,
) -> Result<UpdateReport, CgroupError> {
    let deadline = Instant::now() + CONTROLLERS_WITHIN;
    loop {
        match fs.update(name, effective) {
            Err(CgroupError::ControllerMissing { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// The start of a container scope around its first process (see [`CgroupJoin::placed_by`]).
struct ScopeStart {
    name: CgroupName,
    unit: String,
    settings: Vec<Property>,
    resources: Vec<Property>,
    effective: ResourceConfig,
    bus: Arc<dyn UnitManager>,
    fs: CgroupfsBackend,
}

impl Placement for ScopeStart {
    fn place(self: Box<Self>, pid: u32) -> Result<(), CgroupError> {
        self.bus
            .start_transient(&self.unit, &self.settings, &self.resources, &[pid])
            .map_err(SystemdBackend::systemd(&self.name))?;
        write_files(&self.fs, &self.name, &self.effective)?;
        if self.fs.version() != CgroupVersion::V2 {
            // systemd placed it in the hierarchies it manages; the others are qosd's.
            self.fs.attach(&self.name, pid)?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!("systemd scope {}", self.unit)
    }
}

impl CgroupReader for SystemdBackend {
    fn version(&self) -> CgroupVersion {
        self.fs.version()
    }

    fn root(&self) -> &CgroupName {
        self.fs.root()
    }

    fn name(&self, name: &CgroupName) -> Result<String, CgroupError> {
        self.fs.name(name)
    }

    fn cgroup_name(&self, path: &str) -> Result<CgroupName, CgroupError> {
        self.fs.cgroup_name(path)
    }

    fn paths(&self, name: &CgroupName) -> Result<BTreeMap<Controller, PathBuf>, CgroupError> {
        self.fs.paths(name)
    }

    fn exists(&self, name: &CgroupName) -> Result<bool, CgroupError> {
        self.fs.exists(name)
    }

    fn children(&self, name: &CgroupName) -> Result<Vec<CgroupName>, CgroupError> {
        self.fs.children(name)
    }

    fn id(&self, name: &CgroupName) -> Result<Option<u64>, CgroupError> {
        self.fs.id(name)
    }

    fn setting(
        &self,
        name: &CgroupName,
        setting: Setting,
    ) -> Result<Option<(&'static str, String)>, CgroupError> {
        self.fs.setting(name, setting)
    }

    fn pids(&self, name: &CgroupName) -> Result<Vec<u32>, CgroupError> {
        self.fs.pids(name)
    }

    fn compare(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<Vec<Difference>, CgroupError> {
        self.fs.compare(name, &self.map(config).effective)
    }

    fn stats_of(&self, name: &CgroupName, wanted: StatKinds) -> Result<CgroupStats, CgroupError> {
        self.fs.stats_of(name, wanted)
    }

    fn container(&self, pod: &CgroupName, container: &str) -> Result<CgroupName, CgroupError> {
        Self::container_scope(pod, container)
    }
}

impl CgroupJoiner for SystemdBackend {
    /// A scope without processes does not exist: its first process is placed by systemd
    /// (`StartTransientUnit` with `PIDs`) while it waits before exec. A cgroup that exists is
    /// joined through its `cgroup.procs` files.
    fn join(&self, name: &CgroupName) -> Result<CgroupJoin, CgroupError> {
        self.owned(name)?;
        if !is_own_scope(name) || self.fs.exists(name)? {
            return self.fs.join(name);
        }
        Ok(CgroupJoin::placed_by(Box::new(self.scope_start(name)?)))
    }
}

impl CgroupWriter for SystemdBackend {
    /// Starts the slice with its properties (an existing one gets them set), then writes
    /// the files. A container scope is only recorded: it starts with its first process.
    fn create(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<CreateReport, CgroupError> {
        self.owned(name)?;
        if is_own_scope(name) {
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.clone(), config.clone());
            return Ok(CreateReport::default());
        }
        let existed = self.fs.exists(name)?;
        let mapped = self.map(config);
        let unit = self.unit(name)?;
        self.bus
            .start_transient(
                &unit,
                &self.unit_properties(name, false),
                &mapped.properties,
                &[],
            )
            .map_err(Self::systemd(name))?;
        let files = write_files(&self.fs, name, &mapped.effective)?;
        let created = if existed {
            Vec::new()
        } else {
            self.dirs(name)?
        };
        Ok(CreateReport {
            created,
            unmounted: Vec::new(),
            written: files.written,
            skipped: files.skipped,
        })
    }

    /// Sets the properties whose files differ (systemd keeps them across reloads) and
    /// writes those files; a container scope without processes gets the config recorded
    /// for its next start.
    fn update(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<UpdateReport, CgroupError> {
        let scope = is_own_scope(name);
        if scope {
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(name.clone(), config.clone());
            if !self.fs.exists(name)? {
                return Ok(UpdateReport::default());
            }
        }
        let mapped = self.map(config);
        let send = match self.fs.compare(name, &mapped.effective) {
            Ok(differences) if differences.is_empty() => return Ok(UpdateReport::default()),
            Ok(differences) => {
                // Files that differ may be files that are not there: a unit must not be given
                // properties (which would load it, stopped) for a cgroup that does not exist.
                if !self.fs.exists(name)? {
                    return Err(CgroupError::Missing {
                        name: name.to_string(),
                        path: self.dirs(name)?.into_iter().next().unwrap_or_default(),
                    });
                }
                differing(&mapped, &differences)
            }
            // The unit has no property of that controller yet (a scope another manager
            // started without one): systemd enables it with the properties.
            Err(CgroupError::ControllerMissing { .. })
                if self.fs.version() == CgroupVersion::V2 =>
            {
                mapped.properties.clone()
            }
            Err(e) => return Err(e),
        };
        if send.is_empty() {
            return self.fs.update(name, &mapped.effective);
        }
        let unit = self.unit(name)?;
        self.bus
            .set_properties(&unit, &send)
            .map_err(Self::systemd(name))?;
        // A property can be the unit's first of its controller (a scope another manager
        // started without it), which systemd enables after answering.
        if self.fs.version() == CgroupVersion::V2 {
            update_when_enabled(&self.fs, name, &mapped.effective)
        } else {
            self.fs.update(name, &mapped.effective)
        }
    }

    /// Stops the unit (systemd stops the units below a slice and removes their cgroups),
    /// then removes what systemd did not make (v1 cpuset directories).
    fn destroy(&self, name: &CgroupName) -> Result<DestroyReport, CgroupError> {
        self.owned(name)?;
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|pending, _| !pending.starts_with(name));
        let before: Vec<PathBuf> = self
            .dirs(name)?
            .into_iter()
            .filter(|p| p.is_dir())
            .collect();
        let unit = self.unit(name)?;
        self.bus.stop(&unit).map_err(Self::systemd(name))?;
        let leftovers = self.fs.destroy(name)?;
        let mut removed: Vec<PathBuf> = before.into_iter().filter(|p| !p.exists()).collect();
        for path in leftovers.removed {
            if !removed.contains(&path) {
                removed.push(path);
            }
        }
        Ok(DestroyReport { removed })
    }

    /// A container scope that does not exist yet is started around `pid`; any other cgroup
    /// is joined through its files.
    fn attach(&self, name: &CgroupName, pid: u32) -> Result<Vec<PathBuf>, CgroupError> {
        self.owned(name)?;
        if is_own_scope(name) && !self.fs.exists(name)? {
            Box::new(self.scope_start(name)?).place(pid)?;
            return Ok(self
                .dirs(name)?
                .into_iter()
                .map(|p| p.join("cgroup.procs"))
                .collect());
        }
        self.fs.attach(name, pid)
    }

    fn kill(&self, name: &CgroupName) -> Result<usize, CgroupError> {
        self.fs.kill(name)
    }
}

/// True for the name of a container scope qosd starts ([`SystemdBackend::container_scope`]).
/// Other scopes (a runtime's `cri-containerd-<id>.scope` beside kubelet) are units like any
/// other: their properties are set, nothing is recorded for a later start.
fn is_own_scope(name: &CgroupName) -> bool {
    name.components()
        .last()
        .is_some_and(|c| is_scope(c) && c.starts_with(&format!("{SCOPE_PREFIX}-")))
}

/// The properties of `mapped` that carry a setting in `differences`.
fn differing(mapped: &Mapped, differences: &[Difference]) -> Vec<Property> {
    mapped
        .properties
        .iter()
        .filter(|p| differences.iter().any(|d| p.carries.contains(&d.setting)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests;
