//! The run-queue latency probe (`runqlat`): per-cgroup log2 histograms of the time tasks wait
//! for a CPU (after a wakeup or a preemption), and preemptions counted per (victim cgroup,
//! preemptor cgroup) pair with the waits they caused.
//!
//! One sched_switch handler does it all, as `tp_btf`, or as `raw_tracepoint` when the kernel
//! refuses BTF-typed tracepoints; a fresh object is loaded for the fallback so no half-attached
//! set stays behind. The same object carries the throttle-episode programs (see
//! [`super::throttle`]), attached afterwards where fentry/fexit is allowed.
//!
//! The waits are the kernel's own: `task->sched_info` (`CONFIG_SCHED_INFO`, which schedstats
//! and delay accounting select) sums every wait into `run_delay`, on the run queue's clock.
//! When a task leaves a CPU, the handler records the growth of its `run_delay` since its
//! previous departure, kept in a fixed array indexed by pid (see `ebpf/src/runq.rs`), so no
//! wakeup hook, clock read or per-task hash insert is on the scheduler's path. Counts go to
//! the cgroup's counter slot ([`super::slots`]) or, before the cgroup has one, to hashes.
use std::collections::HashMap;

use aya::maps::{HashMap as AyaHashMap, MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::{BtfTracePoint, RawTracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use qosd_common::{
    HIST_MAX_BUCKET, HistBucket, HistKey, KernelOffsets, MAX_SLOTS, PreemptKey, PreemptValue,
    RunqSlot, RunqStats, SchedOffsets, names,
};

use super::btf::{BtfError, KernelBtf};
use super::slots::{self, SlotError, SlotTable};
use super::throttle;
use super::{EBPF_OBJECT, ProbeMode, error_chain, program_as};

/// The probe's name in `qosd check` and in `qosd_probe_info{probe}`.
pub const PROBE_NAME: &str = "runqlat";

/// Where the waits come from, for `check` and the logs.
pub const WAIT_SOURCE: &str = "sched_info";

/// Errors of the run-queue latency probe.
#[derive(Debug, thiserror::Error)]
pub enum RunqlatError {
    #[error("the kernel object is empty: this qosd was built with AYA_BUILD_SKIP=1")]
    EmptyObject,
    #[error("reading kernel struct offsets: {0}")]
    Offsets(#[from] BtfError),
    #[error("no attach mode worked: {0}")]
    NoMode(String),
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

/// The loaded object with the run-queue programs and, where allowed, the throttle programs.
/// Dropping it detaches everything.
pub struct SchedProbe {
    ebpf: Ebpf,
    mode: ProbeMode,
    refused: Vec<(ProbeMode, String)>,
    throttle_mode: ProbeMode,
    slots: SlotTable,
}

impl SchedProbe {
    /// Loads the object with offsets for the running kernel, attaches the run-queue handlers
    /// (tp_btf, else raw_tracepoint), then tries the throttle-episode programs.
    pub fn attach(v1_cpu: bool, prefer_raw_tracepoint: bool) -> Result<Self, RunqlatError> {
        if EBPF_OBJECT.is_empty() {
            return Err(RunqlatError::EmptyObject);
        }
        let btf = KernelBtf::from_running_kernel()?;
        let offsets = btf.kernel_offsets(v1_cpu)?;
        let sched = sched_offsets(&btf)?;
        let candidates: &[ProbeMode] = if prefer_raw_tracepoint {
            &[ProbeMode::RawTracepoint]
        } else {
            &[ProbeMode::TpBtf, ProbeMode::RawTracepoint]
        };
        let mut refused: Vec<(ProbeMode, String)> = Vec::new();
        for candidate in candidates {
            match load_and_attach(&offsets, &sched.offsets, candidate) {
                Ok(mut ebpf) => {
                    let throttle_mode = match &sched.throttle_missing {
                        None => throttle::attach_episodes(&mut ebpf),
                        Some(why) => {
                            let features = super::features::KernelFeatures::detect();
                            ProbeMode::Unavailable(format!(
                                "fentry: {}; offsets: {why}",
                                features.fentry
                            ))
                        }
                    };
                    tracing::info!(
                        probe = PROBE_NAME,
                        mode = candidate.label(),
                        waits = WAIT_SOURCE,
                        throttle_episodes = %throttle_mode,
                        "probe attached"
                    );
                    for (m, why) in &refused {
                        tracing::info!(probe = PROBE_NAME, mode = m.label(), reason = %why, "mode refused by the kernel");
                    }
                    return Ok(Self {
                        ebpf,
                        mode: candidate.clone(),
                        refused,
                        throttle_mode,
                        slots: SlotTable::new(MAX_SLOTS),
                    });
                }
                Err(reason) => refused.push((candidate.clone(), reason)),
            }
        }
        let all = refused
            .iter()
            .map(|(mode, why)| format!("{}: {why}", mode.label()))
            .collect::<Vec<_>>()
            .join("; ");
        Err(RunqlatError::NoMode(all))
    }

    /// The attach mode of the run-queue handlers.
    #[must_use]
    pub fn mode(&self) -> &ProbeMode {
        &self.mode
    }

    /// Modes tried before the one in use, with the kernel's reasons.
    #[must_use]
    pub fn refused_modes(&self) -> &[(ProbeMode, String)] {
        &self.refused
    }

    /// The mode of the throttle-episode programs (fentry, or unavailable with the reason).
    #[must_use]
    pub fn throttle_mode(&self) -> &ProbeMode {
        &self.throttle_mode
    }

    /// Reads every counter: the hashes' and the slots', added. Cgroups found in the hashes
    /// without a slot get one first, so their next events take the slot path.
    pub fn sample(&mut self) -> Result<RunqSample, RunqlatError> {
        let mut sample = RunqSample::default();
        let (mut waits, entries) = self.read_hist(names::RUNQ_HIST_MAP)?;
        sample.map_entries.push((names::RUNQ_HIST_MAP, entries));

        let pairs: PerCpuHashMap<&MapData, PreemptKey, PreemptValue> =
            self.per_cpu_hash(names::PREEMPT_MAP)?;
        let mut pair_entries = 0;
        for entry in pairs.iter() {
            let (key, per_cpu) = entry.map_err(|e| map_error(names::PREEMPT_MAP, &e))?;
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

        slots::assign(
            &mut self.ebpf,
            &mut self.slots,
            waits
                .keys()
                .chain(sample.preemptions.keys().map(|(victim, _)| victim))
                .copied(),
            names::RUNQ_SLOTS_MAP,
            RunqSlot::EMPTY,
        )?;
        for (cgroup_id, slot) in self.slots.assigned() {
            let per_cpu = slots::read::<RunqSlot>(&self.ebpf, names::RUNQ_SLOTS_MAP, slot)?;
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

        if self.throttle_mode == ProbeMode::Fentry {
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

    /// Removes every entry of cgroups that no longer exist, keeping the maps bounded.
    pub fn forget(&mut self, cgroup_ids: &[u64]) -> Result<(), RunqlatError> {
        if cgroup_ids.is_empty() {
            return Ok(());
        }
        slots::release(&mut self.ebpf, &mut self.slots, cgroup_ids)?;
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
        for entry in map.iter() {
            let (key, per_cpu) = entry.map_err(|e| map_error(name, &e))?;
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
struct SchedOffsetsFound {
    offsets: SchedOffsets,
    /// Why the throttle programs cannot run, when an offset is missing.
    throttle_missing: Option<String>,
}

fn sched_offsets(btf: &KernelBtf) -> Result<SchedOffsetsFound, BtfError> {
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

/// A fresh object with the run-queue handlers attached in `mode`.
fn load_and_attach(
    offsets: &KernelOffsets,
    sched: &SchedOffsets,
    mode: &ProbeMode,
) -> Result<Ebpf, String> {
    let mut loader = EbpfLoader::new();
    loader
        .override_global(names::OFFSETS_GLOBAL, offsets, true)
        .override_global(names::SCHED_OFFSETS_GLOBAL, sched, true);
    super::shrink_unused_maps(&mut loader, super::Loader::Runq);
    let mut ebpf = loader
        .load(EBPF_OBJECT)
        .map_err(|e| format!("loading the kernel object: {}", error_chain(&e)))?;
    let tracepoint = "sched_switch";
    if *mode == ProbeMode::TpBtf {
        let btf = Btf::from_sys_fs().map_err(|e| format!("kernel BTF: {}", error_chain(&e)))?;
        let program: &mut BtfTracePoint = program_as(&mut ebpf, names::RUNQ_SWITCH_TP_BTF)?;
        program
            .load(tracepoint, &btf)
            .map_err(|e| format!("{tracepoint}: {}", error_chain(&e)))?;
        program
            .attach()
            .map_err(|e| format!("{tracepoint}: {}", error_chain(&e)))?;
    } else {
        let program: &mut RawTracePoint = program_as(&mut ebpf, names::RUNQ_SWITCH_RAW_TP)?;
        program
            .load()
            .map_err(|e| format!("{tracepoint}: {}", error_chain(&e)))?;
        program
            .attach(tracepoint)
            .map_err(|e| format!("{tracepoint}: {}", error_chain(&e)))?;
    }
    Ok(ebpf)
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
