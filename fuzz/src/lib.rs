//! The fuzz harnesses: one function per parser of outside input, fed raw bytes by a libFuzzer
//! target (`fuzz_targets/<name>.rs`, run by `cargo xtask fuzz`) and, in `cargo test`, by every
//! seed (`corpus/<name>/`) and every input a fuzzer once crashed on (`regressions/<name>/`).
//!
//! A harness fails (panics) when the parser panics, and when a property that must hold for
//! every input does not: what parses prints back to the same value, a checkpoint qosd decodes
//! encodes and decodes to the same state, an error names its input. Time and memory are
//! bounded by libFuzzer (`-timeout`, `-malloc_limit_mb`), set by `cargo xtask fuzz`.
use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};
use qosd::cgroup::stats;
use qosd::cgroup::{CgroupLayout, CpuSet};
use qosd::cm::checkpoint::Restored;
use qosd::cm::cpu::Cpus;
use qosd::config::kubelet::{parse_go_duration, parse_kubelet_config};
use qosd::numa::node_layout::{LayoutPaths, NodeLayout};
use qosd::pods::kubernetes::decode::{decode_pod, decode_pod_list};
use qosd::pods::manifest::{ManifestFormat, parse_manifest};
use qosd::pods::quantity::Quantity;
use qosd::probes::btf::KernelBtf;

/// A harness: the bytes of one input.
pub type Harness = fn(&[u8]);

/// Every target by name: the fuzz binary, its seed corpus and its regressions share the name.
pub const TARGETS: &[(&str, Harness)] = &[
    ("quantity", quantity),
    ("manifest", manifest),
    ("kubelet_config", kubelet_config),
    ("checkpoint", checkpoint),
    ("kubernetes_pod", kubernetes_pod),
    ("cgroup_stat", cgroup_stat),
    ("cpu_list", cpu_list),
    ("mountinfo", mountinfo),
    ("sysfs_numa", sysfs_numa),
    ("btf", btf),
];

/// Resource quantities (`resource.ParseQuantity`): what parses prints (in Kubernetes' canonical
/// form) as text that parses to the same value and prints the same again; `Value()` and
/// `MilliValue()` round up consistently; errors quote the text.
pub fn quantity(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Quantity::parse(text) {
        Ok(q) => {
            let printed = q.to_string();
            let again = Quantity::parse(&printed).unwrap_or_else(|e| {
                panic!("{text:?} prints as {printed:?}, which does not parse: {e}")
            });
            assert_eq!(again, q, "{text:?} prints as {printed:?}, another value");
            // The canonical form is a fixed point, as Kubernetes' String() is: parsing what it
            // printed and printing again gives the same text.
            assert_eq!(
                again.to_string(),
                printed,
                "{text:?} prints as {printed:?}, which prints as another text"
            );
            // Both round up: MilliValue() is within (Value() - 1) * 1000 exclusive and
            // Value() * 1000 inclusive, unless one of them saturated at the i64 range.
            let (value, milli) = (i128::from(q.value()), i128::from(q.milli_value()));
            let saturated = [i64::MAX, i64::MIN].map(i128::from);
            if !saturated.contains(&value) && !saturated.contains(&milli) {
                assert!(
                    value * 1000 >= milli,
                    "{text:?}: Value() {value} is below MilliValue() {milli} / 1000"
                );
                assert!(
                    milli > (value - 1) * 1000,
                    "{text:?}: Value() {value} is more than MilliValue() {milli} rounded up"
                );
            }
        }
        Err(e) => assert!(
            e.to_string().contains(&format!("{text:?}")),
            "the error {e} does not quote {text:?}"
        ),
    }
}

/// Pod manifests, YAML (several documents) and JSON: every result is a pod with a name,
/// namespace and uid, or an error naming its document.
pub fn manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for format in [ManifestFormat::Yaml, ManifestFormat::Json] {
        for result in parse_manifest(text, format) {
            match result {
                Ok(parsed) => {
                    let meta = &parsed.pod.metadata;
                    assert!(
                        parsed.document >= 1
                            && !meta.name.is_empty()
                            && !meta.namespace.is_empty()
                            && !meta.uid.is_empty(),
                        "{format:?}: a pod without a name, namespace or uid passed: {meta:?}"
                    );
                }
                Err(e) => {
                    let message = e.to_string();
                    assert!(
                        e.document() >= 1
                            && message.starts_with(&format!("document {}", e.document())),
                        "{format:?}: an error that does not name its document: {message}"
                    );
                }
            }
        }
    }
}

/// KubeletConfiguration (YAML or JSON) and the Go durations in it: errors name the file.
pub fn kubelet_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/fuzz/kubelet-config.yaml");
    if let Err(e) = parse_kubelet_config(text, path) {
        let message = e.to_string();
        assert!(
            message.contains("/fuzz/kubelet-config.yaml"),
            "an error that does not name the file: {message}"
        );
    }
    let _ = parse_go_duration(text);
}

