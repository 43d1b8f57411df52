//! The sched_switch object: one kernel handler on sched_switch that serves the cpu-time probe
//! ([`super::cpu_time`]) and the run-queue latency probe ([`super::runqlat`]), so each context
//! switch runs one program and walks each task's cgroup chain at most once; the same load
//! carries the CFS throttle-episode programs ([`super::throttle`]).
//!
//! Load order: offsets from BTF are written into the object's globals, then the handler is
//! attached as `tp_btf` if the kernel allows it, as `raw_tracepoint` otherwise (a fresh object
//! for each try, so no half-attached set stays behind), then the throttle programs where
//! fentry/fexit is allowed. Without the run-queue offsets the handler still counts CPU time
//! and the run-queue probe is reported unavailable with the reason. The chosen mode and the
//! reasons for every refused mode are kept for `check` and the metrics.
//!
//! The two probes share the object's counter slots ([`super::slots`]): slot `n` is the same
//! cgroup's in the cpu-time and in the run-queue slot arrays.
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use aya::programs::{BtfTracePoint, RawTracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use qosd_common::{KernelOffsets, MAX_SLOTS, RunqSlot, SchedOffsets, names};

use super::btf::{BtfError, KernelBtf};
use super::cpu_time::CpuTimeError;
use super::kernel_log::KernelLogReader;
use super::runqlat::RunqlatError;
use super::slots::{self, SlotError, SlotTable};
use super::{AttachError, EBPF_OBJECT, ProbeMode, program_as, runqlat, throttle};

/// The pid namespace of the host (`PROC_PID_INIT_INO`): only there do the kernel's task ids
/// the programs record name the same tasks in `/proc`.
const INIT_PID_NS_INODE: u64 = 0xEFFF_FFFC;

/// The tracepoint both program flavours attach to.
const TRACEPOINT: &str = "sched_switch";

/// Errors loading and attaching the sched_switch object.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("the kernel object is empty: this qosd was built with AYA_BUILD_SKIP=1")]
    EmptyObject,
    #[error("reading kernel struct offsets: {0}")]
    Offsets(#[from] BtfError),
    #[error("no attach mode worked: {0}")]
    NoMode(String),
}

/// Errors removing the counters of removed cgroups.
#[derive(Debug, thiserror::Error)]
pub enum ForgetError {
    #[error("cpu-time maps: {0}")]
    CpuTime(#[from] CpuTimeError),
    #[error("run-queue maps: {0}")]
    Runq(#[from] RunqlatError),
    #[error("counter slots: {0}")]
    Slots(#[from] SlotError),
}

/// Which attach modes to try.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModePreference {
    /// tp_btf, falling back to raw_tracepoint.
    #[default]
    Auto,
    /// Only tp_btf.
    TpBtf,
    /// Only raw_tracepoint (what kernels without BTF-typed tracepoints get).
    RawTracepoint,
}

/// The loaded and attached object. Dropping it detaches and unloads every program.
pub struct SwitchProbe {
    pub(super) ebpf: Ebpf,
    mode: ProbeMode,
    refused: Vec<(ProbeMode, AttachError)>,
    /// Why the run-queue half counts nothing (its offsets are missing), if it does not.
    runq_missing: Option<String>,
    throttle_mode: ProbeMode,
    pub(super) slots: SlotTable,
    /// Whether `/proc/<pid>` names the tasks the programs record (qosd shares the host's pid
    /// namespace), so the slices in progress can be read from `/proc/<pid>/schedstat`.
    pub(super) host_pids: bool,
    /// The node of each CPU, to sum CPU time per NUMA node (two nodes or more).
    pub(super) cpu_nodes: Option<crate::numa::placement::CpuNodes>,
    /// The programs' diagnostics, until the daemon takes them to forward.
    log: Option<KernelLogReader>,
}

impl SwitchProbe {
    /// Loads the object with offsets for the running kernel, attaches the sched_switch
    /// handler in the first mode of `preference` the kernel accepts, then tries the
    /// throttle-episode programs. `v1_cpu` selects attribution through the v1 cpu controller
    /// (v1 and hybrid hosts).
    pub fn attach(v1_cpu: bool, preference: ModePreference) -> Result<Self, SwitchError> {
        if EBPF_OBJECT.is_empty() {
            return Err(SwitchError::EmptyObject);
        }
        let btf = KernelBtf::from_running_kernel()?;
        let offsets = btf.kernel_offsets(v1_cpu)?;
        let (sched, runq_missing, throttle_missing) = match runqlat::sched_offsets(&btf) {
            Ok(found) => (
                found.offsets,
                None,
                found.throttle_missing.map(|e| format!("offsets: {e}")),
            ),
            Err(e) => {
                tracing::warn!(probe = runqlat::PROBE_NAME, error = %e, "run-queue offsets unavailable");
                let why = format!("offsets: {e}");
                (SchedOffsets::default(), Some(why.clone()), Some(why))
            }
        };
        let candidates: &[ProbeMode] = match preference {
            ModePreference::Auto => &[ProbeMode::TpBtf, ProbeMode::RawTracepoint],
            ModePreference::TpBtf => &[ProbeMode::TpBtf],
            ModePreference::RawTracepoint => &[ProbeMode::RawTracepoint],
        };
        let mut refused: Vec<(ProbeMode, AttachError)> = Vec::new();
        for candidate in candidates {
            let mut ebpf = match load_and_attach(&offsets, &sched, candidate) {
                Ok(ebpf) => ebpf,
                Err(reason) => {
                    refused.push((candidate.clone(), reason));
                    continue;
                }
            };
            let throttle_mode = match &throttle_missing {
                None => throttle::attach_episodes(&mut ebpf),
                Some(why) => {
                    let features = super::features::KernelFeatures::detect();
                    ProbeMode::Unavailable(format!("fentry: {}; {why}", features.fentry))
                }
            };
            tracing::info!(
                program = TRACEPOINT,
                mode = candidate.label(),
                runq_waits = runq_missing.as_deref().unwrap_or(runqlat::WAIT_SOURCE),
                throttle_episodes = %throttle_mode,
                ?offsets,
                "sched_switch handler attached (cpu_time, runqlat)"
            );
            for (m, why) in &refused {
                tracing::info!(program = TRACEPOINT, mode = m.label(), reason = %why, "mode refused by the kernel");
            }
            let log = KernelLogReader::take(&mut ebpf, "sched_switch");
            let host_pids = in_host_pid_namespace();
            if !host_pids {
                tracing::info!(
                    "not in the host's pid namespace: cpu-time readings leave out the slices in progress until they end"
                );
            }
            return Ok(Self {
                ebpf,
                mode: candidate.clone(),
                refused,
                runq_missing,
                throttle_mode,
                slots: SlotTable::new(MAX_SLOTS),
                host_pids,
                cpu_nodes: None,
                log,
            });
        }
        let all = refused
            .iter()
            .map(|(mode, why)| format!("{}: {why}", mode.label()))
            .collect::<Vec<_>>()
            .join("; ");
        Err(SwitchError::NoMode(all))
    }

    /// The programs' diagnostics, to forward into qosd's log (once).
    pub fn take_log(&mut self) -> Option<KernelLogReader> {
        self.log.take()
    }

    /// The attach mode of the sched_switch handler: the cpu-time probe's mode.
    #[must_use]
    pub fn mode(&self) -> &ProbeMode {
        &self.mode
    }

    /// The run-queue probe's mode: the handler's, or unavailable when its offsets are missing.
    #[must_use]
    pub fn runq_mode(&self) -> ProbeMode {
        match &self.runq_missing {
            None => self.mode.clone(),
            Some(why) => ProbeMode::Unavailable(why.clone()),
        }
    }

    /// Modes tried before the one in use, with the kernel's reasons.
    #[must_use]
    pub fn refused_modes(&self) -> &[(ProbeMode, AttachError)] {
        &self.refused
    }

    /// Has every cpu-time reading sum the per-CPU counters per NUMA node too
    /// ([`super::cpu_time::CpuTimeSample::nanos_by_cgroup_node`]).
    pub fn set_cpu_nodes(&mut self, nodes: crate::numa::placement::CpuNodes) {
        self.cpu_nodes = Some(nodes);
    }

    /// The mode of the throttle-episode programs (fentry, or unavailable with the reason).
    #[must_use]
    pub fn throttle_mode(&self) -> &ProbeMode {
        &self.throttle_mode
    }

    /// Gives a counter slot to each of `cgroup_ids` that has none (while slots are free),
    /// zeroed in both probes' slot arrays before it is published.
    pub(super) fn assign_slots(
        &mut self,
        cgroup_ids: impl IntoIterator<Item = u64>,
    ) -> Result<usize, SlotError> {
        slots::assign(&mut self.ebpf, &mut self.slots, cgroup_ids, |ebpf, slot| {
            slots::zero(ebpf, names::CPU_TIME_SLOTS_MAP, slot, 0u64)?;
            slots::zero(ebpf, names::RUNQ_SLOTS_MAP, slot, RunqSlot::EMPTY)
        })
    }

    /// Removes every counter of cgroups that no longer exist, keeping the maps bounded: both
    /// probes' hash entries, then the slots. Both at once, whichever collector finds the
    /// cgroups gone first, so the other's next reading cannot find them in a hash and hand
    /// them a fresh slot.
    pub fn forget(&mut self, cgroup_ids: &[u64]) -> Result<(), ForgetError> {
        if cgroup_ids.is_empty() {
            return Ok(());
        }
        self.forget_cpu_time_entries(cgroup_ids)?;
        self.forget_runq_entries(cgroup_ids)?;
        slots::release(&mut self.ebpf, &mut self.slots, cgroup_ids)?;
        Ok(())
    }

    /// Hands the probe to both probes' collectors.
    #[must_use]
    pub fn shared(self) -> SharedSwitchProbe {
        SharedSwitchProbe(Arc::new(Mutex::new(self)))
    }
}

/// The probe shared by the cpu-time and run-queue collectors, which read it in turn.
#[derive(Clone)]
pub struct SharedSwitchProbe(Arc<Mutex<SwitchProbe>>);

impl SharedSwitchProbe {
    /// The probe, for one reading. A collector that panicked mid-reading left nothing half
    /// written that the next one could trip over (readings only add up map values), so a
    /// poisoned lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, SwitchProbe> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A handle that does not keep the programs attached: once the collectors are dropped
    /// (at shutdown), the programs detach and the handle reads nothing.
    #[must_use]
    pub fn downgrade(&self) -> WeakSwitchProbe {
        WeakSwitchProbe(Arc::downgrade(&self.0))
    }
}

/// A [`SharedSwitchProbe`] that does not keep it alive.
#[derive(Clone)]
pub struct WeakSwitchProbe(Weak<Mutex<SwitchProbe>>);

impl WeakSwitchProbe {
    /// The probe, while it is still attached.
    #[must_use]
    pub fn upgrade(&self) -> Option<SharedSwitchProbe> {
        self.0.upgrade().map(SharedSwitchProbe)
    }
}

/// A fresh object with the sched_switch handler attached in `mode`.
fn load_and_attach(
    offsets: &KernelOffsets,
    sched: &SchedOffsets,
    mode: &ProbeMode,
) -> Result<Ebpf, AttachError> {
    let mut loader = EbpfLoader::new();
    loader
        .override_global(names::OFFSETS_GLOBAL, offsets, true)
        .override_global(names::SCHED_OFFSETS_GLOBAL, sched, true);
    super::shrink_unused_maps(&mut loader, super::Loader::SchedSwitch);
    let mut ebpf = loader
        .load(EBPF_OBJECT)
        .map_err(AttachError::at("loading the kernel object"))?;
    if *mode == ProbeMode::TpBtf {
        let btf = Btf::from_sys_fs().map_err(AttachError::at("kernel BTF"))?;
        let program: &mut BtfTracePoint = program_as(&mut ebpf, names::SWITCH_TP_BTF)?;
        let target = super::fault::active()
            .ok()
            .and_then(|f| f.tp_btf_target.as_deref())
            .unwrap_or(TRACEPOINT);
        program
            .load(target, &btf)
            .map_err(AttachError::at(target))?;
        program.attach().map_err(AttachError::at(TRACEPOINT))?;
    } else {
        let program: &mut RawTracePoint = program_as(&mut ebpf, names::SWITCH_RAW_TP)?;
        program.load().map_err(AttachError::at(TRACEPOINT))?;
        program
            .attach(TRACEPOINT)
            .map_err(AttachError::at(TRACEPOINT))?;
    }
    Ok(ebpf)
}

/// Whether this process shares the host's pid namespace.
fn in_host_pid_namespace() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == INIT_PID_NS_INODE)
}
