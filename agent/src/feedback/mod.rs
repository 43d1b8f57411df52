//! Feedback: the measurements turned into cgroup decisions.
//!
//! Each feedback period the container manager takes a [`Snapshot`] of its containers (the
//! kernel's `cpu.stat` counters, resident memory per NUMA node, CPUs) and of the run-queue
//! probe's preemptions between QoS classes, and hands it to [`Feedback::observe`]. The policies
//! look at the [`Window`] since the previous snapshot and decide:
//!
//! - [`besteffort`]: BestEffort tasks crowd out Guaranteed and Burstable ones (preemptions
//!   and the waits they caused): the BestEffort tier is capped at half the CPU it used (a CFS
//!   quota) and made an idle group (`cpu.idle`) where the kernel allows;
//! - [`burst`]: a Burstable container throttled in many CFS periods gets a CFS burst;
//! - [`numa_align`]: a container whose CPUs are on one NUMA node but whose memory is not gets
//!   `cpuset.mems` of that node (its pages migrate).
//!
//! Policies never write: they hold their interventions, which [`Feedback::overrides`] hands to
//! the container manager, the one writer of cgroup files, as values laid over kubelet's
//! ([`Overrides`]); the manager's reconcile keeps them in place like any other value. Under
//! them the manager writes kubelet's values of the same settings ([`Capabilities`]'
//! baselines), so a lifted intervention, or one a crashed qosd left, goes back to kubelet's. Every
//! decision is explained (policy, target, change, the numbers behind it): logged through
//! tracing, kept in a [`DecisionLog`] for `qosd inspect`, and counted in
//! `qosd_feedback_decisions_total{policy,action}` ([`FeedbackMetrics`]). In
//! [`Mode::DryRun`] decisions are logged and counted but nothing is written.
//!
//! The policies act on what the kernel offers ([`Capabilities`]) and say once, per target,
//! when it offers too little.
pub mod besteffort;
pub mod burst;
pub mod decision;
pub mod hysteresis;
pub mod metrics;
pub mod numa_align;
pub mod snapshot;
pub mod source;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

pub use decision::{Action, Decision, DecisionLog, LoggedDecision};
pub use metrics::FeedbackMetrics;
pub use snapshot::{CfsLimit, ContainerRef, ContainerSnapshot, Preemptions, Snapshot, Window};
pub use source::PreemptionSource;

use crate::cgroup::resources::ResourceConfig;
use crate::numa::NodeLayout;
use besteffort::{BestEffortConfig, BestEffortPolicy};
use burst::{BurstConfig, BurstPolicy};
use hysteresis::HoldConfig;
use numa_align::{NumaAlignConfig, NumaAlignPolicy};

/// Decisions kept for `qosd inspect`.
const LOG_CAPACITY: usize = 256;

/// Whether the feedback runs, and whether it writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Decisions are made, logged and written.
    #[default]
    On,
    /// Decisions are made and logged, nothing is written.
    DryRun,
    /// No feedback.
    Off,
}

/// The feedback's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FeedbackConfig {
    pub mode: Mode,
    /// How often a snapshot is taken (the window length).
    pub period: Duration,
    pub besteffort: BestEffortConfig,
    pub burst: BurstConfig,
    pub numa: NumaAlignConfig,
}

impl FeedbackConfig {
    /// The defaults, with `mode`, `period` and the first `hold` of an intervention. A
    /// condition must hold for [`EVIDENCE`] and two windows at least (so 500 ms windows decide
    /// 1 to 1.5 s after it begins): BestEffort suppressed at 50 ms/s of crowding (capped at
    /// half what it used, at least 10m, and idle where the kernel allows; held `hold`, doubling
    /// while it comes back within 10 min, up to 15 min or `hold` if longer); a burst of the
    /// whole quota at 10% throttled periods (2 at least over those windows) while using at most
    /// 90% of the limit on average, lifted once held and 30 s (6 windows at least) without a
    /// burst used; memory realigned at 50% remote (16 MiB or more).
    #[must_use]
    pub fn with_defaults(mode: Mode, period: Duration, hold: Duration) -> Self {
        let hold = HoldConfig {
            initial: hold,
            max: hold.max(Duration::from_secs(15 * 60)),
            memory: Duration::from_secs(10 * 60),
        };
        let windows = windows_in(EVIDENCE, period).max(2);
        Self {
            mode,
            period,
            besteffort: BestEffortConfig {
                enter_wait: 0.05,
                windows,
                cap_fraction: 0.5,
                min_cap_millicores: 10,
                hold,
            },
            burst: BurstConfig {
                enter_ratio: 0.10,
                windows,
                max_use_of_limit: 0.9,
                release_windows: windows_in(Duration::from_secs(30), period).max(6),
                min_throttled: 2,
                burst_fraction: 1.0,
                hold,
            },
            numa: NumaAlignConfig {
                enter_remote: 0.5,
                windows,
                min_bytes: 16 << 20,
                unpinned_share: 0.9,
                unpinned_windows: windows_in(UNPINNED_SPAN, period).max(windows),
            },
        }
    }
}

