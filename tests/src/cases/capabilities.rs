//! The capabilities `deploy/README.md` lists for the DaemonSet, against the running kernel: qosd
//! started as uid 0 with every other capability gone (dropped from the bounding set, the
//! inheritable and the ambient sets before the exec, so the kernel gives it exactly the list;
//! its `CapEff` is checked), and its probes compared with an unrestricted run (the list is
//! complete). Then each listed capability is taken away alone and what the probes lose is
//! reported. `CAP_SYS_ADMIN` also grants what `bpf(2)` and `perf_event_open(2)` ask of `BPF`
//! and `PERFMON`, so those two are shown needed by taking each away together with `SYS_ADMIN`:
//! a probe must lose its mode. `SYS_ADMIN` itself mounts tracefs where the host has not (the
//! kernel-surprises case shows it) and serves BPF on kernels before 5.8; `SYS_RESOURCE` raises
//! `RLIMIT_MEMLOCK` for the maps on kernels before 5.11. The result says what each one's absence
//! changed here.
//!
//! What a probes-only run does not exercise is measured with helper processes holding exactly
//! the list ([`privileged_paths`]): kubelet's checkpoints (root's files, mode 0600, in a 0700
//! directory) are read without any DAC capability, and qosd's page migration of a pod's process
//! of another user is refused with the list and allowed with `SYS_PTRACE` added (the kernel
//! applies ptrace's access rule to `migrate_pages(2)`), not with `SYS_NICE` (needed only to
//! move pages outside the task's cpuset, which qosd never does: it narrows `cpuset.mems`
//! first). The DaemonSet runs the feedback in dry-run and so lists neither; `--feedback on`
//! needs `SYS_PTRACE` added on kernels that do not move pages on a `cpuset.mems` write.
use std::collections::BTreeSet;
use std::time::Duration;

use crate::agent::{Agent, Launch, last_capability, probe_info_modes};
use crate::harness::{Context, Outcome, fail};

/// `deploy/README.md`'s list (capability numbers of linux/capability.h).
const LISTED: [(u32, &str); 4] = [
    (CAP_BPF, "BPF"),
    (CAP_PERFMON, "PERFMON"),
    (CAP_SYS_ADMIN, "SYS_ADMIN"),
    (CAP_SYS_RESOURCE, "SYS_RESOURCE"),
];
const CAP_DAC_READ_SEARCH: u32 = 2;
pub(super) const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_NICE: u32 = 23;
const CAP_SYS_RESOURCE: u32 = 24;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
/// Capabilities whose absence (with `SYS_ADMIN`'s, which covers them) must cost a probe.
const NEEDED_BY_PROBES: [u32; 2] = [CAP_BPF, CAP_PERFMON];

