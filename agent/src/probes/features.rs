//! What the running kernel offers the probes: version, BTF, and which attach types it allows.
//! Used by `qosd check` and logged at start-up.
use std::path::Path;

use aya::programs::ProgramType;

use super::btf::VMLINUX_BTF;
use super::error_chain;

/// The perf PMU through which kprobes are created; absent when CONFIG_KPROBES is off.
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe";

/// Whether a kernel feature is there, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    Available,
    Unavailable(String),
}

impl std::fmt::Display for Availability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Available => f.write_str("yes"),
            Self::Unavailable(why) => write!(f, "no ({why})"),
        }
    }
}

/// Kernel facts relevant to the probes.
#[derive(Clone, Debug)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// `/sys/kernel/btf/vmlinux` is present.
    pub btf: Availability,
    /// fentry/fexit programs load (BPF_PROG_TYPE_TRACING).
    pub fentry: Availability,
    /// kprobes can be created.
    pub kprobes: Availability,
}

impl KernelFeatures {
    /// Probes the running kernel. Loading a test fentry program needs CAP_BPF (root).
    #[must_use]
    pub fn detect() -> Self {
        Self {
            release: kernel_release(),
            btf: if Path::new(VMLINUX_BTF).exists() {
                Availability::Available
            } else {
                Availability::Unavailable(format!(
                    "{VMLINUX_BTF} missing (CONFIG_DEBUG_INFO_BTF off)"
                ))
            },
            fentry: match aya::sys::is_program_supported(ProgramType::Tracing) {
                Ok(true) => Availability::Available,
                Ok(false) => {
                    Availability::Unavailable("kernel does not support tracing programs".into())
                }
                Err(e) => Availability::Unavailable(error_chain(&e)),
            },
            kprobes: if Path::new(KPROBE_PMU).exists() {
                Availability::Available
            } else {
                Availability::Unavailable(format!("{KPROBE_PMU} missing (CONFIG_KPROBES off)"))
            },
        }
    }
}

/// The running kernel's release string, as `uname -r` prints it.
#[must_use]
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}