/// How long a condition must hold before a policy acts on it (and two windows at least: one
/// window cannot tell a condition from a blip).
pub const EVIDENCE: Duration = Duration::from_secs(1);

/// How long an unpinned container must run on one node with its memory on another before
/// `numa_align` reports it: where the scheduler puts a task changes often, and a report is
/// worth reading only for a placement that lasts.
pub const UNPINNED_SPAN: Duration = Duration::from_secs(10);

/// How many windows of `period` cover `span` (rounded up; one at least).
fn windows_in(span: Duration, period: Duration) -> u32 {
    let period = period.as_millis().max(1);
    u32::try_from(span.as_millis().div_ceil(period)).unwrap_or(u32::MAX)
}

/// What the running kernel lets the policies write (found from the kubepods cgroup's files);
/// the default is neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `cpu.cfs_burst_us` / `cpu.max.burst` (Linux 5.14+).
    pub cpu_burst: bool,
    /// `cpu.idle` (Linux 5.15+).
    pub cpu_idle: bool,
}

impl Capabilities {
    /// kubelet's values of what the BestEffort policy changes (no quota, not idle), written
    /// whenever the feedback runs: a lifted suppression, or one an earlier qosd left behind,
    /// goes back to them.
    #[must_use]
    pub fn besteffort_baseline(&self) -> ResourceConfig {
        ResourceConfig {
            cpu_quota: Some(crate::cgroup::resources::Limit::Max),
            cpu_idle: self.cpu_idle.then_some(false),
            ..ResourceConfig::default()
        }
    }

    /// kubelet's value of what the burst policy changes (no burst) for a container with a CFS
    /// quota (`quota`), written whenever the feedback runs.
    #[must_use]
    pub fn container_baseline(&self, quota: bool) -> ResourceConfig {
        ResourceConfig {
            cpu_burst: (self.cpu_burst && quota).then_some(0),
            ..ResourceConfig::default()
        }
    }
}

/// Values the policies lay over kubelet's, per target. A field set here replaces the one the
/// manager computed; `None` keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub besteffort_tier: ResourceConfig,
    pub containers: BTreeMap<ContainerRef, ResourceConfig>,
}

/// The feedback loop's state: the policies, the previous snapshot and the decision log.
#[derive(Debug)]
pub struct Feedback {
    config: FeedbackConfig,
    caps: Capabilities,
    besteffort: BestEffortPolicy,
    burst: BurstPolicy,
    numa: Option<NumaAlignPolicy>,
    previous: Option<Snapshot>,
    log: DecisionLog,
    metrics: Option<FeedbackMetrics>,
}

impl Feedback {
    /// The policies with `config` on a kernel with `caps`; NUMA realignment needs the
    /// machine's CPU-to-node `layout`.
    #[must_use]
    pub fn new(
        config: FeedbackConfig,
        caps: Capabilities,
        layout: Option<NodeLayout>,
        metrics: Option<FeedbackMetrics>,
    ) -> Self {
        Self {
            config,
            caps,
            besteffort: BestEffortPolicy::new(config.besteffort),
            burst: BurstPolicy::new(config.burst),
            numa: layout.map(|l| NumaAlignPolicy::new(config.numa, l)),
            previous: None,
            log: DecisionLog::new(LOG_CAPACITY),
            metrics,
        }
    }

    /// What the kernel lets the policies write.
    #[must_use]
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// The configured snapshot period.
    #[must_use]
    pub fn period(&self) -> Duration {
        self.config.period
    }

    /// How far back `numa_align` judges where an unpinned container ran.
    #[must_use]
    pub fn numa_span(&self) -> Duration {
        self.config.period * self.config.numa.unpinned_windows
    }

