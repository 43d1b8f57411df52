//! Types shared by qosd's kernel programs (`qosd-ebpf`) and its user space (`qosd`).
//!
//! Everything here is `#[repr(C)]` plain data with an identical layout on both sides. With the
//! `user` feature the types implement `aya::Pod`, so user space can place them in globals and
//! read them from maps.
#![no_std]

/// How a kernel program finds the cgroup a task belongs to.
pub mod cgroup_mode {
    /// cgroup v2: `task->cgroups->dfl_cgrp`.
    pub const UNIFIED: u32 = 1;
    /// cgroup v1 or hybrid: the cgroup of the task's cpu controller,
    /// `task->cgroups->subsys[cpu_cgrp_id]->cgroup`.
    pub const V1_CPU: u32 = 2;
}

/// Whether a task of scheduling policy `policy` (`task_struct.policy`) runs in the fair
/// class, whose `set_next_entity` records the start of each run in
/// `se.prev_sum_exec_runtime`: `SCHED_NORMAL` (0), `SCHED_BATCH` (3) and `SCHED_IDLE` (5), as
/// numbered in the kernel's `include/uapi/linux/sched.h`. (A sched_ext scheduler that takes
/// over these policies is not detected.)
#[inline(always)]
#[must_use]
pub const fn is_fair_policy(policy: u32) -> bool {
    matches!(policy, 0 | 3 | 5)
}

/// Byte offsets of the kernel struct fields the programs follow from a `task_struct` to its
/// cgroup id, read from the running kernel's BTF at load time. Rust eBPF has no CO-RE
/// relocations, so these are passed in as a global and one object serves every kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.pid` (`pid_t`).
    pub task_pid: u32,
    /// `task_struct.cgroups` (`struct css_set *`).
    pub task_cgroups: u32,
    /// `css_set.dfl_cgrp` (`struct cgroup *`), used in [`cgroup_mode::UNIFIED`].
    pub css_set_dfl_cgrp: u32,
    /// `css_set.subsys[cpu_cgrp_id]` (`struct cgroup_subsys_state *`), used in
    /// [`cgroup_mode::V1_CPU`]: the array's offset plus the element for the cpu controller.
    pub css_set_cpu_css: u32,
    /// `cgroup_subsys_state.cgroup` (`struct cgroup *`).
    pub css_cgroup: u32,
    /// `cgroup.kn` (`struct kernfs_node *`).
    pub cgroup_kn: u32,
    /// `kernfs_node.id` (`u64`): the cgroup id, equal to the cgroup directory's inode number.
    pub kernfs_node_id: u32,
    /// One of [`cgroup_mode`]; 0 means "not configured" and the programs count nothing.
    pub cgroup_mode: u32,
    /// `task_struct.se.sum_exec_runtime` (`u64`): the task's CPU time as the scheduler
    /// accounts it (the clock cpuacct and `cpu.stat` charge from).
    pub task_sum_exec_runtime: u32,
    /// `task_struct.se.prev_sum_exec_runtime` (`u64`): `sum_exec_runtime` when the fair
    /// scheduler last picked the task to run (`set_next_entity`), i.e. at the start of its
    /// current run; for tasks of other classes it is stale.
    pub task_prev_sum_exec_runtime: u32,
    /// `task_struct.policy` (`unsigned int`): the scheduling policy, which says whether the
    /// fair scheduler keeps `prev_sum_exec_runtime` for the task.
    pub task_policy: u32,
}

/// What one CPU's sched_switch program remembers about the task it switched in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunningTask {
    /// cgroup id of the task now on this CPU; 0 for the idle task or when unknown.
    pub cgroup_id: u64,
    /// The task's `se.sum_exec_runtime` when it was switched in: the slice it then runs is
    /// the growth of that counter, as the scheduler itself accounts it.
    pub start_runtime_ns: u64,
    /// Its `task->cgroups` (`struct css_set *`) when `cgroup_id` was read: while the task's
    /// css_set is unchanged so is its cgroup, and the walk to the id can be skipped.
    pub css_set: u64,
    /// Its `struct task_struct *`, compared with the next switch's `prev` (never followed):
    /// equal, it is the same task, so its pid need not be read again. 0 when unknown.
    pub task: u64,
    /// Its pid (kernel task id); 0 for the idle task or before the first switch.
    pub pid: u32,
    /// The counter slot of `cgroup_id`, or [`NO_SLOT`].
    pub slot: u32,
}

