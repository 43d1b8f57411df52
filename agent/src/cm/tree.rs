//! The text tree `qosd inspect` prints: QoS tiers, pods, containers, their cgroup paths, the
//! limits in effect (read back from cgroupfs, not from the desired state) and process counts;
//! then the feedback's decisions, when it runs.
use std::fmt::Write as _;

use crate::cgroup::files::Setting;
use crate::cgroup::name::CgroupName;
use crate::runtime::supervisor::ContainerState;

use super::manager::ContainerManager;

/// Limits shown, each under its file name in the cgroup version at hand (when it exists).
const LIMITS: &[Setting] = &[
    Setting::CpuShares,
    Setting::CpuQuota,
    Setting::CpuBurst,
    Setting::CpuIdle,
    Setting::MemoryLimit,
    Setting::MemoryMin,
    Setting::CpusetCpus,
    Setting::CpusetMems,
    Setting::PidsLimit,
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
                view.origin
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
    for setting in LIMITS {
        if let Ok(Some((file, value))) = driver.setting(name, *setting) {
            let _ = write!(text, "  {file}={value}");
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
