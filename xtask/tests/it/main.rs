//! Integration tests of the `xtask` binary: `cargo xtask submit` from the command line, and on a real one-node
//! Slurm cluster started on this machine.

mod cli;
mod cluster;
mod netns;
mod sglang;
mod slurm;
