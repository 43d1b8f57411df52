//! CPU burst for throttled Burstable containers.
//!
//! A Burstable container with a CPU limit that the CFS bandwidth controller throttles in many
//! periods (`cpu.stat` `nr_throttled` / `nr_periods` at least [`BurstConfig::enter_ratio`] for
//! [`BurstConfig::windows`] windows in a row, [`BurstConfig::min_throttled`] throttled periods
//! among them) although it uses less than its limit on average
//! (at most [`BurstConfig::max_use_of_limit`] of it: spikes, not a steady overrun) gets a CFS
//! burst (`cpu.cfs_burst_us`, `cpu.max.burst`; kernel 5.14+): quota it left unused in earlier
//! periods, up to the burst, may be spent in a later one, so short spikes within its average
//! limit stop being throttled. A container that runs at its limit leaves no quota unused, and
//! a burst would never fill. The burst is the quota times [`BurstConfig::burst_fraction`] (the
//! kernel allows at most the quota). It is lifted (the manager writes kubelet's 0 again) once
//! the kernel reports no burst used (`nr_bursts`) for [`BurstConfig::release_windows`] windows
//! and the hold has passed.
use std::collections::BTreeMap;
use std::time::Instant;

use super::decision::{Action, Decision};
use super::hysteresis::{Hold, HoldConfig, Streak};
use super::snapshot::{CfsDelta, ContainerRef, Window};
use super::{Capabilities, Overrides};
use crate::pods::qos::QosClass;

/// The policy's name in decisions and metrics.
pub const POLICY: &str = "cpu_burst";

/// Thresholds of the burst policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BurstConfig {
    /// Throttled share of periods that counts as throttled.
    pub enter_ratio: f64,
    /// Windows in a row that must be throttled.
    pub windows: u32,
    /// The highest average use, as a share of the limit, that a burst can help.
    pub max_use_of_limit: f64,
    /// Windows in a row without a burst used before release.
    pub release_windows: u32,
    /// Throttled periods the windows in a row must hold together before a burst is given
    /// (one throttled period of a mostly idle container is a large share of nothing); a
    /// window without any throttled period breaks the streak.
    pub min_throttled: u64,
    /// Burst as a fraction of the quota, in (0, 1].
    pub burst_fraction: f64,
    pub hold: HoldConfig,
}

#[derive(Debug)]
struct TargetState {
    throttled: Streak,
    /// Throttled periods of the windows of the current `throttled` streak.
    throttled_in_streak: u64,
    quiet: Streak,
    hold: Hold,
    /// The burst in place, in µs.
    burst_us: Option<u64>,
    said_unavailable: bool,
}

/// The burst policy and what it holds per container.
#[derive(Debug)]
pub struct BurstPolicy {
    config: BurstConfig,
    targets: BTreeMap<ContainerRef, TargetState>,
}

impl BurstPolicy {
    #[must_use]
    pub fn new(config: BurstConfig) -> Self {
        Self {
            config,
            targets: BTreeMap::new(),
        }
    }

