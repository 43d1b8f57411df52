//! The Prometheus registry and its HTTP endpoint.
//!
//! - [`cgroup_cpu`]: `qosd_cgroup_cpu_seconds_total` and the probe's health series, read from
//!   the kernel maps at scrape time so every scrape sees the kernel's current counters.
//! - [`runqlat`]: run-queue latency, preemption pairs and throttle episodes (eBPF maps).
//! - [`cpu_throttling`]: CFS throttling counters from each cgroup's `cpu.stat`.
//! - [`numa`]: resident memory per NUMA node (`memory.numa_stat`), hinting faults, page
//!   allocations and task migrations, local or remote.
//! - [`server`]: `/metrics` and `/healthz` over HTTP/1.1 (hyper).
pub mod cgroup_cpu;
pub mod cpu_throttling;
mod families;
pub mod numa;
pub mod runqlat;
pub mod server;

use std::sync::Arc;

use prometheus::{IntGaugeVec, Opts, Registry};

use crate::cgroup::trees::CgroupTrees;

use crate::probes::ProbeMode;

/// Errors while building the registry.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("registering metric {name}: {source}")]
    Register {
        name: &'static str,
        #[source]
        source: prometheus::Error,
    },
}

/// Why a probe's maps could not be read at a scrape (or for the feedback).
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("reading the cpu-time maps: {0}")]
    CpuTime(#[from] crate::probes::cpu_time::CpuTimeError),
    #[error("reading the run-queue maps: {0}")]
    Runq(#[from] crate::probes::runqlat::RunqlatError),
    #[error("reading the NUMA maps: {0}")]
    Numa(#[from] crate::probes::numa::NumaProbeError),
    #[error("the sched_switch programs are detached")]
    Detached,
}

/// The agent's registry with its static series.
pub struct Metrics {
    pub registry: Registry,
    /// The cgroup hierarchies as the collectors see them (live from inotify, or walked once
    /// per scrape).
    pub trees: Arc<CgroupTrees>,
    probe_info: IntGaugeVec,
}

impl Metrics {
    /// Creates the registry with `qosd_build_info` and an empty `qosd_probe_info`.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let build_info = IntGaugeVec::new(
            Opts::new("qosd_build_info", "qosd build; the value is always 1"),
            &["version"],
        )
        .map_err(|source| MetricsError::Register {
            name: "qosd_build_info",
            source,
        })?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let probe_info = IntGaugeVec::new(
            Opts::new(
                "qosd_probe_info",
                "Attach mode of each probe (tp_btf, raw_tracepoint, tracepoint, fentry, unavailable); the value is always 1",
            ),
            &["probe", "mode"],
        )
        .map_err(|source| MetricsError::Register { name: "qosd_probe_info", source })?;
        for (name, metric) in [
            ("qosd_build_info", &build_info),
            ("qosd_probe_info", &probe_info),
        ] {
            registry
                .register(Box::new(metric.clone()))
                .map_err(|source| MetricsError::Register { name, source })?;
        }
        Ok(Self {
            registry,
            trees: Arc::default(),
            probe_info,
        })
    }

    /// Records the mode a probe runs in, replacing any earlier mode of the same probe.
    pub fn set_probe_mode(&self, probe: &str, mode: &ProbeMode) {
        for label in [
            "tp_btf",
            "raw_tracepoint",
            "tracepoint",
            "fentry",
            "unavailable",
        ] {
            // Absent series are fine: only one mode per probe is ever set.
            let _ = self.probe_info.remove_label_values(&[probe, label]);
        }
        self.probe_info
            .with_label_values(&[probe, mode.label()])
            .set(1);
    }

    /// Registers a custom collector as it comes from its constructor (which fails when its
    /// descriptors are invalid); `name` is its main family, for the error.
    pub fn register<C: prometheus::core::Collector + 'static>(
        &self,
        name: &'static str,
        made: Result<C, prometheus::Error>,
    ) -> Result<(), MetricsError> {
        made.and_then(|collector| self.registry.register(Box::new(collector)))
            .map_err(|source| MetricsError::Register { name, source })
    }

    /// The text exposition of every metric; the collectors share each cgroup hierarchy's tree.
    #[must_use]
    pub fn render(&self) -> String {
        let families = {
            let _scrape = self.trees.scope();
            self.registry.gather()
        };
        let encoder = prometheus::TextEncoder::new();
        encoder
            .encode_to_string(&families)
            .unwrap_or_else(|e| format!("# encoding failed: {e}\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_and_probe_mode_are_exposed() {
        let metrics = Metrics::new().expect("registry");
        metrics.set_probe_mode("cpu_time", &ProbeMode::RawTracepoint);
        metrics.set_probe_mode("cpu_time", &ProbeMode::TpBtf);
        let text = metrics.render();
        assert!(
            text.contains(&format!(
                "qosd_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(
            text.contains("qosd_probe_info{mode=\"tp_btf\",probe=\"cpu_time\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("mode=\"raw_tracepoint\""),
            "an earlier mode must be replaced: {text}"
        );
    }
}
