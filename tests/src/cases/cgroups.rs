//! The cgroup manager (`qosd::cgroup::CgroupfsBackend`) against the real cgroup filesystems:
//! v1 on the hybrid host, v2 in the guests (`CgroupLayout::detect` decides). Every case works
//! under its own uniquely named root, `qosd-systest-cg-<pid>-<nanos>`, which is destroyed when
//! the case ends, failed or not; nothing outside it is written (on v2, controllers are also
//! enabled in the hierarchy root's `cgroup.subtree_control`, as any v2 cgroup manager must).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Instant;

use qosd::cgroup::{
    CgroupError, CgroupLayout, CgroupName, CgroupReader as _, CgroupVersion, CgroupWriter as _,
    CgroupfsBackend, Controller, CpuSet, FilesError, Hierarchies, Limit, NameStyle, ResourceConfig,
    Setting, Written, milli_cpu_to_quota, milli_cpu_to_shares,
};

use crate::harness::{Context, Outcome, fail};

const MB2: u64 = 2 << 20;

/// A manager confined to a fresh test root; on drop, its workloads are killed and the root
/// destroyed in every hierarchy.
struct TestRoot {
    manager: CgroupfsBackend,
    root: CgroupName,
    children: Vec<Child>,
}

impl TestRoot {
    /// A manager for `/<prefix>-<pid>-<nanos>` (created by the case, not here).
    fn new(prefix: &str) -> Result<Self, String> {
        let layout = CgroupLayout::detect().map_err(|e| e.to_string())?;
        let hierarchies = Hierarchies::from_layout(&layout).map_err(|e| e.to_string())?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let root = CgroupName::new([format!("{prefix}-{}-{nanos}", std::process::id())])
            .map_err(|e| e.to_string())?;
        Ok(Self {
            manager: CgroupfsBackend::new(hierarchies, root.clone(), NameStyle::Cgroupfs),
            root,
            children: Vec::new(),
        })
    }

    fn name(&self, components: &[&str]) -> Result<CgroupName, String> {
        self.root
            .join(components.iter().copied())
            .map_err(|e| e.to_string())
    }

    fn version(&self) -> CgroupVersion {
        self.manager.version()
    }

    /// The directory holding `controller`'s files for `name`.
    fn dir(&self, name: &CgroupName, controller: Controller) -> Result<PathBuf, String> {
        self.manager
            .paths(name)
            .map_err(|e| e.to_string())?
            .remove(&controller)
            .ok_or_else(|| format!("{controller} is not mounted"))
    }

