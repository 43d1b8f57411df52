//! `qosd check`: a report of what this node offers qosd: cgroup layout and mounts, kernel
//! version, BTF, attach types, and the mode each probe will use (found by really loading and
//! attaching it, then detaching).
use std::fmt::Write as _;

use crate::cgroup::CgroupLayout;
use crate::feedback;
use crate::numa::{NodeLayout, NumaMemoryReader};
use crate::probes::btf::KernelBtf;
use crate::probes::features::KernelFeatures;
use crate::probes::numa::{self as numa_probe, NumaProbe};
use crate::probes::sched_switch::{ModePreference, SwitchProbe};
use crate::probes::{ProbeMode, btf::VMLINUX_BTF};
use crate::probes::{cpu_time, runqlat, throttle};

/// Builds the report text. Never fails: every problem becomes a line of the report.
#[must_use]
pub fn report() -> String {
    let mut out = String::new();
    let features = KernelFeatures::detect();
    let _ = writeln!(out, "kernel            {}", features.release);
    let layout = CgroupLayout::detect();
    match &layout {
        Ok(layout) => {
            let _ = writeln!(out, "cgroup layout     {}", layout.kind);
            if let Some(unified) = &layout.unified {
                let _ = writeln!(out, "  cgroup2         {}", unified.display());
            }
            for (controller, mount) in &layout.v1 {
                let _ = writeln!(out, "  v1 {controller:<12} {}", mount.display());
            }
        }
        Err(e) => {
            let _ = writeln!(out, "cgroup layout     unknown ({e})");
        }
    }
    systemd_line(&mut out);
    let _ = writeln!(out, "BTF               {} ({VMLINUX_BTF})", features.btf);
    let _ = writeln!(out, "fentry            {}", features.fentry);
    let _ = writeln!(out, "kprobes           {}", features.kprobes);
    match crate::probes::fault::active() {
        Ok(faults) if faults.any() => {
            let _ = writeln!(
                out,
                "test faults       {} set, never on a production node: {faults:?}",
                crate::probes::fault::FAULTS_VAR
            );
        }
        Ok(_) => {}
        Err(e) => {
            let _ = writeln!(out, "test faults       {e}");
        }
    }
    let _ = writeln!(out, "probes");
    let v1_cpu = layout
        .as_ref()
        .is_ok_and(CgroupLayout::uses_v1_cpu_controller);
    let attribution = if v1_cpu {
        "task's v1 cpu controller cgroup"
    } else {
        "task's cgroup v2 id"
    };
    match SwitchProbe::attach(v1_cpu, ModePreference::Auto) {
        Ok(probe) => {
            let _ = writeln!(
                out,
                "  {:<15} {:<15} sched_switch; per cgroup by {attribution}, from se.sum_exec_runtime",
                cpu_time::PROBE_NAME,
                probe.mode().to_string()
            );
            for (mode, why) in probe.refused_modes() {
                let _ = writeln!(out, "  {:<15} (not {}: {why})", "", mode.label());
            }
            let _ = writeln!(
                out,
                "  {:<15} {:<15} sched_switch (the same handler); waits from the kernel's {}",
                runqlat::PROBE_NAME,
                probe.runq_mode().to_string(),
                runqlat::WAIT_SOURCE
            );
            let _ = writeln!(
                out,
                "  {:<15} {} throttle_cfs_rq (fexit), unthrottle_cfs_rq (fentry)",
                throttle::PROBE_NAME,
                probe.throttle_mode()
            );
        }
        Err(e) => {
            let mode = ProbeMode::Unavailable(e.to_string());
            for name in [
                cpu_time::PROBE_NAME,
                runqlat::PROBE_NAME,
                throttle::PROBE_NAME,
            ] {
                let _ = writeln!(out, "  {name:<15} {mode}");
            }
        }
    }
    let _ = writeln!(
        out,
        "  {:<15} {:<15} cpu.stat nr_periods, nr_throttled, throttled time of cgroups with a quota",
        "cpu_throttling", "cgroupfs"
    );
    numa_lines(&mut out, layout.as_ref().ok(), v1_cpu);
    feedback_lines(&mut out);
    out
}

/// Whether `cgroupDriver: systemd` can work here: systemd is PID 1 and answers on the system
/// bus (qosd asks it for every slice and scope, and beside kubelet for the interventions).
fn systemd_line(out: &mut String) {
    use crate::cgroup::systemd::{UnitManager as _, bus::SystemdBus};
    let line = if std::path::Path::new("/run/systemd/system").is_dir() {
        match SystemdBus::connect(std::time::Duration::from_secs(5)) {
            Ok(bus) => format!(
                "systemd {} on the system bus: cgroupDriver systemd available",
                bus.version()
            ),
            Err(e) => format!(
                "PID 1, not reachable ({e}): cgroupDriver systemd fails to start, and beside kubelet interventions go to cgroupfs only"
            ),
        }
    } else {
        "not PID 1 (no /run/systemd/system): cgroupDriver systemd unavailable".to_owned()
    };
    let _ = writeln!(out, "systemd           {line}");
}