/// The case.
pub(crate) fn listed_capabilities_suffice(ctx: &Context) -> Outcome {
    match run(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// (probe, mode) pairs qosd reports live.
type Modes = BTreeSet<(String, String)>;

fn run(ctx: &Context) -> Result<String, String> {
    let last_cap = last_capability()?;
    if last_cap < CAP_BPF {
        return Err(format!(
            "this kernel knows capabilities up to {last_cap}: no CAP_BPF (Linux 5.8+)"
        ));
    }
    // A capability outside this process's own bounding set cannot be given to qosd here (this
    // development machine's session lacks SYS_RESOURCE): it is left out of every run, named.
    let (listed, unavailable) = listed_here()?;
    let privileged = privileged_paths(ctx, &listed)?;
    let all = probe_modes(ctx, None)?.1;
    let (effective, with_list, log) = probe_modes(ctx, Some(&listed))?;
    let want: u64 = listed.iter().map(|cap| 1u64 << cap).sum();
    if effective != want {
        return Err(format!(
            "qosd ran with CapEff {effective:#x}, not the list's {want:#x}: the case could not limit it"
        ));
    }
    if with_list != all {
        return Err(format!(
            "with the listed capabilities the probes differ from an unrestricted run: {} instead of {}\n{log}",
            show(&with_list),
            show(&all)
        ));
    }
    let non_root = as_another_user(ctx, &listed, &with_list)?;
    let lost_without = |removed: &[u32]| -> Result<Vec<String>, String> {
        let without: Vec<u32> = listed
            .iter()
            .copied()
            .filter(|c| !removed.contains(c))
            .collect();
        let (_, modes, _) = probe_modes(ctx, Some(&without))?;
        Ok(with_list
            .difference(&modes)
            .map(|(probe, mode)| format!("{probe} {mode}"))
            .collect())
    };
    let mut report = Vec::new();
    if !unavailable.is_empty() {
        report.push(format!(
            "not in this machine's bounding set, so in no run here: {}",
            unavailable.join(", ")
        ));
    }
    for (cap, name) in LISTED {
        if !listed.contains(&cap) {
            continue;
        }
        let lost = lost_without(&[cap])?;
        report.push(if lost.is_empty() {
            format!("without {name} alone: no probe changed")
        } else {
            format!("without {name} alone: lost {}", lost.join(", "))
        });
    }
    for cap in NEEDED_BY_PROBES {
        let name = LISTED
            .iter()
            .find(|(c, _)| *c == cap)
            .map_or("?", |(_, n)| *n);
        let lost = lost_without(&[cap, CAP_SYS_ADMIN])?;
        if lost.is_empty() {
            return Err(format!(
                "without {name} and SYS_ADMIN every probe kept its mode ({}): {name} is not needed here",
                show(&with_list)
            ));
        }
        report.push(format!(
            "without {name} and SYS_ADMIN: lost {}",
            lost.join(", ")
        ));
    }
    Ok(format!(
        "CapEff {want:#x} (the list): the same probe modes as unrestricted ({}); {}; {privileged}; {non_root}",
        show(&with_list),
        report.join("; ")
    ))
}

fn show(modes: &Modes) -> String {
    modes
        .iter()
        .map(|(probe, mode)| format!("{probe}={mode}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the probes do not exercise, measured with helper processes (this binary's
/// `read-file` and `migrate-pages`) holding exactly the capabilities given: reading kubelet's
/// checkpoints (a root-owned 0600 file in a 0700 directory) and a file of another owner, and
/// qosd's page migration (`numa::migrate::move_pages_to`, the feedback's `numa_align`) of a
/// process of another user (uid 65534, as pods' processes usually are).
fn privileged_paths(ctx: &Context, listed: &[u32]) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let with = |add: &[u32]| -> Vec<u32> { listed.iter().chain(add).copied().collect() };
    let allowed = |keep: &[u32], args: &[&str]| -> Result<(bool, String), String> {
        let mut command = std::process::Command::new(&ctx.self_exe);
        command.args(args);
        Launch {
            keep: Some(keep),
            ..Launch::default()
        }
        .configure(&mut command)?;
        let out = command.output().map_err(|e| format!("{args:?}: {e}"))?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        ))
    };

    // kubelet's checkpoints: root's files in root's 0700 directory.
    let dir = std::env::temp_dir().join(format!("qosd-systest-kubelet-{}", std::process::id()));
    let _cleanup = crate::pod_tree::TempPaths(vec![dir.clone()]);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let set_mode = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    set_mode(&dir, 0o700)?;
    let checkpoint = dir.join("cpu_manager_state");
    std::fs::write(&checkpoint, "{}").map_err(|e| format!("{}: {e}", checkpoint.display()))?;
    set_mode(&checkpoint, 0o600)?;
    let checkpoint_text = checkpoint.display().to_string();
    let (read, why) = allowed(listed, &["read-file", &checkpoint_text])?;
    if !read {
        return Err(format!(
            "with the list, a root-owned 0600 checkpoint in a 0700 directory is unreadable: {why}"
        ));
    }
    // A file of another owner: what DAC_READ_SEARCH would add, and the list does not need.
    let foreign = std::env::temp_dir().join(format!("qosd-systest-foreign-{}", std::process::id()));
    let _cleanup_foreign = crate::pod_tree::TempPaths(vec![foreign.clone()]);
    std::fs::write(&foreign, "x").map_err(|e| format!("{}: {e}", foreign.display()))?;
    set_mode(&foreign, 0o600)?;
    std::os::unix::fs::chown(&foreign, Some(65534), Some(65534))
        .map_err(|e| format!("chown {}: {e}", foreign.display()))?;
    let foreign_text = foreign.display().to_string();
    let (foreign_read, _) = allowed(listed, &["read-file", &foreign_text])?;
    let (foreign_with_dac, why) =
        allowed(&with(&[CAP_DAC_READ_SEARCH]), &["read-file", &foreign_text])?;
    if foreign_read || !foreign_with_dac {
        return Err(format!(
            "another owner's 0600 file: read with the list {foreign_read}, with DAC_READ_SEARCH added {foreign_with_dac} ({why}); want false, true: the capability limits did not hold"
        ));
    }

    // Page migration of another user's process: the system's `sleep` (this binary may lie in
    // a directory uid 65534 cannot enter, such as the CI's cache under /root). `spawn` returns
    // once the exec is done.
    let mut sleeper = std::process::Command::new("sleep");
    sleeper.arg("120").uid(65534).gid(65534);
    let target = KillOnDrop(
        sleeper
            .spawn()
            .map_err(|e| format!("starting a uid 65534 sleep: {e}"))?,
    );
    let pid = target.0.id().to_string();
    let migrate = |keep: &[u32]| allowed(keep, &["migrate-pages", &pid]);
    let (with_list, refusal) = migrate(listed)?;
    let (with_nice, _) = migrate(&with(&[CAP_SYS_NICE]))?;
    let (with_ptrace, why) = migrate(&with(&[CAP_SYS_PTRACE]))?;
    if with_list || with_nice || !with_ptrace {
        return Err(format!(
            "migrate_pages of a uid 65534 process: with the list {with_list} ({refusal}), with SYS_NICE added {with_nice}, with SYS_PTRACE added {with_ptrace} ({why}); want false, false, true"
        ));
    }
    Ok(format!(
        "kubelet's checkpoint (root, 0600, in a 0700 directory) read with the list, no DAC capability needed (another owner's file needs DAC_READ_SEARCH); migrate_pages of a uid 65534 process refused with the list ({refusal}) and with SYS_NICE added, done with SYS_PTRACE added ({why})"
    ))
}

/// qosd as uid 65534 instead of root, with the list as its ambient capabilities, against
/// `as_root`, the probes of root with the list: what a non-root DaemonSet would lose, and
/// whether adding `DAC_READ_SEARCH` gives it back (the DaemonSet runs as uid 0 with no DAC
/// capability).
fn as_another_user(ctx: &Context, listed: &[u32], as_root: &Modes) -> Result<String, String> {
    let want: u64 = listed.iter().map(|cap| 1u64 << cap).sum();
    // qosd may lie in a directory uid 65534 cannot enter (the CI's cache under /root): it runs
    // from a link in a directory anyone can enter.
    let (qosd, _link) = reachable_by_anyone(&ctx.qosd)?;
    let ctx = &Context {
        qosd,
        self_exe: ctx.self_exe.clone(),
        skip_all: None,
    };
    let launch = Launch {
        keep: Some(listed),
        uid: Some(65534),
        ..Launch::default()
    };
    let (effective, modes, log) = probe_modes_launched(ctx, &launch)?;
    if effective != want {
        return Err(format!(
            "qosd as uid 65534 ran with CapEff {effective:#x}, not the list's {want:#x}\n{log}"
        ));
    }
    let lost: Vec<String> = as_root
        .difference(&modes)
        .map(|(probe, mode)| format!("{probe} {mode}"))
        .collect();
    let with_dac: Vec<u32> = listed
        .iter()
        .copied()
        .chain([CAP_DAC_READ_SEARCH])
        .collect();
    let launch = Launch {
        keep: Some(&with_dac),
        uid: Some(65534),
        ..Launch::default()
    };
    let (_, with_dac_modes, log) = probe_modes_launched(ctx, &launch)?;
    if &with_dac_modes != as_root {
        return Err(format!(
            "as uid 65534 with the list and DAC_READ_SEARCH the probes are {}, not root's {}\n{log}",
            show(&with_dac_modes),
            show(as_root)
        ));
    }
    Ok(if lost.is_empty() {
        "as uid 65534 with the list: no probe changed".to_owned()
    } else {
        format!(
            "as uid 65534 with the list: lost {}, given back by DAC_READ_SEARCH",
            lost.join(", ")
        )
    })
}

/// `program` at a path any user can reach: a hard link (or, across file systems, a copy) in a
/// new 0755 directory under the temporary directory, removed with the returned guard.
fn reachable_by_anyone(
    program: &std::path::Path,
) -> Result<(std::path::PathBuf, crate::pod_tree::TempPaths), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("qosd-systest-bin-{}", std::process::id()));
    let guard = crate::pod_tree::TempPaths(vec![dir.clone()]);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let link = dir.join("qosd");
    if std::fs::hard_link(program, &link).is_err() {
        std::fs::copy(program, &link)
            .map_err(|e| format!("copying {} to {}: {e}", program.display(), link.display()))?;
    }
    Ok((link, guard))
}

