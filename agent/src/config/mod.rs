//! Agent configuration and the KubeletConfiguration fields qosd honours.
