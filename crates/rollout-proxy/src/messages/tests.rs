//! Tests of `messages`.