/// A child killed when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The listed capabilities this process can give (its bounding set has them), and the names
/// of those it cannot.
pub(super) fn listed_here() -> Result<(Vec<u32>, Vec<&'static str>), String> {
    let bounding = own_bounding_set()?;
    let unavailable = LISTED
        .iter()
        .filter(|(cap, _)| bounding & (1 << cap) == 0)
        .map(|(_, name)| *name)
        .collect();
    let listed = LISTED
        .iter()
        .map(|(cap, _)| *cap)
        .filter(|cap| bounding & (1 << cap) != 0)
        .collect();
    Ok((listed, unavailable))
}

/// This process's bounding set (`CapBnd` in `/proc/self/status`).
fn own_bounding_set() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("/proc/self/status: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| "no CapBnd in /proc/self/status".to_owned())
}

/// Runs qosd (probes only) with exactly `keep` (`None`: unrestricted) until it serves; its
/// effective capabilities and the probes' live modes.
fn probe_modes(ctx: &Context, keep: Option<&[u32]>) -> Result<(u64, Modes, String), String> {
    let launch = Launch {
        keep,
        ..Launch::default()
    };
    probe_modes_launched(ctx, &launch)
}

/// [`probe_modes`] for qosd started as `launch` says.
fn probe_modes_launched(
    ctx: &Context,
    launch: &Launch<'_>,
) -> Result<(u64, Modes, String), String> {
    let agent = Agent::start_launched(&ctx.qosd, &[], launch, Duration::from_secs(120))?;
    let pid = agent.pid().ok_or("qosd has no pid")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or("no CapEff in /proc/<pid>/status")?;
    let text = agent.scrape()?;
    let modes = probe_info_modes(&text);
    Ok((effective, modes, agent.log_tail()))
}

#[cfg(test)]
mod tests {
    use super::LISTED;

    /// The capabilities the DaemonSet adds, in its order.
    fn daemonset_capabilities() -> Vec<String> {
        let yaml = include_str!("../../../deploy/daemonset.yaml");
        let mut lines = yaml.lines().skip_while(|l| l.trim() != "add:").skip(1);
        let mut names = Vec::new();
        for line in lines.by_ref() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            match line.strip_prefix("- ") {
                Some(name) => names.push(name.to_owned()),
                None => break,
            }
        }
        names
    }

    #[test]
    fn the_case_tests_the_daemonsets_list() {
        let listed: Vec<String> = LISTED.iter().map(|(_, n)| (*n).to_owned()).collect();
        assert_eq!(daemonset_capabilities(), listed);
    }
}