/// Most cgroups with a counter slot: an index into per-CPU arrays that user space assigns to
/// each cgroup the programs have seen, so the sched_switch handlers add to an array element
/// instead of looking the cgroup up in a hash. Cgroups beyond it are counted in the hashes.
pub const MAX_SLOTS: u32 = 1024;
/// No slot assigned.
pub const NO_SLOT: u32 = u32::MAX;
/// Entries of each CPU's cache of cgroup -> slot lookups (a power of two: the index is the
/// cgroup id's low bits).
pub const SLOT_CACHE_SIZE: u32 = 64;

/// One entry of a CPU's cgroup -> slot cache.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotCacheEntry {
    /// cgroup id; 0 for an empty entry (no cgroup has id 0).
    pub cgroup_id: u64,
    /// Its slot.
    pub slot: u32,
    /// Padding, always 0.
    pub pad: u32,
}

/// Per-CPU health counters of the cpu-time probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeStats {
    /// sched_switch events handled.
    pub events: u64,
    /// Events whose cgroup could not be read from kernel memory.
    pub read_errors: u64,
    /// Time slices that could not be recorded because the per-cgroup map was full or busy,
    /// or because the task's switch in was not seen and it is not a fair-class task.
    pub dropped: u64,
    /// Switches out of a task whose switch in this CPU's program did not see (the first
    /// switch on each CPU after attach, and switches the kernel did not deliver): its slice
    /// is charged from the scheduler's own start of the run instead.
    pub unchained: u64,
}

/// Capacity of the per-cgroup cpu-time map. User space removes entries of cgroups that are gone.
pub const MAX_CGROUPS: u32 = 16_384;

/// Byte offsets the run-queue latency and throttling programs need beyond [`KernelOffsets`],
/// read from the running kernel's BTF at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedOffsets {
    /// `task_struct.__state` (5.14+, `unsigned int`) or `task_struct.state` (older, `long`);
    /// the low 32 bits are read, which hold every state bit on little-endian machines.
    pub task_state: u32,
    /// `cfs_rq.tg` (`struct task_group *`).
    pub cfs_rq_tg: u32,
    /// `task_group.css` (embedded `struct cgroup_subsys_state`).
    pub tg_css: u32,
    /// `cfs_rq.throttled` (`int`): non-zero while the cfs_rq is throttled.
    pub cfs_rq_throttled: u32,
    /// `task_struct.sched_info.run_delay` (`unsigned long long`): nanoseconds the task has
    /// waited on a run queue, up to its last arrival on a CPU.
    pub task_run_delay: u32,
    /// `task_struct.sched_info.pcount` (`unsigned long`): arrivals on a CPU after a wait.
    pub task_pcount: u32,
    /// 1 when the offsets are filled in; 0 means "not configured" and the programs count nothing.
    pub configured: u32,
    /// Padding, always 0.
    pub pad: u32,
}

/// What the run-queue program keeps of a task when it leaves a CPU, in a fixed array of
/// [`MAX_TASK_WAITS`] entries indexed by [`task_wait_index`]. The kernel's own `sched_info`
/// supplies the wait: by the task's next departure, the kernel has added the wait its arrival
/// ended (and any part waited on a run queue it was moved off) to `run_delay`, so the growth
/// of `run_delay` since the entry is that wait. Tasks whose pids collide overwrite each other
/// (the pid tells), and the next wait of a task that lost its entry is not measured. An
/// exiting task clears its entry, so a reused pid never finds its predecessor's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskWait {
    /// The task's pid; 0 while the entry is being written.
    pub pid: u32,
    /// Padding, always 0.
    pub pad: u32,
    /// Its `sched_info.pcount` when it left the CPU: arrivals can only add to it.
    pub pcount: u64,
    /// Its `sched_info.run_delay` when it left the CPU.
    pub run_delay_ns: u64,
    /// When it was preempted (left the CPU still runnable), its cgroup; 0 otherwise.
    pub victim_cgroup: u64,
    /// When it was preempted, the cgroup of the task that took the CPU; 0 otherwise.
    pub preemptor_cgroup: u64,
    /// Padding to a cache line, always 0: entries written by different CPUs never share one.
    pub pad_line: [u64; 3],
}

/// Entries of the per-task array (a power of two).
pub const MAX_TASK_WAITS: u32 = 32_768;

