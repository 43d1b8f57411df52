//! The hysteresis the policies share: a condition must hold for several windows in a row
//! before anything changes ([`Streak`]), and an action stays in place for a hold time that
//! doubles when it has to be taken again soon after it was lifted ([`Hold`]), so a policy
//! whose action removes its own trigger settles instead of flapping.
use std::time::{Duration, Instant};

/// Consecutive windows in which a condition held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streak(u32);

impl Streak {
    /// Records one window; returns how many windows in a row the condition has held.
    pub fn observe(&mut self, holds: bool) -> u32 {
        self.0 = if holds { self.0.saturating_add(1) } else { 0 };
        self.0
    }
}

/// How long actions are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldConfig {
    /// The first hold.
    pub initial: Duration,
    /// The longest hold.
    pub max: Duration,
    /// An action taken again within this long of being lifted holds twice as long as before.
    pub memory: Duration,
}

/// When an action in place may be lifted, and how long the next one will hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    config: HoldConfig,
    current: Duration,
    since: Option<Instant>,
    lifted: Option<Instant>,
}

impl Hold {
    #[must_use]
    pub fn new(config: HoldConfig) -> Self {
        Self {
            config,
            current: config.initial,
            since: None,
            lifted: None,
        }
    }

    /// The action is taken at `now`; returns how long it holds.
    pub fn start(&mut self, now: Instant) -> Duration {
        let again_soon = self
            .lifted
            .is_some_and(|t| now.saturating_duration_since(t) < self.config.memory);
        self.current = if again_soon {
            (self.current * 2).min(self.config.max)
        } else {
            self.config.initial
        };
        self.since = Some(now);
        self.current
    }

    /// Whether the action taken has held long enough to be lifted at `now`.
    #[must_use]
    pub fn expired(&self, now: Instant) -> bool {
        self.since
            .is_some_and(|t| now.saturating_duration_since(t) >= self.current)
    }

    /// The action is lifted at `now`.
    pub fn lift(&mut self, now: Instant) {
        self.since = None;
        self.lifted = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_counts_consecutive_windows_only() {
        let mut s = Streak::default();
        assert_eq!(s.observe(true), 1);
        assert_eq!(s.observe(true), 2);
        assert_eq!(s.observe(false), 0);
        assert_eq!(s.observe(true), 1);
    }

    #[test]
    fn a_hold_doubles_when_taken_again_soon_and_resets_later() {
        let config = HoldConfig {
            initial: Duration::from_secs(60),
            max: Duration::from_secs(200),
            memory: Duration::from_secs(600),
        };
        let t0 = Instant::now();
        let mut hold = Hold::new(config);
        assert!(!hold.expired(t0));
        assert_eq!(hold.start(t0), Duration::from_secs(60));
        assert!(!hold.expired(t0 + Duration::from_secs(59)));
        assert!(hold.expired(t0 + Duration::from_secs(60)));
        hold.lift(t0 + Duration::from_secs(60));
        // Again within the memory: twice as long, then capped.
        assert_eq!(
            hold.start(t0 + Duration::from_secs(70)),
            Duration::from_secs(120)
        );
        hold.lift(t0 + Duration::from_secs(190));
        assert_eq!(
            hold.start(t0 + Duration::from_secs(200)),
            Duration::from_secs(200)
        );
        hold.lift(t0 + Duration::from_secs(400));
        // Long after the last lift: back to the first hold.
        assert_eq!(
            hold.start(t0 + Duration::from_secs(1100)),
            Duration::from_secs(60)
        );
    }
}
