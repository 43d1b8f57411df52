//! Suppressing BestEffort CPU when it crowds out the other classes.
//!
//! kubelet gives the BestEffort tier the smallest weight (2 shares), yet against Burstable
//! pods with small requests (the Burstable tier's weight is the sum of its pods' requests) it
//! still takes a real share of a contended CPU. The signal is the run-queue probe's
//! preemption attribution: how long Guaranteed and Burstable tasks waited for a CPU after
//! BestEffort tasks preempted them, per second of the window. At
//! [`BestEffortConfig::enter_wait`] or more for [`BestEffortConfig::windows`] windows in a
//! row the BestEffort tier is suppressed:
//!
//! - its CPU is capped (a CFS quota) at [`BestEffortConfig::cap_fraction`] of what it used in
//!   the last window, at least [`BestEffortConfig::min_cap_millicores`];
//! - where the kernel has `cpu.idle` (Linux 5.15+), the tier also becomes an idle group: its
//!   tasks never preempt the other tiers' tasks on wakeup and give way to them at once.
//!
//! Lifting it gives the tier kubelet's values again (the manager writes them under every
//! intervention). The suppression removes its own trigger, so it is lifted after a hold rather than on the
//! signal; when the crowding comes back within the hold's memory the next hold is twice as
//! long ([`super::hysteresis::Hold`]).
use std::time::Instant;

use super::decision::{Action, Decision};
use super::hysteresis::{Hold, HoldConfig, Streak};
use super::snapshot::{Preemptions, Window};
use super::{Capabilities, Overrides};
use crate::cgroup::resources::{Limit, MIN_QUOTA_PERIOD, QUOTA_PERIOD};
use crate::pods::qos::QosClass;

/// The policy's name in decisions and metrics.
pub const POLICY: &str = "besteffort_cpu";

/// What the decisions call the tier.
const TARGET: &str = "besteffort tier";

/// Thresholds of the BestEffort policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BestEffortConfig {
    /// Seconds Guaranteed and Burstable tasks waited after BestEffort preemptions, per second.
    pub enter_wait: f64,
    /// Windows in a row at or above `enter_wait`.
    pub windows: u32,
    /// The tier's cap as a fraction of the CPU it used in the last window.
    pub cap_fraction: f64,
    /// The lowest cap.
    pub min_cap_millicores: u64,
    pub hold: HoldConfig,
}

/// How the tier is suppressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Suppression {
    /// The tier was made an idle group.
    idle: bool,
    /// CFS quota per default period, µs.
    quota_us: u64,
}

/// The BestEffort policy's state.
#[derive(Debug)]
pub struct BestEffortPolicy {
    config: BestEffortConfig,
    crowded: Streak,
    hold: Hold,
    active: Option<Suppression>,
    said_unavailable: bool,
}

impl BestEffortPolicy {
    #[must_use]
    pub fn new(config: BestEffortConfig) -> Self {
        Self {
            config,
            crowded: Streak::default(),
            hold: Hold::new(config.hold),
            active: None,
            said_unavailable: false,
        }
    }

