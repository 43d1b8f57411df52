//! Configuration qosd reads: the kubelet's own `KubeletConfiguration` file, so a node configured
//! for kubelet is configured for qosd.
//!
//! - [`kubelet`]: loading, defaulting and validating `kubelet.config.k8s.io/v1beta1`
//!   `KubeletConfiguration`, reporting the fields qosd does not act on.
//! - [`eviction`]: hard eviction thresholds (`evictionHard`), which feed node allocatable.
pub mod eviction;
pub mod kubelet;

pub use kubelet::{ConfigError, KubeletConfiguration, LoadedKubeletConfig, load_kubelet_config};
