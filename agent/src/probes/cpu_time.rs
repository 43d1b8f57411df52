//! The cpu-time probe: on-CPU nanoseconds per cgroup, counted in the kernel on sched_switch
//! from the scheduler's own per-task accounting (`se.sum_exec_runtime`), into the cgroup's
//! counter slot ([`super::slots`]) or, before it has one, a per-CPU hash. The handler is the
//! sched_switch object's ([`super::sched_switch`]); this module reads its cpu-time maps.
use std::collections::HashMap;

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap};
use qosd_common::{ProbeStats, RunningTask, names};

use super::sched_switch::SwitchProbe;
use super::slots::{self, SlotError};
use super::{batch, error_chain};

/// The probe's name in `qosd check` and in `qosd_probe_info{probe}`.
pub const PROBE_NAME: &str = "cpu_time";

/// Errors reading the cpu-time maps.
#[derive(Debug, thiserror::Error)]
pub enum CpuTimeError {
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
    /// cgroup id -> nanoseconds on CPU per NUMA node (positions of
    /// [`crate::numa::placement::CpuNodes::nodes`]), when the probe was given the nodes
    /// ([`SwitchProbe::set_cpu_nodes`]); empty otherwise.
    pub nanos_by_cgroup_node: HashMap<u64, Vec<u64>>,
}

impl SwitchProbe {
    /// Reads every counter: the hash's and the slots', added, plus the slices running right
    /// now (how far each running task's `sum_exec_runtime` has grown since it was switched
    /// in), so a busy task that has not been switched out yet is counted too. Cgroups found in
    /// the hash without a slot get one first.
    pub fn sample_cpu_time(&mut self) -> Result<CpuTimeSample, CpuTimeError> {
        let totals = self.cpu_time_map()?;
        let mut nanos_by_cgroup = HashMap::new();
        let mut nanos_by_cgroup_node: HashMap<u64, Vec<u64>> = HashMap::new();
        let nodes = self.cpu_nodes.clone();
        let mut per_node = |cgroup_id: u64, per_cpu: &[u64]| {
            if let Some(nodes) = &nodes {
                let slot = nanos_by_cgroup_node
                    .entry(cgroup_id)
                    .or_insert_with(|| vec![0; nodes.nodes.len()]);
                nodes.add_per_cpu(per_cpu, slot);
            }
        };
        let mut map_entries = 0;
        for (cgroup_id, per_cpu) in
            batch::per_cpu_hash(&totals).map_err(|e| map_error(names::CPU_TIME_MAP, &e))?
        {
            map_entries += 1;
            nanos_by_cgroup.insert(
                cgroup_id,
                per_cpu.iter().copied().fold(0u64, u64::saturating_add),
            );
            per_node(cgroup_id, &per_cpu);
        }
        self.assign_slots(nanos_by_cgroup.keys().copied())?;
        for (cgroup_id, per_cpu) in
            slots::read_assigned::<u64>(&self.ebpf, names::CPU_TIME_SLOTS_MAP, &self.slots)?
        {
            let total = nanos_by_cgroup.entry(cgroup_id).or_default();
            *total = per_cpu.iter().copied().fold(*total, u64::saturating_add);
            per_node(cgroup_id, &per_cpu);
        }

        if self.host_pids {
            let running: PerCpuArray<&MapData, RunningTask> =
                self.per_cpu_array(names::RUNNING_MAP)?;
            let on_cpus = running
                .get(&0, 0)
                .map_err(|e| map_error(names::RUNNING_MAP, &e))?;
            for (cpu, task) in on_cpus
                .iter()
                .enumerate()
                .filter(|(_, t)| t.pid != 0 && t.cgroup_id != 0)
            {
                if let Some(runtime) = task_runtime_ns(task.pid)
                    && runtime > task.start_runtime_ns
                {
                    let running = runtime - task.start_runtime_ns;
                    *nanos_by_cgroup.entry(task.cgroup_id).or_default() += running;
                    if let Some(nodes) = &nodes {
                        let slot = nanos_by_cgroup_node
                            .entry(task.cgroup_id)
                            .or_insert_with(|| vec![0; nodes.nodes.len()]);
                        nodes.add_on_cpu(cpu, running, slot);
                    }
                }
            }
        }
        nanos_by_cgroup.retain(|_, ns| *ns != 0);
        nanos_by_cgroup_node.retain(|id, _| nanos_by_cgroup.contains_key(id));

        let stats_map: PerCpuArray<&MapData, ProbeStats> = self.per_cpu_array(names::STATS_MAP)?;
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
            nanos_by_cgroup_node,
            stats,
            map_entries,
            slots_used: self.slots.len(),
        })
    }

    /// Removes the cpu-time hash entries of cgroups that no longer exist (their slots are
    /// withdrawn by [`SwitchProbe::forget`]).
    pub(super) fn forget_cpu_time_entries(
        &mut self,
        cgroup_ids: &[u64],
    ) -> Result<(), CpuTimeError> {
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

    fn cpu_time_map(&self) -> Result<PerCpuHashMap<&MapData, u64, u64>, CpuTimeError> {
        let map = self
            .ebpf
            .map(names::CPU_TIME_MAP)
            .ok_or_else(|| missing_map(names::CPU_TIME_MAP))?;
        PerCpuHashMap::try_from(map).map_err(|e| map_error(names::CPU_TIME_MAP, &e))
    }

    fn per_cpu_array<'a, T: aya::Pod>(
        &'a self,
        name: &'static str,
    ) -> Result<PerCpuArray<&'a MapData, T>, CpuTimeError> {
        let map = self.ebpf.map(name).ok_or_else(|| missing_map(name))?;
        PerCpuArray::try_from(map).map_err(|e| map_error(name, &e))
    }
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

/// The task's `se.sum_exec_runtime` from `/proc/<pid>/schedstat` (first field; the kernel
/// brings the running task's counter up to date for the read). `None` when the task is gone.
fn task_runtime_ns(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}
