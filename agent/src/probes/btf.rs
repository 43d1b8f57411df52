//! Reads the kernel struct field offsets the programs need from the running kernel's BTF
//! (`/sys/kernel/btf/vmlinux`), so one compiled object works on every kernel.
use std::path::{Path, PathBuf};

use btf_rs::{Btf, Type};
use qosd_common::{KernelOffsets, cgroup_mode};

/// The kernel's own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Errors while reading offsets from BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading BTF from {path}: {source}")]
    Load {
        path: PathBuf,
        #[source]
        source: btf_rs::Error,
    },
    #[error("BTF has no struct {0}")]
    NoStruct(String),
    #[error("BTF struct {strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    #[error("BTF member {strukt}.{member} is a bitfield")]
    Bitfield { strukt: String, member: String },
    #[error("BTF has no enumerator {0}")]
    NoEnumerator(String),
    /// An offset past 4 GiB: a BTF no kernel writes (the fuzzer's, or a corrupt file).
    #[error("BTF offset of {0} overflows 32 bits")]
    Overflow(String),
    /// Anonymous members nested deeper than [`MAX_ANONYMOUS_DEPTH`] (or a cycle).
    #[error(
        "BTF struct {strukt} nests anonymous members deeper than {MAX_ANONYMOUS_DEPTH} looking for {member}"
    )]
    TooDeep { strukt: String, member: String },
    #[error("BTF lookup failed: {0}")]
    Lookup(#[source] btf_rs::Error),
}

/// How deep anonymous structs and unions are searched for a member: the kernel nests two or
/// three (`task_struct`'s randomized layout, unions in `thread_info`); a cycle in a corrupt
/// BTF would recurse forever.
const MAX_ANONYMOUS_DEPTH: u32 = 16;

