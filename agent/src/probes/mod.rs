//! Kernel programs: loading the embedded object, choosing each probe's attach mode, reading
//! its maps into per-cgroup samples.
//!
//! - [`btf`]: struct offsets from the running kernel's BTF.
//! - [`kernel_log`]: the kernel programs' rare-path diagnostics, read into qosd's log.
//! - [`fault`]: kernel refusals and full maps on demand (`QOSD_TEST_FAULTS`), for the tests.
//! - [`features`]: what the kernel offers (version, BTF, fentry, kprobes) for `qosd check`.
//! - [`sched_switch`]: the one sched_switch handler both following probes count in.
//! - [`cpu_time`]: on-CPU time per cgroup from sched_switch.
//! - [`runqlat`]: run-queue latency and preemption pairs per cgroup.
//! - [`slots`]: which cgroup owns which counter slot of the sched_switch handler.
//! - [`batch`]: a whole per-CPU array read in one `bpf(2)` call.
//! - [`throttle`]: CFS throttle episodes (fexit/fentry).
//! - [`numa`]: NUMA hinting faults, page allocations and task migrations, local or remote.
pub mod batch;
pub mod btf;
pub mod cpu_time;
pub mod fault;
pub mod features;
pub mod kernel_log;
pub mod numa;
pub mod runqlat;
pub mod sched_switch;
pub mod slots;
pub mod throttle;

use std::fmt;

use qosd_common::names;

/// The kernel object built from `ebpf/` by `agent/build.rs`, embedded in the binary.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/qosd"));

/// How a probe is attached, or why it is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeMode {
    /// BTF-typed raw tracepoint.
    TpBtf,
    /// Raw tracepoint (untyped arguments).
    RawTracepoint,
    /// Classic perf tracepoint.
    Tracepoint,
    /// fentry/fexit trampoline.
    Fentry,
    /// No mode could be attached; the kernel's reason.
    Unavailable(String),
}

impl ProbeMode {
    /// The `mode` label value.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::TpBtf => "tp_btf",
            Self::RawTracepoint => "raw_tracepoint",
            Self::Tracepoint => "tracepoint",
            Self::Fentry => "fentry",
            Self::Unavailable(_) => "unavailable",
        }
    }
}

impl fmt::Display for ProbeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(reason) => write!(f, "unavailable ({reason})"),
            other => f.write_str(other.label()),
        }
    }
}

/// The loads of the kernel object: the sched_switch object (cpu time, run-queue latency,
/// throttle episodes) and the NUMA probes' (separate, so either degrades alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loader {
    SchedSwitch,
    Numa,
}

/// The object's maps and the loads that use them. Each load shrinks the maps it never
/// touches to one entry (maps are created for the whole object, used or not).
const MAP_USERS: &[(&str, &[Loader])] = &[
    (names::CPU_TIME_MAP, &[Loader::SchedSwitch]),
    (names::CPU_TIME_SLOTS_MAP, &[Loader::SchedSwitch]),
    (names::RUNNING_MAP, &[Loader::SchedSwitch]),
    (names::STATS_MAP, &[Loader::SchedSwitch]),
    (names::SLOT_MAP, &[Loader::SchedSwitch]),
    (names::SLOT_CACHE_MAP, &[Loader::SchedSwitch]),
    (names::TASK_WAITS_MAP, &[Loader::SchedSwitch]),
    (names::RUNQ_SLOTS_MAP, &[Loader::SchedSwitch]),
    (names::RUNQ_HIST_MAP, &[Loader::SchedSwitch]),
    (names::PREEMPT_MAP, &[Loader::SchedSwitch]),
    (names::RUNQ_STATS_MAP, &[Loader::SchedSwitch]),
    (names::THROTTLED_MAP, &[Loader::SchedSwitch]),
    (names::THROTTLE_HIST_MAP, &[Loader::SchedSwitch]),
    (names::NUMA_HINT_FAULTS_MAP, &[Loader::Numa]),
    (names::NUMA_PAGE_ALLOCS_MAP, &[Loader::Numa]),
    (names::NUMA_MIGRATIONS_MAP, &[Loader::Numa]),
    (names::NUMA_STATS_MAP, &[Loader::Numa]),
    (names::DIAG_LAST_MAP, &[Loader::SchedSwitch, Loader::Numa]),
    (names::LOG_MAP, &[Loader::SchedSwitch, Loader::Numa]),
];

