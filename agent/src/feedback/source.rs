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

    /// The cpu-time probe's cumulative CPU time per NUMA node by cgroup id, when the source
    /// can read it (the feedback records it when no scrape has recently).
    fn cpu_by_node(&mut self) -> Option<HashMap<u64, Vec<u64>>> {
        None
    }
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

    fn cpu_by_node(&mut self) -> Option<HashMap<u64, Vec<u64>>> {
        let probe = self.upgrade()?;
        let sample = probe
            .lock()
            .sample_cpu_time()
            .inspect_err(|e| tracing::debug!(error = %e, "feedback: CPU time per node unreadable"))
            .ok()?;
        Some(sample.nanos_by_cgroup_node).filter(|n| !n.is_empty())
    }
}
