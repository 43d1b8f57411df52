//! Kubernetes mode: qosd beside kubelet on a node. Builds the manager
//! ([`crate::cm::beside_kubelet`]) from the node's KubeletConfiguration (cgroup driver,
//! cgroupRoot, the values kubelet derives) and the machine, starts the pod source (the API
//! server's watch of this node's pods, or kubelet's `/pods`) on the async runtime, and drives
//! the manager on its own thread: pod events and discovery every 100 ms, kubelet's values and
//! the feedback's interventions checked every reconcile period. Stopping it puts kubelet's
//! values back under every intervention; no cgroup is created or removed in this mode.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cgroup::name::{CgroupName, NameError};
use crate::cgroup::settings_writer::SettingsOnlyWriter;
use crate::cgroup::systemd::{CALL_TIMEOUT, SystemdBackend, UnitManager as _, bus::SystemdBus};
use crate::cgroup::trees::CgroupTrees;
use crate::cgroup::{
    CgroupError, CgroupLayout, CgroupWriter, CgroupfsBackend, Hierarchies, NameStyle,
};
use crate::cm::allocatable::{self, AllocatableError, CgroupLimits, NodeAllocatableConfig};
use crate::cm::beside_kubelet::expected::KubeletView;
use crate::cm::beside_kubelet::metrics::BesideKubeletMetrics;
use crate::cm::beside_kubelet::{BesideKubelet, BesideKubeletOptions, write_rule};
use crate::cm::capacity::{CapacityError, MachineInfo};
use crate::cm::index::WorkloadIndex;
use crate::cm::pod_resources::PodCgroupPolicy;
use crate::cm::qos_tiers::QosTiers;
use crate::config::kubelet::{
    CgroupDriver, ConfigError, EnforcementKey, KubeletConfiguration, load_kubelet_config,
};
use crate::feedback::{FeedbackConfig, FeedbackMetrics, Mode as FeedbackMode, PreemptionSource};
use crate::metrics::server::Inspect;
use crate::numa::NodeLayout;
use crate::pods::kubernetes::client::{self, ApiServerOptions, ClientError, KubeletOptions};
use crate::pods::kubernetes::{api, kubelet};
use crate::pods::source::PodSource;
use crate::report::Report;

/// How often pod events, discovery and the feedback are looked at.
const TICK: Duration = Duration::from_millis(100);

/// Where the node's pods come from.
#[derive(Clone, Debug)]
pub enum PodSourceChoice {
    /// The API server's watch of the pods bound to `node`.
    ApiServer {
        node: String,
        options: ApiServerOptions,
    },
    /// kubelet's `/pods`.
    Kubelet(KubeletOptions),
}

impl PodSourceChoice {
    /// The `source` label of the source's metrics.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::ApiServer { .. } => "api_server",
            Self::Kubelet(_) => "kubelet",
        }
    }
}

/// What Kubernetes mode needs from the command line.
#[derive(Clone, Debug)]
pub struct KubernetesOptions {
    pub source: PodSourceChoice,
    /// The node's KubeletConfiguration (`/var/lib/kubelet/config.yaml`); without it the cgroup
    /// driver is detected and kubelet's defaults are assumed (kubepods is then not checked).
    pub kubelet_config: Option<PathBuf>,
    /// kubelet's root directory, where its CPU and memory manager checkpoints are (read only).
    pub kubelet_root: PathBuf,
    /// Overrides `cgroupDriver`.
    pub cgroup_driver: Option<CgroupDriver>,
    /// Overrides `cgroupRoot`.
    pub cgroup_root: Option<String>,
    /// How often kubelet's values and the interventions are checked.
    pub reconcile_period: Duration,
    /// Where kubelet's values under the feedback's interventions are recorded (see
    /// [`crate::cm::beside_kubelet::interventions::RECORD_FILE`]).
    pub state_dir: PathBuf,
    pub feedback: FeedbackConfig,
}

