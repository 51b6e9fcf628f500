//! Tests of `trajectory`.
