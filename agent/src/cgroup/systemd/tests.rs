//! The systemd backend against a fake manager that plays systemd on a v2 fixture tree: a
//! started slice or scope gets its directory (systemd's spelling, parents made), a stopped one
//! loses it with everything below, and every call is recorded. What the real systemd does
//! with the properties is the systemd guest's case (`tests/src/cases/systemd.rs`).
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::properties::{Property, PropertyValue};
use super::*;
use crate::cgroup::backend::NameStyle;
use crate::cgroup::cgroupfs::Hierarchies;
use crate::cgroup::resources::Limit;

/// systemd on a fixture: records calls, makes and removes directories.
struct FakeSystemd {
    mount: PathBuf,
    calls: Mutex<Vec<String>>,
}

impl FakeSystemd {
    fn calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    /// Where systemd puts a unit: a slice nested in the slices its name implies, a scope in
    /// its `Slice=`.
    fn dir(&self, unit: &str, settings: &[Property]) -> PathBuf {
        if let Some(slice) = settings.iter().find_map(|p| match (&p.name, &p.value) {
            (&"Slice", PropertyValue::Str(s)) => Some(s.clone()),
            _ => None,
        }) {
            return self.dir(&slice, &[]).join(unit);
        }
        let stem = unit.trim_end_matches(".slice");
        let mut dir = self.mount.clone();
        let mut prefix = String::new();
        for part in stem.split('-') {
            if !prefix.is_empty() {
                prefix.push('-');
            }
            prefix.push_str(part);
            dir.push(format!("{prefix}.slice"));
        }
        dir
    }

    fn find(&self, unit: &str) -> Option<PathBuf> {
        walk(&self.mount)
            .into_iter()
            .find(|d| d.file_name().is_some_and(|n| n == unit))
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            out.push(entry.path());
            out.extend(walk(&entry.path()));
        }
    }
    out
}

fn names(props: &[Property]) -> String {
    props
        .iter()
        .map(|p| match &p.value {
            PropertyValue::U64(v) => format!("{}={v}", p.name),
            PropertyValue::U32s(v) => format!("{}={v:?}", p.name),
            _ => p.name.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl UnitManager for FakeSystemd {
    fn version(&self) -> u32 {
        252
    }

    fn start_transient(
        &self,
        unit: &str,
        settings: &[Property],
        resources: &[Property],
        pids: &[u32],
    ) -> Result<(), BusError> {
        let pids = if pids.is_empty() {
            String::new()
        } else {
            format!(" PIDs={pids:?}")
        };
        self.calls
            .lock()
            .unwrap()
            .push(format!("start {unit} {}{pids}", names(resources)));
        fs::create_dir_all(self.dir(unit, settings)).unwrap();
        Ok(())
    }

    fn set_properties(&self, unit: &str, properties: &[Property]) -> Result<(), BusError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("set {unit} {}", names(properties)));
        Ok(())
    }

    fn stop(&self, unit: &str) -> Result<(), BusError> {
        self.calls.lock().unwrap().push(format!("stop {unit}"));
        if let Some(dir) = self.find(unit) {
            fs::remove_dir_all(dir).unwrap();
        }
        Ok(())
    }
}

fn fixture() -> (
    tempfile::TempDir,
    SystemdBackend,
    Arc<FakeSystemd>,
    CgroupName,
) {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeSystemd {
        mount: dir.path().to_owned(),
        calls: Mutex::new(Vec::new()),
    });
    let root = CgroupName::new(["qosd-test"]).unwrap();
    let fs = CgroupfsBackend::new(
        Hierarchies::V2(dir.path().to_owned()),
        root.clone(),
        NameStyle::Systemd,
    );
    let backend = SystemdBackend::new(fs, Arc::clone(&fake) as Arc<dyn UnitManager>);
    (dir, backend, fake, root)
}

fn burstable() -> ResourceConfig {
    ResourceConfig {
        cpu_shares: Some(102),
        cpu_quota: Some(Limit::Value(20_000)),
        cpu_period: Some(100_000),
        memory_limit: Some(Limit::Value(64 << 20)),
        ..ResourceConfig::default()
    }
}

