//! Restart back-off as kubelet applies it to exited containers: 10 s, doubling, capped at
//! 5 minutes, forgotten after a container ran 10 minutes.
use std::time::Duration;

/// Back-off parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    /// A run this long resets the back-off.
    pub reset_after: Duration,
}

impl Default for Backoff {
    /// kubelet's values (pkg/kubelet/kubelet.go: backOffPeriod, MaxContainerBackOff).
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

impl Backoff {
    /// Delay before restarting a container that already restarted `restarts` times since its
    /// back-off was last reset: `initial * 2^restarts`, capped at `max`.
    #[must_use]
    pub fn delay(&self, restarts: u32) -> Duration {
        let factor = 1u32.checked_shl(restarts.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// True when a run of `ran` was long enough to forget earlier crashes.
    #[must_use]
    pub fn resets(&self, ran: Duration) -> bool {
        ran >= self.reset_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_ten_seconds_to_the_five_minute_cap() {
        let b = Backoff::default();
        let secs: Vec<u64> = (0..7).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(secs, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn ten_minutes_of_running_resets() {
        let b = Backoff::default();
        assert!(b.resets(Duration::from_secs(600)));
        assert!(!b.resets(Duration::from_secs(599)));
    }
}
