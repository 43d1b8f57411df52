//! Pod admission against node allocatable (placeholder until written).
