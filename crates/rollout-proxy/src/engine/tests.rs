//! Tests of `engine`.
