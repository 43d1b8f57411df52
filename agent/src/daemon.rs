//! `qosd run`: wires the probes, the metrics registry and the HTTP endpoint together, and shuts
//! them down cleanly on SIGTERM or SIGINT (programs detached, endpoint closed, exit 0).
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::cgroup::{CgroupLayout, LayoutError};
use crate::cm::index::WorkloadIndex;
use crate::feedback::PreemptionSource;
use crate::kubernetes::{KubernetesError, KubernetesMode, KubernetesOptions};
use crate::metrics::cgroup_cpu::CgroupCpuCollector;
use crate::metrics::cpu_throttling::CpuThrottlingCollector;
use crate::metrics::numa::{NumaCollector, NumaMemoryCollector, PlacementView};
use crate::metrics::runqlat::RunqCollector;
use crate::metrics::server::{Inspect, MetricsServer, ServerError};
use crate::metrics::{Metrics, MetricsError};
use crate::numa::placement::{CpuNodes, CpuPlacement};
use crate::numa::{NodeLayout, NumaContext, NumaMemoryReader};
use crate::probes::ProbeMode;
use crate::probes::numa::{self as numa_probe, NumaProbe};
use crate::probes::sched_switch::{ModePreference, SwitchProbe, WeakSwitchProbe};
use crate::probes::{cpu_time, runqlat, throttle};
use crate::report::Report;
use crate::standalone::{Standalone, StandaloneError, StandaloneOptions};

/// Which container manager runs beside the probes.
#[derive(Clone, Debug)]
pub enum AgentMode {
    /// Probes and metrics only.
    ProbesOnly,
    /// The container manager fed from a manifest directory.
    Standalone(StandaloneOptions),
    /// Beside kubelet on a Kubernetes node.
    Kubernetes(KubernetesOptions),
}

/// What `qosd run` needs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Address of the metrics endpoint.
    pub metrics_addr: SocketAddr,
    pub mode: AgentMode,
    /// Which attach modes the sched_switch handler may use.
    pub cpu_time_mode: ModePreference,
}

/// The running container manager of either mode.
enum Running {
    Standalone(Standalone),
    Kubernetes(KubernetesMode),
}

impl Running {
    fn stop(self) {
        match self {
            Self::Standalone(s) => s.stop(),
            Self::Kubernetes(k) => k.stop(),
        }
    }
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
    #[error("beside kubelet: {0}")]
    Kubernetes(#[from] KubernetesError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Faults(#[from] crate::probes::fault::FaultError),
    #[error("installing the {signal} handler: {source}")]
    Signal {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Gives the kernel back the pages the probe loaders freed. Loading the programs parses the
/// kernel's BTF (tens of MiB) on a blocking thread; glibc keeps what that thread's arena freed
/// resident until asked, so without this the agent's RSS stays about 64 MiB higher for its
/// whole life.
fn return_freed_memory() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim(3) only releases free heap pages; it takes a padding value and
        // touches no memory the program owns.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(
            released = released != 0,
            "freed memory returned after loading the probes"
        );
    }
}

