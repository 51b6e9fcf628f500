//! Tests of `auth`.
