//! `qosd run`: wires the probes, the metrics registry and the HTTP endpoint together, and shuts
//! them down cleanly on SIGTERM or SIGINT (programs detached, endpoint closed, exit 0).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::cgroup::{CgroupLayout, LayoutError};
use crate::cm::index::WorkloadIndex;
use crate::feedback::PreemptionSource;
use crate::metrics::cgroup_cpu::CgroupCpuCollector;
use crate::metrics::cpu_throttling::CpuThrottlingCollector;
use crate::metrics::numa::{NumaCollector, NumaMemoryCollector};
use crate::metrics::runqlat::RunqCollector;
use crate::metrics::server::{InspectText, MetricsServer, ServerError};
use crate::metrics::{Metrics, MetricsError};
use crate::numa::{NodeLayout, NumaMemoryReader};
use crate::probes::ProbeMode;
use crate::probes::numa::{self as numa_probe, NumaProbe};
use crate::probes::sched_switch::{ModePreference, SwitchProbe, WeakSwitchProbe};
use crate::probes::{cpu_time, runqlat, throttle};
use crate::standalone::{Standalone, StandaloneError, StandaloneOptions};

/// What `qosd run` needs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Address of the metrics endpoint.
    pub metrics_addr: SocketAddr,
    /// Standalone mode (container manager fed from a manifest directory); `None` runs the
    /// probes and metrics only.
    pub standalone: Option<StandaloneOptions>,
    /// Which attach modes the sched_switch handler may use.
    pub cpu_time_mode: ModePreference,
}