    /// Decisions for one window.
    pub fn evaluate(
        &mut self,
        window: &Window<'_>,
        caps: &Capabilities,
        now: Instant,
    ) -> Vec<Decision> {
        let config = self.config;
        let mut decisions = Vec::new();
        let present: Vec<&ContainerRef> = window.containers().map(|c| &c.target).collect();
        self.targets.retain(|t, _| present.contains(&t));
        for container in window.containers() {
            let Some(limit) = container.limit else {
                continue;
            };
            if container.qos != QosClass::Burstable {
                continue;
            }
            let Some(delta) = window.cfs(&container.target) else {
                continue;
            };
            let state = self
                .targets
                .entry(container.target.clone())
                .or_insert_with(|| TargetState {
                    throttled: Streak::default(),
                    throttled_in_streak: 0,
                    quiet: Streak::default(),
                    hold: Hold::new(config.hold),
                    burst_us: None,
                    said_unavailable: false,
                });
            let ratio = delta.throttled_ratio();
            let counted = delta.throttled_periods > 0;
            match state.burst_us {
                None => {
                    let used = window.cpu_used_by(&container.target);
                    let spiky = used.is_some_and(|u| u <= limit.cpus() * config.max_use_of_limit);
                    let holds = counted && spiky && ratio >= config.enter_ratio;
                    let streak = state.throttled.observe(holds);
                    state.throttled_in_streak = if holds {
                        state
                            .throttled_in_streak
                            .saturating_add(delta.throttled_periods)
                    } else {
                        0
                    };
                    if streak < config.windows || state.throttled_in_streak < config.min_throttled {
                        continue;
                    }
                    let reason = format!(
                        "{}, using {:.0}m of its {:.0}m limit",
                        throttled_reason(&delta, streak, window.seconds()),
                        used.unwrap_or(0.0) * 1e3,
                        limit.cpus() * 1e3
                    );
                    if !caps.cpu_burst {
                        if !state.said_unavailable {
                            state.said_unavailable = true;
                            decisions.push(Decision {
                                policy: POLICY,
                                action: Action::Unavailable,
                                target: container.target.to_string(),
                                change: "none: the kernel has no CFS burst (cpu.cfs_burst_us / cpu.max.burst, Linux 5.14+)".to_owned(),
                                reason,
                            });
                        }
                        continue;
                    }
                    let quota_us = limit.quota_us;
                    let burst = burst_us(quota_us, config.burst_fraction);
                    state.burst_us = Some(burst);
                    state.quiet = Streak::default();
                    state.hold.start(now);
                    decisions.push(Decision {
                        policy: POLICY,
                        action: Action::Apply,
                        target: container.target.to_string(),
                        change: format!("cpu burst {burst} us (quota {quota_us} us)"),
                        reason,
                    });
                }
                Some(burst) => {
                    let streak = state.quiet.observe(delta.bursts.unwrap_or(0) == 0);
                    if streak < config.release_windows || !state.hold.expired(now) {
                        continue;
                    }
                    state.burst_us = None;
                    state.throttled = Streak::default();
                    state.throttled_in_streak = 0;
                    state.hold.lift(now);
                    decisions.push(Decision {
                        policy: POLICY,
                        action: Action::Release,
                        target: container.target.to_string(),
                        change: format!("cpu burst 0 us (was {burst} us)"),
                        reason: format!(
                            "no burst used (nr_bursts), {streak} windows in a row; throttled in {:.1}% of periods",
                            ratio * 100.0
                        ),
                    });
                }
            }
        }
        decisions
    }

    /// Adds the bursts in place to `out`.
    pub fn overrides(&self, out: &mut Overrides) {
        for (target, state) in &self.targets {
            if let Some(burst) = state.burst_us {
                out.containers.entry(target.clone()).or_default().cpu_burst = Some(burst);
            }
        }
    }

    /// Containers with a burst in place.
    #[must_use]
    pub fn active(&self) -> usize {
        self.targets
            .values()
            .filter(|s| s.burst_us.is_some())
            .count()
    }
}

fn throttled_reason(delta: &CfsDelta, windows: u32, seconds: f64) -> String {
    format!(
        "throttled in {} of {} periods ({:.1}%) in the last {seconds:.0} s, {windows} windows in a row",
        delta.throttled_periods,
        delta.periods,
        delta.throttled_ratio() * 100.0
    )
}

