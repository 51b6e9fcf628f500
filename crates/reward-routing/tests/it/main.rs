//! Integration tests of `reward-routing` through its public API: the reference's acceptance cases as a rollout
//! workflow would drive them, group post-processing end to end, and the shared audit writer under concurrency
//! and against symlinks.

mod audit_writer;
mod pipeline;
mod reference;
mod support;
