//! Random frames through a pcap file and back.

mod common;

use common::TempFile;
use flick_packet_io::{open, read_pcap, write_pcap, PortSpec, RecvStatus};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_frames_round_trip(
        frames in prop::collection::vec(
            (prop::collection::vec(any::<u8>(), 0..2000), 0u64..(u32::MAX as u64 * 1_000_000_000)),
            0..40,
        ),
        batch in 1usize..16,
    ) {
        let file = TempFile::new("pcap");
        write_pcap(file.path(), &frames).unwrap();
        prop_assert_eq!(&read_pcap(file.path()).unwrap(), &frames);

        let mut rx = open(&PortSpec::PcapIn(file.path().to_path_buf())).unwrap().rx.unwrap();
        let mut got = Vec::new();
        while rx.recv_batch(batch, &mut |f, ts| got.push((f.to_vec(), ts))).unwrap() != RecvStatus::End {}
        prop_assert_eq!(got, frames);
    }
}
