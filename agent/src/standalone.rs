//! Standalone mode: builds the container manager (with its topology, CPU and memory managers)
//! from the KubeletConfiguration and the machine, feeds it pods from a
//! [`PodSource`](crate::pods::source::PodSource) (the manifest directory), and drives it on its
//! own thread: the source's first complete list resumes what an earlier run left, then
//! container supervision and the pod source every 100 ms, reconcile every period. Stopping the thread stops every container and removes every
//! cgroup it created.
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cgroup::name::{CgroupName, NameError};
use crate::cgroup::systemd::{
    BusError, CALL_TIMEOUT, SystemdBackend, UnitManager as _, bus::SystemdBus,
};
use crate::cgroup::{
    CgroupError, CgroupLayout, CgroupWriter, CgroupfsBackend, Hierarchies, NameStyle,
};
use crate::cm::allocatable::{self, AllocatableError, CgroupLimits, NodeAllocatableConfig};
use crate::cm::capacity::{CapacityError, MachineInfo};
use crate::cm::index::WorkloadIndex;
use crate::cm::manager::{ContainerManager, ManagerError, ManagerOptions};
use crate::cm::metrics::{CmMetrics, ResourceMetrics};
use crate::cm::pod_resources::PodCgroupPolicy;
use crate::cm::resource_managers::{
    ResourceManagers, ResourceManagersConfig, ResourceManagersError,
};
use crate::config::kubelet::{
    CgroupDriver, ConfigError, KubeletConfiguration, load_kubelet_config,
};
use crate::feedback::{FeedbackConfig, FeedbackMetrics, Mode as FeedbackMode, PreemptionSource};
use crate::machine::TopologyError;
use crate::metrics::server::Inspect;
use crate::numa::{NodeLayout, NumaContext};
use crate::pods::manifest::{ManifestError, ManifestWatcher};
use crate::pods::source::PodSource;
use crate::report::Report;
use crate::runtime::backoff::Backoff;

/// How often containers are reaped and restarted.
const TICK: Duration = Duration::from_millis(100);

/// What standalone mode needs from the command line.
#[derive(Clone, Debug)]
pub struct StandaloneOptions {
    pub manifest_dir: PathBuf,
    pub kubelet_config: Option<PathBuf>,
    /// Overrides `cgroupRoot`.
    pub cgroup_root: Option<String>,
    pub reconcile_period: Duration,
    pub log_dir: Option<PathBuf>,
    /// Where `cpu_manager_state` and `memory_manager_state` live (kubelet's root directory).
    pub state_dir: PathBuf,
    /// The feedback policies' mode and thresholds.
    pub feedback: FeedbackConfig,
}

