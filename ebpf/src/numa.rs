//! Cross-NUMA memory behaviour per cgroup: NUMA hinting faults, page allocations and task
//! migrations, each counted local or remote in a per-CPU hash keyed by cgroup id.
//!
//! - `numa_hint_fault_fentry` (fentry on `task_numa_fault`): the faulting task's cgroup; local
//!   when the memory node the kernel reports equals the node of the CPU taking the fault.
//! - `numa_page_alloc_tp` (classic tracepoint `kmem:mm_page_alloc`): the current task's cgroup;
//!   `1 << order` pages, local when the page frame's node (looked up in the ranges user space
//!   passed in) equals the allocating CPU's node. The classic tracepoint is the one flavour that
//!   hands over the page frame number itself on every kernel; its offset in the record comes
//!   from tracefs.
//! - `numa_migrate_tp_btf` / `numa_migrate_raw_tp` (`sched_migrate_task`): the migrated task's
//!   cgroup; cross-node when the node of the CPU it leaves differs from the destination's.
//!   The kernel fires this tracepoint also when the "new" CPU is the current one, without
//!   counting a migration; nor does this program.
//!
//! Everything the programs need to know about the machine (CPU -> node, page-frame ranges ->
//! node) and the kernel (where a task's CPU number and the record's fields are) is in the
//! [`NumaConfig`] global that user space fills in before load.
use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_get_smp_processor_id},
    macros::{btf_tracepoint, fentry, map, raw_tracepoint, tracepoint},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, FEntryContext, RawTracePointContext, TracePointContext},
};
use qosd_common::{
    LocalityCounts, MAX_CGROUPS, MAX_CPUS, MAX_PFN_RANGES, NO_NODE, NumaConfig, NumaStats,
    PfnRange, names,
};

use crate::{Direct, KernelRead, Probed, offsets, task_cgroup_id};

/// Machine and kernel facts, written by user space before load (see `qosd::probes::numa`).
#[unsafe(no_mangle)]
static QOSD_NUMA: NumaConfig = NumaConfig::EMPTY;

/// cgroup id -> hinting faults on the local / a remote node.
#[map]
static NUMA_HINT_FAULTS: PerCpuHashMap<u64, LocalityCounts> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// cgroup id -> pages allocated on the local / a remote node.
#[map]
static NUMA_PAGE_ALLOCS: PerCpuHashMap<u64, LocalityCounts> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// cgroup id -> task migrations within a node (`local`) / across nodes (`remote`).
#[map]
static NUMA_MIGRATIONS: PerCpuHashMap<u64, LocalityCounts> =
    PerCpuHashMap::with_max_entries(MAX_CGROUPS, 0);

/// Health counters, one set per CPU.
#[map]
static NUMA_STATS: PerCpuArray<NumaStats> = PerCpuArray::with_max_entries(1, 0);

const BPF_ANY: u64 = 0;
/// Binary-search steps over [`MAX_PFN_RANGES`] sorted ranges: log2(64) + 1.
const SEARCH_STEPS: u32 = 7;

#[fentry(function = "task_numa_fault")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn numa_hint_fault_fentry(ctx: FEntryContext) -> i32 {
    // task_numa_fault(int last_cpupid, int mem_node, int pages, int flags)
    let mem_node: i32 = ctx.arg(1);
    on_hint_fault(mem_node);
    0
}

#[tracepoint(category = "kmem", name = "mm_page_alloc")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn numa_page_alloc_tp(ctx: TracePointContext) -> i32 {
    on_page_alloc(&ctx);
    0
}

#[btf_tracepoint(function = "sched_migrate_task")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn numa_migrate_tp_btf(ctx: BtfTracePointContext) -> i32 {
    // sched_migrate_task(struct task_struct *p, int dest_cpu)
    let dest_cpu: i32 = ctx.arg(1);
    on_migrate::<Direct>(ctx.arg(0), dest_cpu);
    0
}

#[raw_tracepoint(tracepoint = "sched_migrate_task")]
#[expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand over the context by value"
)]
pub fn numa_migrate_raw_tp(ctx: RawTracePointContext) -> i32 {
    let dest_cpu: i32 = ctx.arg(1);
    on_migrate::<Probed>(ctx.arg(0), dest_cpu);
    0
}

