//! Fake libnvidia-ml (work in progress).
