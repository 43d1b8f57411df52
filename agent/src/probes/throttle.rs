//! CFS throttle episodes: durations from fexit on `throttle_cfs_rq` and fentry on
//! `unthrottle_cfs_rq`, where the kernel allows tracing programs. (The cgroups' own `cpu.stat`
//! counters, available everywhere, are read by [`crate::cgroup::cfs`].)
//!
//! The episode programs live in the sched_switch object ([`super::sched_switch::SwitchProbe`]);
//! this module attaches them.

use aya::programs::{FEntry, FExit};
use aya::{Btf, Ebpf};
use qosd_common::names;

use super::{AttachError, ProbeMode, error_chain, program_as};

/// The episode probe's name in `qosd check` and in `qosd_probe_info{probe}`.
pub const PROBE_NAME: &str = "cpu_throttle_episodes";

/// Attaches the episode programs; a refusal is returned as the unavailable mode with the
/// kernel's reason, and nothing stays attached.
pub fn attach_episodes(ebpf: &mut Ebpf) -> ProbeMode {
    match try_attach(ebpf) {
        Ok(()) => ProbeMode::Fentry,
        Err(reason) => {
            if let Some(program) = ebpf.program_mut(names::THROTTLE_FEXIT)
                && let Ok(program) = <&mut FExit>::try_from(program)
                && let Err(e) = program.unload()
            {
                tracing::debug!(error = %error_chain(&e), "unloading the fexit program");
            }
            if let Some(program) = ebpf.program_mut(names::UNTHROTTLE_FENTRY)
                && let Ok(program) = <&mut FEntry>::try_from(program)
                && let Err(e) = program.unload()
            {
                tracing::debug!(error = %error_chain(&e), "unloading the fentry program");
            }
            ProbeMode::Unavailable(reason.to_string())
        }
    }
}

fn try_attach(ebpf: &mut Ebpf) -> Result<(), AttachError> {
    let btf = Btf::from_sys_fs().map_err(AttachError::at("kernel BTF"))?;
    {
        let program: &mut FExit = program_as(ebpf, names::THROTTLE_FEXIT)?;
        program
            .load("throttle_cfs_rq", &btf)
            .map_err(AttachError::at("fexit throttle_cfs_rq"))?;
        program
            .attach()
            .map_err(AttachError::at("fexit throttle_cfs_rq"))?;
    }
    let program: &mut FEntry = program_as(ebpf, names::UNTHROTTLE_FENTRY)?;
    program
        .load("unthrottle_cfs_rq", &btf)
        .map_err(AttachError::at("fentry unthrottle_cfs_rq"))?;
    program
        .attach()
        .map_err(AttachError::at("fentry unthrottle_cfs_rq"))?;
    Ok(())
}