    /// Decisions for one window.
    pub fn evaluate(
        &mut self,
        window: &Window<'_>,
        caps: &Capabilities,
        now: Instant,
    ) -> Vec<Decision> {
        if let Some(active) = self.active {
            if !self.hold.expired(now) {
                return Vec::new();
            }
            self.active = None;
            self.crowded = Streak::default();
            self.hold.lift(now);
            return vec![Decision {
                policy: POLICY,
                action: Action::Release,
                target: TARGET.to_owned(),
                change: release_change(active),
                reason: "the hold is over; crowding is measured afresh".to_owned(),
            }];
        }
        let crowding = [QosClass::Guaranteed, QosClass::Burstable]
            .into_iter()
            .map(|victim| window.preemptions(victim, QosClass::BestEffort))
            .try_fold(Preemptions::default(), |sum, p| {
                p.map(|p| Preemptions {
                    count: sum.count + p.count,
                    wait_ns: sum.wait_ns + p.wait_ns,
                })
            });
        let Some(crowding) = crowding else {
            if self.said_unavailable {
                return Vec::new();
            }
            self.said_unavailable = true;
            return vec![Decision {
                policy: POLICY,
                action: Action::Unavailable,
                target: TARGET.to_owned(),
                change: "none".to_owned(),
                reason: "the run-queue probe (preemption attribution) is not running".to_owned(),
            }];
        };
        let seconds = window.seconds();
        if seconds <= 0.0 {
            return Vec::new();
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "nanoseconds and counts of one window, far below 2^53"
        )]
        let (wait, count) = (
            crowding.wait_ns as f64 / 1e9 / seconds,
            crowding.count as f64 / seconds,
        );
        let streak = self.crowded.observe(wait >= self.config.enter_wait);
        if streak < self.config.windows {
            return Vec::new();
        }
        let used = window.besteffort_cpu_used();
        let suppression = Suppression {
            idle: caps.cpu_idle,
            quota_us: cap_quota_us(
                used * self.config.cap_fraction,
                self.config.min_cap_millicores,
            ),
        };
        self.active = Some(suppression);
        let hold = self.hold.start(now);
        vec![Decision {
            policy: POLICY,
            action: Action::Apply,
            target: TARGET.to_owned(),
            change: format!("{} for {} s", apply_change(suppression), hold.as_secs()),
            reason: format!(
                "guaranteed and burstable tasks waited {:.1} ms/s after {count:.1} preemptions/s by besteffort tasks, {streak} windows in a row (threshold {:.1} ms/s); besteffort used {:.0}m",
                wait * 1e3,
                self.config.enter_wait * 1e3,
                used * 1e3
            ),
        }]
    }

    /// Adds the tier's suppression to `out`.
    pub fn overrides(&self, out: &mut Overrides) {
        if let Some(active) = self.active {
            let tier = &mut out.besteffort_tier;
            tier.cpu_quota = Some(Limit::Value(active.quota_us));
            if active.idle {
                tier.cpu_idle = Some(true);
            }
        }
    }

    /// 1 while the tier is suppressed.
    #[must_use]
    pub fn active(&self) -> usize {
        usize::from(self.active.is_some())
    }
}

fn apply_change(suppression: Suppression) -> String {
    let quota = format!(
        "cpu quota {} us per {QUOTA_PERIOD} us",
        suppression.quota_us
    );
    if suppression.idle {
        format!("cpu.idle 1, {quota}")
    } else {
        format!("{quota} (no cpu.idle: Linux 5.15+)")
    }
}

fn release_change(suppression: Suppression) -> String {
    if suppression.idle {
        "cpu.idle 0, cpu quota max".to_owned()
    } else {
        "cpu quota max".to_owned()
    }
}

