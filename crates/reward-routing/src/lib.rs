//! What a finished Arena task means for training.
//!
//! This crate will turn task outcomes into rewards, zero rewards or rejections, compute group advantages and
//! metrics, and write audit shards.
//! It is pure: no async runtime and no network.
