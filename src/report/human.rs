//! Human summary.
