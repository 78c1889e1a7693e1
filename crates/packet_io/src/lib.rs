//! Packet ports: where a packet program's frames come from and go to
//! (pcap and pcapng files, live interfaces through AF_PACKET, TUN devices).
//!
//! This crate moves whole frames as bytes. It must not parse anything
//! above the link framing of its ports, know what a program does with a
//! frame, or own threads or the scheduler.
