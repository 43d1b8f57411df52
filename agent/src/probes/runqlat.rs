//! The run-queue latency probe (`runqlat`): per-cgroup log2 histograms of the time tasks wait
//! for a CPU (after a wakeup or a preemption), and preemptions counted per (victim cgroup,
//! preemptor cgroup) pair with the waits they caused.
//!
//! The counting is the run-queue half of the sched_switch object's handler
//! ([`super::sched_switch`]), whose load also carries the throttle-episode programs (see
//! [`super::throttle`]); this module finds the offsets it needs and reads its maps.
//!
//! The waits are the kernel's own: `task->sched_info` (`CONFIG_SCHED_INFO`, which schedstats
//! and delay accounting select) sums every wait into `run_delay`, on the run queue's clock.
//! When a task leaves a CPU, the handler records the growth of its `run_delay` since its
//! previous departure, kept in a fixed array indexed by pid (see `ebpf/src/runq.rs`), so no
//! wakeup hook, clock read or per-task hash insert is on the scheduler's path. Counts go to
//! the cgroup's counter slot ([`super::slots`]) or, before the cgroup has one, to hashes.
use std::collections::HashMap;

use aya::maps::{HashMap as AyaHashMap, MapData, PerCpuArray, PerCpuHashMap};
use qosd_common::{
    HIST_MAX_BUCKET, HistBucket, HistKey, PreemptKey, PreemptValue, RunqSlot, RunqStats,
    SchedOffsets, names,
};

use super::btf::{BtfError, KernelBtf};
use super::sched_switch::SwitchProbe;
use super::slots::{self, SlotError};
use super::{ProbeMode, batch, error_chain};

/// The probe's name in `qosd check` and in `qosd_probe_info{probe}`.
pub const PROBE_NAME: &str = "runqlat";

/// Where the waits come from, for `check` and the logs.
pub const WAIT_SOURCE: &str = "sched_info";

/// Errors reading the run-queue maps.
#[derive(Debug, thiserror::Error)]
pub enum RunqlatError {
    #[error("map {map}: {detail}")]
    Map { map: &'static str, detail: String },
    #[error("counter slots: {0}")]
    Slots(#[from] SlotError),
}

/// A log2 histogram: `buckets[b]` counts values `v` with `2^(b-1) <= v < 2^b` nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log2Histogram {
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
}

impl Log2Histogram {
    /// Adds `count` values summing to `sum_ns` to `bucket` (capped at [`HIST_MAX_BUCKET`]).
    fn add(&mut self, bucket: u32, count: u64, sum_ns: u64) {
        self.add_sum(sum_ns);
        let len = HIST_MAX_BUCKET as usize + 1;
        if self.buckets.len() < len {
            self.buckets.resize(len, 0);
        }
        let b = (bucket as usize).min(len - 1);
        self.buckets[b] = self.buckets[b].saturating_add(count);
    }

    /// Adds to the sum only, for a source that keeps the sum apart from the bucket counts.
    fn add_sum(&mut self, sum_ns: u64) {
        self.sum_ns = self.sum_ns.saturating_add(sum_ns);
    }

    /// Number of recorded values.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.buckets.iter().copied().fold(0, u64::saturating_add)
    }
}

/// One reading of the probe's maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunqSample {
    /// cgroup id -> run-queue waits.
    pub waits: HashMap<u64, Log2Histogram>,
    /// (victim cgroup, preemptor cgroup) -> preemptions and the waits they caused.
    pub preemptions: HashMap<(u64, u64), PreemptValue>,
    /// cgroup id -> throttle episodes (empty unless the throttle programs are attached).
    pub throttle_episodes: HashMap<u64, Log2Histogram>,
    /// Health counters summed over CPUs.
    pub stats: RunqStats,
    /// Entries per map, by map name.
    pub map_entries: Vec<(&'static str, usize)>,
}