/// Shrinks the maps `loader`'s probe never touches to one entry, and the diagnostics' ring
/// buffer to [`kernel_log::RING_BYTES`].
pub(crate) fn shrink_unused_maps(loader: &mut aya::EbpfLoader<'_>, user: Loader) {
    loader.map_max_entries(names::LOG_MAP, kernel_log::RING_BYTES);
    for (map, users) in MAP_USERS {
        if !users.contains(&user) {
            loader.map_max_entries(map, 1);
        }
    }
    if let Ok(faults) = fault::active() {
        for (map, entries) in &faults.map_entries {
            let used = MAP_USERS
                .iter()
                .any(|(name, users)| name == map && users.contains(&user));
            if used {
                loader.map_max_entries(map, *entries);
            }
        }
    }
}

/// Why a program (or what it needs) could not be loaded or attached: the step tried and the
/// kernel's answer, rendered with aya's whole error chain (the errno sits in the source). Its
/// text is the reason `qosd check` and `qosd_probe_info` show for a refused mode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    #[error("program {0} missing from the object")]
    MissingProgram(String),
    /// `step` (empty when the context says it) was refused with `reason`.
    #[error("{}{reason}", if .step.is_empty() { String::new() } else { format!("{}: ", .step) })]
    Refused { step: String, reason: String },
}

impl AttachError {
    /// Maps an aya (or BTF) error of `step` to a refusal.
    pub(crate) fn at<E: std::error::Error + 'static>(
        step: impl Into<String>,
    ) -> impl FnOnce(E) -> Self {
        let step = step.into();
        move |e| Self::Refused {
            step,
            reason: error_chain(&e),
        }
    }
}

/// Program `name` of a loaded object as its concrete type, or why not.
pub(crate) fn program_as<'a, P>(
    ebpf: &'a mut aya::Ebpf,
    name: &str,
) -> Result<&'a mut P, AttachError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| AttachError::MissingProgram(name.to_owned()))?;
    program
        .try_into()
        .map_err(AttachError::at::<aya::programs::ProgramError>(""))
}

/// Renders an error with its whole source chain on one line (aya's top-level messages, such as
/// "the BPF_PROG_LOAD syscall failed", keep the errno in the source).
#[must_use]
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    one_line(&text)
}

/// Lines of a verifier log kept in a reason: its last ones say why it refused.
const VERIFIER_TAIL_LINES: usize = 8;

/// Folds a multi-line message (aya's errors carry the verifier's whole log) into one line, so
/// a log record stays one line: the first line, then the last [`VERIFIER_TAIL_LINES`], joined
/// by ` | `.
fn one_line(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    match lines.as_slice() {
        [] => String::new(),
        [first, rest @ ..] if rest.len() > VERIFIER_TAIL_LINES => {
            let tail = &rest[rest.len() - VERIFIER_TAIL_LINES..];
            format!(
                "{first} | ({} lines left out) | {}",
                rest.len() - VERIFIER_TAIL_LINES,
                tail.join(" | ")
            )
        }
        all => all.join(" | "),
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_verifier_log_becomes_one_line_with_its_last_lines() {
        let short = "the BPF_PROG_LOAD syscall returned Permission denied. Verifier output: 0: R1=ctx()\n\
                     0: (79) r9 = *(u64 *)(r1 +16)\nfunc 'sched_wakeup' doesn't have 4-th argument\n\
                     invalid bpf_context access off=16 size=8\n\n";
        assert_eq!(
            one_line(short),
            "the BPF_PROG_LOAD syscall returned Permission denied. Verifier output: 0: R1=ctx() | \
             0: (79) r9 = *(u64 *)(r1 +16) | func 'sched_wakeup' doesn't have 4-th argument | \
             invalid bpf_context access off=16 size=8"
        );
        let long: String = (0..20).map(|i| format!("line {i}\n")).collect();
        assert_eq!(
            one_line(&long),
            "line 0 | (11 lines left out) | line 12 | line 13 | line 14 | line 15 | line 16 | line 17 | line 18 | line 19"
        );
        assert_eq!(one_line("plain"), "plain");
    }
}