/// What the feedback policies can write on this kernel: the kernel structures behind CFS burst
/// and idle groups, from BTF (the running manager checks the files themselves).
fn feedback_lines(out: &mut String) {
    let btf = KernelBtf::from_running_kernel();
    let has = |strukt: &str, member: &str| match &btf {
        Ok(btf) => btf.member_offset(strukt, member).is_ok(),
        Err(_) => false,
    };
    let yes_no = |present: bool| if present { "yes" } else { "no" };
    let burst = has("cfs_bandwidth", "burst");
    let idle = has("task_group", "idle");
    let _ = writeln!(out, "feedback");
    let _ = writeln!(
        out,
        "  {:<15} CFS burst {} (cpu.cfs_burst_us / cpu.max.burst, Linux 5.14+)",
        feedback::burst::POLICY,
        yes_no(burst)
    );
    let how = if idle {
        "CFS quota cap and idle group (cpu.idle)"
    } else {
        "CFS quota cap only (no cpu.idle before Linux 5.15)"
    };
    let _ = writeln!(out, "  {:<15} {how}", feedback::besteffort::POLICY);
    let nodes = NodeLayout::read_system()
        .map(|l| l.nodes().len())
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "  {:<15} {nodes} NUMA node(s){}",
        feedback::numa_align::POLICY,
        if nodes < 2 {
            ": nothing to realign"
        } else {
            ""
        }
    );
}

/// The NUMA probes, each with its mode, and the NUMA layout they were given.
fn numa_lines(out: &mut String, layout: Option<&CgroupLayout>, v1_cpu: bool) {
    let balancing = match numa_probe::numa_balancing() {
        Some(true) => "kernel.numa_balancing on".to_owned(),
        Some(false) => "kernel.numa_balancing off: no hinting faults are taken".to_owned(),
        None => format!("{} missing", numa_probe::NUMA_BALANCING_SYSCTL),
    };
    let read = NodeLayout::read_system();
    let attached = match &read {
        Ok(nodes) => NumaProbe::attach(v1_cpu, false, nodes).map_err(|e| e.to_string()),
        Err(e) => Err(format!("NUMA layout: {e}")),
    };
    match attached {
        Ok(probe) => {
            let nodes = probe.layout();
            let _ = writeln!(
                out,
                "  {:<15} {:<15} task_numa_fault; memory node vs the faulting CPU's node; {balancing}",
                numa_probe::HINT_FAULT_PROBE,
                probe.hint_fault_mode().to_string()
            );
            let ranges = match (nodes.range_source(), probe.page_alloc_format()) {
                (Some(source), Some(format)) => format!(
                    "; {} page-frame ranges from {source}; pfn at +{}, order at +{}",
                    nodes.ranges().len(),
                    format.pfn,
                    format.order
                ),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  {:<15} {:<15} kmem:mm_page_alloc; page node vs the allocating CPU's node{ranges}",
                numa_probe::PAGE_ALLOC_PROBE,
                probe.page_alloc_mode().to_string()
            );
            let _ = writeln!(
                out,
                "  {:<15} {:<15} sched_migrate_task; source vs destination CPU's node; {} nodes",
                numa_probe::MIGRATION_PROBE,
                probe.migration_mode().to_string(),
                nodes.nodes().len()
            );
            for (mode, why) in probe.migration_refused() {
                let _ = writeln!(out, "  {:<15} (not {}: {why})", "", mode.label());
            }
        }
        Err(e) => {
            let mode = ProbeMode::Unavailable(e);
            for probe in [
                numa_probe::HINT_FAULT_PROBE,
                numa_probe::PAGE_ALLOC_PROBE,
                numa_probe::MIGRATION_PROBE,
            ] {
                let _ = writeln!(out, "  {probe:<15} {mode}");
            }
        }
    }
    let memory = match read {
        Ok(nodes) => match layout.and_then(|l| NumaMemoryReader::for_layout(l, nodes)) {
            Some(_) => "memory.numa_stat against the nodes of cpuset.cpus.effective".to_owned(),
            None => "unavailable (no memory controller mounted)".to_owned(),
        },
        Err(e) => format!("unavailable ({e})"),
    };
    let _ = writeln!(out, "  {:<15} {:<15} {memory}", "numa_memory", "cgroupfs");
    let _ = writeln!(
        out,
        "  {:<15} {:<15} remote-DRAM PMU events are not used (see docs/architecture.md)",
        "numa_pmu", "none"
    );
}
