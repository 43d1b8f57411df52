//! The feedback's series: `qosd_feedback_decisions_total{policy,action}` (every decision,
//! dry-run ones included) and `qosd_feedback_interventions{policy}` (targets under an applied
//! intervention right now).
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::decision::{Action, Decision};
use super::{besteffort, burst, numa_align};

/// Every policy, for the series that exist from the start.
const POLICIES: [&str; 3] = [besteffort::POLICY, burst::POLICY, numa_align::POLICY];

/// Handles to the feedback's series.
#[derive(Clone, Debug)]
pub struct FeedbackMetrics {
    decisions: IntCounterVec,
    interventions: IntGaugeVec,
}

impl FeedbackMetrics {
    /// Creates the series (every policy and action at 0, so rates start from the first
    /// scrape) and registers them.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let metrics = Self {
            decisions: IntCounterVec::new(
                Opts::new(
                    "qosd_feedback_decisions_total",
                    "Feedback decisions, by policy and action (apply, release, unavailable); dry-run decisions included",
                ),
                &["policy", "action"],
            )?,
            interventions: IntGaugeVec::new(
                Opts::new(
                    "qosd_feedback_interventions",
                    "Targets (the besteffort tier, containers) under an intervention a policy applied",
                ),
                &["policy"],
            )?,
        };
        for policy in POLICIES {
            for action in [Action::Apply, Action::Release, Action::Unavailable] {
                metrics
                    .decisions
                    .with_label_values(&[policy, action.as_str()]);
            }
            metrics.interventions.with_label_values(&[policy]);
        }
        // Only the NUMA policy reports what it deliberately leaves alone.
        metrics
            .decisions
            .with_label_values(&[numa_align::POLICY, Action::Report.as_str()]);
        registry.register(Box::new(metrics.decisions.clone()))?;
        registry.register(Box::new(metrics.interventions.clone()))?;
        Ok(metrics)
    }

    /// Counts `decisions` and sets the interventions in place per policy.
    pub fn record(&self, decisions: &[Decision], active: &[(&'static str, usize)]) {
        for d in decisions {
            self.decisions
                .with_label_values(&[d.policy, d.action.as_str()])
                .inc();
        }
        for &(policy, count) in active {
            self.interventions
                .with_label_values(&[policy])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_and_action_is_exported_from_the_start() {
        let registry = Registry::new();
        let _metrics = FeedbackMetrics::register(&registry).expect("register");
        let families = registry.gather();
        let count = |name: &str| {
            families
                .iter()
                .find(|f| f.name() == name)
                .map_or(0, |f| f.get_metric().len())
        };
        assert_eq!(count("qosd_feedback_decisions_total"), 10);
        assert_eq!(count("qosd_feedback_interventions"), 3);
    }
}