/// Errors that stop the agent from starting. Probe failures are not among them: a probe the
/// kernel refuses is reported as unavailable and the agent runs on.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("the cpu hierarchy is not mounted (no v1 cpu controller and no cgroup2)")]
    NoCpuHierarchy,
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("container manager: {0}")]
    Standalone(#[from] StandaloneError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("installing the {signal} handler: {source}")]
    Signal {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(options: RunOptions) -> Result<(), DaemonError> {
    let mut sigterm = signal(SignalKind::terminate()).map_err(|source| DaemonError::Signal {
        signal: "SIGTERM",
        source,
    })?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|source| DaemonError::Signal {
        signal: "SIGINT",
        source,
    })?;

    let layout = CgroupLayout::detect()?;
    let hierarchy = layout
        .cpu_hierarchy()
        .ok_or(DaemonError::NoCpuHierarchy)?
        .to_owned();
    tracing::info!(layout = %layout.kind, cpu_hierarchy = %hierarchy.display(), "cgroups detected");

    let metrics = Metrics::new()?;
    let workloads = WorkloadIndex::new();
    let inspect = InspectText::default();
    let v1_cpu = layout.uses_v1_cpu_controller();
    let preference = options.cpu_time_mode;
    // CPU time, run-queue latency, preemption pairs and throttle episodes: one sched_switch
    // handler. A probe the kernel refuses is reported unavailable; the agent runs on.
    let switch_probes = [
        cpu_time::PROBE_NAME,
        runqlat::PROBE_NAME,
        throttle::PROBE_NAME,
    ];
    // The run-queue probe's preemption attribution also feeds the feedback (through a handle
    // that does not keep the programs attached at shutdown).
    let preemptions: Option<WeakSwitchProbe> = match tokio::task::spawn_blocking(move || {
        SwitchProbe::attach(v1_cpu, preference)
    })
    .await
    {
        Ok(Ok(probe)) => {
            metrics.set_probe_mode(cpu_time::PROBE_NAME, probe.mode());
            let runq_mode = probe.runq_mode();
            metrics.set_probe_mode(runqlat::PROBE_NAME, &runq_mode);
            metrics.set_probe_mode(throttle::PROBE_NAME, probe.throttle_mode());
            let probe = probe.shared();
            let collector = CgroupCpuCollector::new(
                Box::new(probe.clone()),
                hierarchy.clone(),
                workloads.clone(),
            )
            .map_err(|source| MetricsError::Register {
                name: "qosd_cgroup_cpu_seconds_total",
                source,
            })?;
            metrics.register("qosd_cgroup_cpu_seconds_total", Box::new(collector))?;
            if let ProbeMode::Unavailable(why) = &runq_mode {
                tracing::error!(probe = runqlat::PROBE_NAME, reason = %why, "probe unavailable; running without it");
                None
            } else {
                let weak = probe.downgrade();
                let collector =
                    RunqCollector::new(Box::new(probe), hierarchy.clone(), workloads.clone())
                        .map_err(|source| MetricsError::Register {
                            name: "qosd_runqueue_latency_seconds",
                            source,
                        })?;
                metrics.register("qosd_runqueue_latency_seconds", Box::new(collector))?;
                Some(weak)
            }
        }
        Ok(Err(e)) => {
            tracing::error!(probes = ?switch_probes, error = %e, "sched_switch handler unavailable; running without it");
            let mode = ProbeMode::Unavailable(e.to_string());
            for name in switch_probes {
                metrics.set_probe_mode(name, &mode);
            }
            None
        }
        Err(e) => {
            tracing::error!(probes = ?switch_probes, error = %e, "probe loader panicked; running without it");
            let mode = ProbeMode::Unavailable(e.to_string());
            for name in switch_probes {
                metrics.set_probe_mode(name, &mode);
            }
            None
        }
    };
    let prefer_raw = preference == ModePreference::RawTracepoint;
    // NUMA hinting faults, page allocations, migrations: each probe degrades on its own.
    match tokio::task::spawn_blocking(move || NumaProbe::attach(v1_cpu, prefer_raw)).await {
        Ok(Ok(probe)) => {
            metrics.set_probe_mode(numa_probe::HINT_FAULT_PROBE, probe.hint_fault_mode());
            metrics.set_probe_mode(numa_probe::PAGE_ALLOC_PROBE, probe.page_alloc_mode());
            metrics.set_probe_mode(numa_probe::MIGRATION_PROBE, probe.migration_mode());
            let collector =
                NumaCollector::new(Box::new(probe), hierarchy.clone(), workloads.clone()).map_err(
                    |source| MetricsError::Register {
                        name: "qosd_numa_page_allocations_total",
                        source,
                    },
                )?;
            metrics.register("qosd_numa_page_allocations_total", Box::new(collector))?;
        }
        Ok(Err(e)) => numa_unavailable(&metrics, &e.to_string()),
        Err(e) => numa_unavailable(&metrics, &format!("probe loader panicked: {e}")),
    }
    // Resident memory per node: cgroupfs, read at scrape time.
    match NodeLayout::read_system() {
        Ok(nodes) => match NumaMemoryReader::for_layout(&layout, nodes) {
            Some(reader) => {
                let collector =
                    NumaMemoryCollector::new(reader, workloads.clone()).map_err(|source| {
                        MetricsError::Register {
                            name: "qosd_numa_memory_bytes",
                            source,
                        }
                    })?;
                metrics.register("qosd_numa_memory_bytes", Box::new(collector))?;
            }
            None => tracing::warn!("no memory controller mounted: no qosd_numa_memory_bytes"),
        },
        Err(e) => tracing::warn!(error = %e, "NUMA layout unreadable: no qosd_numa_memory_bytes"),
    }
    let throttling = CpuThrottlingCollector::new(hierarchy.clone(), v1_cpu, workloads.clone())
        .map_err(|source| MetricsError::Register {
            name: "qosd_cpu_periods_total",
            source,
        })?;
    metrics.register("qosd_cpu_periods_total", Box::new(throttling))?;
    let standalone = match &options.standalone {
        Some(opts) => {
            let started = Standalone::start(
                opts,
                &layout,
                &metrics.registry,
                workloads.clone(),
                inspect.clone(),
                preemptions.map(|p| Box::new(p) as Box<dyn PreemptionSource>),
            )?;
            tracing::info!(manifest_dir = %opts.manifest_dir.display(), "standalone container manager running");
            Some(started)
        }
        None => {
            inspect.set("container manager not running (no manifest directory)\n".to_owned());
            None
        }
    };
    let metrics = Arc::new(metrics);

    let server = MetricsServer::bind(options.metrics_addr).await?;
    if let Some(addr) = server.local_addr() {
        tracing::info!(%addr, "serving /metrics");
    }
    let (stop, stopped) = watch::channel(false);
    let serving = tokio::spawn(server.serve(metrics.clone(), inspect, stopped));

    let which = tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
    };
    tracing::info!(signal = which, "shutting down");
    // Receivers only disappear when the server task has already ended.
    let _ = stop.send(true);
    if tokio::time::timeout(Duration::from_millis(500), serving)
        .await
        .is_err()
    {
        tracing::warn!("metrics endpoint did not stop within 500 ms");
    }
    // The last reference to the registry owns the probe; dropping it detaches the programs.
    drop(metrics);
    tracing::info!("programs detached");
    if let Some(standalone) = standalone {
        // Containers get their grace periods; this may take longer than the detach above.
        tokio::task::spawn_blocking(move || standalone.stop())
            .await
            .ok();
    }
    tracing::info!("bye");
    Ok(())
}

/// Marks the three NUMA probes unavailable for one reason.
fn numa_unavailable(metrics: &Metrics, reason: &str) {
    tracing::error!(
        error = reason,
        "NUMA probes unavailable; running without them"
    );
    let mode = ProbeMode::Unavailable(reason.to_owned());
    for probe in [
        numa_probe::HINT_FAULT_PROBE,
        numa_probe::PAGE_ALLOC_PROBE,
        numa_probe::MIGRATION_PROBE,
    ] {
        metrics.set_probe_mode(probe, &mode);
    }
}