#[inline(always)]
fn stats() -> Option<&'static mut NumaStats> {
    let ptr = NUMA_STATS.get_ptr_mut(0)?;
    // SAFETY: a successful per-CPU array lookup; programs run with preemption disabled, so
    // only this program invocation touches this CPU's slot meanwhile.
    Some(unsafe { &mut *ptr })
}

/// One `u32` field of the global.
#[inline(always)]
fn config_word(field: *const u32) -> u32 {
    // SAFETY: `field` points into the QOSD_NUMA static; the volatile read stops the compiler
    // from folding the initialiser that user space overwrites at load time.
    unsafe { core::ptr::read_volatile(field) }
}

#[inline(always)]
fn configured() -> bool {
    config_word(&raw const QOSD_NUMA.configured) != 0 && offsets().cgroup_mode != 0
}

/// The node of CPU `cpu`, or [`NO_NODE`].
#[inline(always)]
fn cpu_node(cpu: u32) -> u32 {
    if cpu >= MAX_CPUS {
        return NO_NODE;
    }
    let base = (&raw const QOSD_NUMA.cpu_node).cast::<u32>();
    // The mask keeps the index provably inside the array for the verifier.
    config_word(base.wrapping_add((cpu & (MAX_CPUS - 1)) as usize))
}

/// One entry of the page-frame range table.
#[inline(always)]
fn range(index: u32) -> PfnRange {
    let base = (&raw const QOSD_NUMA.ranges).cast::<PfnRange>();
    // SAFETY: the masked index is inside the array of the QOSD_NUMA static; the volatile
    // read stops the compiler from folding the initialiser user space overwrites.
    unsafe { core::ptr::read_volatile(base.wrapping_add((index & (MAX_PFN_RANGES - 1)) as usize)) }
}