/// The [`TaskWait`] entry of pid `pid`: the pid times an odd constant, modulo the array size.
/// That is a bijection on the array's range (distinct pids below [`MAX_TASK_WAITS`] never
/// collide) which puts consecutive pids, often a producer and its consumer on two CPUs, far
/// apart instead of on neighbouring cache lines.
#[must_use]
#[inline(always)]
pub const fn task_wait_index(pid: u32) -> u32 {
    pid.wrapping_mul(0x4F1B) & (MAX_TASK_WAITS - 1)
}

const _: () = assert!(size_of::<TaskWait>() == 64 && MAX_TASK_WAITS.is_power_of_two());

/// Preemptors a victim cgroup's slot counts by name, per CPU; others go to the pair hash.
pub const SLOT_PREEMPTORS: usize = 4;

/// Preemptions of a slot's cgroup by one preemptor cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreemptCell {
    /// The preemptor's cgroup id; 0 for an unused cell.
    pub preemptor_cgroup: u64,
    /// Preemptions.
    pub count: u64,
    /// Nanoseconds the victims then waited before running again.
    pub wait_ns: u64,
}

/// One CPU's run-queue counters of a cgroup with a counter slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunqSlot {
    /// Sum of the recorded waits, in nanoseconds.
    pub sum_ns: u64,
    /// Waits per log2 bucket, as [`HistKey::bucket`].
    pub buckets: [u64; HIST_MAX_BUCKET as usize + 1],
    /// Preemptions of this cgroup's tasks, by preemptor.
    pub preemptors: [PreemptCell; SLOT_PREEMPTORS],
}

impl RunqSlot {
    /// Nothing recorded.
    pub const EMPTY: Self = Self {
        sum_ns: 0,
        buckets: [0; HIST_MAX_BUCKET as usize + 1],
        preemptors: [PreemptCell {
            preemptor_cgroup: 0,
            count: 0,
            wait_ns: 0,
        }; SLOT_PREEMPTORS],
    };
}

/// Key of a per-cgroup log2 histogram (run-queue waits, throttle episodes): one entry per
/// (cgroup, bucket), whose value is a [`HistBucket`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HistKey {
    /// cgroup id (kernfs id).
    pub cgroup_id: u64,
    /// log2 bucket: the wait `w` in nanoseconds falls in bucket `b` when `2^(b-1) <= w < 2^b`
    /// (bucket 0 holds `w == 0`).
    pub bucket: u32,
    /// Padding, always 0.
    pub pad: u32,
}

/// Value of one histogram bucket: how many values fell in it and their sum. Keeping the sum
/// per bucket lets a program record a value with one map lookup; the histogram's sum is the
/// sum over its buckets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistBucket {
    /// Values recorded in this bucket.
    pub count: u64,
    /// Their sum in nanoseconds.
    pub sum_ns: u64,
}

/// Highest log2 bucket the programs record; longer waits land here.
pub const HIST_MAX_BUCKET: u32 = 40;

/// Bit length of each byte value (0 for 0): the last step of [`log2_bucket`].
static BIT_LENGTH_OF_BYTE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 1;
    while i < 256 {
        table[i] = table[i / 2] + 1;
        i += 1;
    }
    table
};

/// The log2 bucket of `v` nanoseconds: `b` such that `2^(b-1) <= v < 2^b` (0 for 0), capped
/// at [`HIST_MAX_BUCKET`]. BPF has no count-leading-zeros instruction (LLVM expands
/// `leading_zeros` into some 45 instructions), so this halves the range three times and looks
/// the last byte up in a table.
#[must_use]
#[inline(always)]
pub fn log2_bucket(v: u64) -> u32 {
    if v >= 1 << HIST_MAX_BUCKET {
        return HIST_MAX_BUCKET;
    }
    let (mut x, mut b) = (v, 0u32);
    for shift in [32u32, 16, 8] {
        if x >> shift != 0 {
            x >>= shift;
            b += shift;
        }
    }
    // x is now below 256; the mask keeps the bound visible to the BPF verifier.
    b + u32::from(BIT_LENGTH_OF_BYTE[(x & 0xff) as usize])
}

/// Key of the preemption-pair counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PreemptKey {
    /// cgroup of the task switched out while still runnable.
    pub victim_cgroup: u64,
    /// cgroup of the task switched in instead.
    pub preemptor_cgroup: u64,
}

/// Value of the preemption-pair counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreemptValue {
    /// Preemptions.
    pub count: u64,
    /// Nanoseconds the victims then waited before running again.
    pub wait_ns: u64,
}

