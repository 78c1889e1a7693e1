//! Plain Rust models of the FlowBlaze use cases (`examples/flowblaze/`),
//! for their property tests.