/// The burst for `quota_us`: the fraction of the quota, at least 1 µs, at most the quota.
fn burst_us(quota_us: u64, fraction: f64) -> u64 {
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a CFS quota in µs is far below 2^53; the product is clamped to [1, quota]"
    )]
    let burst = (quota_us as f64 * fraction).round() as u64;
    burst.clamp(1, quota_us.max(1))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::snapshot::fixtures::{container, cpu, each_window, snapshot, target};
    use super::super::snapshot::{CfsLimit, Snapshot};
    use super::*;

    pub(super) fn config() -> BurstConfig {
        BurstConfig {
            enter_ratio: 0.1,
            windows: 2,
            max_use_of_limit: 0.9,
            release_windows: 2,
            min_throttled: 2,
            burst_fraction: 1.0,
            hold: HoldConfig {
                initial: Duration::from_secs(20),
                max: Duration::from_secs(80),
                memory: Duration::from_secs(300),
            },
        }
    }

    const CAPS: Capabilities = Capabilities {
        cpu_burst: true,
        cpu_idle: true,
    };

    /// Snapshots of one burstable container ("web", 20 ms quota) every 5 s with these
    /// cumulative (periods, throttled, bursts).
    fn series(t0: Instant, points: &[(u64, u64, u64)], qos: QosClass) -> Vec<Snapshot> {
        points
            .iter()
            .zip(0u64..)
            .map(|(&(p, t, b), i)| {
                let mut c = container("web", qos);
                c.limit = Some(CfsLimit {
                    quota_us: 20_000,
                    period_us: 100_000,
                });
                c.cpu = Some(cpu(p, t, b));
                snapshot(t0 + Duration::from_secs(5 * i), vec![c], &[])
            })
            .collect()
    }

    fn run(
        policy: &mut BurstPolicy,
        snaps: &[Snapshot],
        caps: &Capabilities,
    ) -> Vec<Vec<Decision>> {
        each_window(snaps, |window, now| policy.evaluate(window, caps, now))
    }

    #[test]
    fn throttled_for_two_windows_gets_a_burst_of_its_quota_and_keeps_it_while_used() {
        let t0 = Instant::now();
        let mut policy = BurstPolicy::new(config());
        // 50 periods per window; 40% throttled, 40%, then bursting without throttling.
        let snaps = series(
            t0,
            &[
                (0, 0, 0),
                (50, 20, 0),
                (100, 40, 0),
                (150, 40, 12),
                (200, 40, 24),
            ],
            QosClass::Burstable,
        );
        let decisions = run(&mut policy, &snaps, &CAPS);
        assert!(
            decisions[0].is_empty(),
            "one throttled window is not enough"
        );
        assert_eq!(decisions[1].len(), 1);
        let d = &decisions[1][0];
        assert_eq!((d.action, d.policy), (Action::Apply, POLICY));
        assert_eq!(d.target, "default/web/web");
        assert_eq!(d.change, "cpu burst 20000 us (quota 20000 us)");
        assert!(
            d.reason.contains("throttled in 20 of 50 periods (40.0%)"),
            "{}",
            d.reason
        );
        assert!(decisions[2].is_empty() && decisions[3].is_empty());
        let mut out = Overrides::default();
        policy.overrides(&mut out);
        assert_eq!(out.containers[&target("web")].cpu_burst, Some(20_000));
        assert_eq!(policy.active(), 1);
    }

    #[test]
    fn the_windows_in_a_row_need_two_throttled_periods_together() {
        let t0 = Instant::now();
        // Short windows of 5 periods: one throttled period in each of two windows is 20%,
        // and two together are enough; a window without one breaks the streak.
        let mut policy = BurstPolicy::new(config());
        let snaps = series(
            t0,
            &[(0, 0, 0), (5, 1, 0), (10, 1, 0), (15, 2, 0), (20, 3, 0)],
            QosClass::Burstable,
        );
        let decisions = run(&mut policy, &snaps, &CAPS);
        assert!(decisions[0].is_empty());
        assert!(decisions[1].is_empty(), "the streak was broken");
        assert!(decisions[2].is_empty(), "one window after the break");
        assert_eq!(decisions[3].len(), 1, "{decisions:?}");
        assert_eq!(decisions[3][0].action, Action::Apply);

        // Two windows with one throttled period in all: too little evidence.
        let mut config = config();
        config.min_throttled = 3;
        let mut policy = BurstPolicy::new(config);
        let snaps = series(
            t0,
            &[(0, 0, 0), (5, 1, 0), (10, 2, 0), (15, 3, 0)],
            QosClass::Burstable,
        );
        let decisions = run(&mut policy, &snaps, &CAPS);
        assert!(decisions[1].is_empty(), "2 of the 3 periods asked for");
        assert_eq!(decisions[2].len(), 1, "3 windows in a row hold 3");
    }

    #[test]
    fn released_when_unused_after_the_hold() {
        let t0 = Instant::now();
        let mut policy = BurstPolicy::new(config());
        // Applied at 10 s; quiet from 15 s; the hold (20 s) ends at 30 s.
        let snaps = series(
            t0,
            &[
                (0, 0, 0),
                (50, 20, 0),
                (100, 40, 0),
                (150, 40, 0),
                (200, 40, 0),
                (250, 40, 0),
                (300, 40, 0),
            ],
            QosClass::Burstable,
        );
        let decisions = run(&mut policy, &snaps, &CAPS);
        assert_eq!(decisions[1][0].action, Action::Apply);
        assert!(decisions[2].is_empty() && decisions[3].is_empty(), "held");
        assert!(decisions[4].is_empty(), "hold not over at 25 s");
        assert_eq!(decisions[5].len(), 1);
        assert_eq!(decisions[5][0].action, Action::Release);
        assert_eq!(decisions[5][0].change, "cpu burst 0 us (was 20000 us)");
        let mut out = Overrides::default();
        policy.overrides(&mut out);
        assert!(out.containers.is_empty(), "kubelet's value again: {out:?}");
        assert_eq!(policy.active(), 0);
    }

    #[test]
    fn only_burstable_containers_with_a_limit_throttled_more_than_once() {
        let t0 = Instant::now();
        let mut policy = BurstPolicy::new(config());
        let guaranteed = series(
            t0,
            &[(0, 0, 0), (50, 40, 0), (100, 80, 0)],
            QosClass::Guaranteed,
        );
        assert!(run(&mut policy, &guaranteed, &CAPS).concat().is_empty());
        // One throttled period in one window, then none: too little to judge.
        let idle = series(t0, &[(0, 0, 0), (5, 1, 0), (10, 1, 0)], QosClass::Burstable);
        assert!(run(&mut policy, &idle, &CAPS).concat().is_empty());
    }

    #[test]
    fn without_kernel_burst_support_it_says_so_once() {
        let t0 = Instant::now();
        let mut policy = BurstPolicy::new(config());
        let snaps = series(
            t0,
            &[(0, 0, 0), (50, 20, 0), (100, 40, 0), (150, 60, 0)],
            QosClass::Burstable,
        );
        let caps = Capabilities {
            cpu_burst: false,
            cpu_idle: true,
        };
        let all = run(&mut policy, &snaps, &caps).concat();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].action, Action::Unavailable);
        let mut out = Overrides::default();
        policy.overrides(&mut out);
        assert!(out.containers.is_empty());
    }

    #[test]
    fn burst_is_a_fraction_of_the_quota_within_the_kernels_bounds() {
        assert_eq!(burst_us(20_000, 0.5), 10_000);
        assert_eq!(burst_us(20_000, 1.0), 20_000);
        assert_eq!(burst_us(20_000, 3.0), 20_000);
        assert_eq!(burst_us(20_000, 0.0), 1);
    }
}