    /// Evaluates the window since the previous snapshot (nothing for the first) and returns
    /// the decisions made, already logged and counted.
    pub fn observe(&mut self, snapshot: Snapshot) -> Vec<Decision> {
        let now = snapshot.taken;
        let decisions = match self.previous.take() {
            Some(previous) => {
                let window = Window {
                    previous: &previous,
                    current: &snapshot,
                };
                self.evaluate(&window, now)
            }
            None => Vec::new(),
        };
        self.previous = Some(snapshot);
        let dry_run = self.config.mode == Mode::DryRun;
        for decision in &decisions {
            tracing::info!(
                policy = decision.policy,
                action = decision.action.as_str(),
                target = %decision.target,
                change = %decision.change,
                reason = %decision.reason,
                dry_run,
                "feedback decision"
            );
            self.log.push(LoggedDecision {
                at: SystemTime::now(),
                dry_run,
                decision: decision.clone(),
            });
        }
        if let Some(metrics) = &self.metrics {
            metrics.record(&decisions, &self.active());
        }
        decisions
    }

    fn evaluate(&mut self, window: &Window<'_>, now: Instant) -> Vec<Decision> {
        let mut decisions = self.besteffort.evaluate(window, &self.caps, now);
        decisions.extend(self.burst.evaluate(window, &self.caps, now));
        if let Some(numa) = &mut self.numa {
            decisions.extend(numa.evaluate(window));
        }
        decisions
    }

    /// Targets under an applied intervention, per policy.
    #[must_use]
    pub fn active(&self) -> [(&'static str, usize); 3] {
        [
            (besteffort::POLICY, self.besteffort.active()),
            (burst::POLICY, self.burst.active()),
            (
                numa_align::POLICY,
                self.numa.as_ref().map_or(0, NumaAlignPolicy::active),
            ),
        ]
    }

    /// What the manager lays over kubelet's values now (nothing in dry-run mode).
    #[must_use]
    pub fn overrides(&self) -> Overrides {
        let mut out = Overrides::default();
        if self.config.mode != Mode::On {
            return out;
        }
        self.besteffort.overrides(&mut out);
        self.burst.overrides(&mut out);
        if let Some(numa) = &self.numa {
            numa.overrides(&mut out);
        }
        out
    }

    /// The decision log, for `qosd inspect`.
    #[must_use]
    pub fn log(&self) -> &DecisionLog {
        &self.log
    }
}

#[cfg(test)]
mod tests {
    use super::snapshot::fixtures::{container, cpu, snapshot, target};
    use super::*;
    use crate::pods::qos::QosClass;

    fn throttled_web(t0: Instant, i: u64) -> Snapshot {
        let mut c = container("web", QosClass::Burstable);
        c.limit = Some(CfsLimit {
            quota_us: 20_000,
            period_us: 100_000,
        });
        c.cpu = Some(cpu(50 * i, 20 * i, 0));
        snapshot(t0 + Duration::from_secs(5 * i), vec![c], &[])
    }

    fn feedback(mode: Mode) -> Feedback {
        Feedback::new(
            FeedbackConfig::with_defaults(mode, Duration::from_secs(5), Duration::from_secs(60)),
            Capabilities {
                cpu_burst: true,
                cpu_idle: true,
            },
            None,
            None,
        )
    }

    #[test]
    fn decisions_are_logged_and_become_overrides() {
        let t0 = Instant::now();
        let mut fb = feedback(Mode::On);
        let made: Vec<Decision> = (0..3)
            .flat_map(|i| fb.observe(throttled_web(t0, i)))
            .collect();
        assert_eq!(made.len(), 1, "{made:?}");
        assert_eq!(made[0].policy, burst::POLICY);
        assert_eq!(fb.log().iter().count(), 1);
        assert!(!fb.log().iter().any(|e| e.dry_run));
        assert_eq!(
            fb.overrides().containers[&target("web")].cpu_burst,
            Some(20_000)
        );
        assert_eq!(fb.active()[1], (burst::POLICY, 1));
    }

    #[test]
    fn dry_run_decides_and_logs_but_overrides_nothing() {
        let t0 = Instant::now();
        let mut fb = feedback(Mode::DryRun);
        let made: Vec<Decision> = (0..3)
            .flat_map(|i| fb.observe(throttled_web(t0, i)))
            .collect();
        assert_eq!(made.len(), 1);
        assert!(fb.log().iter().all(|e| e.dry_run));
        assert_eq!(fb.overrides(), Overrides::default());
    }
}