/// kubelet's CPU and memory manager checkpoints (the first byte picks which, bit 0, and the
/// configured policy, the bits above):
/// a checkpoint qosd accepts is written back by qosd and read again as the same state.
pub fn checkpoint(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    if selector & 1 == 0 {
        use qosd::cm::cpu::state::{decode, encode};
        let policy = if selector & 2 == 0 { "static" } else { "none" };
        round_trip("CPU", bytes, policy, decode, encode);
    } else {
        use qosd::cm::memory::state::{decode, encode};
        // qosd writes "Static"; kubelet's own test vectors say "static".
        let policy = ["Static", "None", "static"][usize::from(selector >> 1) % 3];
        round_trip("memory", bytes, policy, decode, encode);
    }
}

/// A checkpoint `decode` accepts is encoded and decoded again to the same state.
fn round_trip<S: PartialEq + std::fmt::Debug>(
    manager: &str,
    bytes: &[u8],
    policy: &str,
    decode: fn(&[u8], &str) -> Restored<S>,
    encode: fn(&str, &S) -> Result<Vec<u8>, serde_json::Error>,
) {
    if let Restored::State(state) = decode(bytes, policy) {
        let written = encode(policy, &state)
            .unwrap_or_else(|e| panic!("{manager} state {state:?} does not encode: {e}"));
        match decode(&written, policy) {
            Restored::State(again) => assert_eq!(again, state, "{manager} state changed"),
            Restored::Rebuild { detail, .. } => {
                panic!("qosd's own {manager} checkpoint is refused: {detail}")
            }
        }
    }
}

/// Pod objects and PodLists from the API server or kubelet (JSON): a decoded pod has a name,
/// namespace and uid.
pub fn kubernetes_pod(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(pod) = decode_pod(value.clone(), "fuzz") {
        assert!(
            !pod.metadata.name.is_empty() && !pod.metadata.uid.is_empty(),
            "a pod without a name or uid decoded: {:?}",
            pod.metadata
        );
    }
    if let Ok(pods) = decode_pod_list(value) {
        for pod in pods.into_iter().flatten() {
            assert!(!pod.metadata.name.is_empty(), "a nameless pod in a list");
        }
    }
}

/// The cgroup files qosd reads (the first byte picks which): flat keyed files (`cpu.stat`,
/// `memory.stat`), single values, v1 `cpu.stat` with `cpuacct.usage` (split at the first NUL),
/// v2 `cpu.stat`, `memory.numa_stat`.
pub fn cgroup_stat(data: &[u8]) {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match selector % 5 {
        0 => {
            let _ = stats::parse_flat_keyed(text);
        }
        1 => {
            let _ = stats::parse_single_u64(text);
        }
        2 => {
            let (stat, usage) = text.split_once('\0').unwrap_or((text, ""));
            let _ = stats::parse_cpu_stat_v1(stat, (!usage.is_empty()).then_some(usage));
        }
        3 => {
            let _ = stats::parse_cpu_stat_v2(text);
        }
        _ => {
            let _ = stats::parse_numa_stat(text);
        }
    }
}

/// CPU and node lists (`0-3,7`) of cpuset files and sysfs: what parses prints back to the
/// same set, in both of qosd's set types.
pub fn cpu_list(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    prints_back(text, CpuSet::parse);
    prints_back(text, Cpus::parse);
}

/// What `parse` accepts in `text` prints as text that `parse` reads as the same value.
fn prints_back<T: std::fmt::Display + PartialEq + std::fmt::Debug, E>(
    text: &str,
    parse: fn(&str) -> Result<T, E>,
) {
    if let Ok(value) = parse(text) {
        let printed = value.to_string();
        assert_eq!(
            parse(&printed).ok(),
            Some(value),
            "{text:?} prints as {printed:?}"
        );
    }
}

/// `/proc/self/mountinfo`, where qosd finds the cgroup hierarchies.
pub fn mountinfo(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = CgroupLayout::parse_mountinfo(text);
    }
}

/// One NUMA node's sysfs directory as the fuzzer makes it.
#[derive(Arbitrary, Debug)]
struct NodeDir {
    id: u8,
    cpulist: String,
    memory_blocks: Vec<u16>,
}

/// A sysfs and procfs tree of NUMA nodes, memory blocks and zone spans.
#[derive(Arbitrary, Debug)]
struct SysfsTree {
    numa_support: bool,
    nodes: Vec<NodeDir>,
    block_size_bytes: Option<String>,
    cpu_possible: String,
    zoneinfo: String,
    page_size_shift: u8,
}