#[cfg(test)]
mod steady_overrun {
    use std::time::Duration;

    use super::super::snapshot::CfsLimit;
    use super::super::snapshot::fixtures::{container, cpu, each_window, snapshot};
    use super::*;
    use crate::cgroup::stats::CpuStats;

    /// A container at its 200m limit on average (throttled because it always wants more)
    /// leaves no quota unused: a burst could never fill, so none is given. Spikes under the
    /// limit on average (100m) do get one.
    #[test]
    fn a_container_running_at_its_limit_gets_no_burst() {
        let t0 = Instant::now();
        let run = |used_per_window_ns: u64| {
            let snaps: Vec<_> = (0..4u64)
                .map(|i| {
                    let mut c = container("web", QosClass::Burstable);
                    c.limit = Some(CfsLimit {
                        quota_us: 20_000,
                        period_us: 100_000,
                    });
                    c.cpu = Some(CpuStats {
                        usage_ns: Some(used_per_window_ns * i),
                        ..cpu(50 * i, 20 * i, 0)
                    });
                    snapshot(t0 + Duration::from_secs(5 * i), vec![c], &[])
                })
                .collect();
            let mut policy = BurstPolicy::new(tests::config());
            let caps = Capabilities {
                cpu_burst: true,
                cpu_idle: true,
            };
            each_window(&snaps, |w, now| policy.evaluate(w, &caps, now)).concat()
        };
        // 1 s of CPU per 5 s window = 200m, the whole limit.
        assert!(run(1_000_000_000).is_empty());
        // 0.5 s per window = 100m.
        let decisions = run(500_000_000);
        assert_eq!(decisions.len(), 1);
        assert!(
            decisions[0]
                .reason
                .ends_with("using 100m of its 200m limit"),
            "{}",
            decisions[0].reason
        );
    }
}
