//! Code scanning.