/// Errors that keep standalone mode from starting.
#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cgroup root {root:?}: {source}")]
    Root {
        root: String,
        #[source]
        source: NameError,
    },
    #[error("reserved cgroup {cgroup:?} (systemReservedCgroup / kubeReservedCgroup): {source}")]
    ReservedCgroup {
        cgroup: String,
        #[source]
        source: NameError,
    },
    #[error(transparent)]
    Cgroups(#[from] CgroupError),
    #[error("cgroupDriver systemd needs systemd's manager on the system bus: {0}")]
    Systemd(#[source] BusError),
    #[error("machine capacity: {0}")]
    Capacity(#[from] CapacityError),
    #[error("node allocatable: {0}")]
    Allocatable(#[from] AllocatableError),
    #[error("machine topology (hwloc): {0}")]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    ResourceManagers(#[from] ResourceManagersError),
    #[error(transparent)]
    Manager(#[from] ManagerError),
    #[error(transparent)]
    Manifests(#[from] ManifestError),
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("starting the container manager thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// A running container manager thread.
pub struct Standalone {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Standalone {
    /// Builds everything and starts the thread. `preemptions` (the run-queue probe's, when
    /// it runs) feeds the BestEffort feedback policy.
    pub fn start(
        options: &StandaloneOptions,
        layout: &CgroupLayout,
        registry: &prometheus::Registry,
        index: WorkloadIndex,
        inspect: Inspect,
        preemptions: Option<Box<dyn PreemptionSource>>,
        numa: NumaContext,
    ) -> Result<Self, StandaloneError> {
        let nodes = numa.layout;
        let config = match &options.kubelet_config {
            Some(path) => {
                let loaded = load_kubelet_config(path)?;
                for field in &loaded.unsupported_fields {
                    tracing::warn!(file = %path.display(), field, "KubeletConfiguration field not supported by qosd; ignored");
                }
                loaded.config
            }
            None => KubeletConfiguration::default(),
        };
        let root_text = options
            .cgroup_root
            .clone()
            .unwrap_or_else(|| config.cgroup_root.clone());
        let root =
            CgroupName::parse_cgroupfs(&root_text).map_err(|source| StandaloneError::Root {
                root: root_text.clone(),
                source,
            })?;
        let style = match config.cgroup_driver {
            CgroupDriver::Cgroupfs => NameStyle::Cgroupfs,
            CgroupDriver::Systemd => NameStyle::Systemd,
        };
        let capacity = MachineInfo::host().capacity()?;
        let allocatable_config = NodeAllocatableConfig::from_kubelet(&config);
        allocatable::validate(&capacity, &allocatable_config)?;
        let node = allocatable::node_allocatable(&capacity, &allocatable_config);
        let enforcement = allocatable::enforcement(&capacity, &allocatable_config)?;
        let metrics = CmMetrics::register(registry)?;
        #[expect(
            clippy::cast_precision_loss,
            reason = "gauge of cores; millicores far below 2^53"
        )]
        let cores = node.milli_cpu as f64 / 1000.0;
        metrics
            .node_allocatable
            .with_label_values(&["cpu"])
            .set(cores.round() as i64);
        metrics
            .node_allocatable
            .with_label_values(&["memory"])
            .set(node.memory_bytes);
        metrics
            .node_allocatable
            .with_label_values(&["pods"])
            .set(node.pods);
        if let Some(pids) = node.pids {
            metrics
                .node_allocatable
                .with_label_values(&["pid"])
                .set(pids);
        }
        tracing::info!(?capacity, ?node, "node allocatable");

        let kubepods = enforcement
            .kubepods
            .as_ref()
            .map(CgroupLimits::to_resource_config)
            .unwrap_or_default();
        // system-reserved / kube-reserved: existing cgroups outside the cgroup root, updated
        // and reconciled (never created or removed) by the container manager like kubelet's
        // enforceNodeAllocatableCgroups.
        let reserved = [&enforcement.system_reserved, &enforcement.kube_reserved]
            .into_iter()
            .flatten()
            .map(|r| {
                CgroupName::parse_cgroupfs(&r.cgroup)
                    .map(|name| (name, r.limits.to_resource_config()))
                    .map_err(|source| StandaloneError::ReservedCgroup {
                        cgroup: r.cgroup.clone(),
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fs = CgroupfsBackend::new(Hierarchies::from_layout(layout)?, root.clone(), style)
            .with_reserved(reserved.iter().map(|(name, _)| name.clone()).collect());
        let cgroups: Box<dyn CgroupWriter> = match config.cgroup_driver {
            CgroupDriver::Cgroupfs => Box::new(fs),
            CgroupDriver::Systemd => {
                let bus = SystemdBus::connect(CALL_TIMEOUT).map_err(StandaloneError::Systemd)?;
                tracing::info!(
                    systemd = bus.version(),
                    "cgroupDriver systemd: slices and scopes through systemd's D-Bus API"
                );
                Box::new(SystemdBackend::new(fs, std::sync::Arc::new(bus)))
            }
        };
        let policy = PodCgroupPolicy::from_kubelet(&config, layout.v1.is_empty());
        let machine = crate::machine::hwloc::load_host()?;
        if let Some(nodes) = &nodes {
            check_numa_agreement(&machine, nodes);
        }
        let resources = ResourceManagers::new(
            &ResourceManagersConfig::from_kubelet(
                &config,
                &allocatable::reservation(&capacity, &allocatable_config),
                Some(options.state_dir.clone()),
            )?,
            &machine,
            ResourceMetrics::register(registry)?,
        )?;
        // Everything that can fail on bad input is checked before the first cgroup is made.
        let source: Box<dyn PodSource> = Box::new(ManifestWatcher::new(&options.manifest_dir)?);
        let mut manager = ContainerManager::start(
            cgroups,
            ManagerOptions {
                root,
                policy,
                kubepods,
                allocatable: node,
                log_dir: options.log_dir.clone(),
                state_dir: Some(options.state_dir.clone()),
                backoff: Backoff::default(),
                reserved,
            },
            resources,
            index,
            metrics.clone(),
        )?;
        if options.feedback.mode != FeedbackMode::Off {
            if nodes.is_none() {
                tracing::warn!("NUMA layout unreadable: no NUMA realignment");
            }
            manager.enable_feedback(
                options.feedback,
                nodes,
                preemptions,
                Some(FeedbackMetrics::register(registry)?),
            );
            if let Some(placement) = numa.placement {
                manager.set_cpu_placement(placement);
            }
        }
        let (stop, stopped) = mpsc::channel();
        let period = options.reconcile_period;
        let thread = std::thread::Builder::new()
            .name("container-manager".into())
            .spawn(move || run_loop(manager, source, &stopped, period, &metrics, &inspect))
            .map_err(StandaloneError::Thread)?;
        Ok(Self { stop, thread })
    }

    /// Stops every container and removes the cgroups; returns when done.
    pub fn stop(self) {
        // A send error means the thread already ended.
        let _ = self.stop.send(());
        if self.thread.join().is_err() {
            tracing::error!("the container manager thread panicked");
        }
    }
}

/// The resource managers place CPUs and memory on hwloc's view of the machine; the probes, the
/// NUMA metrics and the feedback on the kernel's (sysfs, [`NodeLayout`]). Both come from the
/// same kernel, so they must agree on every CPU's node; a disagreement is reported per CPU.
fn check_numa_agreement(machine: &crate::machine::MachineTopology, nodes: &NodeLayout) {
    for cpu in machine.cpus().values() {
        let kernel = u32::try_from(cpu.id)
            .ok()
            .and_then(|id| nodes.node_of_cpu(id));
        if kernel.is_some_and(|node| usize::try_from(node).ok() != Some(cpu.numa_node)) {
            tracing::error!(
                cpu = cpu.id,
                hwloc_node = cpu.numa_node,
                kernel_node = ?kernel,
                "hwloc and the kernel disagree on this CPU's NUMA node; the resource managers follow hwloc, the probes and the feedback the kernel"
            );
        }
    }
}

fn run_loop(
    mut manager: ContainerManager,
    mut source: Box<dyn PodSource>,
    stopped: &mpsc::Receiver<()>,
    period: Duration,
    metrics: &CmMetrics,
    inspect: &Inspect,
) {
    let mut resumed = false;
    // Events before the source's first complete list, handed to resume together.
    let mut early = Vec::new();
    tracing::info!(source = %source.describe(), "pod source");
    let mut last_reconcile = Instant::now();
    inspect.render_on_request();
    loop {
        match stopped.recv_timeout(TICK) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        manager.tick();
        manager.feedback_tick();
        // Every tick: an unchanged source costs next to nothing (the manifest directory is
        // watched with inotify).
        let events = source.poll();
        for error in source.new_errors() {
            tracing::warn!(error = %error, "pod not admitted");
            metrics.manifest_errors.inc();
        }
        if resumed {
            for event in events {
                manager.handle(event);
            }
        } else {
            early.extend(events);
            if source.synced() {
                manager.resume(std::mem::take(&mut early));
                resumed = true;
            }
        }
        // Rendered only for a waiting `/inspect` (it reads every cgroup's files).
        inspect.answer_with(|| manager.render_tree());
        if last_reconcile.elapsed() >= period {
            manager.reconcile();
            last_reconcile = Instant::now();
        }
    }
    tracing::info!("stopping containers");
    manager.shutdown(Duration::from_secs(60));
    inspect.set(Report::message("standalone", "stopped"));
}
