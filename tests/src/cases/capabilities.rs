//! The capabilities `deploy/README.md` lists for the DaemonSet, against the running kernel: qosd
//! started as uid 0 with every other capability gone (dropped from the bounding set, the
//! inheritable and the ambient sets before the exec, so the kernel gives it exactly the list;
//! its `CapEff` is checked), and its probes compared with an unrestricted run (the list is
//! complete). Then each listed capability is taken away alone and what the probes lose is
//! reported. `CAP_SYS_ADMIN` also grants what `bpf(2)` and `perf_event_open(2)` ask of `BPF`
//! and `PERFMON`, so those two are shown needed by taking each away together with `SYS_ADMIN`:
//! a probe must lose its mode. `SYS_ADMIN` itself (mounting tracefs where the host has not, BPF
//! on kernels before 5.8), `SYS_NICE` (`migrate_pages(2)` of the feedback) and
//! `DAC_READ_SEARCH` (kubelet's checkpoints) serve what a probes-only run does not exercise;
//! `SYS_RESOURCE` raises `RLIMIT_MEMLOCK` for the maps on kernels before 5.11. The result says
//! what each one's absence changed here.
use std::collections::BTreeSet;
use std::time::Duration;

use crate::agent::{Agent, last_capability, samples};
use crate::harness::{Context, Outcome, fail};

/// `deploy/README.md`'s list (capability numbers of linux/capability.h).
const LISTED: [(u32, &str); 6] = [
    (CAP_BPF, "BPF"),
    (CAP_PERFMON, "PERFMON"),
    (CAP_SYS_ADMIN, "SYS_ADMIN"),
    (CAP_SYS_NICE, "SYS_NICE"),
    (CAP_DAC_READ_SEARCH, "DAC_READ_SEARCH"),
    (CAP_SYS_RESOURCE, "SYS_RESOURCE"),
];
const CAP_DAC_READ_SEARCH: u32 = 2;
pub(super) const CAP_SYS_ADMIN: u32 = 21;
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
                "without {name} and SYS_ADMIN every probe kept its mode: {name} is not needed here"
            ));
        }
        report.push(format!(
            "without {name} and SYS_ADMIN: lost {}",
            lost.join(", ")
        ));
    }
    Ok(format!(
        "CapEff {want:#x} (the list): the same probe modes as unrestricted ({}); {}",
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
    let agent = Agent::start_limited(&ctx.qosd, keep, Duration::from_secs(120))?;
    let pid = agent.pid().ok_or("qosd has no pid")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or("no CapEff in /proc/<pid>/status")?;
    let text = agent.scrape()?;
    let modes = samples(&text, "qosd_probe_info")
        .into_iter()
        .filter(|(_, value)| *value == 1.0)
        .filter_map(|(labels, _)| {
            let get = |key: &str| {
                labels
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.clone())
            };
            Some((get("probe")?, get("mode")?))
        })
        .collect();
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
