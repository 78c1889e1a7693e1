//! Plain Rust models of the metering and Bloom filter packet examples,
//! for their property tests.