/// Per-CPU health counters of the run-queue and throttling probes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunqStats {
    /// sched_switch events handled.
    pub switches: u64,
    /// Waits recorded.
    pub waits: u64,
    /// Waits that could not be measured because the task had no valid entry of its previous
    /// departure: a task first seen after its first arrival (one wait per task already
    /// running when the probe attached), or one whose entry a task with colliding pid bits took.
    pub unmeasured_waits: u64,
    /// Waits that could not be recorded (a map full or busy).
    pub dropped: u64,
    /// Switches whose task state, `sched_info` or task switched in could not be read from
    /// kernel memory (a task switched out whose cgroup could not be read is counted in the
    /// cpu-time probe's [`ProbeStats::read_errors`], and its wait is not measured).
    pub read_errors: u64,
    /// Throttle episodes recorded (fentry on unthrottle_cfs_rq).
    pub throttle_episodes: u64,
    /// Throttle starts or ends that could not be recorded.
    pub throttle_dropped: u64,
}

/// The kernel programs' rare-path diagnostics (see the eBPF crate's `diag`): each kind is
/// logged at most once per CPU per [`DIAG_INTERVAL_NS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum DiagKind {
    /// A kernel field could not be read.
    ReadFailed = 0,
    /// A map refused a new entry.
    MapFull = 1,
}

impl DiagKind {
    /// Number of kinds: the entries of the last-logged map.
    pub const COUNT: u32 = 2;
}

/// Least time between two diagnostics of one kind on one CPU: 10 s.
pub const DIAG_INTERVAL_NS: u64 = 10_000_000_000;

/// Capacity of the per-(cgroup, bucket) histogram map.
pub const MAX_HIST_ENTRIES: u32 = 32_768;
/// Capacity of the preemption-pair map.
pub const MAX_PREEMPT_PAIRS: u32 = 16_384;
/// Capacity of the map of throttled `cfs_rq`s (CPUs times throttled cgroups).
pub const MAX_THROTTLED_CFS_RQS: u32 = 16_384;

/// Most CPUs the NUMA programs know the node of (a power of two: indexes are masked with
/// `MAX_CPUS - 1`, which the verifier can bound).
pub const MAX_CPUS: u32 = 1024;
/// Most physical page-frame ranges the page-allocation program can map to nodes (a power of
/// two, as above). User space merges adjacent ranges of one node before passing them in.
pub const MAX_PFN_RANGES: u32 = 64;
/// Node of a CPU that is not present, in [`NumaConfig::cpu_node`].
pub const NO_NODE: u32 = u32::MAX;

/// Physical page frames `start..end` (end exclusive) belong to NUMA node `node`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PfnRange {
    pub start: u64,
    pub end: u64,
    pub node: u32,
    /// Padding, always 0.
    pub pad: u32,
}

/// What the NUMA programs need to know about the machine and the kernel, written by user
/// space before load: where a task's CPU number lives, where `pfn` and `order` sit in the
/// `kmem:mm_page_alloc` record (from tracefs), the node of every CPU and the node of every
/// physical page-frame range (from sysfs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumaConfig {
    /// Byte offset of the task's CPU (`u32`) in `task_struct`: `thread_info.cpu` (5.16+, with
    /// `CONFIG_THREAD_INFO_IN_TASK`) or `cpu` (older kernels).
    pub task_cpu: u32,
    /// Byte offset of `pfn` (`unsigned long`) in the `mm_page_alloc` record.
    pub alloc_pfn: u32,
    /// Byte offset of `order` (`unsigned int`) in the `mm_page_alloc` record.
    pub alloc_order: u32,
    /// Valid entries of [`Self::ranges`], sorted by `start`, not overlapping.
    pub nr_ranges: u32,
    /// 1 when filled in; 0 means "not configured" and the programs count nothing.
    pub configured: u32,
    /// Padding, always 0.
    pub pad: u32,
    /// CPU number -> node, [`NO_NODE`] for CPUs that do not exist.
    pub cpu_node: [u32; MAX_CPUS as usize],
    /// Page-frame ranges -> node.
    pub ranges: [PfnRange; MAX_PFN_RANGES as usize],
}

impl NumaConfig {
    /// Nothing configured: the initial value of the kernel object's global.
    pub const EMPTY: Self = Self {
        task_cpu: 0,
        alloc_pfn: 0,
        alloc_order: 0,
        nr_ranges: 0,
        configured: 0,
        pad: 0,
        cpu_node: [NO_NODE; MAX_CPUS as usize],
        ranges: [PfnRange {
            start: 0,
            end: 0,
            node: 0,
            pad: 0,
        }; MAX_PFN_RANGES as usize],
    };
}

