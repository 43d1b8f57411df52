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
    /// Refuses every call with this message (a policy denying the caller, say).
    refuse: Mutex<Option<&'static str>>,
}

impl FakeSystemd {
    fn refused(
        &self,
        unit: &str,
        method: &'static str,
        props: &[Property],
    ) -> Result<(), BusError> {
        match *self.refuse.lock().unwrap() {
            Some(message) => Err(BusError::Call {
                unit: unit.to_owned(),
                method,
                properties: names(props),
                source: Box::new(zbus::Error::Failure(message.to_owned())),
            }),
            None => Ok(()),
        }
    }

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
        self.refused(unit, "StartTransientUnit", resources)?;
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
        self.refused(unit, "SetUnitProperties", properties)?;
        self.calls
            .lock()
            .unwrap()
            .push(format!("set {unit} {}", names(properties)));
        Ok(())
    }

    fn stop(&self, unit: &str) -> Result<(), BusError> {
        self.refused(unit, "StopUnit", &[])?;
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
        refuse: Mutex::new(None),
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

/// Beside kubelet the feedback writes onto kubelet's slices and the runtime's scopes: their
/// properties are set (so a reload keeps them), a scope of another manager is not one qosd
/// starts, and an idle tier gets its weight back as a property when idle is lifted.
#[test]
fn units_of_others_get_properties_and_an_idle_tier_its_weight_back() {
    let (dir, backend, fake, root) = fixture();
    let tier = root.join(["kubepods", "besteffort"]).unwrap();
    let scope = root
        .join(["kubepods", "burstable", "pod1", "cri-containerd-abc.scope"])
        .unwrap();
    let tier_dir = dir
        .path()
        .join("qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-besteffort.slice");
    let scope_dir = dir.path().join(
        "qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-burstable.slice/qosd_test-kubepods-burstable-pod1.slice/cri-containerd-abc.scope",
    );
    for (d, file, value) in [
        (&tier_dir, "cpu.weight", "1"),
        (&tier_dir, "cpu.idle", "0"),
        (&tier_dir, "cpu.max", "max 100000"),
        (&scope_dir, "cpuset.mems", ""),
        (&scope_dir, "cpu.max.burst", "0"),
    ] {
        fs::create_dir_all(d).unwrap();
        fs::write(d.join(file), value).unwrap();
    }

    let suppress = ResourceConfig {
        cpu_idle: Some(true),
        cpu_quota: Some(Limit::Value(5_000)),
        ..ResourceConfig::default()
    };
    backend.update(&tier, &suppress).unwrap();
    assert_eq!(
        fake.calls(),
        ["set qosd_test-kubepods-besteffort.slice CPUWeight=0,CPUQuotaPerSecUSec=50000"],
        "CPUWeight=idle holds cpu.idle through a reload"
    );
    assert_eq!(fs::read_to_string(tier_dir.join("cpu.idle")).unwrap(), "1");
    let lifted = ResourceConfig {
        cpu_idle: Some(false),
        cpu_shares: Some(2),
        cpu_quota: Some(Limit::Max),
        ..ResourceConfig::default()
    };
    backend.update(&tier, &lifted).unwrap();
    assert_eq!(
        fake.calls(),
        [format!(
            "set qosd_test-kubepods-besteffort.slice CPUWeight=1,CPUQuotaPerSecUSec={}",
            properties::INFINITY
        )]
    );

    let near = ResourceConfig {
        cpuset_mems: Some(crate::cgroup::CpuSet::parse("1").unwrap()),
        cpu_burst: Some(20_000),
        ..ResourceConfig::default()
    };
    backend.update(&scope, &near).unwrap();
    assert_eq!(
        fake.calls(),
        ["set cri-containerd-abc.scope AllowedMemoryNodes"],
        "the burst has no property: written to the scope's files only"
    );
    assert_eq!(
        fs::read_to_string(scope_dir.join("cpu.max.burst")).unwrap(),
        "20000"
    );
    assert_eq!(
        fs::read_to_string(scope_dir.join("cpuset.mems")).unwrap(),
        "1"
    );
    assert!(
        backend.pending.lock().unwrap().is_empty(),
        "nothing recorded for a scope qosd does not start"
    );
}

/// systemd refusing a call (a bus policy, a unit it will not change) is an error naming the
/// cgroup, the unit, the method and the properties; nothing is written behind its back.
#[test]
fn a_refusal_names_the_unit_and_the_properties_and_writes_nothing() {
    let (dir, backend, fake, root) = fixture();
    let pod = root.join(["kubepods", "pod1"]).unwrap();
    backend.create(&pod, &burstable()).unwrap();
    let pod_dir = dir
        .path()
        .join("qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-pod1.slice");
    fs::write(pod_dir.join("cpu.max"), "max 100000").unwrap();
    *fake.refuse.lock().unwrap() = Some("Access denied");
    let error = backend.update(&pod, &burstable()).unwrap_err().to_string();
    for part in [
        "qosd_test-kubepods-pod1.slice",
        "SetUnitProperties",
        "CPUQuotaPerSecUSec",
        "Access denied",
    ] {
        assert!(error.contains(part), "{part} not in: {error}");
    }
    assert_eq!(
        fs::read_to_string(pod_dir.join("cpu.max")).unwrap(),
        "max 100000",
        "not written behind systemd's back"
    );
    let other = root.join(["kubepods", "pod2"]).unwrap();
    let error = backend
        .create(&other, &burstable())
        .unwrap_err()
        .to_string();
    assert!(error.contains("StartTransientUnit"), "{error}");
    assert!(
        !dir.path()
            .join("qosd_test.slice/qosd_test-kubepods.slice/qosd_test-kubepods-pod2.slice")
            .exists()
    );
    *fake.refuse.lock().unwrap() = None;
    backend.update(&pod, &burstable()).unwrap();
    assert_eq!(
        fs::read_to_string(pod_dir.join("cpu.max")).unwrap(),
        "20000 100000",
        "the next reconcile, systemd answering again"
    );
}
