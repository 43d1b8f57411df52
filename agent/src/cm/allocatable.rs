//! Node allocatable (placeholder until written).