/// The node of page frame `pfn`: binary search for the last range starting at or before it.
#[inline(always)]
fn pfn_node(pfn: u64) -> u32 {
    let count = config_word(&raw const QOSD_NUMA.nr_ranges);
    if count == 0 || count > MAX_PFN_RANGES {
        return NO_NODE;
    }
    // The answer is in lo..hi.
    let (mut lo, mut hi) = (0u32, count);
    for _ in 0..SEARCH_STEPS {
        if hi - lo <= 1 {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if range(mid).start <= pfn {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let found = range(lo);
    if pfn >= found.start && pfn < found.end {
        found.node
    } else {
        NO_NODE
    }
}

/// The node of the CPU this program runs on.
#[inline(always)]
fn this_cpu_node() -> u32 {
    // SAFETY: bpf_get_smp_processor_id has no preconditions.
    cpu_node(unsafe { bpf_get_smp_processor_id() })
}

/// The cgroup of the task running this program; 0 for the idle task.
#[inline(always)]
fn current_cgroup() -> Result<u64, ()> {
    // SAFETY: bpf_get_current_task has no preconditions; the pointer is only read through
    // bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    task_cgroup_id::<Probed>(task, offsets())
}

/// Adds `n` to the local or remote counter of `cgroup`; true when the map refused a new entry.
#[inline(always)]
fn count(
    map: &PerCpuHashMap<u64, LocalityCounts>,
    name: &'static str,
    cgroup: u64,
    local: bool,
    n: u64,
) -> bool {
    if let Some(slot) = map.get_ptr_mut(cgroup) {
        // SAFETY: this CPU's slot of an existing element, written only by this CPU with
        // preemption disabled.
        unsafe {
            if local {
                (*slot).local += n;
            } else {
                (*slot).remote += n;
            }
        }
        return false;
    }
    let value = if local {
        LocalityCounts {
            local: n,
            remote: 0,
        }
    } else {
        LocalityCounts {
            local: 0,
            remote: n,
        }
    };
    let full = map.insert(cgroup, value, BPF_ANY).is_err();
    if full {
        crate::diag::map_full(name);
    }
    full
}

#[inline(always)]
fn on_hint_fault(mem_node: i32) {
    let Some(stats) = stats() else {
        return;
    };
    stats.hint_faults += 1;
    if !configured() {
        return;
    }
    let cpu_node = this_cpu_node();
    // A fault with no node (NUMA_NO_NODE, -1) is left out; it is not a failed read.
    let Ok(mem_node) = u32::try_from(mem_node) else {
        stats.hint_dropped += 1;
        return;
    };
    let Ok(cgroup) = current_cgroup() else {
        crate::diag::read_failed(
            "numa hinting fault",
            crate::diag::DROPPED,
            &mut stats.hint_dropped,
        );
        return;
    };
    // Kernel threads take no hinting faults; the idle task (cgroup 0) never does.
    if cgroup == 0 {
        return;
    }
    if cpu_node == NO_NODE
        || count(
            &NUMA_HINT_FAULTS,
            names::NUMA_HINT_FAULTS_MAP,
            cgroup,
            mem_node == cpu_node,
            1,
        )
    {
        stats.hint_dropped += 1;
    }
}

#[inline(always)]
fn on_page_alloc(ctx: &TracePointContext) {
    let Some(stats) = stats() else {
        return;
    };
    stats.page_allocs += 1;
    if !configured() {
        return;
    }
    let pfn_at = config_word(&raw const QOSD_NUMA.alloc_pfn) as usize;
    let order_at = config_word(&raw const QOSD_NUMA.alloc_order) as usize;
    // SAFETY: read_at copies from the tracepoint record with bpf_probe_read_kernel, which
    // reports a bad address as an error instead of faulting.
    let (Ok(pfn), Ok(order)) = (unsafe { ctx.read_at::<u64>(pfn_at) }, unsafe {
        ctx.read_at::<u32>(order_at)
    }) else {
        crate::diag::read_failed(
            "mm_page_alloc",
            crate::diag::DROPPED,
            &mut stats.alloc_dropped,
        );
        return;
    };
    // A failed allocation is traced with pfn -1 and allocates nothing.
    if pfn == u64::MAX {
        return;
    }
    let pages = 1u64 << (order & 31);
    let (page_node, cpu_node) = (pfn_node(pfn), this_cpu_node());
    let Ok(cgroup) = current_cgroup() else {
        crate::diag::read_failed(
            "mm_page_alloc",
            crate::diag::DROPPED,
            &mut stats.alloc_dropped,
        );
        return;
    };
    if page_node == NO_NODE || cpu_node == NO_NODE {
        stats.alloc_dropped += 1;
        return;
    }
    // Allocations from the idle task (interrupts on an idle CPU) belong to no cgroup.
    if cgroup != 0
        && count(
            &NUMA_PAGE_ALLOCS,
            names::NUMA_PAGE_ALLOCS_MAP,
            cgroup,
            page_node == cpu_node,
            pages,
        )
    {
        stats.alloc_dropped += 1;
    }
}

#[inline(always)]
fn on_migrate<R: KernelRead>(task: *const u8, dest_cpu: i32) {
    let Some(stats) = stats() else {
        return;
    };
    stats.migrations += 1;
    if !configured() {
        return;
    }
    let (Ok(from), Ok(to)) = (
        R::read::<u32>(task, config_word(&raw const QOSD_NUMA.task_cpu)),
        u32::try_from(dest_cpu),
    ) else {
        crate::diag::read_failed(
            "task migration",
            crate::diag::DROPPED,
            &mut stats.migration_dropped,
        );
        return;
    };
    if from == to {
        // set_task_cpu() to the CPU the task is on: not a migration.
        return;
    }
    let (from_node, to_node) = (cpu_node(from), cpu_node(to));
    let cgroup = match task_cgroup_id::<R>(task, offsets()) {
        Ok(0) => return,
        Ok(id) => id,
        Err(()) => {
            crate::diag::read_failed(
                "task migration",
                crate::diag::DROPPED,
                &mut stats.migration_dropped,
            );
            return;
        }
    };
    if from_node == NO_NODE
        || to_node == NO_NODE
        || count(
            &NUMA_MIGRATIONS,
            names::NUMA_MIGRATIONS_MAP,
            cgroup,
            from_node == to_node,
            1,
        )
    {
        stats.migration_dropped += 1;
    }
}
