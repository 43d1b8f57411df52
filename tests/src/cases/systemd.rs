//! The systemd cgroup driver against a real systemd (PID 1 in the systemd guest): qosd with
//! `cgroupDriver: systemd` starts its slices and the container's scope over D-Bus; the
//! kernel files hold kubelet's values and `systemctl show` agrees with them; a
//! `systemctl daemon-reload` leaves every value in place; a value changed behind qosd's back
//! is put back by reconcile, and a slice stopped behind its back is started again with its
//! container; at stop every unit is gone. A second case has the feedback cap and idle the
//! BestEffort tier (crowding a Burstable spinner on one CPU): systemd holds the intervention
//! as the tier's `CPUQuotaPerSecUSec` and `CPUWeight=idle`, so a `daemon-reload` keeps it
//! without qosd correcting anything (`qosd_cgroup_drift_corrections_total` unchanged). The
//! cases run on cgroup v2 and on the hybrid layout (v1 controllers: `CPUShares`, `MemoryLimit`,
//! `cpu.idle` written by qosd, the cpuset directories qosd's own); elsewhere (the host is not
//! booted by systemd) they are skipped with that reason.
//!
//! Unit and directory names are spelled here from kubelet's rules (`-` inside a component
//! becomes `_`, each component a slice nested in its parent), not from qosd's code.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::agent::{Agent, http_get, sample_value};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{TempPaths, wait_for};

const UID: &str = "0f0e0d0c-0000-4000-8000-0000000000d1";
const MEMORY: &str = "67108864";

/// A kernel file and its value: (controller, file, value).
type KernelFile = (&'static str, &'static str, &'static str);
/// A unit property and its value as `systemctl show` prints it.
type UnitValue = (&'static str, &'static str);

/// Where the cases find a unit's kernel files and what they are called: cgroup v2, or the
/// hybrid layout (each v1 controller its own hierarchy).
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) v2: bool,
}

impl Layout {
    pub(super) fn here() -> Self {
        Self {
            v2: Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        }
    }

    /// The directory of `relative` (slices and scopes below the root) in `controller`'s
    /// hierarchy.
    pub(super) fn dir(self, controller: &str, relative: &Path) -> PathBuf {
        let mount = Path::new("/sys/fs/cgroup");
        if self.v2 {
            mount.join(relative)
        } else {
            mount.join(controller).join(relative)
        }
    }

    pub(super) fn name(self) -> &'static str {
        if self.v2 { "cgroup v2" } else { "hybrid" }
    }

    /// The file of the CFS quota.
    pub(super) fn quota_file(self) -> &'static str {
        if self.v2 {
            "cpu.max"
        } else {
            "cpu.cfs_quota_us"
        }
    }

    /// True when `text` of [`Self::quota_file`] says no quota.
    pub(super) fn unlimited(self, text: &str) -> bool {
        if self.v2 {
            text.starts_with("max")
        } else {
            text == "-1"
        }
    }

    /// The file of the CPU weight, and the unit property systemd keeps it in.
    pub(super) fn weight(self) -> (&'static str, &'static str) {
        if self.v2 {
            ("cpu.weight", "CPUWeight")
        } else {
            ("cpu.shares", "CPUShares")
        }
    }

    /// kubelet's values for 100m / 200m / 64Mi: (controller, file, value), and the unit
    /// properties with their values as `systemctl show` prints them.
    fn kubelet_values(self) -> ([KernelFile; 3], [UnitValue; 3]) {
        if self.v2 {
            (
                [
                    // 1 + (102 - 2) * 9999 / 262142
                    ("cpu", "cpu.weight", "4"),
                    ("cpu", "cpu.max", "20000 100000"),
                    ("memory", "memory.max", MEMORY),
                ],
                [
                    ("CPUWeight", "4"),
                    ("CPUQuotaPerSecUSec", "200ms"),
                    ("MemoryMax", MEMORY),
                ],
            )
        } else {
            (
                [
                    ("cpu", "cpu.shares", "102"),
                    ("cpu", "cpu.cfs_quota_us", "20000"),
                    ("memory", "memory.limit_in_bytes", MEMORY),
                ],
                [
                    ("CPUShares", "102"),
                    ("CPUQuotaPerSecUSec", "200ms"),
                    ("MemoryLimit", MEMORY),
                ],
            )
        }
    }
}