// The kernel and user space must agree on the layout byte for byte: no implicit padding.
const _: () =
    assert!(size_of::<NumaConfig>() == 24 + 4 * MAX_CPUS as usize + 24 * MAX_PFN_RANGES as usize);
const _: () = assert!(MAX_CPUS.is_power_of_two() && MAX_PFN_RANGES.is_power_of_two());

/// Per-cgroup counters of one NUMA probe: events on the local node and on another node
/// (for task migrations: within a node and across nodes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalityCounts {
    pub local: u64,
    pub remote: u64,
}

/// Per-CPU health counters of the NUMA probes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NumaStats {
    /// task_numa_fault calls handled.
    pub hint_faults: u64,
    /// Hinting faults not recorded (map full, cgroup or node unreadable).
    pub hint_dropped: u64,
    /// mm_page_alloc events handled.
    pub page_allocs: u64,
    /// Allocations not recorded (map full, cgroup unreadable, page frame in no known range).
    pub alloc_dropped: u64,
    /// sched_migrate_task events handled (including the kernel's no-op "migrations" to the
    /// same CPU, which are not counted as migrations).
    pub migrations: u64,
    /// Migrations not recorded (map full, cgroup or CPU unreadable).
    pub migration_dropped: u64,
}

/// Names of the maps and globals in the kernel object, shared so both sides agree.
pub mod names {
    /// Global holding [`super::KernelOffsets`].
    pub const OFFSETS_GLOBAL: &str = "QOSD_OFFSETS";
    /// Per-CPU hash map: cgroup id (u64) -> nanoseconds on CPU (u64).
    pub const CPU_TIME_MAP: &str = "CGROUP_CPU_NS";
    /// Per-CPU array with one [`super::RunningTask`].
    pub const RUNNING_MAP: &str = "RUNNING";
    /// Hash: cgroup id (u64) -> counter slot (u32), written by user space.
    pub const SLOT_MAP: &str = "CGROUP_SLOT";
    /// Per-CPU array of [`super::SlotCacheEntry`]: each CPU's recent slot lookups.
    pub const SLOT_CACHE_MAP: &str = "SLOT_CACHE";
    /// Per-CPU array: slot -> nanoseconds on CPU (u64).
    pub const CPU_TIME_SLOTS_MAP: &str = "CPU_NS_BY_SLOT";
    /// Per-CPU array with one [`super::ProbeStats`].
    pub const STATS_MAP: &str = "CPU_TIME_STATS";
    /// Per-CPU array: [`super::DiagKind`] -> when this CPU last logged it (ns).
    pub const DIAG_LAST_MAP: &str = "DIAG_LAST_NS";
    /// aya-log's ring buffer of the kernel programs' diagnostics.
    pub const LOG_MAP: &str = "AYA_LOGS";
    /// The sched_switch program (cpu time, run-queue waits and preemptions), BTF-typed raw
    /// tracepoint flavour. (Both names fit the kernel's 15 characters, so `bpftool prog`
    /// and the program's `fdinfo` show them whole.)
    pub const SWITCH_TP_BTF: &str = "qosd_switch_btf";
    /// The same program, raw tracepoint flavour.
    pub const SWITCH_RAW_TP: &str = "qosd_switch_raw";
    /// Global holding [`super::SchedOffsets`].
    pub const SCHED_OFFSETS_GLOBAL: &str = "QOSD_SCHED_OFFSETS";
    /// Array: pid's low bits -> [`super::TaskWait`].
    pub const TASK_WAITS_MAP: &str = "TASK_WAITS";
    /// Per-CPU array: slot -> [`super::RunqSlot`].
    pub const RUNQ_SLOTS_MAP: &str = "RUNQ_BY_SLOT";
    /// Per-CPU hash: [`super::HistKey`] -> count (or sum in ns).
    pub const RUNQ_HIST_MAP: &str = "RUNQ_HIST";
    /// Per-CPU hash: [`super::PreemptKey`] -> [`super::PreemptValue`].
    pub const PREEMPT_MAP: &str = "RUNQ_PREEMPT";
    /// Per-CPU array with one [`super::RunqStats`].
    pub const RUNQ_STATS_MAP: &str = "RUNQ_STATS";
    /// Hash: `struct cfs_rq *` (u64) -> throttle start (ns).
    pub const THROTTLED_MAP: &str = "THROTTLED_CFS_RQ";
    /// Per-CPU hash: [`super::HistKey`] -> throttle episode count (or sum in ns).
    pub const THROTTLE_HIST_MAP: &str = "THROTTLE_HIST";
    /// fexit on throttle_cfs_rq, fentry on unthrottle_cfs_rq.
    pub const THROTTLE_FEXIT: &str = "throttle_cfs_rq_fexit";
    pub const UNTHROTTLE_FENTRY: &str = "unthrottle_cfs_rq_fentry";
    /// Global holding [`super::NumaConfig`].
    pub const NUMA_CONFIG_GLOBAL: &str = "QOSD_NUMA";
    /// Per-CPU hashes: cgroup id (u64) -> [`super::LocalityCounts`].
    pub const NUMA_HINT_FAULTS_MAP: &str = "NUMA_HINT_FAULTS";
    pub const NUMA_PAGE_ALLOCS_MAP: &str = "NUMA_PAGE_ALLOCS";
    pub const NUMA_MIGRATIONS_MAP: &str = "NUMA_MIGRATIONS";
    /// Per-CPU array with one [`super::NumaStats`].
    pub const NUMA_STATS_MAP: &str = "NUMA_STATS";
    /// fentry on task_numa_fault.
    pub const NUMA_HINT_FENTRY: &str = "numa_hint_fault_fentry";
    /// Classic tracepoint kmem:mm_page_alloc.
    pub const NUMA_PAGE_ALLOC_TP: &str = "numa_page_alloc_tp";
    /// sched_migrate_task, tp_btf and raw tracepoint flavours.
    pub const NUMA_MIGRATE_TP_BTF: &str = "numa_migrate_tp_btf";
    pub const NUMA_MIGRATE_RAW_TP: &str = "numa_migrate_raw_tp";
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all three are #[repr(C)] structs of plain integers with no padding; every bit
    // pattern is a valid value.
    unsafe impl aya::Pod for super::KernelOffsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RunningTask {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProbeStats {}
    // SAFETY: as above (the explicit `pad` leaves no implicit padding).
    unsafe impl aya::Pod for super::SlotCacheEntry {}
    // SAFETY: as above (HistKey's explicit `pad` leaves no implicit padding).
    unsafe impl aya::Pod for super::SchedOffsets {}
    // SAFETY: as above (the explicit `pad` leaves no implicit padding).
    unsafe impl aya::Pod for super::TaskWait {}
    // SAFETY: u64 fields only.
    unsafe impl aya::Pod for super::PreemptCell {}
    // SAFETY: u64 fields and arrays of u64-only structs, no padding.
    unsafe impl aya::Pod for super::RunqSlot {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::HistKey {}
    // SAFETY: two u64 fields, no padding.
    unsafe impl aya::Pod for super::HistBucket {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PreemptKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PreemptValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RunqStats {}
    // SAFETY: as above (PfnRange's explicit `pad` leaves no implicit padding).
    unsafe impl aya::Pod for super::PfnRange {}
    // SAFETY: as above: six u32 (24 bytes, so the u64-aligned ranges start without a gap),
    // a u32 array and an array of PfnRange.
    unsafe impl aya::Pod for super::NumaConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::LocalityCounts {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NumaStats {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_leading_zeros(v: u64) -> u32 {
        (64 - v.leading_zeros()).min(HIST_MAX_BUCKET)
    }

    #[test]
    fn log2_bucket_agrees_with_leading_zeros() {
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1] {
                assert_eq!(log2_bucket(v), by_leading_zeros(v), "v = {v}");
            }
        }
        // xorshift64: a spread of magnitudes.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = x >> (x % 64);
            assert_eq!(log2_bucket(v), by_leading_zeros(v), "v = {v}");
        }
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(u64::MAX), HIST_MAX_BUCKET);
    }

    #[test]
    fn task_wait_index_is_a_bijection_on_the_array() {
        let mut seen = [false; MAX_TASK_WAITS as usize];
        for pid in 0..MAX_TASK_WAITS {
            let i = task_wait_index(pid) as usize;
            assert!(!seen[i], "pids below the size collide at {i}");
            seen[i] = true;
        }
        // Neighbouring pids land far apart (not on neighbouring entries).
        let gap = task_wait_index(1001).abs_diff(task_wait_index(1000));
        assert!(gap > 64, "gap {gap}");
    }
}