    /// Starts this binary as a workload (`spin SECS` / `sleep SECS`), killed on drop.
    fn spawn(&mut self, self_exe: &Path, args: &[&str]) -> Result<u32, String> {
        let child = Command::new(self_exe)
            .args(args)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", self_exe.display()))?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    fn kill_children(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The managed hierarchies' directories of the root, to check nothing is left.
    fn root_dirs(&self) -> Result<Vec<PathBuf>, String> {
        let mut dirs: Vec<PathBuf> = self
            .manager
            .paths(&self.root)
            .map_err(|e| e.to_string())?
            .into_values()
            .collect();
        dirs.sort();
        dirs.dedup();
        Ok(dirs)
    }
}

impl Drop for TestRoot {
    fn drop(&mut self) {
        self.kill_children();
        if let Err(e) = self.manager.destroy(&self.root) {
            eprintln!("warning: could not remove test cgroup {}: {e}", self.root);
        }
    }
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A file that must hold `value`.
struct Expect {
    controller: Controller,
    file: String,
    value: String,
    /// The kernel's default for a new cgroup is already this value, so it is not written.
    kernel_default: bool,
}

fn expect(controller: Controller, file: &str, value: &str) -> Expect {
    Expect {
        controller,
        file: file.to_owned(),
        value: value.to_owned(),
        kernel_default: false,
    }
}

/// The pod used by the cases: 250m requested, 500m limit, 64 MiB, 64 pids, pinned to one CPU
/// and node, 4 MiB of 2 MiB huge pages; burst and (v2) memory.min where the kernel has them.
struct Pod {
    config: ResourceConfig,
    /// Files and the exact text the kernel must show, spelled out by hand.
    files: Vec<Expect>,
    hugetlb_expected: bool,
}

fn pod_for(t: &TestRoot, cpu: u32, mem: u32, burst: bool) -> Result<Pod, String> {
    let period = 100_000;
    let quota = u64::try_from(milli_cpu_to_quota(500, period)).map_err(|e| e.to_string())?;
    let mut config = ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(250)),
        cpu_quota: Some(Limit::Value(quota)),
        cpu_period: Some(period),
        cpuset_cpus: Some([cpu].into_iter().collect::<CpuSet>()),
        cpuset_mems: Some([mem].into_iter().collect::<CpuSet>()),
        memory_limit: Some(Limit::Value(64 << 20)),
        pids_limit: Some(Limit::Value(64)),
        hugetlb_limits: BTreeMap::from([(MB2, Limit::Value(4 << 20))]),
        ..ResourceConfig::default()
    };
    let (cpu, mem) = (cpu.to_string(), mem.to_string());
    let hugetlb_expected;
    let mut files = match t.version() {
        CgroupVersion::V1 => {
            hugetlb_expected = t.manager.hierarchies().mount(Controller::Hugetlb).is_some();
            vec![
                expect(Controller::Cpu, "cpu.shares", "256"),
                Expect {
                    kernel_default: true,
                    ..expect(Controller::Cpu, "cpu.cfs_period_us", "100000")
                },
                expect(Controller::Cpu, "cpu.cfs_quota_us", "50000"),
                expect(Controller::Memory, "memory.limit_in_bytes", "67108864"),
                expect(Controller::Pids, "pids.max", "64"),
                expect(Controller::Cpuset, "cpuset.cpus", &cpu),
                expect(Controller::Cpuset, "cpuset.mems", &mem),
            ]
        }
        CgroupVersion::V2 => {
            config.memory_min = Some(16 << 20);
            // What the root is offered, the manager enables for everything below it.
            let offered = read(&t.dir(&t.root, Controller::Cpu)?.join("cgroup.controllers"))?;
            hugetlb_expected = offered.split_whitespace().any(|c| c == "hugetlb");
            vec![
                expect(Controller::Cpu, "cpu.weight", "10"),
                expect(Controller::Cpu, "cpu.max", "50000 100000"),
                expect(Controller::Memory, "memory.max", "67108864"),
                expect(Controller::Memory, "memory.min", "16777216"),
                expect(Controller::Pids, "pids.max", "64"),
                expect(Controller::Cpuset, "cpuset.cpus", &cpu),
                expect(Controller::Cpuset, "cpuset.mems", &mem),
            ]
        }
    };
    if burst {
        config.cpu_burst = Some(20_000);
        let file = match t.version() {
            CgroupVersion::V1 => "cpu.cfs_burst_us",
            CgroupVersion::V2 => "cpu.max.burst",
        };
        files.push(expect(Controller::Cpu, file, "20000"));
    }
    if hugetlb_expected {
        let file = match t.version() {
            CgroupVersion::V1 => "hugetlb.2MB.limit_in_bytes",
            CgroupVersion::V2 => "hugetlb.2MB.max",
        };
        files.push(expect(Controller::Hugetlb, file, "4194304"));
    }
    Ok(Pod {
        config,
        files,
        hugetlb_expected,
    })
}

/// Creates the root and `kubepods/burstable/pod-<n>` below it (QoS-like parents with shares
/// only), returns the pod's name and its expectations.
fn create_pod(t: &TestRoot) -> Result<(CgroupName, Pod), String> {
    t.manager
        .create(&t.root, &ResourceConfig::default())
        .map_err(|e| e.to_string())?;
    // The root's effective cpuset (inherited on v1, enabled on v2) to pin the pod inside it.
    let effective = t
        .manager
        .stats(&t.root)
        .map_err(|e| e.to_string())?
        .cpuset
        .ok_or("no effective cpuset for the test root")?;
    let cpu = *effective.cpus.last().ok_or("the test root has no CPU")?;
    let mem = *effective
        .mems
        .first()
        .ok_or("the test root has no memory node")?;
    let burst_file = match t.version() {
        CgroupVersion::V1 => "cpu.cfs_burst_us",
        CgroupVersion::V2 => "cpu.max.burst",
    };
    let burst = t.dir(&t.root, Controller::Cpu)?.join(burst_file).exists();
    let pod = pod_for(t, cpu, mem, burst)?;
    let qos = |shares| ResourceConfig {
        cpu_shares: Some(shares),
        ..ResourceConfig::default()
    };
    let kubepods = t.name(&["kubepods"])?;
    t.manager
        .create(&kubepods, &qos(milli_cpu_to_shares(2000)))
        .map_err(|e| e.to_string())?;
    t.manager
        // kubelet gives the burstable tier the sum of its pods' requests: this pod's 250m.
        .create(
            &t.name(&["kubepods", "burstable"])?,
            &qos(milli_cpu_to_shares(250)),
        )
        .map_err(|e| e.to_string())?;
    let name = t.name(&["kubepods", "burstable", "pod-1234-abcd"])?;
    Ok((name, pod))
}

