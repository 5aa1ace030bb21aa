//! Spindle's graph runtime.
