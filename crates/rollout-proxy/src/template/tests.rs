//! Tests of `template`.
