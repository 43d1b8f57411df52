//! Where the preemption attribution comes from: the sched_switch handler's (victim cgroup,
//! preemptor cgroup) counters, or a fake in tests.
use std::collections::HashMap;

use super::snapshot::Preemptions;
use crate::metrics::SampleError;
use crate::probes::sched_switch::WeakSwitchProbe;

/// Cumulative preemptions by (victim cgroup id, preemptor cgroup id).
pub trait PreemptionSource: Send {
    /// The counters now; an error (the probe is gone or a map unreadable) is reported by the
    /// caller, which then decides without preemptions.
    fn preemptions(&mut self) -> Result<HashMap<(u64, u64), Preemptions>, SampleError>;
}

impl PreemptionSource for WeakSwitchProbe {
    fn preemptions(&mut self) -> Result<HashMap<(u64, u64), Preemptions>, SampleError> {
        let probe = self.upgrade().ok_or(SampleError::Detached)?;
        let sample = probe.lock().sample_runq()?;
        Ok(sample
            .preemptions
            .into_iter()
            .map(|(pair, v)| {
                (
                    pair,
                    Preemptions {
                        count: v.count,
                        wait_ns: v.wait_ns,
                    },
                )
            })
            .collect())
    }
}