impl SwitchProbe {
    /// Reads every counter: the hashes' and the slots', added. Cgroups found in the hashes
    /// without a slot get one first, so their next events take the slot path.
    pub fn sample_runq(&mut self) -> Result<RunqSample, RunqlatError> {
        let mut sample = RunqSample::default();
        let (mut waits, entries) = self.read_hist(names::RUNQ_HIST_MAP)?;
        sample.map_entries.push((names::RUNQ_HIST_MAP, entries));

        let pairs: PerCpuHashMap<&MapData, PreemptKey, PreemptValue> =
            self.per_cpu_hash(names::PREEMPT_MAP)?;
        let mut pair_entries = 0;
        for (key, per_cpu) in
            batch::per_cpu_hash(&pairs).map_err(|e| map_error(names::PREEMPT_MAP, &e))?
        {
            pair_entries += 1;
            let total = sample
                .preemptions
                .entry((key.victim_cgroup, key.preemptor_cgroup))
                .or_default();
            for v in per_cpu.iter() {
                add_pair(total, v.count, v.wait_ns);
            }
        }
        sample.map_entries.push((names::PREEMPT_MAP, pair_entries));

        self.assign_slots(
            waits
                .keys()
                .chain(sample.preemptions.keys().map(|(victim, _)| victim))
                .copied(),
        )?;
        for (cgroup_id, per_cpu) in
            slots::read_assigned::<RunqSlot>(&self.ebpf, names::RUNQ_SLOTS_MAP, &self.slots)?
        {
            let hist = waits.entry(cgroup_id).or_default();
            for counters in per_cpu.iter() {
                for (bucket, &count) in (0u32..).zip(counters.buckets.iter()) {
                    if count != 0 {
                        hist.add(bucket, count, 0);
                    }
                }
                hist.add_sum(counters.sum_ns);
                for cell in counters
                    .preemptors
                    .iter()
                    .filter(|c| c.preemptor_cgroup != 0)
                {
                    let total = sample
                        .preemptions
                        .entry((cgroup_id, cell.preemptor_cgroup))
                        .or_default();
                    add_pair(total, cell.count, cell.wait_ns);
                }
            }
        }
        waits.retain(|_, h| h.count() != 0);
        sample.waits = waits;
        sample
            .map_entries
            .push((names::RUNQ_SLOTS_MAP, self.slots.len()));

        if *self.throttle_mode() == ProbeMode::Fentry {
            let (episodes, entries) = self.read_hist(names::THROTTLE_HIST_MAP)?;
            sample.throttle_episodes = episodes;
            sample.map_entries.push((names::THROTTLE_HIST_MAP, entries));
            let open: AyaHashMap<&MapData, u64, u64> = self.hash(names::THROTTLED_MAP)?;
            sample
                .map_entries
                .push((names::THROTTLED_MAP, open.keys().flatten().count()));
        }

        let map = self
            .ebpf
            .map(names::RUNQ_STATS_MAP)
            .ok_or_else(|| missing_map(names::RUNQ_STATS_MAP))?;
        let stats: PerCpuArray<&MapData, RunqStats> =
            PerCpuArray::try_from(map).map_err(|e| map_error(names::RUNQ_STATS_MAP, &e))?;
        let per_cpu = stats
            .get(&0, 0)
            .map_err(|e| map_error(names::RUNQ_STATS_MAP, &e))?;
        sample.stats = per_cpu.iter().fold(RunqStats::default(), |a, s| RunqStats {
            switches: a.switches.saturating_add(s.switches),
            waits: a.waits.saturating_add(s.waits),
            unmeasured_waits: a.unmeasured_waits.saturating_add(s.unmeasured_waits),
            dropped: a.dropped.saturating_add(s.dropped),
            read_errors: a.read_errors.saturating_add(s.read_errors),
            throttle_episodes: a.throttle_episodes.saturating_add(s.throttle_episodes),
            throttle_dropped: a.throttle_dropped.saturating_add(s.throttle_dropped),
        });
        Ok(sample)
    }

    /// Removes the run-queue hash entries of cgroups that no longer exist (their slots are
    /// withdrawn by [`SwitchProbe::forget`]).
    pub(super) fn forget_runq_entries(&mut self, cgroup_ids: &[u64]) -> Result<(), RunqlatError> {
        for name in [names::RUNQ_HIST_MAP, names::THROTTLE_HIST_MAP] {
            let map = self.ebpf.map_mut(name).ok_or_else(|| missing_map(name))?;
            let mut hist: PerCpuHashMap<&mut MapData, HistKey, HistBucket> =
                PerCpuHashMap::try_from(map).map_err(|e| map_error(name, &e))?;
            let stale: Vec<HistKey> = hist
                .keys()
                .flatten()
                .filter(|k| cgroup_ids.contains(&k.cgroup_id))
                .collect();
            for key in &stale {
                // Racing with a new charge re-creates the entry; the next sweep removes it.
                let _ = hist.remove(key);
            }
        }
        let map = self
            .ebpf
            .map_mut(names::PREEMPT_MAP)
            .ok_or_else(|| missing_map(names::PREEMPT_MAP))?;
        let mut pairs: PerCpuHashMap<&mut MapData, PreemptKey, PreemptValue> =
            PerCpuHashMap::try_from(map).map_err(|e| map_error(names::PREEMPT_MAP, &e))?;
        let stale: Vec<PreemptKey> = pairs
            .keys()
            .flatten()
            .filter(|k| {
                cgroup_ids.contains(&k.victim_cgroup) || cgroup_ids.contains(&k.preemptor_cgroup)
            })
            .collect();
        for key in &stale {
            let _ = pairs.remove(key);
        }
        Ok(())
    }

