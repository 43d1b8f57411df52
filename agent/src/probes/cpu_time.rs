//! The cpu-time probe: on-CPU nanoseconds per cgroup, counted in the kernel on sched_switch
//! from the scheduler's own per-task accounting (`se.sum_exec_runtime`), into the cgroup's
//! counter slot ([`super::slots`]) or, before it has one, a per-CPU hash.
//!
//! Load order: offsets from BTF are written into the object's global, then the sched_switch
//! handler is attached as `tp_btf` if the kernel allows it, as `raw_tracepoint` otherwise. The
//! chosen mode and the reasons for every refused mode are kept for `check` and the metrics.
use std::collections::HashMap;

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::{BtfTracePoint, RawTracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use qosd_common::{KernelOffsets, MAX_SLOTS, ProbeStats, RunningTask, names};

use super::btf::{BtfError, KernelBtf};
use super::slots::{self, SlotError, SlotTable};
use super::{EBPF_OBJECT, ProbeMode, error_chain, program_as};

/// The pid namespace of the host (`PROC_PID_INIT_INO`): only there do the kernel's task ids
/// the programs record name the same tasks in `/proc`.
const INIT_PID_NS_INODE: u64 = 0xEFFF_FFFC;

/// The probe's name in `qosd check` and in `qosd_probe_info{probe}`.
pub const PROBE_NAME: &str = "cpu_time";

/// The tracepoint both program flavours attach to.
const TRACEPOINT: &str = "sched_switch";

/// Errors of the cpu-time probe.
#[derive(Debug, thiserror::Error)]
pub enum CpuTimeError {
    #[error("the kernel object is empty: this qosd was built with AYA_BUILD_SKIP=1")]
    EmptyObject,
    #[error("reading kernel struct offsets: {0}")]
    Offsets(#[from] BtfError),
    #[error("loading the kernel object: {0}")]
    Load(String),
    #[error("no attach mode worked: {0}")]
    NoMode(String),
    #[error("map {map}: {detail}")]
    Map { map: &'static str, detail: String },
    #[error("counter slots: {0}")]
    Slots(#[from] SlotError),
}

/// One reading of the probe's maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTimeSample {
    /// cgroup id -> nanoseconds on CPU, including the slices running right now.
    pub nanos_by_cgroup: HashMap<u64, u64>,
    /// Health counters summed over CPUs.
    pub stats: ProbeStats,
    /// Entries in the per-cgroup map.
    pub map_entries: usize,
    /// Counter slots assigned.
    pub slots_used: usize,
}

/// A loaded and attached cpu-time probe. Dropping it detaches and unloads the programs.
pub struct CpuTimeProbe {
    ebpf: Ebpf,
    mode: ProbeMode,
    refused: Vec<(ProbeMode, String)>,
    slots: SlotTable,
    /// Whether `/proc/<pid>` names the tasks the programs record (qosd shares the host's pid
    /// namespace), so the slices in progress can be read from `/proc/<pid>/schedstat`.
    host_pids: bool,
}

/// Which attach modes to try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModePreference {
    /// tp_btf, falling back to raw_tracepoint.
    #[default]
    Auto,
    /// Only tp_btf.
    TpBtf,
    /// Only raw_tracepoint (what kernels without BTF-typed tracepoints get).
    RawTracepoint,
}

impl CpuTimeProbe {
    /// Loads the object with offsets for the running kernel and attaches the first mode of
    /// `preference` the kernel accepts. `v1_cpu` selects attribution through the v1 cpu
    /// controller (v1 and hybrid hosts).
    pub fn attach(v1_cpu: bool, preference: ModePreference) -> Result<Self, CpuTimeError> {
        if EBPF_OBJECT.is_empty() {
            return Err(CpuTimeError::EmptyObject);
        }
        let offsets = KernelBtf::from_running_kernel()?.kernel_offsets(v1_cpu)?;
        Self::attach_with_offsets(offsets, preference)
    }

    fn attach_with_offsets(
        offsets: KernelOffsets,
        preference: ModePreference,
    ) -> Result<Self, CpuTimeError> {
        let mut loader = EbpfLoader::new();
        loader.override_global(names::OFFSETS_GLOBAL, &offsets, true);
        super::shrink_unused_maps(&mut loader, super::Loader::CpuTime);
        let mut ebpf = loader
            .load(EBPF_OBJECT)
            .map_err(|e| CpuTimeError::Load(error_chain(&e)))?;
        let candidates: &[ProbeMode] = match preference {
            ModePreference::Auto => &[ProbeMode::TpBtf, ProbeMode::RawTracepoint],
            ModePreference::TpBtf => &[ProbeMode::TpBtf],
            ModePreference::RawTracepoint => &[ProbeMode::RawTracepoint],
        };
        let mut refused = Vec::new();
        let mut chosen = None;
        for candidate in candidates {
            let attached = if *candidate == ProbeMode::TpBtf {
                attach_tp_btf(&mut ebpf)
            } else {
                attach_raw_tp(&mut ebpf)
            };
            match attached {
                Ok(()) => {
                    chosen = Some(candidate.clone());
                    break;
                }
                Err(reason) => refused.push((candidate.clone(), reason)),
            }
        }
        let Some(mode) = chosen else {
            let all = refused
                .iter()
                .map(|(mode, why)| format!("{}: {why}", mode.label()))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(CpuTimeError::NoMode(all));
        };
        tracing::info!(
            probe = PROBE_NAME,
            mode = mode.label(),
            ?offsets,
            "probe attached"
        );
        for (m, why) in &refused {
            tracing::info!(probe = PROBE_NAME, mode = m.label(), reason = %why, "mode refused by the kernel");
        }
        let host_pids = in_host_pid_namespace();
        if !host_pids {
            tracing::info!(
                probe = PROBE_NAME,
                "not in the host's pid namespace: readings leave out the slices in progress until they end"
            );
        }
        Ok(Self {
            ebpf,
            mode,
            refused,
            slots: SlotTable::new(MAX_SLOTS),
            host_pids,
        })
    }

    /// The attach mode in use.
    #[must_use]
    pub fn mode(&self) -> &ProbeMode {
        &self.mode
    }

    /// Modes tried before the one in use, with the kernel's reasons.
    #[must_use]
    pub fn refused_modes(&self) -> &[(ProbeMode, String)] {
        &self.refused
    }

    /// Reads every counter: the hash's and the slots', added, plus the slices running right
    /// now (how far each running task's `sum_exec_runtime` has grown since it was switched
    /// in), so a busy task that has not been switched out yet is counted too. Cgroups found in
    /// the hash without a slot get one first.
    pub fn sample(&mut self) -> Result<CpuTimeSample, CpuTimeError> {
        let totals = self.per_cgroup_map()?;
        let mut nanos_by_cgroup = HashMap::new();
        let mut map_entries = 0;
        for entry in totals.iter() {
            let (cgroup_id, per_cpu) = entry.map_err(|e| map_error(names::CPU_TIME_MAP, &e))?;
            map_entries += 1;
            nanos_by_cgroup.insert(
                cgroup_id,
                per_cpu.iter().copied().fold(0u64, u64::saturating_add),
            );
        }
        slots::assign(
            &mut self.ebpf,
            &mut self.slots,
            nanos_by_cgroup.keys().copied(),
            names::CPU_TIME_SLOTS_MAP,
            0u64,
        )?;
        for (cgroup_id, slot) in self.slots.assigned() {
            let per_cpu = slots::read::<u64>(&self.ebpf, names::CPU_TIME_SLOTS_MAP, slot)?;
            let total = nanos_by_cgroup.entry(cgroup_id).or_default();
            *total = per_cpu.iter().copied().fold(*total, u64::saturating_add);
        }

        if self.host_pids {
            let running: PerCpuArray<&MapData, RunningTask> = self.map(names::RUNNING_MAP)?;
            let on_cpus = running
                .get(&0, 0)
                .map_err(|e| map_error(names::RUNNING_MAP, &e))?;
            for task in on_cpus.iter().filter(|t| t.pid != 0 && t.cgroup_id != 0) {
                if let Some(runtime) = task_runtime_ns(task.pid)
                    && runtime > task.start_runtime_ns
                {
                    *nanos_by_cgroup.entry(task.cgroup_id).or_default() +=
                        runtime - task.start_runtime_ns;
                }
            }
        }
        nanos_by_cgroup.retain(|_, ns| *ns != 0);

        let stats_map: PerCpuArray<&MapData, ProbeStats> = self.map(names::STATS_MAP)?;
        let per_cpu = stats_map
            .get(&0, 0)
            .map_err(|e| map_error(names::STATS_MAP, &e))?;
        let stats = per_cpu
            .iter()
            .fold(ProbeStats::default(), |acc, s| ProbeStats {
                events: acc.events.saturating_add(s.events),
                read_errors: acc.read_errors.saturating_add(s.read_errors),
                dropped: acc.dropped.saturating_add(s.dropped),
                unchained: acc.unchained.saturating_add(s.unchained),
            });
        Ok(CpuTimeSample {
            nanos_by_cgroup,
            stats,
            map_entries,
            slots_used: self.slots.len(),
        })
    }

    /// Removes the entries and slots of cgroups that no longer exist, keeping the maps bounded.
    pub fn forget(&mut self, cgroup_ids: &[u64]) -> Result<(), CpuTimeError> {
        slots::release(&mut self.ebpf, &mut self.slots, cgroup_ids)?;
        let map = self
            .ebpf
            .map_mut(names::CPU_TIME_MAP)
            .ok_or_else(|| missing_map(names::CPU_TIME_MAP))?;
        let mut totals: PerCpuHashMap<&mut MapData, u64, u64> =
            PerCpuHashMap::try_from(map).map_err(|e| map_error(names::CPU_TIME_MAP, &e))?;
        for id in cgroup_ids {
            // A cgroup id appears in the map only after a slice was charged to it; a removal
            // racing with a new charge re-creates the entry, which the next sweep removes.
            if let Err(e) = totals.remove(id) {
                tracing::debug!(cgroup_id = id, error = %e, "map entry already gone");
            }
        }
        Ok(())
    }

    fn per_cgroup_map(&self) -> Result<PerCpuHashMap<&MapData, u64, u64>, CpuTimeError> {
        let map = self
            .ebpf
            .map(names::CPU_TIME_MAP)
            .ok_or_else(|| missing_map(names::CPU_TIME_MAP))?;
        PerCpuHashMap::try_from(map).map_err(|e| map_error(names::CPU_TIME_MAP, &e))
    }

    fn map<'a, T: aya::Pod>(
        &'a self,
        name: &'static str,
    ) -> Result<PerCpuArray<&'a MapData, T>, CpuTimeError> {
        let map = self.ebpf.map(name).ok_or_else(|| missing_map(name))?;
        PerCpuArray::try_from(map).map_err(|e| map_error(name, &e))
    }
}

