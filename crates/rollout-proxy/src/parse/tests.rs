//! Tests of `parse`.