/// The quota per default period for a cap of `cpus` CPUs, at least `min_millicores` and the
/// kernel's 1 ms.
fn cap_quota_us(cpus: f64, min_millicores: u64) -> u64 {
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "CPUs of a node times a period in µs, far below 2^53; negative clamps to 0"
    )]
    let quota = (cpus.max(0.0) * QUOTA_PERIOD as f64).round() as u64;
    let floor =
        (min_millicores.saturating_mul(QUOTA_PERIOD) / 1000).max(MIN_QUOTA_PERIOD.unsigned_abs());
    quota.max(floor)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::snapshot::fixtures::{container, each_window, snapshot};
    use super::super::snapshot::{ContainerSnapshot, Snapshot};
    use super::*;
    use crate::cgroup::stats::CpuStats;
    use QosClass::{BestEffort, Burstable, Guaranteed};

    fn config() -> BestEffortConfig {
        BestEffortConfig {
            enter_wait: 0.05,
            windows: 2,
            cap_fraction: 0.5,
            min_cap_millicores: 10,
            hold: HoldConfig {
                initial: Duration::from_secs(10),
                max: Duration::from_secs(40),
                memory: Duration::from_secs(60),
            },
        }
    }

    const IDLE: Capabilities = Capabilities {
        cpu_burst: true,
        cpu_idle: true,
    };

    /// A besteffort container that has used `ns` of CPU.
    fn noisy(ns: u64) -> ContainerSnapshot {
        let mut c = container("noisy", BestEffort);
        c.cpu = Some(CpuStats {
            usage_ns: Some(ns),
            ..CpuStats::default()
        });
        c
    }

    /// Snapshots every 5 s with cumulative (burstable <- besteffort) waits in ms, the
    /// besteffort container using 200m throughout, plus a constant guaranteed <- besteffort
    /// pair and a pair in the other direction that must not count.
    fn series(t0: Instant, waits_ms: &[u64]) -> Vec<Snapshot> {
        waits_ms
            .iter()
            .zip(0u64..)
            .map(|(&ms, i)| {
                snapshot(
                    t0 + Duration::from_secs(5 * i),
                    vec![noisy(i * 1_000_000_000)],
                    &[
                        ((Burstable, BestEffort), 100 * i, ms * 1_000_000),
                        ((Guaranteed, BestEffort), 0, 0),
                        ((BestEffort, Burstable), 1000 * i, 1_000_000_000 * i),
                    ],
                )
            })
            .collect()
    }

    fn run(
        policy: &mut BestEffortPolicy,
        snaps: &[Snapshot],
        caps: &Capabilities,
    ) -> Vec<Vec<Decision>> {
        each_window(snaps, |window, now| policy.evaluate(window, caps, now))
    }

    #[test]
    fn crowded_for_two_windows_caps_the_tier_at_half_its_use_then_lifts_it_after_the_hold() {
        let t0 = Instant::now();
        let mut policy = BestEffortPolicy::new(config());
        // 500 ms per 5 s window = 100 ms/s; then nothing.
        let snaps = series(t0, &[0, 500, 1000, 1000, 1000, 1000]);
        let decisions = run(&mut policy, &snaps[..3], &IDLE);
        assert!(decisions[0].is_empty());
        let applied = &decisions[1][0];
        assert_eq!(applied.action, Action::Apply);
        assert_eq!(
            applied.change,
            "cpu.idle 1, cpu quota 10000 us per 100000 us for 10 s"
        );
        assert!(
            applied
                .reason
                .contains("waited 100.0 ms/s after 20.0 preemptions/s"),
            "{}",
            applied.reason
        );
        assert!(
            applied.reason.ends_with("besteffort used 200m"),
            "{}",
            applied.reason
        );
        let mut out = Overrides::default();
        policy.overrides(&mut out);
        assert_eq!(out.besteffort_tier.cpu_idle, Some(true));
        assert_eq!(out.besteffort_tier.cpu_quota, Some(Limit::Value(10_000)));
        assert_eq!(policy.active(), 1);
        // Applied at 10 s, held until 20 s.
        let decisions = run(&mut policy, &snaps[2..], &IDLE);
        assert!(decisions[0].is_empty(), "held at 15 s");
        assert_eq!(decisions[1][0].action, Action::Release);
        assert_eq!(decisions[1][0].change, "cpu.idle 0, cpu quota max");
        assert!(decisions[2].is_empty());
        let mut out = Overrides::default();
        policy.overrides(&mut out);
        assert_eq!(out, Overrides::default(), "kubelet's values again");
        assert_eq!(policy.active(), 0);
    }

    #[test]
    fn below_the_threshold_or_only_once_nothing_happens() {
        let t0 = Instant::now();
        let mut policy = BestEffortPolicy::new(config());
        // 40 ms/s twice; then 100 ms/s once between quiet windows.
        let all = run(
            &mut policy,
            &series(t0, &[0, 200, 400, 900, 900, 1400, 1400]),
            &IDLE,
        )
        .concat();
        assert!(all.is_empty(), "{all:?}");
    }

    #[test]
    fn without_cpu_idle_only_the_quota() {
        let t0 = Instant::now();
        let mut policy = BestEffortPolicy::new(config());
        let caps = Capabilities {
            cpu_burst: false,
            cpu_idle: false,
        };
        let decisions = run(&mut policy, &series(t0, &[0, 500, 1000]), &caps);
        assert_eq!(
            decisions[1][0].change,
            "cpu quota 10000 us per 100000 us (no cpu.idle: Linux 5.15+) for 10 s"
        );
        let mut out = Overrides::default();
        policy.overrides(&mut out);
        assert_eq!(out.besteffort_tier.cpu_quota, Some(Limit::Value(10_000)));
        assert_eq!(out.besteffort_tier.cpu_idle, None);
    }

    #[test]
    fn without_the_run_queue_probe_it_says_so_once() {
        let t0 = Instant::now();
        let mut policy = BestEffortPolicy::new(config());
        let blind = |i: u64| Snapshot {
            taken: t0 + Duration::from_secs(5 * i),
            containers: vec![],
            preemptions: None,
            besteffort_tier: None,
        };
        let snaps = [blind(0), blind(1), blind(2)];
        let all = run(&mut policy, &snaps, &IDLE).concat();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].action, Action::Unavailable);
    }

    #[test]
    fn the_cap_is_a_share_of_use_within_the_floors() {
        assert_eq!(cap_quota_us(0.1, 10), 10_000);
        assert_eq!(cap_quota_us(0.0, 10), 1000);
        assert_eq!(cap_quota_us(0.0, 0), 1000, "the kernel's smallest quota");
        assert_eq!(cap_quota_us(2.5, 10), 250_000);
    }
}