/// A parsed BTF blob with offset lookups.
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    /// Parses the running kernel's BTF.
    pub fn from_running_kernel() -> Result<Self, BtfError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    /// Parses a raw BTF file.
    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let btf = Btf::from_file(path).map_err(|source| BtfError::Load {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self { btf })
    }

    /// Parses raw BTF bytes; `origin` names them in errors (the fuzz target's input, a test's
    /// blob).
    pub fn from_bytes(bytes: &[u8], origin: &Path) -> Result<Self, BtfError> {
        let btf = Btf::from_bytes(bytes).map_err(|source| BtfError::Load {
            path: origin.to_owned(),
            source,
        })?;
        Ok(Self { btf })
    }

    /// Byte offset of `member` in `struct strukt`, looking through anonymous structs and unions.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let types = self
            .btf
            .resolve_types_by_name(strukt)
            .map_err(|_| BtfError::NoStruct(strukt.to_owned()))?;
        for ty in types {
            if let Type::Struct(s) = ty {
                if let Some(bits) = self.find_member(&s, member, strukt, 0)? {
                    return Ok(bits / 8);
                }
                return Err(BtfError::NoMember {
                    strukt: strukt.to_owned(),
                    member: member.to_owned(),
                });
            }
        }
        Err(BtfError::NoStruct(strukt.to_owned()))
    }

    /// Bit offset of `member` inside `s`, recursing into anonymous members (`depth` levels
    /// down already).
    fn find_member(
        &self,
        s: &btf_rs::Struct,
        member: &str,
        strukt: &str,
        depth: u32,
    ) -> Result<Option<u32>, BtfError> {
        if depth > MAX_ANONYMOUS_DEPTH {
            return Err(BtfError::TooDeep {
                strukt: strukt.to_owned(),
                member: member.to_owned(),
            });
        }
        for m in &s.members {
            let name = self.btf.resolve_name(m).unwrap_or_default();
            if name == member {
                if m.bitfield_size().is_some_and(|size| size != 0) {
                    return Err(BtfError::Bitfield {
                        strukt: strukt.to_owned(),
                        member: member.to_owned(),
                    });
                }
                return Ok(Some(m.bit_offset()));
            }
            if name.is_empty() {
                let inner = self.btf.resolve_chained_type(m).map_err(BtfError::Lookup)?;
                if let Type::Struct(inner) | Type::Union(inner) = inner
                    && let Some(bits) = self.find_member(&inner, member, strukt, depth + 1)?
                {
                    return m
                        .bit_offset()
                        .checked_add(bits)
                        .map(Some)
                        .ok_or_else(|| BtfError::Overflow(format!("{strukt}.{member}")));
                }
            }
        }
        Ok(None)
    }

    /// Byte offset of `outer.member.inner_member`, where `member` is an embedded
    /// `struct inner` (e.g. `task_struct.se.sum_exec_runtime`).
    pub fn nested_offset(
        &self,
        outer: &str,
        member: &str,
        inner: &str,
        inner_member: &str,
    ) -> Result<u32, BtfError> {
        self.member_offset(outer, member)?
            .checked_add(self.member_offset(inner, inner_member)?)
            .ok_or_else(|| BtfError::Overflow(format!("{outer}.{member}.{inner_member}")))
    }

    /// Value of `enumerator` in `enum name` (e.g. `cpu_cgrp_id` in `cgroup_subsys_id`).
    pub fn enumerator(&self, name: &str, enumerator: &str) -> Result<u32, BtfError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|_| BtfError::NoEnumerator(format!("{name}::{enumerator}")))?;
        for ty in types {
            if let Type::Enum(e) = ty {
                for m in &e.members {
                    if self.btf.resolve_name(m).is_ok_and(|n| n == enumerator) {
                        return Ok(m.val());
                    }
                }
            }
        }
        Err(BtfError::NoEnumerator(format!("{name}::{enumerator}")))
    }

    /// Byte offset of the number of the CPU a task is on (`u32`): `task_struct.thread_info.cpu`
    /// where the CPU moved into `thread_info` (5.16+, `CONFIG_THREAD_INFO_IN_TASK`), else
    /// `task_struct.cpu`.
    pub fn task_cpu_offset(&self) -> Result<u32, BtfError> {
        match (
            self.member_offset("task_struct", "thread_info"),
            self.member_offset("thread_info", "cpu"),
        ) {
            (Ok(thread_info), Ok(cpu)) => thread_info
                .checked_add(cpu)
                .ok_or_else(|| BtfError::Overflow("task_struct.thread_info.cpu".into())),
            _ => self.member_offset("task_struct", "cpu"),
        }
    }

    /// Offsets for the task -> cgroup id walk. `v1_cpu` selects the v1 cpu controller's css
    /// instead of the default (v2) hierarchy.
    pub fn kernel_offsets(&self, v1_cpu: bool) -> Result<KernelOffsets, BtfError> {
        let pointer_size = 8;
        let css_set_subsys = self.member_offset("css_set", "subsys")?;
        let css_set_cpu_css = if v1_cpu {
            self.enumerator("cgroup_subsys_id", "cpu_cgrp_id")?
                .checked_mul(pointer_size)
                .and_then(|index| index.checked_add(css_set_subsys))
                .ok_or_else(|| BtfError::Overflow("css_set.subsys[cpu_cgrp_id]".into()))?
        } else {
            0
        };
        Ok(KernelOffsets {
            task_pid: self.member_offset("task_struct", "pid")?,
            task_cgroups: self.member_offset("task_struct", "cgroups")?,
            css_set_dfl_cgrp: self.member_offset("css_set", "dfl_cgrp")?,
            css_set_cpu_css,
            css_cgroup: self.member_offset("cgroup_subsys_state", "cgroup")?,
            cgroup_kn: self.member_offset("cgroup", "kn")?,
            kernfs_node_id: self.member_offset("kernfs_node", "id")?,
            cgroup_mode: if v1_cpu {
                cgroup_mode::V1_CPU
            } else {
                cgroup_mode::UNIFIED
            },
            task_sum_exec_runtime: self.nested_offset(
                "task_struct",
                "se",
                "sched_entity",
                "sum_exec_runtime",
            )?,
            task_prev_sum_exec_runtime: self.nested_offset(
                "task_struct",
                "se",
                "sched_entity",
                "prev_sum_exec_runtime",
            )?,
            task_policy: self.member_offset("task_struct", "policy")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit tier runs on development machines and CI alike, which all expose BTF; a machine
    /// without it fails these tests with the reason rather than passing them silently.
    fn running_kernel() -> KernelBtf {
        KernelBtf::from_running_kernel()
            .unwrap_or_else(|err| panic!("this test needs {VMLINUX_BTF}: {err}"))
    }

    /// Found by the `btf` fuzz target: a `cpu_cgrp_id` so large that the offset of its slot in
    /// `css_set.subsys` overflowed (a panic in debug builds, a wrapped offset the programs
    /// would read through in release builds). Input kept in fuzz/regressions/btf/.
    #[test]
    fn an_offset_past_32_bits_is_an_error_not_a_wrapped_offset() {
        let blob =
            include_bytes!("../../../fuzz/regressions/btf/cpu-cgrp-id-times-pointer-overflows");
        let btf = KernelBtf::from_bytes(blob, Path::new("regression")).expect("the blob parses");
        let err = btf
            .kernel_offsets(true)
            .expect_err("the slot's offset overflows");
        assert!(
            matches!(err, BtfError::Overflow(ref what) if what == "css_set.subsys[cpu_cgrp_id]"),
            "{err}"
        );
    }

    #[test]
    fn task_struct_offsets_are_found_and_distinct() {
        let btf = running_kernel();
        let off = btf.kernel_offsets(true).expect("offsets");
        assert_ne!(off.task_pid, off.task_cgroups);
        assert!(
            off.task_cgroups > 0,
            "cgroups is not the first task_struct field"
        );
        // css_set.subsys[] begins the struct; the cpu controller's slot is a pointer further on.
        assert_eq!(off.css_set_cpu_css % 8, 0);
        assert!(off.css_set_cpu_css > 0);
        assert_eq!(off.cgroup_mode, cgroup_mode::V1_CPU);
        let se = btf.member_offset("task_struct", "se").expect("se");
        assert!(
            off.task_sum_exec_runtime > se,
            "sum_exec_runtime lies inside se"
        );
        assert_eq!(off.task_sum_exec_runtime % 8, 0);
        // The fair scheduler's mark of the current run's start is a separate u64 of se.
        assert!(off.task_prev_sum_exec_runtime > se);
        assert_ne!(off.task_prev_sum_exec_runtime, off.task_sum_exec_runtime);
        assert_eq!(off.task_prev_sum_exec_runtime % 8, 0);
        assert_eq!(off.task_policy % 4, 0);
        assert!(![off.task_pid, off.task_cgroups].contains(&off.task_policy));
    }

    #[test]
    fn task_cpu_is_found_in_thread_info_or_the_task() {
        let btf = running_kernel();
        let offset = btf.task_cpu_offset().expect("task cpu");
        // Either way the field is a 4-byte aligned u32 inside task_struct, and on kernels
        // where it lives in thread_info (the first member) it sits within its first bytes.
        assert_eq!(offset % 4, 0);
        if let Ok(cpu) = btf.member_offset("thread_info", "cpu") {
            let thread_info = btf
                .member_offset("task_struct", "thread_info")
                .expect("thread_info");
            assert_eq!(offset, thread_info + cpu);
        } else {
            assert_eq!(
                offset,
                btf.member_offset("task_struct", "cpu").expect("cpu")
            );
        }
    }

    #[test]
    fn anonymous_members_are_searched() {
        let btf = running_kernel();
        // Since 5.x `struct page` keeps `lru` inside anonymous unions/structs.
        let off = btf.member_offset("page", "lru").expect("page.lru");
        assert_eq!(off, 8, "page.lru follows the flags word");
    }

    #[test]
    fn unknown_names_are_errors_naming_them() {
        let btf = running_kernel();
        let err = btf
            .member_offset("task_struct", "no_such_field")
            .expect_err("no field");
        assert!(err.to_string().contains("no_such_field"), "{err}");
        let err = btf
            .enumerator("cgroup_subsys_id", "no_such_enumerator")
            .expect_err("no enumerator");
        assert!(err.to_string().contains("no_such_enumerator"), "{err}");
    }
}