    fn read_hist(
        &self,
        name: &'static str,
    ) -> Result<(HashMap<u64, Log2Histogram>, usize), RunqlatError> {
        let map: PerCpuHashMap<&MapData, HistKey, HistBucket> = self.per_cpu_hash(name)?;
        let mut out: HashMap<u64, Log2Histogram> = HashMap::new();
        let mut entries = 0;
        for (key, per_cpu) in batch::per_cpu_hash(&map).map_err(|e| map_error(name, &e))? {
            entries += 1;
            let (count, sum_ns) = per_cpu.iter().fold((0u64, 0u64), |(c, s), b| {
                (c.saturating_add(b.count), s.saturating_add(b.sum_ns))
            });
            out.entry(key.cgroup_id)
                .or_default()
                .add(key.bucket, count, sum_ns);
        }
        Ok((out, entries))
    }

    fn per_cpu_hash<K: aya::Pod, V: aya::Pod>(
        &self,
        name: &'static str,
    ) -> Result<PerCpuHashMap<&MapData, K, V>, RunqlatError> {
        let map = self.ebpf.map(name).ok_or_else(|| missing_map(name))?;
        PerCpuHashMap::try_from(map).map_err(|e| map_error(name, &e))
    }

    fn hash<K: aya::Pod, V: aya::Pod>(
        &self,
        name: &'static str,
    ) -> Result<AyaHashMap<&MapData, K, V>, RunqlatError> {
        let map = self.ebpf.map(name).ok_or_else(|| missing_map(name))?;
        AyaHashMap::try_from(map).map_err(|e| map_error(name, &e))
    }
}

/// Offsets for the run-queue and throttle programs, and whether the throttle ones exist.
pub(super) struct SchedOffsetsFound {
    pub(super) offsets: SchedOffsets,
    /// Why the throttle programs cannot run, when an offset is missing.
    pub(super) throttle_missing: Option<String>,
}

/// The run-queue offsets (an error when one is missing: the handler's run-queue half then
/// counts nothing) and the throttle programs' (missing ones are reported in the result).
pub(super) fn sched_offsets(btf: &KernelBtf) -> Result<SchedOffsetsFound, BtfError> {
    // `state` became `__state` in 5.14.
    let task_state = btf
        .member_offset("task_struct", "__state")
        .or_else(|_| btf.member_offset("task_struct", "state"))?;
    let sched_info = |member| btf.nested_offset("task_struct", "sched_info", "sched_info", member);
    let throttle = (|| {
        Ok::<_, BtfError>((
            btf.member_offset("cfs_rq", "tg")?,
            btf.member_offset("task_group", "css")?,
            btf.member_offset("cfs_rq", "throttled")?,
        ))
    })();
    let (cfs_rq_tg, tg_css, cfs_rq_throttled, throttle_missing) = match throttle {
        Ok((a, b, c)) => (a, b, c, None),
        Err(e) => {
            tracing::info!(error = %e, "throttle-episode offsets unavailable");
            (0, 0, 0, Some(e.to_string()))
        }
    };
    Ok(SchedOffsetsFound {
        offsets: SchedOffsets {
            task_state,
            cfs_rq_tg,
            tg_css,
            cfs_rq_throttled,
            task_run_delay: sched_info("run_delay")?,
            task_pcount: sched_info("pcount")?,
            configured: 1,
            pad: 0,
        },
        throttle_missing,
    })
}

/// Adds a count and a wait to a pair's total.
fn add_pair(total: &mut PreemptValue, count: u64, wait_ns: u64) {
    total.count = total.count.saturating_add(count);
    total.wait_ns = total.wait_ns.saturating_add(wait_ns);
}

fn missing_map(map: &'static str) -> RunqlatError {
    RunqlatError::Map {
        map,
        detail: "missing from the kernel object".to_owned(),
    }
}

fn map_error(map: &'static str, err: &(dyn std::error::Error + 'static)) -> RunqlatError {
    RunqlatError::Map {
        map,
        detail: error_chain(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_folds_buckets_and_sum() {
        let mut h = Log2Histogram::default();
        h.add(3, 2, 9);
        h.add(3, 1, 6);
        h.add(HIST_MAX_BUCKET + 5, 1, 1 << 45);
        assert_eq!(h.count(), 4);
        assert_eq!(h.buckets[3], 3);
        assert_eq!(h.sum_ns, 15 + (1 << 45));
        assert_eq!(h.buckets[HIST_MAX_BUCKET as usize], 1);
        h.add_sum(5);
        assert_eq!(h.count(), 4, "a sum alone adds no value");
        assert_eq!(h.sum_ns, 20 + (1 << 45));
    }
}
