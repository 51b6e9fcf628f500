//! Integration tests of the `xtask` binary: `cargo xtask submit` from the command line, on a real one-node
//! Slurm cluster started on this machine, and on a multi-node cluster of network namespaces.

mod cli;
mod cluster;
mod multinode;
mod netns;
mod nodes;
mod sglang;
mod slurm;
