//! The machine's topology: packages, NUMA nodes and their distances, cores, SMT threads, L3
//! caches and memory per node, read from hwloc for the real host or built synthetically for
//! tests ([`MachineTopology`] either way), plus the [`bitmask::NumaMask`] node set.
pub mod bitmask;
