//! Integration tests of `arena-sim`: YAML worlds and the binary over a real socket.
//!
//! The client side of the contract is tested at length in `arena-client`'s tests, which run against this sim.

mod binary;
mod world;