/// The kernel's NUMA layout from sysfs and `/proc/zoneinfo`, in a tree made from the input:
/// a layout that reads maps every one of its CPUs and page ranges to a node.
pub fn sysfs_numa(data: &[u8]) {
    let Ok(tree) = SysfsTree::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let Ok(root) = tempfile::tempdir() else {
        return;
    };
    let paths = LayoutPaths::under(root.path());
    if !write_tree(&tree, &paths) {
        return;
    }
    let page_size = 1u64 << (tree.page_size_shift % 24);
    if let Ok(layout) = NodeLayout::read(&paths, page_size) {
        for cpu in layout.cpus().iter() {
            assert!(layout.node_of_cpu(cpu).is_some(), "CPU {cpu} has no node");
        }
        for range in layout.ranges() {
            assert!(
                range.start < range.end && layout.node_of_pfn(range.start) == Some(range.node),
                "the range {range:?} does not map to its node"
            );
        }
    }
}

/// Writes `tree` under `paths`; false when the file system refuses (not the parser's fault).
fn write_tree(tree: &SysfsTree, paths: &LayoutPaths) -> bool {
    let write = |path: &Path, text: &str| {
        path.parent()
            .is_some_and(|dir| std::fs::create_dir_all(dir).is_ok())
            && std::fs::write(path, text).is_ok()
    };
    let mut ok =
        write(&paths.cpu_possible, &tree.cpu_possible) && write(&paths.zoneinfo, &tree.zoneinfo);
    if tree.numa_support {
        ok &= std::fs::create_dir_all(&paths.node_dir).is_ok();
        for node in tree.nodes.iter().take(8) {
            let dir = paths.node_dir.join(format!("node{}", node.id));
            ok &= write(&dir.join("cpulist"), &node.cpulist);
            for block in node.memory_blocks.iter().take(32) {
                ok &= std::fs::create_dir_all(dir.join(format!("memory{block}"))).is_ok();
            }
        }
    }
    if let Some(size) = &tree.block_size_bytes {
        ok &= write(&paths.memory_dir.join("block_size_bytes"), size);
    }
    ok
}

/// The kernel's BTF, where qosd reads the offsets its programs walk: any blob either gives
/// offsets or an error.
pub fn btf(data: &[u8]) {
    let Ok(btf) = KernelBtf::from_bytes(data, Path::new("/fuzz/vmlinux")) else {
        return;
    };
    let _ = btf.kernel_offsets(true);
    let _ = btf.kernel_offsets(false);
    let _ = btf.task_cpu_offset();
    let _ = btf.member_offset("task_struct", "__state");
    let _ = btf.nested_offset("task_struct", "sched_info", "sched_info", "run_delay");
    let _ = btf.member_offset("cfs_rq", "tg");
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::TARGETS;

    /// The inputs of `dir/<target>/`, by target; a target without a directory has none.
    fn inputs(dir: &str) -> Vec<(&'static str, super::Harness, PathBuf)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut out = Vec::new();
        for (name, harness) in TARGETS {
            let Ok(entries) = std::fs::read_dir(root.join(name)) else {
                continue;
            };
            for entry in entries.flatten() {
                out.push((*name, *harness, entry.path()));
            }
        }
        out
    }

    /// Every seed: a real file of the kind the target parses (see `corpus/README.md`).
    #[test]
    fn every_seed_passes_its_harness() {
        let seeds = inputs("corpus");
        for (name, _) in TARGETS {
            assert!(
                seeds.iter().any(|(target, _, _)| target == name),
                "target {name} has no seed in corpus/{name}/"
            );
        }
        for (name, harness, path) in seeds {
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            eprintln!("{name}: {}", path.display());
            harness(&bytes);
        }
    }

    /// The generated BTF seed (`tools/make-btf-seed.py`) answers every lookup qosd makes, so
    /// the fuzzer starts from a blob that reaches the offset code, not only the header checks.
    #[test]
    fn the_btf_seed_has_every_offset_qosd_reads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/btf/kernel-structs.btf");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let btf = qosd::probes::btf::KernelBtf::from_bytes(&bytes, &path)
            .unwrap_or_else(|e| panic!("{e}"));
        for v1 in [true, false] {
            btf.kernel_offsets(v1)
                .unwrap_or_else(|e| panic!("v1 {v1}: {e}"));
        }
        assert_eq!(btf.task_cpu_offset().ok(), Some(16), "thread_info.cpu");
    }

    /// Every input a fuzzer crashed on once, kept after the fix (see `regressions/README.md`).
    #[test]
    fn every_regression_passes_its_harness() {
        for (name, harness, path) in inputs("regressions") {
            if path.extension().is_some_and(|e| e == "md") {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            eprintln!("{name}: {}", path.display());
            harness(&bytes);
        }
    }
}
