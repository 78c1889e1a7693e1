//! Packet programs served: frames read from packet ports, parsed with the
//! stock `packet` grammar, steered to workers by the program's flow key and
//! run through its rules, then written to the ports its sends name.
//!
//! This crate must not read or write ports itself (that is
//! `flick-packet-io`) nor hold language rules (that is `flick-check`).
