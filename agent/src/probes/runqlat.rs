//! The run-queue latency probe (`runqlat`): per-cgroup log2 histograms of the time tasks wait
//! for a CPU (after a wakeup or a preemption), and preemptions counted per (victim cgroup,
//! preemptor cgroup) pair with the waits they caused.
//!
//! The three handlers (sched_wakeup, sched_wakeup_new, sched_switch) attach together as
//! `tp_btf`, or all as `raw_tracepoint` when the kernel refuses BTF-typed tracepoints; a fresh
//! object is loaded for the fallback so no half-attached set stays behind. The same object
//! carries the throttle-episode programs (see [`super::throttle`]), attached afterwards where
//! fentry/fexit is allowed.
//!
//! Per-task wait starts live in a hash keyed by pid ([`MAX_WAITING_TASKS`] entries) on every
//! kernel: aya-ebpf 0.2 has no task-local storage map, and a map type the kernel cannot create
//! (task storage for tracing programs does not exist on 5.10) would make the whole object fail
//! to load, taking the cpu-time probe with it. Only waiting tasks have an entry; a wait that
//! finds the map full is counted as dropped (an LRU map would evict silently), and entries
//! older than [`STALE_WAIT`] are expired at scrape and counted the same way.
use std::collections::HashMap;

use aya::maps::{HashMap as AyaHashMap, MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::{BtfTracePoint, RawTracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use qosd_common::{
    HIST_MAX_BUCKET, HistBucket, HistKey, KernelOffsets, MAX_WAITING_TASKS, PreemptKey,
    PreemptValue, RunqStats, SchedOffsets, WaitStart, names,
};

use super::btf::{BtfError, KernelBtf};
use super::throttle;
use super::{EBPF_OBJECT, ProbeMode, error_chain, program_as};

/// The probe's name in `qosd check` and in `qosd_probe_info{probe}`.
pub const PROBE_NAME: &str = "runqlat";

/// How per-task wait starts are kept, for `check` and the logs.
pub const TASK_STATE_STORAGE: &str = "hash";

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
        self.sum_ns = self.sum_ns.saturating_add(sum_ns);
        let len = HIST_MAX_BUCKET as usize + 1;
        if self.buckets.len() < len {
            self.buckets.resize(len, 0);
        }
        let b = (bucket as usize).min(len - 1);
        self.buckets[b] = self.buckets[b].saturating_add(count);
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
    /// Wait-start entries removed by [`SchedProbe::expire_waits`] (lost waits).
    expired_waits: u64,
}

/// A wait-start entry older than this can only be left by a missed event (no task waits ten
/// minutes for a CPU): [`SchedProbe::expire_waits`] removes it and counts a dropped event.
pub const STALE_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

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
                        task_state = TASK_STATE_STORAGE,
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
                        expired_waits: 0,
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

    /// Reads every counter.
    pub fn sample(&self) -> Result<RunqSample, RunqlatError> {
        let mut sample = RunqSample::default();
        let (waits, entries) = self.read_hist(names::RUNQ_HIST_MAP)?;
        sample.waits = waits;
        sample.map_entries.push((names::RUNQ_HIST_MAP, entries));

        let pairs: PerCpuHashMap<&MapData, PreemptKey, PreemptValue> =
            self.per_cpu_hash(names::PREEMPT_MAP)?;
        let mut pair_entries = 0;
        for entry in pairs.iter() {
            let (key, per_cpu) = entry.map_err(|e| map_error(names::PREEMPT_MAP, &e))?;
            pair_entries += 1;
            let total = per_cpu
                .iter()
                .fold(PreemptValue::default(), |acc, v| PreemptValue {
                    count: acc.count.saturating_add(v.count),
                    wait_ns: acc.wait_ns.saturating_add(v.wait_ns),
                });
            sample
                .preemptions
                .insert((key.victim_cgroup, key.preemptor_cgroup), total);
        }
        sample.map_entries.push((names::PREEMPT_MAP, pair_entries));

        let waiting: AyaHashMap<&MapData, u32, WaitStart> = self.hash(names::WAIT_START_MAP)?;
        sample
            .map_entries
            .push((names::WAIT_START_MAP, waiting.keys().flatten().count()));

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
        let kernel = per_cpu.iter().fold(RunqStats::default(), |a, s| RunqStats {
            switches: a.switches.saturating_add(s.switches),
            wakeups: a.wakeups.saturating_add(s.wakeups),
            dropped: a.dropped.saturating_add(s.dropped),
            read_errors: a.read_errors.saturating_add(s.read_errors),
            throttle_episodes: a.throttle_episodes.saturating_add(s.throttle_episodes),
            throttle_dropped: a.throttle_dropped.saturating_add(s.throttle_dropped),
        });
        sample.stats = RunqStats {
            dropped: kernel.dropped.saturating_add(self.expired_waits),
            ..kernel
        };
        Ok(sample)
    }

    /// Removes wait-start entries older than [`STALE_WAIT`] (CLOCK_MONOTONIC, the programs'
    /// clock), so a missed switch-in can never fill the map; each counts as a dropped event.
    pub fn expire_waits(&mut self) -> Result<usize, RunqlatError> {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec into the valid struct on our stack.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) } != 0 {
            return Ok(0);
        }
        let now_ns = u64::try_from(now.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0));
        let limit = u64::try_from(STALE_WAIT.as_nanos()).unwrap_or(u64::MAX);
        let map = self
            .ebpf
            .map_mut(names::WAIT_START_MAP)
            .ok_or_else(|| missing_map(names::WAIT_START_MAP))?;
        let mut waiting: AyaHashMap<&mut MapData, u32, WaitStart> =
            AyaHashMap::try_from(map).map_err(|e| map_error(names::WAIT_START_MAP, &e))?;
        let stale: Vec<u32> = waiting
            .iter()
            .flatten()
            .filter(|(_, start)| now_ns.saturating_sub(start.since_ns) > limit)
            .map(|(pid, _)| pid)
            .collect();
        for pid in &stale {
            // Racing with the task being switched in: either side removes it.
            let _ = waiting.remove(pid);
        }
        self.expired_waits = self.expired_waits.saturating_add(stale.len() as u64);
        Ok(stale.len())
    }

    /// Removes every entry of cgroups that no longer exist, keeping the maps bounded.
    pub fn forget(&mut self, cgroup_ids: &[u64]) -> Result<(), RunqlatError> {
        if cgroup_ids.is_empty() {
            return Ok(());
        }
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
    let task_on_cpu = btf.member_offset("task_struct", "on_cpu")?;
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
            task_on_cpu,
            configured: 1,
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
    let mut ebpf = EbpfLoader::new()
        .override_global(names::OFFSETS_GLOBAL, offsets, true)
        .override_global(names::SCHED_OFFSETS_GLOBAL, sched, true)
        .load(EBPF_OBJECT)
        .map_err(|e| format!("loading the kernel object: {}", error_chain(&e)))?;
    let programs = [
        (
            names::RUNQ_WAKEUP_TP_BTF,
            names::RUNQ_WAKEUP_RAW_TP,
            "sched_wakeup",
        ),
        (
            names::RUNQ_WAKEUP_NEW_TP_BTF,
            names::RUNQ_WAKEUP_NEW_RAW_TP,
            "sched_wakeup_new",
        ),
        (
            names::RUNQ_SWITCH_TP_BTF,
            names::RUNQ_SWITCH_RAW_TP,
            "sched_switch",
        ),
    ];
    if *mode == ProbeMode::TpBtf {
        let btf = Btf::from_sys_fs().map_err(|e| format!("kernel BTF: {}", error_chain(&e)))?;
        for (name, _, tracepoint) in programs {
            let program: &mut BtfTracePoint = program_as(&mut ebpf, name)?;
            program
                .load(tracepoint, &btf)
                .map_err(|e| format!("{tracepoint}: {}", error_chain(&e)))?;
            program
                .attach()
                .map_err(|e| format!("{tracepoint}: {}", error_chain(&e)))?;
        }
    } else {
        for (_, name, tracepoint) in programs {
            let program: &mut RawTracePoint = program_as(&mut ebpf, name)?;
            program
                .load()
                .map_err(|e| format!("{tracepoint}: {}", error_chain(&e)))?;
            program
                .attach(tracepoint)
                .map_err(|e| format!("{tracepoint}: {}", error_chain(&e)))?;
        }
    }
    Ok(ebpf)
}

/// Capacity of the per-task map, for the metrics.
#[must_use]
pub fn waiting_tasks_capacity() -> u32 {
    MAX_WAITING_TASKS
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
    }
}