/// The units and directories (below the hierarchies) of one run.
struct Units {
    root_unit: String,
    pod_unit: String,
    scope_unit: String,
    pod_dir: PathBuf,
    scope_dir: PathBuf,
    root_dir: PathBuf,
}

impl Units {
    fn new(root: &str) -> Self {
        let slice = root.replace('-', "_");
        let kubepods = format!("{slice}-kubepods");
        let burstable = format!("{kubepods}-burstable");
        let pod = format!("{burstable}-pod{}", UID.replace('-', "_"));
        let scope_unit = format!("qosd-pod{UID}-c.scope");
        let root_dir = PathBuf::from(format!("{slice}.slice"));
        let pod_dir = root_dir
            .join(format!("{kubepods}.slice"))
            .join(format!("{burstable}.slice"))
            .join(format!("{pod}.slice"));
        Self {
            root_unit: format!("{slice}.slice"),
            pod_unit: format!("{pod}.slice"),
            scope_dir: pod_dir.join(&scope_unit),
            scope_unit,
            pod_dir,
            root_dir,
        }
    }
}

/// Skips unless systemd is PID 1.
pub(super) fn systemd_here() -> Option<String> {
    if Path::new("/run/systemd/system").is_dir() {
        None
    } else {
        Some(
            "systemd is not PID 1 here (no /run/systemd/system); the systemd guests run this case"
                .to_owned(),
        )
    }
}

