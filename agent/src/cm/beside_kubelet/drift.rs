//! kubelet checked, not trusted: every difference between what kubelet should have written
//! ([`super::expected`]) and what cgroupfs holds is a drift once it has been seen in
//! [`DRIFT_CHECKS`] checks in a row (kubelet itself writes some values a little after a pod
//! starts, and its CPU manager reconciles cpusets every `cpuManagerReconcilePeriod`, so a
//! difference seen once is not yet kubelet's mistake). Drifts are exported as
//! `qosd_kubelet_drift{level,file,namespace,pod,container,qos_class} 1` and listed by
//! `qosd inspect`; qosd never corrects them.
use std::collections::BTreeMap;

use prometheus::IntGaugeVec;

use super::expected::Level;

/// Checks in a row a difference must be seen in before it is a drift.
pub const DRIFT_CHECKS: u32 = 3;

/// One difference found by a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriftItem {
    pub level: Level,
    /// The cgroup's path (driver spelling).
    pub cgroup: String,
    /// The file name (`cpu.shares`), or `status.qosClass` for the pod's class.
    pub file: String,
    pub expected: String,
    /// `None`: the file does not exist.
    pub actual: Option<String>,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub qos_class: String,
}

impl DriftItem {
    fn key(&self) -> (String, String) {
        (self.cgroup.clone(), self.file.clone())
    }

    fn labels(&self) -> [&str; 6] {
        [
            self.level.label(),
            &self.file,
            &self.namespace,
            &self.pod,
            &self.container,
            &self.qos_class,
        ]
    }
}

/// The differences seen, how many checks in a row each, and those reported.
#[derive(Debug, Default)]
pub struct DriftTracker {
    streaks: BTreeMap<(String, String), (u32, DriftItem)>,
}

impl DriftTracker {
    /// Records one check's differences; returns the drifts (seen in [`DRIFT_CHECKS`] checks in
    /// a row), keeping `gauge`'s series to exactly those.
    pub fn check(&mut self, found: Vec<DriftItem>, gauge: Option<&IntGaugeVec>) -> Vec<DriftItem> {
        let before: Vec<DriftItem> = self.reported();
        let mut next = BTreeMap::new();
        for item in found {
            let key = item.key();
            let streak = self.streaks.get(&key).map_or(0, |(n, _)| *n);
            next.insert(key, (streak.saturating_add(1), item));
        }
        self.streaks = next;
        let now = self.reported();
        if let Some(gauge) = gauge {
            for gone in before
                .iter()
                .filter(|b| !now.iter().any(|n| n.labels() == b.labels()))
            {
                // Absent series are fine.
                let _ = gauge.remove_label_values(&gone.labels());
            }
            for item in &now {
                gauge.with_label_values(&item.labels()).set(1);
            }
        }
        now
    }

    /// The drifts of the last check.
    #[must_use]
    pub fn reported(&self) -> Vec<DriftItem> {
        self.streaks
            .values()
            .filter(|(n, _)| *n >= DRIFT_CHECKS)
            .map(|(_, item)| item.clone())
            .collect()
    }

    /// Differences seen fewer times than [`DRIFT_CHECKS`] so far.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.streaks
            .values()
            .filter(|(n, _)| *n < DRIFT_CHECKS)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(file: &str, actual: &str) -> DriftItem {
        DriftItem {
            level: Level::Pod,
            cgroup: "/kubepods/burstable/poda".into(),
            file: file.into(),
            expected: "256".into(),
            actual: Some(actual.into()),
            namespace: "ns".into(),
            pod: "web".into(),
            container: String::new(),
            qos_class: "burstable".into(),
        }
    }

    #[test]
    fn a_difference_is_a_drift_after_three_checks_in_a_row_and_goes_with_it() {
        let gauge = IntGaugeVec::new(
            prometheus::Opts::new("qosd_kubelet_drift", "test"),
            &super::super::metrics::DRIFT_LABELS,
        )
        .expect("gauge");
        let mut tracker = DriftTracker::default();
        let series = || {
            let mut n = 0;
            for family in prometheus::core::Collector::collect(&gauge) {
                n += family.get_metric().len();
            }
            n
        };
        assert!(
            tracker
                .check(vec![item("cpu.shares", "2")], Some(&gauge))
                .is_empty()
        );
        assert!(
            tracker
                .check(vec![item("cpu.shares", "2")], Some(&gauge))
                .is_empty()
        );
        assert_eq!(tracker.pending(), 1);
        // A value that changes is the same drift (same file), still counted.
        let drifts = tracker.check(vec![item("cpu.shares", "3")], Some(&gauge));
        assert_eq!(drifts.len(), 1);
        assert_eq!(drifts[0].actual.as_deref(), Some("3"));
        assert_eq!(series(), 1);
        // Missing from one check: the streak starts again, the series goes.
        assert!(tracker.check(vec![], Some(&gauge)).is_empty());
        assert_eq!(series(), 0);
        assert!(
            tracker
                .check(vec![item("cpu.shares", "3")], Some(&gauge))
                .is_empty()
        );
    }
}
