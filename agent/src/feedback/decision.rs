//! What the feedback decided and why: [`Decision`]s, each naming its policy, target, the
//! change, and the measurements behind it, kept in a bounded [`DecisionLog`] that `qosd
//! inspect` prints.
use std::collections::VecDeque;
use std::fmt;
use std::time::SystemTime;

use crate::report::Section;

/// What a decision does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// An intervention is put in place.
    Apply,
    /// An intervention is lifted: the target gets kubelet's values back.
    Release,
    /// The policy would act but the kernel lacks what it needs (said once per target).
    Unavailable,
    /// The policy reports a condition it deliberately does not act on (said once per
    /// episode): an unpinned container running on one node with its memory on another.
    Report,
}

impl Action {
    /// The label in `qosd_feedback_decisions_total{action}`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Apply => "apply",
            Self::Release => "release",
            Self::Unavailable => "unavailable",
            Self::Report => "report",
        }
    }
}

/// One decision of one policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The policy's name (`qosd_feedback_decisions_total{policy}`).
    pub policy: &'static str,
    pub action: Action,
    /// What it applies to: `besteffort tier` or `namespace/pod/container`.
    pub target: String,
    /// The cgroup change, as the files will read (`cpu.idle 1`).
    pub change: String,
    /// The measurements that led to it.
    pub reason: String,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {}: {} ({})",
            self.policy,
            self.action.as_str(),
            self.target,
            self.change,
            self.reason
        )
    }
}

/// A decision with when it was made and whether it was carried out.
#[derive(Clone, Debug, PartialEq)]
pub struct LoggedDecision {
    pub at: SystemTime,
    /// Made in dry-run mode: logged, not written.
    pub dry_run: bool,
    pub decision: Decision,
}

/// The most recent decisions, oldest first.
#[derive(Clone, Debug)]
pub struct DecisionLog {
    entries: VecDeque<LoggedDecision>,
    capacity: usize,
}

impl DecisionLog {
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Appends a decision, dropping the oldest beyond the capacity.
    pub fn push(&mut self, entry: LoggedDecision) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        if self.capacity > 0 {
            self.entries.push_back(entry);
        }
    }

    /// The decisions kept, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &LoggedDecision> {
        self.entries.iter()
    }

    /// The decisions as a table for `qosd inspect`: time (RFC 3339), whether it was written,
    /// policy, action, target, change, reason.
    #[must_use]
    pub fn section(&self) -> Section {
        let mut section = Section::new(
            "FEEDBACK DECISIONS",
            &[
                "time", "mode", "policy", "action", "target", "change", "reason",
            ],
        );
        for entry in &self.entries {
            let d = &entry.decision;
            section.row([
                humantime::format_rfc3339_seconds(entry.at).to_string(),
                if entry.dry_run { "dry-run" } else { "written" }.to_owned(),
                d.policy.to_owned(),
                d.action.as_str().to_owned(),
                d.target.clone(),
                d.change.clone(),
                d.reason.clone(),
            ]);
        }
        section
    }

    /// The decisions as JSON objects, oldest first.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        self.entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "time": humantime::format_rfc3339_seconds(e.at).to_string(),
                    "dry_run": e.dry_run,
                    "policy": e.decision.policy,
                    "action": e.decision.action.as_str(),
                    "target": e.decision.target,
                    "change": e.decision.change,
                    "reason": e.decision.reason,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn decision(n: u32) -> LoggedDecision {
        LoggedDecision {
            at: UNIX_EPOCH + Duration::from_secs(1_700_000_000 + u64::from(n)),
            dry_run: n % 2 == 1,
            decision: Decision {
                policy: "cpu_burst",
                action: Action::Apply,
                target: format!("default/web-{n}/app"),
                change: "cpu burst 20000 us".to_owned(),
                reason: "throttled 40% of periods".to_owned(),
            },
        }
    }

    #[test]
    fn the_log_keeps_the_newest_and_shows_one_row_each() {
        let mut log = DecisionLog::new(2);
        for n in 0..3 {
            log.push(decision(n));
        }
        let targets: Vec<_> = log.iter().map(|e| e.decision.target.clone()).collect();
        assert_eq!(targets, ["default/web-1/app", "default/web-2/app"]);
        let section = log.section();
        assert_eq!(
            section.rows[0],
            [
                "2023-11-14T22:13:21Z",
                "dry-run",
                "cpu_burst",
                "apply",
                "default/web-1/app",
                "cpu burst 20000 us",
                "throttled 40% of periods"
            ]
        );
        assert_eq!(section.rows[1][1], "written");
        let json = log.to_json();
        assert_eq!(json[1]["target"], "default/web-2/app");
        assert_eq!(json[0]["dry_run"], true);
    }
}
