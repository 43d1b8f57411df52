//! The cpu-time probe: on-CPU nanoseconds per cgroup, counted in the kernel on sched_switch.
//!
//! Load order: offsets from BTF are written into the object's global, then the sched_switch
//! handler is attached as `tp_btf` if the kernel allows it, as `raw_tracepoint` otherwise. The
//! chosen mode and the reasons for every refused mode are kept for `check` and the metrics.
use std::collections::HashMap;

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::{BtfTracePoint, RawTracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use qosd_common::{KernelOffsets, ProbeStats, RunningTask, names};

use super::btf::{BtfError, KernelBtf};
use super::{EBPF_OBJECT, ProbeMode, error_chain, program_as};

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
    #[error("reading CLOCK_MONOTONIC: {0}")]
    Clock(#[source] std::io::Error),
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
}

/// A loaded and attached cpu-time probe. Dropping it detaches and unloads the programs.
pub struct CpuTimeProbe {
    ebpf: Ebpf,
    mode: ProbeMode,
    refused: Vec<(ProbeMode, String)>,
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
        let mut ebpf = EbpfLoader::new()
            .override_global(names::OFFSETS_GLOBAL, &offsets, true)
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
        Ok(Self {
            ebpf,
            mode,
            refused,
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

    /// Reads every counter. Time slices still running are added up to now, so a busy task
    /// that has not been switched out yet is counted too.
    pub fn sample(&self) -> Result<CpuTimeSample, CpuTimeError> {
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

        let now = monotonic_nanos()?;
        let running: PerCpuArray<&MapData, RunningTask> = self.map(names::RUNNING_MAP)?;
        let slots = running
            .get(&0, 0)
            .map_err(|e| map_error(names::RUNNING_MAP, &e))?;
        for slot in slots.iter() {
            if slot.cgroup_id != 0 && slot.since_ns != 0 && now > slot.since_ns {
                *nanos_by_cgroup.entry(slot.cgroup_id).or_default() += now - slot.since_ns;
            }
        }

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
            });
        Ok(CpuTimeSample {
            nanos_by_cgroup,
            stats,
            map_entries,
        })
    }

    /// Removes the entries of cgroups that no longer exist, keeping the map bounded.
    pub fn forget(&mut self, cgroup_ids: &[u64]) -> Result<(), CpuTimeError> {
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

/// CLOCK_MONOTONIC in nanoseconds: the clock `bpf_ktime_get_ns()` reads.
fn monotonic_nanos() -> Result<u64, CpuTimeError> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime writes only into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    if rc != 0 {
        return Err(CpuTimeError::Clock(std::io::Error::last_os_error()));
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or_default();
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or_default();
    Ok(secs * 1_000_000_000 + nanos)
}