pub(crate) fn units_hold_kubelet_values_through_reload_drift_and_stops(ctx: &Context) -> Outcome {
    if let Some(reason) = systemd_here() {
        return Outcome::Skip(reason);
    }
    let root = format!("qosd-systest-sd{}", std::process::id());
    let units = Units::new(&root);
    let scratch = std::env::temp_dir().join(format!("{root}-files"));
    let _files = TempPaths(vec![scratch.clone()]);
    let outcome = run(ctx, &root, &units, &scratch);
    // Whatever happened: no unit of ours stays behind.
    stop_root_slice(&units.root_unit);
    let _ = systemctl(&["reset-failed", &units.scope_unit]);
    match outcome {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run(ctx: &Context, root: &str, units: &Units, scratch: &Path) -> Result<String, String> {
    let (manifests, config) = crate::agent::standalone_inputs(
        scratch,
        &format!("cgroupDriver: systemd\ncgroupRoot: /{root}\n"),
    )?;
    std::fs::write(
        manifests.join("pod.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: sd, namespace: systest, uid: {UID}}}\n\
             spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    \
             command: [\"{}\", \"sleep\", \"600\"]\n    resources: {{requests: {{cpu: 100m, memory: 32Mi}}, \
             limits: {{cpu: 200m, memory: 64Mi}}}}\n",
            ctx.self_exe.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let args = crate::agent::standalone_args(
        scratch,
        &manifests,
        &config,
        &["--reconcile-period", "1s", "--feedback", "off"],
    );
    let mut agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    let with_log = |e: String| format!("{e}\n--- qosd log ---\n{}", agent.log_tail());

    let check = Command::new(&ctx.qosd)
        .arg("check")
        .output()
        .map_err(|e| format!("qosd check: {e}"))?;
    let check = String::from_utf8_lossy(&check.stdout).into_owned();
    let systemd_line = check
        .lines()
        .find(|l| l.starts_with("systemd "))
        .unwrap_or_default()
        .to_owned();
    if !systemd_line.contains("cgroupDriver systemd available") {
        return Err(format!(
            "qosd check's systemd line: {systemd_line:?}\n{check}"
        ));
    }

    let layout = Layout::here();
    let (files, properties) = layout.kubelet_values();
    let procs_of = |relative: &Path| read(&layout.dir("cpu", relative).join("cgroup.procs"));
    let pid = wait_for(
        "the container's process in its scope",
        Duration::from_secs(30),
        || {
            let procs = procs_of(&units.scope_dir)?;
            procs
                .split_whitespace()
                .next()
                .map(str::to_owned)
                .ok_or_else(|| "no process yet".to_owned())
        },
    )
    .map_err(with_log)?;

    let kernel = |relative: &Path| -> Result<(), String> {
        for (controller, file, want) in files {
            let path = layout.dir(controller, relative).join(file);
            let got = read(&path)?;
            if got != want {
                return Err(format!("{} = {got}, want {want}", path.display()));
            }
        }
        Ok(())
    };
    for dir in [&units.pod_dir, &units.scope_dir] {
        kernel(dir).map_err(with_log)?;
    }
    let mut shown = Vec::new();
    for unit in [&units.pod_unit, &units.scope_unit] {
        let state = show(unit, "ActiveState")?;
        let mut values = Vec::new();
        for (property, want) in properties {
            let got = show(unit, property)?;
            if got != want {
                return Err(with_log(format!(
                    "systemctl show {unit}: {property}={got}, want {want} (ActiveState={state})"
                )));
            }
            values.push(format!("{property}={got}"));
        }
        if state != "active" {
            return Err(with_log(format!("{unit}: ActiveState={state}")));
        }
        shown.push(format!("{unit}: {}", values.join(" ")));
    }

    systemctl(&["daemon-reload"])?;
    std::thread::sleep(Duration::from_secs(2));
    for dir in [&units.pod_dir, &units.scope_dir] {
        kernel(dir).map_err(|e| with_log(format!("after systemctl daemon-reload: {e}")))?;
    }

    // Behind qosd's back: reconcile puts kubelet's value back (through systemd).
    let quota_path = layout.dir("cpu", &units.pod_dir).join(layout.quota_file());
    let quota_want = files[1].2;
    let unlimited = if layout.v2 { "max 100000" } else { "-1" };
    std::fs::write(&quota_path, unlimited).map_err(|e| e.to_string())?;
    wait_for(
        "reconcile to restore the quota",
        Duration::from_secs(15),
        || {
            let got = read(&quota_path)?;
            if got == quota_want {
                Ok(())
            } else {
                Err(format!("{} = {got}", quota_path.display()))
            }
        },
    )
    .map_err(with_log)?;
    systemctl(&["daemon-reload"])?;
    std::thread::sleep(Duration::from_secs(2));
    kernel(&units.pod_dir).map_err(|e| with_log(format!("after the repair and a reload: {e}")))?;

    // The pod's slice stopped behind qosd's back (its container's scope and process with it):
    // reconcile starts the slice again, the container is started again in a new scope.
    systemctl(&["stop", &units.pod_unit])?;
    let restarted = wait_for(
        "the pod slice and its container back",
        Duration::from_secs(30),
        || {
            let state = show(&units.pod_unit, "ActiveState")?;
            let procs = procs_of(&units.scope_dir).unwrap_or_default();
            match procs.split_whitespace().next() {
                Some(new) if state == "active" && new != pid => Ok(new.to_owned()),
                _ => Err(format!("slice {state}, scope processes [{procs}]")),
            }
        },
    )
    .map_err(with_log)?;
    for dir in [&units.pod_dir, &units.scope_dir] {
        kernel(dir).map_err(|e| with_log(format!("after the slice came back: {e}")))?;
    }

    let (status, took) = agent.stop(libc::SIGTERM, Duration::from_secs(20))?;
    if !status.success() {
        return Err(format!(
            "qosd exited with {status} on SIGTERM\n--- qosd log ---\n{}",
            agent.log_tail()
        ));
    }
    let left = systemctl(&[
        "list-units",
        "--all",
        "--plain",
        "--no-legend",
        &format!("{}*", root.replace('-', "_")),
    ])?;
    let scope_left = show(&units.scope_unit, "LoadState")?;
    // On the hybrid layout the cpuset directories are qosd's own (systemd has none).
    let dirs_left: Vec<PathBuf> = ["cpu", "memory", "cpuset"]
        .into_iter()
        .map(|c| layout.dir(c, &units.root_dir))
        .filter(|d| d.exists())
        .collect();
    if !left.trim().is_empty() || !dirs_left.is_empty() || scope_left == "loaded" {
        return Err(format!(
            "after stop: units {left:?}, scope {scope_left}, directories left {dirs_left:?}"
        ));
    }
    let kernel_files: Vec<String> = files.iter().map(|(_, f, v)| format!("{f} {v}")).collect();
    Ok(format!(
        "{}; qosd check: {:?}; container pid {pid} in {}; kernel files {} in the pod slice and \
         the scope; {}; unchanged after daemon-reload; {} written behind qosd's back restored \
         and kept over a reload; the pod slice stopped behind qosd's back started again with \
         the container in a new scope (pid {restarted}) and kubelet's values; stopped in \
         {took:?} with every unit and directory gone",
        layout.name(),
        systemd_line.trim(),
        units.scope_unit,
        kernel_files.join(", "),
        shown.join("; "),
        layout.quota_file(),
    ))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Stops the root slice `unit`, and removes what systemd leaves of it in the cgroup trees
/// (the cpuset directories qosd makes itself on the hybrid layout): the cases' cleanup,
/// whatever happened.
pub(super) fn stop_root_slice(unit: &str) {
    let _ = systemctl(&["stop", unit]);
    crate::pod_tree::remove_top_cgroup(unit);
}

pub(super) fn systemctl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("systemctl")
        .args(args)
        .output()
        .map_err(|e| format!("systemctl {args:?}: {e}"))?;
    if !out.status.success() && args.first() != Some(&"show") {
        return Err(format!(
            "systemctl {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One property of a unit as `systemctl show` prints it.
pub(super) fn show(unit: &str, property: &str) -> Result<String, String> {
    Ok(systemctl(&["show", "--value", "-p", property, unit])?
        .trim()
        .to_owned())
}

const VICTIM_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000d2";
const NOISY_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000d3";

pub(crate) fn feedback_interventions_survive_daemon_reload(ctx: &Context) -> Outcome {
    if let Some(reason) = systemd_here() {
        return Outcome::Skip(reason);
    }
    let root = format!("qosd-systest-sdf{}", std::process::id());
    let slice = root.replace('-', "_");
    let scratch = std::env::temp_dir().join(format!("{root}-files"));
    let _files = TempPaths(vec![scratch.clone()]);
    let outcome = run_feedback(ctx, &root, &scratch);
    stop_root_slice(&format!("{slice}.slice"));
    match outcome {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run_feedback(ctx: &Context, root: &str, scratch: &Path) -> Result<String, String> {
    let slice = root.replace('-', "_");
    let tier_unit = format!("{slice}-kubepods-besteffort.slice");
    let layout = Layout::here();
    let tier_dir = PathBuf::from(format!("{slice}.slice"))
        .join(format!("{slice}-kubepods.slice"))
        .join(&tier_unit);
    let (manifests, config) = crate::agent::standalone_inputs(
        scratch,
        &format!("cgroupDriver: systemd\ncgroupRoot: /{root}\n"),
    )?;
    let exe = ctx.self_exe.display().to_string();
    let pod = |uid: &str, name: &str, command: &str, resources: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: systest, uid: {uid}}}\n\
             spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    \
             command: {command}\n    resources: {resources}\n"
        )
    };
    // As the feedback case: a Burstable spinner whose 10m request gives its tier little
    // weight, and four BestEffort spinners, all on one CPU.
    for (file, text) in [
        (
            "victim.yaml",
            pod(
                VICTIM_UID,
                "victim",
                &format!("[\"{exe}\", \"spin\", \"600\"]"),
                "{requests: {cpu: 10m}}",
            ),
        ),
        (
            "noisy.yaml",
            pod(
                NOISY_UID,
                "noisy",
                &format!(
                    "[\"/bin/sh\", \"-c\", \"for i in 1 2 3 4; do {exe} spin 600 & done; wait\"]"
                ),
                "{}",
            ),
        ),
    ] {
        std::fs::write(manifests.join(file), text).map_err(|e| e.to_string())?;
    }
    let args = crate::agent::standalone_args(
        scratch,
        &manifests,
        &config,
        &["--feedback-period", "1s", "--feedback-hold", "600s"],
    );
    let mut agent = Agent::start_with(&ctx.qosd, &args, Duration::from_secs(60))?;
    let with_log = |e: String| format!("{e}\n--- qosd log ---\n{}", agent.log_tail());

    // The processes as the cpuset hierarchy has them: on v1 qosd joins a container to the
    // hierarchies systemd does not manage (cpuset) after systemd placed it, and joining a
    // cpuset resets a task's affinity, so it is pinned only once it is there.
    let scope_procs = |tier: &str, uid: &str| -> Result<Vec<u32>, String> {
        let pod_unit = format!("{slice}-kubepods-{tier}-pod{}.slice", uid.replace('-', "_"));
        let mut dir = layout.dir(
            "cpuset",
            &PathBuf::from(format!("{slice}.slice")).join(format!("{slice}-kubepods.slice")),
        );
        if tier != "guaranteed" {
            dir.push(format!("{slice}-kubepods-{tier}.slice"));
        }
        let procs = read(
            &dir.join(pod_unit)
                .join(format!("qosd-pod{uid}-c.scope/cgroup.procs")),
        )
        .unwrap_or_default();
        Ok(procs
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    };
    let victim = wait_for("the victim's process", Duration::from_secs(30), || {
        scope_procs("burstable", VICTIM_UID)?
            .first()
            .copied()
            .ok_or_else(|| "none yet".to_owned())
    })
    .map_err(with_log)?;
    let noisy = wait_for("the five noisy processes", Duration::from_secs(30), || {
        let pids = scope_procs("besteffort", NOISY_UID)?;
        if pids.len() >= 5 {
            Ok(pids)
        } else {
            Err(format!("{} of 5", pids.len()))
        }
    })
    .map_err(with_log)?;
    let cpu = crate::workload::last_allowed_cpu()?;
    for pid in noisy.into_iter().chain([victim]) {
        crate::workload::pin(pid, cpu)?;
    }

    wait_for("a besteffort_cpu decision", Duration::from_secs(90), || {
        let text = agent.scrape()?;
        let count = |action: &str| {
            sample_value(
                &text,
                "qosd_feedback_decisions_total",
                &format!("action=\"{action}\",policy=\"besteffort_cpu\""),
            )
            .unwrap_or(0.0)
        };
        if count("apply") >= 1.0 {
            Ok(())
        } else {
            Err(format!("none yet (unavailable: {})", count("unavailable")))
        }
    })
    .map_err(|e| {
        // What qosd attributes: the pods' CPU time series (labelled when the index knows
        // their cgroup ids) and the scopes' inodes in the cpu hierarchy.
        let text = agent.scrape().unwrap_or_default();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| {
                (l.starts_with("qosd_cgroup_cpu_seconds_total")
                    || l.starts_with("qosd_runqueue_preemptions_total"))
                    && l.contains(&slice)
            })
            .collect();
        let inodes: Vec<String> = [("burstable", VICTIM_UID), ("besteffort", NOISY_UID)]
            .iter()
            .map(|(tier, uid)| {
                let dir = layout.dir(
                    "cpu",
                    &PathBuf::from(format!("{slice}.slice"))
                        .join(format!("{slice}-kubepods.slice"))
                        .join(format!("{slice}-kubepods-{tier}.slice"))
                        .join(format!(
                            "{slice}-kubepods-{tier}-pod{}.slice",
                            uid.replace('-', "_")
                        ))
                        .join(format!("qosd-pod{uid}-c.scope")),
                );
                use std::os::unix::fs::MetadataExt as _;
                format!(
                    "{}: inode {:?}, procs [{}]",
                    dir.display(),
                    std::fs::metadata(&dir).map(|m| m.ino()).ok(),
                    read(&dir.join("cgroup.procs")).unwrap_or_default()
                )
            })
            .collect();
        with_log(format!(
            "{e}\n--- series ---\n{}\n--- scopes ---\n{}",
            series.join("\n"),
            inodes.join("\n")
        ))
    })?;
    let held = || TierHeld::read(layout, &tier_dir, &tier_unit);
    let before = wait_for(
        "the tier idle and capped, in its files and its unit",
        Duration::from_secs(15),
        || {
            let held = held()?;
            if held.capped_and_idle(layout) {
                Ok(held)
            } else {
                Err(held.to_string())
            }
        },
    )
    .map_err(with_log)?;
    // What reconcile writes again is counted here: unchanged means systemd kept the values.
    let corrections = |text: &str| -> f64 {
        sample_value(text, "qosd_cgroup_drift_corrections_total", "").unwrap_or(0.0)
    };
    let corrections_before = corrections(&agent.scrape()?);

    systemctl(&["daemon-reload"])?;
    std::thread::sleep(Duration::from_secs(2));
    let after = held()?;
    // Judged before qosd's next reconcile could have written anything again.
    let corrections_after = corrections(&agent.scrape()?);
    if after != before || corrections_after != corrections_before {
        return Err(with_log(format!(
            "after systemctl daemon-reload: {after}, before {before}; qosd_cgroup_drift_corrections_total {corrections_before} -> {corrections_after}"
        )));
    }
    let decision = http_get(agent.addr, "/inspect")
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|r| {
            r["data"]["decisions"]
                .as_array()?
                .iter()
                .find(|d| d["policy"] == "besteffort_cpu")
                .map(|d| d["change"].as_str().unwrap_or_default().to_owned())
        })
        .unwrap_or_default();

    let (status, _) = agent.stop(libc::SIGTERM, Duration::from_secs(20))?;
    if !status.success() {
        return Err(format!(
            "qosd exited with {status} on SIGTERM\n{}",
            agent.log_tail()
        ));
    }
    Ok(format!(
        "{}; besteffort_cpu applied ({decision}); {tier_unit}: {before}; the same after \
         systemctl daemon-reload, with qosd_cgroup_drift_corrections_total unchanged \
         ({corrections_after})",
        layout.name()
    ))
}

/// The BestEffort tier under the feedback's intervention, as the kernel files and the unit
/// hold it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct TierHeld {
    pub(super) idle: String,
    pub(super) quota: String,
    /// The weight property (`CPUWeight` on v2, `CPUShares` on v1) as `systemctl show` says.
    pub(super) weight_property: String,
    pub(super) quota_per_sec: String,
}

impl TierHeld {
    /// Reads the tier's files (`tier`: below the hierarchies) and its unit.
    pub(super) fn read(layout: Layout, tier: &Path, unit: &str) -> Result<Self, String> {
        let dir = layout.dir("cpu", tier);
        Ok(Self {
            idle: read(&dir.join("cpu.idle"))?,
            quota: read(&dir.join(layout.quota_file()))?,
            weight_property: show(unit, layout.weight().1)?,
            quota_per_sec: show(unit, "CPUQuotaPerSecUSec")?,
        })
    }

    /// Capped and idle, in the files and in the unit: on v2 systemd holds the idle as
    /// `CPUWeight=idle`; on v1 `cpu.idle` is qosd's file (systemd never writes it there).
    pub(super) fn capped_and_idle(&self, layout: Layout) -> bool {
        self.idle == "1"
            && !layout.unlimited(&self.quota)
            && self.quota_per_sec != "infinity"
            && (!layout.v2 || self.weight_property == "idle")
    }
}

impl std::fmt::Display for TierHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cpu.idle {}, quota {}, weight property {}, CPUQuotaPerSecUSec={}",
            self.idle, self.quota, self.weight_property, self.quota_per_sec
        )
    }
}