fn attach_tp_btf(ebpf: &mut Ebpf) -> Result<(), String> {
    let btf = Btf::from_sys_fs().map_err(|e| format!("kernel BTF: {}", error_chain(&e)))?;
    let program: &mut BtfTracePoint = program_as(ebpf, names::SWITCH_TP_BTF)?;
    program
        .load(TRACEPOINT, &btf)
        .map_err(|e| error_chain(&e))?;
    program.attach().map_err(|e| error_chain(&e))?;
    Ok(())
}

fn attach_raw_tp(ebpf: &mut Ebpf) -> Result<(), String> {
    let program: &mut RawTracePoint = program_as(ebpf, names::SWITCH_RAW_TP)?;
    program.load().map_err(|e| error_chain(&e))?;
    program.attach(TRACEPOINT).map_err(|e| error_chain(&e))?;
    Ok(())
}

fn missing_map(map: &'static str) -> CpuTimeError {
    CpuTimeError::Map {
        map,
        detail: "missing from the kernel object".to_owned(),
    }
}

fn map_error(map: &'static str, err: &(dyn std::error::Error + 'static)) -> CpuTimeError {
    CpuTimeError::Map {
        map,
        detail: error_chain(err),
    }
}

/// Whether this process shares the host's pid namespace.
fn in_host_pid_namespace() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == INIT_PID_NS_INODE)
}

/// The task's `se.sum_exec_runtime` from `/proc/<pid>/schedstat` (first field; the kernel
/// brings the running task's counter up to date for the read). `None` when the task is gone.
fn task_runtime_ns(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}