/// Raises the soft limit of open descriptors to the hard one (as the Go runtime does for
/// kubelet and containerd): the live cgroup trees keep a directory descriptor per cgroup of the
/// hierarchies the metrics read. Where the limit stays low, files are opened by path instead.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) fills the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur >= limit.rlim_max {
        return;
    }
    let before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit(2) reads the struct we own; raising the soft limit up to the hard one
    // needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) } == 0 {
        tracing::debug!(
            from = before,
            to = limit.rlim_cur,
            "open descriptor limit raised"
        );
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(options: RunOptions) -> Result<(), DaemonError> {
    raise_open_file_limit();
    let mut sigterm = signal(SignalKind::terminate()).map_err(|source| DaemonError::Signal {
        signal: "SIGTERM",
        source,
    })?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|source| DaemonError::Signal {
        signal: "SIGINT",
        source,
    })?;
    // SIGQUIT stops like SIGTERM. SIGHUP (a closed terminal, a dropped ssh session) is said
    // and ignored: an agent managing containers must not die with the terminal that started
    // it, and qosd has no configuration to reload. SIGPIPE is ignored by the Rust runtime (a
    // write to a closed socket is an error of that write).
    let mut sigquit = signal(SignalKind::quit()).map_err(|source| DaemonError::Signal {
        signal: "SIGQUIT",
        source,
    })?;
    let mut sighup = signal(SignalKind::hangup()).map_err(|source| DaemonError::Signal {
        signal: "SIGHUP",
        source,
    })?;

    crate::probes::fault::warn_if_active()?;
    let layout = CgroupLayout::detect()?;
    let hierarchy = layout
        .cpu_hierarchy()
        .ok_or(DaemonError::NoCpuHierarchy)?
        .to_owned();
    tracing::info!(layout = %layout.kind, cpu_hierarchy = %hierarchy.display(), "cgroups detected");
    // The kernel's NUMA layout, read once: the NUMA probes, the memory reader and the feedback
    // share it.
    let nodes = NodeLayout::read_system()
        .inspect_err(|e| tracing::warn!(error = %e, "NUMA layout unreadable"))
        .ok();

    let metrics = Metrics::new()?;
    let workloads = WorkloadIndex::new();
    let inspect = Inspect::default();
    // Where cgroups run, per node: recorded by the cpu-time collector from the probe's
    // per-CPU counters, read by the NUMA memory collector (machines with two nodes or more).
    let placement = nodes.as_ref().and_then(|nodes| {
        let possible = aya::util::nr_cpus()
            .inspect_err(|(_, e)| tracing::warn!(error = %e, "possible CPUs unreadable: no CPU time per NUMA node"))
            .ok()?;
        let cpu_nodes = CpuNodes::of(nodes, possible)?;
        let placement = CpuPlacement::new(cpu_nodes.nodes.clone());
        Some((cpu_nodes, placement))
    });
    let wiring = Wiring {
        metrics: &metrics,
        workloads: &workloads,
        hierarchy: &hierarchy,
        v1_cpu: layout.uses_v1_cpu_controller(),
        placement: placement.clone(),
    };
    let preemptions = wiring.attach_sched_switch(options.cpu_time_mode).await?;
    wiring
        .attach_numa(
            options.cpu_time_mode == ModePreference::RawTracepoint,
            nodes.clone(),
        )
        .await?;
    wiring.register_cgroupfs_collectors(&layout, nodes.clone(), &inspect)?;
    return_freed_memory();
    let running = match &options.mode {
        AgentMode::Standalone(opts) => {
            let started = Standalone::start(
                opts,
                &layout,
                &metrics.registry,
                workloads.clone(),
                inspect.clone(),
                preemptions.map(|p| Box::new(p) as Box<dyn PreemptionSource>),
                NumaContext {
                    layout: nodes,
                    placement: placement.as_ref().map(|(_, p)| p.clone()),
                },
            )?;
            tracing::info!(manifest_dir = %opts.manifest_dir.display(), "standalone container manager running");
            Some(Running::Standalone(started))
        }
        AgentMode::Kubernetes(opts) => {
            let started = KubernetesMode::start(
                opts,
                crate::kubernetes::Shared {
                    layout: layout.clone(),
                    registry: metrics.registry.clone(),
                    index: workloads.clone(),
                    inspect: inspect.clone(),
                    trees: metrics.trees.clone(),
                    preemptions: preemptions.map(|p| Box::new(p) as Box<dyn PreemptionSource>),
                    nodes,
                    placement: placement.as_ref().map(|(_, p)| p.clone()),
                },
            )
            .await?;
            tracing::info!(source = opts.source.label(), "running beside kubelet");
            Some(Running::Kubernetes(started))
        }
        AgentMode::ProbesOnly => {
            inspect.set(Report::message(
                "probes only",
                "container manager not running (no manifest directory, no Kubernetes pod source)",
            ));
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

    let which = loop {
        tokio::select! {
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
            _ = sigquit.recv() => break "SIGQUIT",
            _ = sighup.recv() => {
                tracing::warn!(
                    signal = "SIGHUP",
                    "ignored: qosd keeps running and managing its pods (stop it with SIGTERM)"
                );
            }
        }
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
    if let Some(running) = running {
        // Containers get their grace periods (standalone), interventions kubelet's values back
        // (beside kubelet); this may take longer than the detach above.
        tokio::task::spawn_blocking(move || running.stop())
            .await
            .ok();
    }
    tracing::info!("bye");
    Ok(())
}

/// What the probes and collectors are wired to.
struct Wiring<'a> {
    metrics: &'a Metrics,
    workloads: &'a WorkloadIndex,
    /// Where the cpu hierarchy (the unified one on v2) is mounted: cgroup ids resolve there.
    hierarchy: &'a Path,
    /// Attribution through the v1 cpu controller (v1 and hybrid hosts).
    v1_cpu: bool,
    /// The CPUs' nodes and the per-node CPU time history (two NUMA nodes or more).
    placement: Option<(CpuNodes, CpuPlacement)>,
}

impl Wiring<'_> {
    /// CPU time, run-queue latency, preemption pairs and throttle episodes: one sched_switch
    /// handler. A probe the kernel refuses is reported unavailable and the agent runs on.
    /// Returns the preemption attribution for the feedback (a handle that does not keep the
    /// programs attached at shutdown) when the run-queue probe runs.
    async fn attach_sched_switch(
        &self,
        preference: ModePreference,
    ) -> Result<Option<WeakSwitchProbe>, DaemonError> {
        let v1_cpu = self.v1_cpu;
        let probe = match tokio::task::spawn_blocking(move || {
            SwitchProbe::attach(v1_cpu, preference)
        })
        .await
        {
            Ok(Ok(probe)) => probe,
            Ok(Err(e)) => return Ok(self.switch_unavailable(&e.to_string())),
            Err(e) => {
                return Ok(self.switch_unavailable(&format!("probe loader panicked: {e}")));
            }
        };
        let mut probe = probe;
        if let Some(log) = probe.take_log() {
            tokio::spawn(log.forward());
        }
        if let Some((cpu_nodes, _)) = &self.placement {
            probe.set_cpu_nodes(cpu_nodes.clone());
        }
        let metrics = self.metrics;
        metrics.set_probe_mode(cpu_time::PROBE_NAME, probe.mode());
        let runq_mode = probe.runq_mode();
        metrics.set_probe_mode(runqlat::PROBE_NAME, &runq_mode);
        metrics.set_probe_mode(throttle::PROBE_NAME, probe.throttle_mode());
        let probe = probe.shared();
        metrics.register(
            "qosd_cgroup_cpu_seconds_total",
            CgroupCpuCollector::new(
                Box::new(probe.clone()),
                self.hierarchy.to_owned(),
                self.metrics.trees.clone(),
                self.workloads.clone(),
                self.placement.as_ref().map(|(_, p)| p.clone()),
            ),
        )?;
        if let ProbeMode::Unavailable(why) = &runq_mode {
            tracing::error!(probe = runqlat::PROBE_NAME, reason = %why, "probe unavailable; running without it");
            return Ok(None);
        }
        let weak = probe.downgrade();
        metrics.register(
            "qosd_runqueue_latency_seconds",
            RunqCollector::new(
                Box::new(probe),
                self.hierarchy.to_owned(),
                self.metrics.trees.clone(),
                self.workloads.clone(),
            ),
        )?;
        Ok(Some(weak))
    }

    /// Marks the sched_switch handler's probes unavailable for one reason.
    fn switch_unavailable(&self, reason: &str) -> Option<WeakSwitchProbe> {
        let probes = [
            cpu_time::PROBE_NAME,
            runqlat::PROBE_NAME,
            throttle::PROBE_NAME,
        ];
        tracing::error!(
            ?probes,
            error = reason,
            "sched_switch handler unavailable; running without it"
        );
        let mode = ProbeMode::Unavailable(reason.to_owned());
        for name in probes {
            self.metrics.set_probe_mode(name, &mode);
        }
        None
    }

    /// NUMA hinting faults, page allocations, migrations: each probe degrades on its own.
    async fn attach_numa(
        &self,
        prefer_raw: bool,
        nodes: Option<NodeLayout>,
    ) -> Result<(), DaemonError> {
        let Some(nodes) = nodes else {
            self.numa_unavailable("the kernel's NUMA layout (sysfs) is unreadable");
            return Ok(());
        };
        let v1_cpu = self.v1_cpu;
        match tokio::task::spawn_blocking(move || NumaProbe::attach(v1_cpu, prefer_raw, &nodes))
            .await
        {
            Ok(Ok(mut probe)) => {
                if let Some(log) = probe.take_log() {
                    tokio::spawn(log.forward());
                }
                let metrics = self.metrics;
                metrics.set_probe_mode(numa_probe::HINT_FAULT_PROBE, probe.hint_fault_mode());
                metrics.set_probe_mode(numa_probe::PAGE_ALLOC_PROBE, probe.page_alloc_mode());
                metrics.set_probe_mode(numa_probe::MIGRATION_PROBE, probe.migration_mode());
                metrics.register(
                    "qosd_numa_page_allocations_total",
                    NumaCollector::new(
                        Box::new(probe),
                        self.hierarchy.to_owned(),
                        metrics.trees.clone(),
                        self.workloads.clone(),
                    ),
                )?;
            }
            Ok(Err(e)) => self.numa_unavailable(&e.to_string()),
            Err(e) => self.numa_unavailable(&format!("probe loader panicked: {e}")),
        }
        Ok(())
    }

    /// Marks the three NUMA probes unavailable for one reason.
    fn numa_unavailable(&self, reason: &str) {
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
            self.metrics.set_probe_mode(probe, &mode);
        }
    }

    /// Resident memory per node and CFS throttling: cgroupfs, read at scrape time; and
    /// `qosd inspect`'s NUMA placement table.
    fn register_cgroupfs_collectors(
        &self,
        layout: &CgroupLayout,
        nodes: Option<NodeLayout>,
        inspect: &Inspect,
    ) -> Result<(), DaemonError> {
        match nodes.and_then(|nodes| NumaMemoryReader::for_layout(layout, nodes)) {
            Some(reader) => {
                if reader.layout.nodes().len() > 1 {
                    let view = PlacementView {
                        reader: reader.clone(),
                        trees: self.metrics.trees.clone(),
                        workloads: self.workloads.clone(),
                        placement: self.placement.as_ref().map(|(_, p)| p.clone()),
                    };
                    inspect.append("numa_placement", Arc::new(move || view.section()));
                }
                self.metrics.register(
                    "qosd_numa_memory_bytes",
                    NumaMemoryCollector::new(
                        reader,
                        self.metrics.trees.clone(),
                        self.workloads.clone(),
                        self.placement.as_ref().map(|(_, p)| p.clone()),
                    ),
                )?;
            }
            None => tracing::warn!(
                "no memory controller mounted or no NUMA layout: no qosd_numa_memory_bytes"
            ),
        }
        self.metrics.register(
            "qosd_cpu_periods_total",
            CpuThrottlingCollector::new(
                self.hierarchy.to_owned(),
                self.metrics.trees.clone(),
                self.v1_cpu,
                self.workloads.clone(),
            ),
        )?;
        Ok(())
    }
}
