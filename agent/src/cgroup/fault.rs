//! Fault injection for tests: a [`CgroupWriter`] that hands everything to a real backend,
//! except writes of the settings it is told to refuse. Those fail the way the kernel fails
//! them (`EINVAL`, `EBUSY`, `ENOSPC`, ...): a [`CgroupError::Write`] naming the file, before
//! anything of that call is written. Faults are added and cleared while the backend is in use
//! (the test keeps the [`Faults`] handle), so a test can show a refusal handled and then the
//! next write succeeding.
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use super::backend::{
    CgroupError, CgroupJoin, CgroupJoiner, CgroupWriter, CreateReport, DestroyReport, UpdateReport,
};
use super::files::{CgroupVersion, Setting, file_spec};
use super::name::CgroupName;
use super::resources::ResourceConfig;

/// One refusal: writes of `setting` to `cgroup` fail with `errno`.
#[derive(Clone, Debug)]
struct Fault {
    cgroup: CgroupName,
    setting: Setting,
    errno: i32,
}

/// The faults in force, shared between a test and its [`FaultyWriter`].
#[derive(Clone, Debug, Default)]
pub struct Faults(Arc<Mutex<Vec<Fault>>>);

impl Faults {
    /// From now on, writes of `setting` to `cgroup` fail with `errno`.
    pub fn refuse(&self, cgroup: &CgroupName, setting: Setting, errno: i32) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Fault {
                cgroup: cgroup.clone(),
                setting,
                errno,
            });
    }

    /// Every write succeeds again (as far as the kernel lets it).
    pub fn clear(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    fn refusal(&self, cgroup: &CgroupName, config: &ResourceConfig) -> Option<(Setting, i32)> {
        let settings = config.settings();
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|f| &f.cgroup == cgroup && settings.contains(&f.setting))
            .map(|f| (f.setting, f.errno))
    }
}

/// A backend whose writes fail where [`Faults`] says.
pub struct FaultyWriter {
    inner: Box<dyn CgroupWriter>,
    faults: Faults,
}

impl FaultyWriter {
    /// Wraps `inner`; the handle adds and clears faults.
    #[must_use]
    pub fn new(inner: Box<dyn CgroupWriter>) -> (Self, Faults) {
        let faults = Faults::default();
        (
            Self {
                inner,
                faults: faults.clone(),
            },
            faults,
        )
    }

    fn check(&self, name: &CgroupName, config: &ResourceConfig) -> Result<(), CgroupError> {
        let Some((setting, errno)) = self.faults.refusal(name, config) else {
            return Ok(());
        };
        let spec = file_spec(setting);
        let file = match self.inner.version() {
            CgroupVersion::V1 => spec.v1,
            CgroupVersion::V2 => spec.v2,
        }
        .unwrap_or("unknown");
        let dir = self
            .inner
            .paths(name)?
            .get(&spec.controller)
            .cloned()
            .unwrap_or_else(|| PathBuf::from(name.to_string()));
        Err(CgroupError::Write {
            path: dir.join(file),
            value: String::from("(refused by the fault layer)"),
            source: io::Error::from_raw_os_error(errno),
        })
    }
}

super::backend::forward_cgroup_reader!(FaultyWriter, inner);

impl CgroupJoiner for FaultyWriter {
    fn join(&self, name: &CgroupName) -> Result<CgroupJoin, CgroupError> {
        self.inner.join(name)
    }
}

impl CgroupWriter for FaultyWriter {
    /// A refused setting fails the creation after the directories are made, as a kernel
    /// refusal of a file does.
    fn create(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<CreateReport, CgroupError> {
        if self.faults.refusal(name, config).is_some() {
            self.inner.create(name, &ResourceConfig::default())?;
            self.check(name, config)?;
        }
        self.inner.create(name, config)
    }
    fn update(
        &self,
        name: &CgroupName,
        config: &ResourceConfig,
    ) -> Result<UpdateReport, CgroupError> {
        self.check(name, config)?;
        self.inner.update(name, config)
    }
    fn destroy(&self, name: &CgroupName) -> Result<DestroyReport, CgroupError> {
        self.inner.destroy(name)
    }
    fn attach(&self, name: &CgroupName, pid: u32) -> Result<Vec<PathBuf>, CgroupError> {
        self.inner.attach(name, pid)
    }
    fn kill(&self, name: &CgroupName) -> Result<usize, CgroupError> {
        self.inner.kill(name)
    }
}