fn check_files(t: &TestRoot, name: &CgroupName, files: &[Expect]) -> Result<(), String> {
    for e in files {
        let path = t.dir(name, e.controller)?.join(&e.file);
        let have = read(&path)?;
        if have != e.value {
            return Err(format!(
                "{}: {have:?}, expected {:?}",
                path.display(),
                e.value
            ));
        }
    }
    Ok(())
}

/// Creates kubepods-like cgroups and checks every file the config names holds exactly the value
/// kubelet would write, and that creation reported exactly those writes.
pub(crate) fn create_writes_exact_files(_ctx: &Context) -> Outcome {
    match run_create() {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run_create() -> Result<String, String> {
    let t = TestRoot::new("qosd-systest-cg")?;
    let (name, pod) = create_pod(&t)?;
    let report = t
        .manager
        .create(&name, &pod.config)
        .map_err(|e| e.to_string())?;
    check_files(&t, &name, &pod.files)?;

    // Every expected file was reported written with that value, except those already holding it
    // (the default CFS period), which must not be written at all.
    for e in &pod.files {
        let path = t.dir(&name, e.controller)?.join(&e.file);
        let found = report
            .written
            .iter()
            .any(|w| w.path == path && w.value.split_whitespace().eq(e.value.split_whitespace()));
        let reported = report.written.iter().any(|w| w.path == path);
        if e.kernel_default && reported {
            return Err(format!(
                "{} already held {:?} but was written: {:?}",
                path.display(),
                e.value,
                report.written
            ));
        }
        if !e.kernel_default && !found {
            return Err(format!(
                "{} = {:?} not in the create report {:?}",
                path.display(),
                e.value,
                report.written
            ));
        }
    }
    let hugetlb_skipped = report
        .skipped
        .iter()
        .any(|s| s.setting == Setting::HugetlbLimit);
    if hugetlb_skipped == pod.hugetlb_expected {
        return Err(format!(
            "hugetlb available: {}, yet skipped: {hugetlb_skipped} ({:?})",
            pod.hugetlb_expected, report.skipped
        ));
    }
    let dirs = t.manager.paths(&name).map_err(|e| e.to_string())?;
    if !t.manager.exists(&name).map_err(|e| e.to_string())? || dirs.values().any(|d| !d.is_dir()) {
        return Err(format!("the pod cgroup is missing somewhere: {dirs:?}"));
    }

    let mut detail = format!(
        "{} ({} hierarchies): {} files exact",
        t.version(),
        t.root_dirs()?.len(),
        pod.files.len()
    );
    match t.version() {
        CgroupVersion::V1 => {
            // Every new cgroup in the cpuset hierarchy inherited usable cpus and mems.
            let burstable = t.dir(&t.name(&["kubepods", "burstable"])?, Controller::Cpuset)?;
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = read(&t.dir(&t.root, Controller::Cpuset)?.join(file))?;
                let own = read(&burstable.join(file))?;
                if own.is_empty() || own != parent {
                    return Err(format!(
                        "{}/{file}: {own:?}, parent {parent:?}",
                        burstable.display()
                    ));
                }
            }
            // memory.min has no v1 file: refused, and nothing is created.
            let protected = t.name(&["protected"])?;
            let config = ResourceConfig {
                memory_min: Some(1 << 20),
                ..ResourceConfig::default()
            };
            match t.manager.create(&protected, &config) {
                Err(CgroupError::Files {
                    source: FilesError::Unsupported { .. },
                    ..
                }) => {}
                other => return Err(format!("memory.min on v1: {other:?}")),
            }
            if t.manager.exists(&protected).map_err(|e| e.to_string())? {
                return Err("a refused cgroup was created".to_owned());
            }
            detail.push_str("; cpusets inherited; memory.min refused on v1");
            if !pod.hugetlb_expected {
                detail.push_str("; hugetlb not mounted: skipped and reported");
            }
        }
        CgroupVersion::V2 => {
            let subtree = read(
                &t.dir(&t.name(&["kubepods"])?, Controller::Cpu)?
                    .join("cgroup.subtree_control"),
            )?;
            for needed in ["cpu", "cpuset", "memory", "pids"] {
                if !subtree.split_whitespace().any(|c| c == needed) {
                    return Err(format!(
                        "kubepods cgroup.subtree_control {subtree:?} lacks {needed}"
                    ));
                }
            }
            detail.push_str(&format!("; kubepods enables {subtree:?}"));
        }
    }
    Ok(detail)
}

/// An update with the same config writes nothing; files edited by hand are rewritten, and only
/// they; a quota below the current burst lands after the burst is lowered.
pub(crate) fn update_writes_only_drift(_ctx: &Context) -> Outcome {
    match run_update() {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run_update() -> Result<String, String> {
    let t = TestRoot::new("qosd-systest-cg")?;
    let (name, pod) = create_pod(&t)?;
    t.manager
        .create(&name, &pod.config)
        .map_err(|e| e.to_string())?;
    let again = t
        .manager
        .update(&name, &pod.config)
        .map_err(|e| e.to_string())?;
    if !again.written.is_empty() {
        return Err(format!("an unchanged config wrote {:?}", again.written));
    }

    let (weight_file, weight_drift, weight_value) = match t.version() {
        CgroupVersion::V1 => ("cpu.shares", "1024", "256"),
        CgroupVersion::V2 => ("cpu.weight", "100", "10"),
    };
    let weight = t.dir(&name, Controller::Cpu)?.join(weight_file);
    let pids = t.dir(&name, Controller::Pids)?.join("pids.max");
    std::fs::write(&weight, weight_drift).map_err(|e| format!("{}: {e}", weight.display()))?;
    std::fs::write(&pids, "100").map_err(|e| format!("{}: {e}", pids.display()))?;
    let repaired = t
        .manager
        .update(&name, &pod.config)
        .map_err(|e| e.to_string())?;
    let expected = vec![
        Written {
            path: weight,
            value: weight_value.to_owned(),
        },
        Written {
            path: pids,
            value: "64".to_owned(),
        },
    ];
    if repaired.written != expected {
        return Err(format!(
            "after editing {weight_file} and pids.max the update wrote {:?}, expected {expected:?}",
            repaired.written
        ));
    }
    check_files(&t, &name, &pod.files)?;
    let mut detail =
        format!("no-op update wrote nothing; drift in {weight_file} and pids.max repaired exactly");

    if pod.config.cpu_burst.is_some() {
        // quota 20000 with the current burst of 20000 is accepted, 10000 is not until the burst
        // drops: the manager must retry the quota after the burst.
        let lower = ResourceConfig {
            cpu_quota: Some(Limit::Value(10_000)),
            cpu_period: Some(100_000),
            cpu_burst: Some(5_000),
            ..ResourceConfig::default()
        };
        let report = t.manager.update(&name, &lower).map_err(|e| e.to_string())?;
        let files: Vec<String> = report
            .written
            .iter()
            .filter_map(|w| w.path.file_name().map(|f| f.to_string_lossy().into_owned()))
            .collect();
        let (quota_file, burst_file, quota_value) = match t.version() {
            CgroupVersion::V1 => ("cpu.cfs_quota_us", "cpu.cfs_burst_us", "10000"),
            CgroupVersion::V2 => ("cpu.max", "cpu.max.burst", "10000 100000"),
        };
        if files != [burst_file, quota_file] {
            return Err(format!("lowering quota below the burst wrote {files:?}"));
        }
        let dir = t.dir(&name, Controller::Cpu)?;
        let (quota, burst) = (read(&dir.join(quota_file))?, read(&dir.join(burst_file))?);
        if quota != quota_value || burst != "5000" {
            return Err(format!("{quota_file} {quota:?}, {burst_file} {burst:?}"));
        }
        detail.push_str(&format!("; {quota_file} retried after {burst_file}"));
    }
    Ok(detail)
}

/// A process moved into the pod appears in `pids` (and in the kernel's /proc/PID/cgroup), and
/// after it exits `destroy` leaves nothing in any hierarchy.
pub(crate) fn pids_and_destroy_leave_nothing(ctx: &Context) -> Outcome {
    match run_pids_destroy(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run_pids_destroy(ctx: &Context) -> Result<String, String> {
    let mut t = TestRoot::new("qosd-systest-cg")?;
    let (name, pod) = create_pod(&t)?;
    t.manager
        .create(&name, &pod.config)
        .map_err(|e| e.to_string())?;
    let sibling = t.name(&["kubepods", "besteffort"])?;
    t.manager
        .create(&sibling, &ResourceConfig::default())
        .map_err(|e| e.to_string())?;

    let pid = t.spawn(&ctx.self_exe, &["sleep", "30"])?;
    let procs = t.manager.attach(&name, pid).map_err(|e| e.to_string())?;
    let spelled = t.manager.name(&name).map_err(|e| e.to_string())?;
    let proc_cgroup = read(Path::new(&format!("/proc/{pid}/cgroup")))?;
    let placed = proc_cgroup
        .lines()
        .filter(|l| l.ends_with(&format!(":{spelled}")))
        .count();
    let wanted = match t.version() {
        CgroupVersion::V1 => t.root_dirs()?.len(),
        CgroupVersion::V2 => 1,
    };
    if placed != wanted || procs.len() != wanted {
        return Err(format!(
            "pid {pid} in {placed} of {wanted} hierarchies after attach ({procs:?}):\n{proc_cgroup}"
        ));
    }
    for (cgroup, should_have) in [(&name, true), (&t.root, true), (&sibling, false)] {
        let pids = t.manager.pids(cgroup).map_err(|e| e.to_string())?;
        if pids.contains(&pid) != should_have {
            return Err(format!(
                "pids({cgroup}) = {pids:?}; {pid} expected: {should_have}"
            ));
        }
    }

    t.kill_children();
    let started = Instant::now();
    let report = t.manager.destroy(&t.root).map_err(|e| e.to_string())?;
    let took = started.elapsed();
    let dirs = t.root_dirs()?;
    if let Some(left) = dirs.iter().find(|d| d.exists()) {
        return Err(format!("{} still exists after destroy", left.display()));
    }
    // root, kubepods, burstable, pod, besteffort in each hierarchy.
    if report.removed.len() != 5 * dirs.len() {
        return Err(format!(
            "destroy removed {} directories, expected {}: {:?}",
            report.removed.len(),
            5 * dirs.len(),
            report.removed
        ));
    }
    let again = t.manager.destroy(&t.root).map_err(|e| e.to_string())?;
    if !again.removed.is_empty() || t.manager.exists(&t.root).map_err(|e| e.to_string())? {
        return Err(format!("a second destroy found {:?}", again.removed));
    }
    Ok(format!(
        "pid {pid} seen in the pod and the root, not the sibling; {} directories removed in {:?}",
        report.removed.len(),
        took
    ))
}

/// A process started through the backend's join handle (the fds of `cgroup.procs` the
/// container manager hands the runtime) is in the container cgroup in every hierarchy from its
/// first instruction (its own /proc/self/cgroup, printed by the program it execs, names it);
/// `kill` signals every process of the cgroup and `pids` is empty afterwards.
pub(crate) fn join_handle_and_kill(ctx: &Context) -> Outcome {
    match run_join_kill(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run_join_kill(_ctx: &Context) -> Result<String, String> {
    use qosd::cgroup::CgroupJoiner as _;
    use qosd::runtime::process::{Launch, spawn};
    let t = TestRoot::new("qosd-systest-cg")?;
    let (name, pod) = create_pod(&t)?;
    let container = name.child("c").map_err(|e| e.to_string())?;
    t.manager
        .create(&container, &pod.config)
        .map_err(|e| e.to_string())?;
    let spelled = t.manager.name(&container).map_err(|e| e.to_string())?;
    let log = std::env::temp_dir().join(format!("qosd-systest-join-{}.log", std::process::id()));
    let launch = Launch {
        // The shell prints where it runs before anything else, then waits to be killed.
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            "cat /proc/self/cgroup; exec sleep 30".into(),
        ],
        env: Vec::new(),
        log_file: Some(log.clone()),
    };
    let join = t.manager.join(&container).map_err(|e| e.to_string())?;
    let mut child = spawn(&launch, join).map_err(|e| e.to_string())?;
    let pid = child.id();
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let wanted = match t.version() {
        CgroupVersion::V1 => t.root_dirs()?.len(),
        CgroupVersion::V2 => 1,
    };
    let printed = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let placed = text
            .lines()
            .filter(|l| l.ends_with(&format!(":{spelled}")))
            .count();
        if placed >= wanted {
            break text;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the process printed {placed} of {wanted} hierarchies in {spelled}:\n{text}"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = std::fs::remove_file(&log);
    let before = t.manager.pids(&container).map_err(|e| e.to_string())?;
    let killed = t.manager.kill(&container).map_err(|e| e.to_string())?;
    let status = child.wait().map_err(|e| e.to_string())?;
    let after = t.manager.pids(&container).map_err(|e| e.to_string())?;
    if !before.contains(&pid) || killed < 1 || !after.is_empty() {
        return Err(format!(
            "pids before kill {before:?} (started {pid}), {killed} signalled, after {after:?}"
        ));
    }
    if std::os::unix::process::ExitStatusExt::signal(&status) != Some(libc::SIGKILL) {
        return Err(format!("the process ended with {status}, not SIGKILL"));
    }
    let lines = printed.lines().count();
    Ok(format!(
        "pid {pid} printed its cgroup {spelled} in {wanted} hierarchies ({lines} lines of /proc/self/cgroup) before exec; kill signalled {killed}, nothing left"
    ))
}

/// Statistics come from the kernel's files: CPU time of a busy process in the pod, memory.stat
/// and memory.numa_stat keys, and the effective cpuset the pod was pinned to.
pub(crate) fn stats_read_kernel_files(ctx: &Context) -> Outcome {
    match run_stats(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run_stats(ctx: &Context) -> Result<String, String> {
    let mut t = TestRoot::new("qosd-systest-cg")?;
    let (name, pod) = create_pod(&t)?;
    t.manager
        .create(&name, &pod.config)
        .map_err(|e| e.to_string())?;
    let pid = t.spawn(&ctx.self_exe, &["spin", "2"])?;
    t.manager.attach(&name, pid).map_err(|e| e.to_string())?;
    if let Some(mut child) = t.children.pop() {
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("the spinning workload exited with {status}"));
        }
    }
    let stats = t.manager.stats(&name).map_err(|e| e.to_string())?;
    let cpu = stats.cpu.ok_or("no cpu statistics")?;
    let usage = cpu.usage_ns.ok_or("no CPU usage")?;
    let source = match t.version() {
        CgroupVersion::V1 => {
            let raw = read(&t.dir(&name, Controller::Cpuacct)?.join("cpuacct.usage"))?;
            let raw: u64 = raw
                .parse()
                .map_err(|e| format!("cpuacct.usage {raw:?}: {e}"))?;
            if raw != usage {
                return Err(format!("stats usage {usage} ns, cpuacct.usage {raw}"));
            }
            "cpuacct.usage"
        }
        CgroupVersion::V2 => "cpu.stat usage_usec",
    };
    // The workload spun two seconds, at most half a CPU by its quota, on a CPU other work may
    // share (this host has two): at least 0.2 s.
    if usage < 200_000_000 {
        return Err(format!("only {usage} ns of CPU in the pod by {source}"));
    }
    if cpu.nr_periods.is_none() {
        return Err("the pod has a CFS quota but no nr_periods".to_owned());
    }
    let memory = stats.memory.ok_or("no memory.stat")?;
    if !memory.contains_key("pgfault") {
        return Err(format!("memory.stat without pgfault: {:?}", memory.keys()));
    }
    let cpuset = stats.cpuset.ok_or("no effective cpuset")?;
    let pinned = pod.config.cpuset_cpus.as_ref().map(CpuSet::to_vec);
    if Some(cpuset.cpus.clone()) != pinned {
        return Err(format!(
            "effective cpus {:?}, pinned to {pinned:?}",
            cpuset.cpus
        ));
    }
    let numa = match stats.numa {
        Some(numa) => {
            let key = match t.version() {
                CgroupVersion::V1 => "hierarchical_total",
                CgroupVersion::V2 => "anon",
            };
            let entry = numa
                .entries
                .get(key)
                .ok_or_else(|| format!("memory.numa_stat without {key}"))?;
            if entry
                .nodes
                .keys()
                .any(|n| !cpuset.mems.contains(n) && entry.nodes[n] > 0)
            {
                return Err(format!(
                    "{key} on nodes outside {:?}: {entry:?}",
                    cpuset.mems
                ));
            }
            format!("numa_stat {} keys", numa.entries.len())
        }
        None => "no memory.numa_stat (kernel without NUMA)".to_owned(),
    };
    Ok(format!(
        "{:.2}s of CPU by {source}; memory.stat {} keys; {numa}; effective cpus {:?}",
        usage as f64 / 1e9,
        memory.len(),
        cpuset.cpus
    ))
}
