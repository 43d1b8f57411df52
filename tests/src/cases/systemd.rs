//! The systemd cgroup driver against a real systemd (PID 1 in the systemd guest): qosd with
//! `cgroupDriver: systemd` starts its slices and the container's scope over D-Bus; the
//! kernel files hold kubelet's values and `systemctl show` agrees with them; a
//! `systemctl daemon-reload` leaves every value in place; a value changed behind qosd's back
//! is put back by reconcile, and a slice stopped behind its back is started again with its
//! container; at stop every unit is gone. Elsewhere (the host is not booted by
//! systemd) the case is skipped with that reason.
//!
//! Unit and directory names are spelled here from kubelet's rules (`-` inside a component
//! becomes `_`, each component a slice nested in its parent), not from qosd's code.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::agent::Agent;
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{TempPaths, wait_for};

const UID: &str = "0f0e0d0c-0000-4000-8000-0000000000d1";
/// kubelet's weight for 100m (102 shares): 1 + (102 - 2) * 9999 / 262142.
const WEIGHT: &str = "4";
const QUOTA: &str = "20000 100000";
const MEMORY: &str = "67108864";

/// The units and directories of one run.
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
        let root_dir = Path::new("/sys/fs/cgroup").join(format!("{slice}.slice"));
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

/// Skips unless systemd is PID 1 on cgroup v2.
fn systemd_here() -> Option<String> {
    if !Path::new("/run/systemd/system").is_dir() {
        return Some(
            "systemd is not PID 1 here (no /run/systemd/system); the systemd guest runs this case"
                .to_owned(),
        );
    }
    if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        return Some("cgroup v1 or hybrid: qosd's systemd driver is tested on v2".to_owned());
    }
    None
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
    let _ = systemctl(&["stop", &units.root_unit]);
    let _ = systemctl(&["reset-failed", &units.scope_unit]);
    match outcome {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run(ctx: &Context, root: &str, units: &Units, scratch: &Path) -> Result<String, String> {
    let manifests = scratch.join("manifests");
    std::fs::create_dir_all(&manifests).map_err(|e| e.to_string())?;
    let config = scratch.join("kubelet.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             cgroupDriver: systemd\ncgroupRoot: /{root}\n"
        ),
    )
    .map_err(|e| e.to_string())?;
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

    let pid = wait_for(
        "the container's process in its scope",
        Duration::from_secs(30),
        || {
            let procs = read(&units.scope_dir.join("cgroup.procs"))?;
            procs
                .split_whitespace()
                .next()
                .map(str::to_owned)
                .ok_or_else(|| "no process yet".to_owned())
        },
    )
    .map_err(with_log)?;

    let kernel = |dir: &Path| -> Result<(), String> {
        for (file, want) in [
            ("cpu.weight", WEIGHT),
            ("cpu.max", QUOTA),
            ("memory.max", MEMORY),
        ] {
            let got = read(&dir.join(file))?;
            if got != want {
                return Err(format!("{}/{file} = {got}, want {want}", dir.display()));
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
        let weight = show(unit, "CPUWeight")?;
        let quota = show(unit, "CPUQuotaPerSecUSec")?;
        let memory = show(unit, "MemoryMax")?;
        if state != "active" || weight != WEIGHT || quota != "200ms" || memory != MEMORY {
            return Err(with_log(format!(
                "systemctl show {unit}: ActiveState={state} CPUWeight={weight} \
                 CPUQuotaPerSecUSec={quota} MemoryMax={memory}; want active, {WEIGHT}, 200ms, {MEMORY}"
            )));
        }
        shown.push(format!(
            "{unit}: CPUWeight={weight} CPUQuotaPerSecUSec={quota} MemoryMax={memory}"
        ));
    }

    systemctl(&["daemon-reload"])?;
    std::thread::sleep(Duration::from_secs(2));
    for dir in [&units.pod_dir, &units.scope_dir] {
        kernel(dir).map_err(|e| with_log(format!("after systemctl daemon-reload: {e}")))?;
    }

    // Behind qosd's back: reconcile puts kubelet's value back (through systemd).
    std::fs::write(units.pod_dir.join("cpu.max"), "max 100000").map_err(|e| e.to_string())?;
    wait_for(
        "reconcile to restore cpu.max",
        Duration::from_secs(15),
        || {
            let got = read(&units.pod_dir.join("cpu.max"))?;
            if got == QUOTA {
                Ok(())
            } else {
                Err(format!("cpu.max = {got}"))
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
            let procs = read(&units.scope_dir.join("cgroup.procs")).unwrap_or_default();
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
    if !left.trim().is_empty() || units.root_dir.exists() || scope_left == "loaded" {
        return Err(format!(
            "after stop: units {left:?}, scope {scope_left}, {} exists: {}",
            units.root_dir.display(),
            units.root_dir.exists()
        ));
    }
    Ok(format!(
        "container pid {pid} in {}; kernel files cpu.weight {WEIGHT}, cpu.max {QUOTA}, memory.max {MEMORY} \
         in the pod slice and the scope; {}; unchanged after daemon-reload; cpu.max written behind qosd's \
         back restored and kept over a reload; the pod slice stopped behind qosd's back started again \
         with the container in a new scope (pid {restarted}) and kubelet's values; stopped in {took:?} \
         with every unit gone",
        units.scope_unit,
        shown.join("; ")
    ))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn systemctl(args: &[&str]) -> Result<String, String> {
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
fn show(unit: &str, property: &str) -> Result<String, String> {
    Ok(systemctl(&["show", "--value", "-p", property, unit])?
        .trim()
        .to_owned())
}