#[test]
fn a_slice_is_started_with_its_properties_and_its_files_hold_them() {
    let (dir, backend, fake, root) = fixture();
    let pod = root.join(["kubepods", "burstable", "pod12-34"]).unwrap();
    let report = backend.create(&pod, &burstable()).unwrap();
    assert_eq!(
        fake.calls(),
        [
            "start qosd_test-kubepods-burstable-pod12_34.slice CPUWeight=4,CPUQuotaPeriodUSec=100000,CPUQuotaPerSecUSec=200000,MemoryMax=67108864"
        ]
    );
    let pod_dir = dir.path().join(
        "qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-burstable.slice/qosd_test-kubepods-burstable-pod12_34.slice",
    );
    assert_eq!(report.created, std::slice::from_ref(&pod_dir));
    assert_eq!(fs::read_to_string(pod_dir.join("cpu.weight")).unwrap(), "4");
    assert_eq!(
        fs::read_to_string(pod_dir.join("cpu.max")).unwrap(),
        "20000 100000"
    );
    assert_eq!(
        fs::read_to_string(pod_dir.join("memory.max")).unwrap(),
        "67108864"
    );
}

#[test]
fn an_update_sends_only_the_properties_whose_files_differ() {
    let (dir, backend, fake, root) = fixture();
    let pod = root.join(["kubepods", "pod1"]).unwrap();
    backend.create(&pod, &burstable()).unwrap();
    fake.calls();
    assert!(
        backend
            .update(&pod, &burstable())
            .unwrap()
            .written
            .is_empty()
    );
    assert_eq!(
        fake.calls(),
        Vec::<String>::new(),
        "nothing differs, nothing is asked"
    );

    let pod_dir = dir
        .path()
        .join("qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-pod1.slice");
    fs::write(pod_dir.join("cpu.max"), "max 100000").unwrap();
    let report = backend.update(&pod, &burstable()).unwrap();
    assert_eq!(
        fake.calls(),
        ["set qosd_test-kubepods-pod1.slice CPUQuotaPerSecUSec=200000"]
    );
    assert_eq!(report.written.len(), 1, "{report:?}");
    assert_eq!(
        fs::read_to_string(pod_dir.join("cpu.max")).unwrap(),
        "20000 100000"
    );
}

#[test]
fn a_container_scope_starts_with_its_process_and_the_config_recorded_for_it() {
    let (dir, backend, fake, root) = fixture();
    let pod = root.join(["kubepods", "pod1"]).unwrap();
    backend.create(&pod, &ResourceConfig::default()).unwrap();
    let container = backend.container(&pod, "app").unwrap();
    assert_eq!(
        container.components().last().unwrap(),
        "qosd-pod1-app.scope"
    );
    // No process, no scope: the config waits for the start.
    let created = backend.create(&container, &burstable()).unwrap();
    assert!(created.created.is_empty());
    assert!(!backend.exists(&container).unwrap());
    assert!(
        backend
            .update(&container, &burstable())
            .unwrap()
            .written
            .is_empty()
    );
    fake.calls();

    let mut join = backend.join(&container).unwrap();
    let placement = join.take_placement().expect("a scope is placed by systemd");
    assert!(placement.describe().contains("qosd-pod1-app.scope"));
    placement.place(4242).unwrap();
    assert_eq!(
        fake.calls(),
        [
            "start qosd-pod1-app.scope CPUWeight=4,CPUQuotaPeriodUSec=100000,CPUQuotaPerSecUSec=200000,MemoryMax=67108864 PIDs=[4242]"
        ]
    );
    let scope = dir
        .path()
        .join("qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-pod1.slice/qosd-pod1-app.scope");
    assert_eq!(
        fs::read_to_string(scope.join("cpu.max")).unwrap(),
        "20000 100000"
    );
    // Once it exists, a scope is joined through its files like any cgroup.
    assert!(backend.join(&container).unwrap().take_placement().is_none());
}

#[test]
fn destroy_stops_the_unit_and_forgets_the_scopes_below() {
    let (dir, backend, fake, root) = fixture();
    let pod = root.join(["kubepods", "pod1"]).unwrap();
    backend.create(&pod, &ResourceConfig::default()).unwrap();
    let container = backend.container(&pod, "app").unwrap();
    backend.create(&container, &burstable()).unwrap();
    fake.calls();
    let report = backend.destroy(&pod).unwrap();
    assert_eq!(fake.calls(), ["stop qosd_test-kubepods-pod1.slice"]);
    assert_eq!(report.removed.len(), 1, "{report:?}");
    assert!(
        !dir.path()
            .join("qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-pod1.slice")
            .exists()
    );
    assert!(backend.pending.lock().unwrap().is_empty());
}

#[test]
fn names_outside_the_root_are_refused() {
    let (_dir, backend, fake, _root) = fixture();
    let other = CgroupName::new(["system.slice"]).unwrap();
    assert!(matches!(
        backend.create(&other, &ResourceConfig::default()),
        Err(CgroupError::OutsideRoot { .. })
    ));
    assert!(matches!(
        backend.destroy(&CgroupName::root()),
        Err(CgroupError::OutsideRoot { .. })
    ));
    assert!(fake.calls().is_empty());
}
