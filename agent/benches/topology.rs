//! Topology manager benchmarks (filled in below).
fn main() {}
