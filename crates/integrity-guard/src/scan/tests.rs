//! The scanner.
