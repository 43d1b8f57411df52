//! CFS bandwidth counters from each cgroup's own `cpu.stat`, with cAdvisor's meaning:
//! `qosd_cpu_periods_total`, `qosd_cpu_throttled_periods_total`,
//! `qosd_cpu_throttled_seconds_total`, for every cgroup that has had a quota (non-zero
//! `nr_periods`), labelled by cgroup path and, for managed cgroups, by pod and QoS class.
//! Read at scrape time, so the series are exactly the kernel's counters.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{MetricFamily, MetricType};

use super::families::{as_f64, cgroup_labels, family};
use crate::cgroup::cfs::{CfsCounters, read_cfs_counters};
use crate::cgroup::trees::CgroupTrees;
use crate::cm::index::WorkloadIndex;

const PERIODS: &str = "qosd_cpu_periods_total";
const PERIODS_HELP: &str = "CFS enforcement periods that elapsed (cpu.stat nr_periods)";
const THROTTLED_PERIODS: &str = "qosd_cpu_throttled_periods_total";
const THROTTLED_PERIODS_HELP: &str =
    "CFS periods in which the cgroup was throttled (cpu.stat nr_throttled)";
const THROTTLED_SECONDS: &str = "qosd_cpu_throttled_seconds_total";
const THROTTLED_SECONDS_HELP: &str =
    "Time the cgroup was throttled (cpu.stat throttled_time on v1, throttled_usec on v2)";

/// Collects the `cpu.stat` throttling counters at scrape time.
pub struct CpuThrottlingCollector {
    hierarchy_root: PathBuf,
    trees: Arc<CgroupTrees>,
    v1: bool,
    workloads: WorkloadIndex,
    descs: Vec<Desc>,
}

impl CpuThrottlingCollector {
    /// Reads `cpu.stat` under the cpu hierarchy mounted at `hierarchy_root` (`v1`: its format),
    /// over the hierarchy's tree from `trees`.
    pub fn new(
        hierarchy_root: PathBuf,
        trees: Arc<CgroupTrees>,
        v1: bool,
        workloads: WorkloadIndex,
    ) -> Result<Self, prometheus::Error> {
        let descs = [
            (PERIODS, PERIODS_HELP),
            (THROTTLED_PERIODS, THROTTLED_PERIODS_HELP),
            (THROTTLED_SECONDS, THROTTLED_SECONDS_HELP),
        ]
        .into_iter()
        .map(|(name, help)| {
            Desc::new(
                name.into(),
                help.into(),
                vec!["cgroup".into()],
                HashMap::new(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            hierarchy_root,
            trees,
            v1,
            workloads,
            descs,
        })
    }
}

impl Collector for CpuThrottlingCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let found = match self.trees.current(&self.hierarchy_root) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(root = %self.hierarchy_root.display(), error = %e, "walking the cpu hierarchy");
                return Vec::new();
            }
        };
        let mut counters = match read_cfs_counters(&found, self.v1) {
            Ok(counters) => counters,
            Err(e) => {
                tracing::warn!(error = %e, "reading cpu.stat");
                return Vec::new();
            }
        };
        counters.sort_by(|a, b| a.path.cmp(&b.path));
        let series = |value: &dyn Fn(&CfsCounters) -> f64| {
            counters
                .iter()
                .map(|c| {
                    (
                        cgroup_labels(&self.workloads, c.cgroup_id, &c.path),
                        value(c),
                    )
                })
                .collect::<Vec<_>>()
        };
        vec![
            family(
                PERIODS,
                PERIODS_HELP,
                MetricType::COUNTER,
                series(&|c| as_f64(c.periods)),
            ),
            family(
                THROTTLED_PERIODS,
                THROTTLED_PERIODS_HELP,
                MetricType::COUNTER,
                series(&|c| as_f64(c.throttled_periods)),
            ),
            family(
                THROTTLED_SECONDS,
                THROTTLED_SECONDS_HELP,
                MetricType::COUNTER,
                series(&|c| as_f64(c.throttled_ns) / 1e9),
            ),
        ]
    }
}