/// Errors that keep Kubernetes mode from starting.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cgroup root {root:?}: {source}")]
    Root {
        root: String,
        #[source]
        source: NameError,
    },
    #[error(transparent)]
    Cgroups(#[from] CgroupError),
    #[error("machine capacity: {0}")]
    Capacity(#[from] CapacityError),
    #[error("node allocatable: {0}")]
    Allocatable(#[from] AllocatableError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("starting the manager thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// What the mode shares with the rest of the agent.
pub struct Shared {
    pub layout: CgroupLayout,
    pub registry: prometheus::Registry,
    pub index: WorkloadIndex,
    pub inspect: Inspect,
    pub trees: Arc<CgroupTrees>,
    pub preemptions: Option<Box<dyn PreemptionSource>>,
    pub nodes: Option<NodeLayout>,
    /// Where cgroups ran, per node (machines with two nodes or more).
    pub placement: Option<crate::numa::placement::CpuPlacement>,
}

/// The running mode: the manager's thread and the pod source's task.
pub struct KubernetesMode {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
    /// Keeps the source task running (it stops when dropped).
    _source_task: Box<dyn std::any::Any + Send>,
}

impl KubernetesMode {
    /// Builds everything and starts the thread (call on the async runtime: the HTTP clients
    /// are built on it).
    pub async fn start(
        options: &KubernetesOptions,
        shared: Shared,
    ) -> Result<Self, KubernetesError> {
        let Shared {
            layout,
            registry,
            index,
            inspect,
            trees,
            preemptions,
            nodes,
            placement,
        } = shared;
        let id_root = layout
            .cpu_hierarchy()
            .map(Path::to_path_buf)
            .ok_or_else(|| CgroupError::NoHierarchy {
                what: "no cpu hierarchy mounted: kubelet's cgroups cannot be found".to_owned(),
            })?;
        let (config, from_file) = match &options.kubelet_config {
            Some(path) => {
                let loaded = load_kubelet_config(path)?;
                for field in &loaded.unsupported_fields {
                    tracing::debug!(file = %path.display(), field, "KubeletConfiguration field qosd does not model");
                }
                (loaded.config, true)
            }
            None => (KubeletConfiguration::default(), false),
        };
        let root_text = options
            .cgroup_root
            .clone()
            .unwrap_or_else(|| config.cgroup_root.clone());
        let root =
            CgroupName::parse_cgroupfs(&root_text).map_err(|source| KubernetesError::Root {
                root: root_text.clone(),
                source,
            })?;
        let driver = options.cgroup_driver.unwrap_or(if from_file {
            config.cgroup_driver
        } else {
            detect_driver(&id_root, &root)
        });
        let style = match driver {
            CgroupDriver::Cgroupfs => NameStyle::Cgroupfs,
            CgroupDriver::Systemd => NameStyle::Systemd,
        };
        let tiers = QosTiers::new(&root).map_err(|source| KubernetesError::Root {
            root: root_text.clone(),
            source,
        })?;
        // kubepods' values need the node's reservations: checked only with its configuration.
        let kubepods = if from_file && config.cgroups_per_qos {
            let capacity = MachineInfo::host().capacity()?;
            let allocatable_config = NodeAllocatableConfig::from_kubelet(&config);
            allocatable::enforcement(&capacity, &allocatable_config)?
                .kubepods
                .as_ref()
                .map(CgroupLimits::to_resource_config)
        } else {
            None
        };
        let view = KubeletView {
            systemd_driver: driver == CgroupDriver::Systemd,
            policy: PodCgroupPolicy::from_kubelet(&config, layout.v1.is_empty()),
            memory_qos: config.memory_qos() && layout.v1.is_empty(),
            kubepods,
            cpu_manager_policy: config.cpu_manager_policy.clone(),
            memory_manager_policy: config.memory_manager_policy.clone(),
            kubelet_root: options.kubelet_root.clone(),
        };
        tracing::info!(
            driver = driver.as_str(),
            cgroup_root = %root,
            kubelet_config = ?options.kubelet_config,
            enforces_pods = config.enforces(EnforcementKey::Pods),
            "beside kubelet"
        );
        let backend = CgroupfsBackend::new(Hierarchies::from_layout(&layout)?, root, style);
        let backend = intervention_backend(backend, driver, options.feedback.mode);
        let writer = SettingsOnlyWriter::new(backend, write_rule(&tiers));
        let metrics = BesideKubeletMetrics::register(&registry)?;
        let mut manager = BesideKubelet::new(
            Box::new(writer),
            BesideKubeletOptions {
                view,
                tiers,
                id_root,
                state_dir: Some(options.state_dir.clone()),
            },
            trees,
            index,
            metrics.clone(),
        );
        if options.feedback.mode != FeedbackMode::Off {
            manager.enable_feedback(
                options.feedback,
                nodes,
                preemptions,
                Some(FeedbackMetrics::register(&registry)?),
            );
            if let Some(placement) = placement {
                manager.set_cpu_placement(placement);
            }
        }
        let runtime = tokio::runtime::Handle::current();
        let (source, task): (Box<dyn PodSource>, Box<dyn std::any::Any + Send>) = match &options
            .source
        {
            PodSourceChoice::ApiServer { node, options } => {
                let (client, url) = client::api_server(options).await?;
                let (source, watch) = api::start(client, node, &url, &runtime);
                (Box::new(source), Box::new(watch))
            }
            PodSourceChoice::Kubelet(options) => {
                let client = client::kubelet(options)?;
                let (source, poll) = kubelet::start(client, &options.url, options.period, &runtime);
                (Box::new(source), Box::new(poll))
            }
        };
        let label = options.source.label();
        let (stop, stopped) = mpsc::channel();
        let period = options.reconcile_period;
        let thread = std::thread::Builder::new()
            .name("beside-kubelet".into())
            .spawn(move || run_loop(manager, source, label, &stopped, period, &metrics, &inspect))
            .map_err(KubernetesError::Thread)?;
        Ok(Self {
            stop,
            thread,
            _source_task: task,
        })
    }

    /// Puts kubelet's values back under every intervention; returns when done.
    pub fn stop(self) {
        // A send error means the thread already ended.
        let _ = self.stop.send(());
        if self.thread.join().is_err() {
            tracing::error!("the manager thread panicked");
        }
    }
}

/// kubelet's driver judged from what is on disk: a `kubepods.slice` under the cgroup root
/// means systemd, anything else cgroupfs (kubelet's default).
fn detect_driver(id_root: &Path, root: &CgroupName) -> CgroupDriver {
    let base = id_root.join(root.to_cgroupfs().trim_start_matches('/'));
    if base.join("kubepods.slice").is_dir() {
        tracing::info!("cgroup driver detected: systemd (kubepods.slice exists)");
        CgroupDriver::Systemd
    } else {
        tracing::info!(
            "cgroup driver: cgroupfs (no kubepods.slice; give --kubelet-config or --cgroup-driver to be sure)"
        );
        CgroupDriver::Cgroupfs
    }
}

/// The backend the feedback's interventions are written through. On kubelet's systemd driver
/// it asks systemd (`SetUnitProperties` on kubelet's slices and the runtime's scopes), so a
/// `systemctl daemon-reload` keeps them; the settings systemd has no property for, and every
/// setting when systemd cannot be reached (then said once as a warning), are written to
/// cgroupfs, where reconcile writes them again after a reload undid them.
fn intervention_backend(
    fs: CgroupfsBackend,
    driver: CgroupDriver,
    feedback: FeedbackMode,
) -> Box<dyn CgroupWriter> {
    if driver != CgroupDriver::Systemd || feedback == FeedbackMode::Off {
        return Box::new(fs);
    }
    match SystemdBus::connect(CALL_TIMEOUT) {
        Ok(bus) => {
            tracing::info!(
                systemd = bus.version(),
                "feedback interventions on kubelet's units through systemd's D-Bus API"
            );
            Box::new(SystemdBackend::new(fs, Arc::new(bus)))
        }
        Err(e) => {
            tracing::warn!(error = %e, "systemd not reachable: feedback interventions are written to cgroupfs only, and a systemctl daemon-reload can undo them until reconcile writes them again");
            Box::new(fs)
        }
    }
}

/// A pass of the manager's loop this long delays pod events: said at debug level, and as a
/// warning past a second.
fn report_slow_pass(took: Duration) {
    if took >= Duration::from_secs(1) {
        tracing::warn!(
            took_ms = took.as_millis(),
            "the manager's pass took over a second: pod events waited"
        );
    } else if took >= TICK {
        tracing::debug!(took_ms = took.as_millis(), "slow manager pass");
    }
}

fn run_loop(
    mut manager: BesideKubelet,
    mut source: Box<dyn PodSource>,
    label: &'static str,
    stopped: &mpsc::Receiver<()>,
    period: Duration,
    metrics: &BesideKubeletMetrics,
    inspect: &Inspect,
) {
    tracing::info!(source = %source.describe(), "pod source");
    inspect.render_on_request();
    let mut last_reconcile = Instant::now();
    let mut first_sync = true;
    loop {
        match stopped.recv_timeout(TICK) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let pass = Instant::now();
        let events = source.poll();
        for error in source.new_errors() {
            tracing::warn!(error = %error, "pod source");
            metrics.source_errors.with_label_values(&[label]).inc();
        }
        if let Some(up) = source.reachable() {
            metrics
                .source_up
                .with_label_values(&[label])
                .set(i64::from(up));
        }
        for event in events {
            manager.handle(event);
        }
        manager.set_source(source.describe(), source.reachable(), source.synced());
        manager.tick();
        if first_sync && source.synced() {
            // The first complete list: check at once rather than a period later.
            first_sync = false;
            manager.reconcile();
            last_reconcile = Instant::now();
        }
        inspect.answer_with(|| manager.report());
        if last_reconcile.elapsed() >= period {
            manager.reconcile();
            last_reconcile = Instant::now();
        }
        report_slow_pass(pass.elapsed());
    }
    tracing::info!("stopping: kubelet's values back under every intervention");
    manager.shutdown();
    inspect.set(Report::message("kubernetes", "stopped"));
}
