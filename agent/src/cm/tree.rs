//! The text tree `qosd inspect` prints: QoS tiers, pods, containers, their cgroup paths, the
//! limits in effect (read back from cgroupfs, not from the desired state) and process counts;
//! then the feedback's decisions, when it runs.
use std::fmt::Write as _;

use crate::cgroup::files::Controller;
use crate::cgroup::name::CgroupName;
use crate::runtime::supervisor::ContainerState;

use super::manager::ContainerManager;

/// Limit files shown, v1 and v2 alike (whichever exist).
const LIMIT_FILES: &[(Controller, &str)] = &[
    (Controller::Cpu, "cpu.shares"),
    (Controller::Cpu, "cpu.weight"),
    (Controller::Cpu, "cpu.cfs_quota_us"),
    (Controller::Cpu, "cpu.max"),
    (Controller::Cpu, "cpu.cfs_burst_us"),
    (Controller::Cpu, "cpu.max.burst"),
    (Controller::Cpu, "cpu.idle"),
    (Controller::Memory, "memory.limit_in_bytes"),
    (Controller::Memory, "memory.max"),
    (Controller::Memory, "memory.min"),
    (Controller::Cpuset, "cpuset.cpus"),
    (Controller::Cpuset, "cpuset.mems"),
    (Controller::Pids, "pids.max"),
];

pub(super) fn render(manager: &ContainerManager) -> String {
    let mut out = String::new();
    let tiers = manager.tiers();
    let _ = writeln!(out, "{}", line(manager, "kubepods", &tiers.kubepods));
    let pods: Vec<_> = manager.pod_views().collect();
    for (label, tier) in [
        ("guaranteed pods", &tiers.kubepods),
        ("burstable", &tiers.burstable),
        ("besteffort", &tiers.besteffort),
    ] {
        if tier != &tiers.kubepods {
            let _ = writeln!(out, "  {}", line(manager, label, tier));
        }
        for view in pods
            .iter()
            .filter(|v| v.cgroup.parent().as_ref() == Some(tier))
        {
            let indent = if tier == &tiers.kubepods {
                "  "
            } else {
                "    "
            };
            let title = format!(
                "pod {} [{}] {} (from {})",
                view.pod.full_name(),
                view.qos,
                view.phase,
                view.file.display()
            );
            let _ = writeln!(out, "{indent}{}", line(manager, &title, view.cgroup));
            for container in view.pod.spec.all_containers() {
                let Ok(cgroup) = view.cgroup.child(&container.name) else {
                    continue;
                };
                let state = match manager.container_state(view.uid, &container.name) {
                    Some((ContainerState::Running { pid }, restarts)) => {
                        format!("running pid {pid}, {restarts} restarts")
                    }
                    Some((ContainerState::Terminated { exit_code }, _)) => {
                        format!("terminated ({exit_code})")
                    }
                    Some((ContainerState::Waiting { last_exit, .. }, restarts)) => {
                        format!("waiting to restart (exit {last_exit}, {restarts} restarts)")
                    }
                    Some((ContainerState::Stopping { pid, .. }, _)) => {
                        format!("stopping pid {pid}")
                    }
                    Some((ContainerState::StartFailed { error, .. }, _)) => {
                        format!("start failed: {error}")
                    }
                    None => "not started".to_owned(),
                };
                let _ = writeln!(
                    out,
                    "{indent}  {}",
                    line(
                        manager,
                        &format!("container {} ({state})", container.name),
                        &cgroup
                    )
                );
            }
        }
    }
    if let Some(log) = manager.feedback_log() {
        let decisions = log.render();
        let _ = writeln!(out, "feedback decisions ({}):", log.iter().count());
        out.push_str(&decisions);
    }
    out
}

/// `title  path  file=value ...  procs=N`.
fn line(manager: &ContainerManager, title: &str, name: &CgroupName) -> String {
    let driver = manager.cgroup_driver();
    let path = driver.name(name).unwrap_or_else(|_| name.to_cgroupfs());
    let mut text = format!("{title}  {path}");
    if let Ok(dirs) = driver.paths(name) {
        for (controller, file) in LIMIT_FILES {
            if let Some(value) = dirs
                .get(controller)
                .and_then(|d| std::fs::read_to_string(d.join(file)).ok())
            {
                let _ = write!(text, "  {file}={}", value.trim());
            }
        }
    }
    match driver.pids(name) {
        Ok(pids) => {
            let _ = write!(text, "  procs={}", pids.len());
        }
        Err(_) => text.push_str("  (missing)"),
    }
    text
}
