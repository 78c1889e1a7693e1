//! Reading a capture through `recv_batch` allocates nothing per frame, nor
//! do live ports (AF_PACKET, AF_XDP) sending and receiving.

mod common;

use std::borrow::Cow;
use std::fs::File;
use std::time::{Duration, Instant};

use common::{
    frames, is_marked, marked_frames, veth_pair, wait_readable, Rng, TempFile, TEST_DEADLINE,
};
use flick_packet_io::{write_pcap, AfPacket, AfXdp, PcapRx, RecvStatus, RxPort, TxPort};
use flick_testkit::alloc::CountingAlloc;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Reads `rx` to its end in batches of 32, counting frames and allocations.
fn read_counting(rx: &mut PcapRx) -> (usize, u64) {
    let mut frames = 0usize;
    let mut sum = 0u64;
    let counted_from = ALLOC.this_thread();
    loop {
        let status = rx
            .recv_batch(32, &mut |frame, ts| {
                frames += 1;
                sum = sum.wrapping_add(frame.len() as u64 ^ ts);
            })
            .unwrap();
        if status == RecvStatus::End {
            break;
        }
    }
    let allocations = ALLOC.this_thread() - counted_from;
    assert_ne!(sum, 0);
    (frames, allocations)
}

#[test]
fn reading_a_thousand_frames_allocates_a_constant() {
    // The counter sees allocations at all.
    let counted_from = ALLOC.this_thread();
    let probe = std::hint::black_box(vec![1u8; 10]);
    assert!(ALLOC.this_thread() - counted_from >= 1);
    drop(probe);

    let sent = frames(42, 1000);

    let pcap = TempFile::new("pcap");
    write_pcap(pcap.path(), &sent).unwrap();
    let mut rx = PcapRx::open(pcap.path()).unwrap();
    let (count, allocations) = read_counting(&mut rx);
    assert_eq!(count, 1000);
    eprintln!("pcap: {allocations} allocations for 1000 frames");
    assert!(
        allocations <= 2,
        "pcap: {allocations} allocations for 1000 frames"
    );

    // pcapng, every frame carrying an option, and an interface block
    // midway (its options are read once, not per frame).
    let pcapng = TempFile::new("pcapng");
    let mut writer = PcapNgWriter::new(File::create(pcapng.path()).unwrap()).unwrap();
    writer
        .write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 65535,
            options: vec![InterfaceDescriptionOption::IfTsResol(9)],
        })
        .unwrap();
    for (i, (frame, ts)) in sent.iter().enumerate() {
        if i == 500 {
            writer
                .write_pcapng_block(InterfaceDescriptionBlock {
                    linktype: DataLink::ETHERNET,
                    snaplen: 65535,
                    options: vec![],
                })
                .unwrap();
        }
        writer
            .write_pcapng_block(EnhancedPacketBlock {
                interface_id: u32::from(i >= 500),
                timestamp: Duration::from_nanos(*ts),
                original_len: frame.len() as u32,
                data: Cow::Borrowed(frame),
                options: vec![EnhancedPacketOption::Flags(1)],
            })
            .unwrap();
    }
    drop(writer);
    let mut rx = PcapRx::open(pcapng.path()).unwrap();
    let (count, allocations) = read_counting(&mut rx);
    assert_eq!(count, 1000);
    // Two interface blocks, each copied into the reader's list and our
    // table: a handful, whatever the number of frames.
    eprintln!("pcapng: {allocations} allocations for 1000 frames");
    assert!(
        allocations <= 12,
        "pcapng: {allocations} allocations for 1000 frames"
    );
}

/// Runs `f` counting this thread's allocations.
fn counting<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let counted_from = ALLOC.this_thread();
    let value = f();
    (value, ALLOC.this_thread() - counted_from)
}

/// Sends 300 frames through `tx` and receives them from `rx`, asserting
/// that neither side allocated.
fn live_frames_allocate_nothing(label: &str, tx: &mut dyn TxPort, rx: &mut dyn RxPort) {
    let sent = marked_frames(&mut Rng(17), 300, 0);

    let ((), allocations) = counting(|| {
        for frame in &sent {
            tx.send(frame, 0).unwrap();
        }
        tx.flush().unwrap();
    });
    eprintln!("{label} send: {allocations} allocations for 300 frames");
    assert_eq!(allocations, 0, "{label}: sending allocated");

    let deadline = Instant::now() + TEST_DEADLINE;
    let fd = rx.raw_fd().unwrap();
    let (received, allocations) = counting(|| {
        let mut received = 0usize;
        while received < sent.len() && Instant::now() < deadline {
            rx.recv_batch(32, &mut |frame, _| {
                received += usize::from(is_marked(frame));
            })
            .unwrap();
            wait_readable(fd, deadline.min(Instant::now() + Duration::from_millis(20)));
        }
        received
    });
    eprintln!("{label} receive: {allocations} allocations for {received} frames");
    assert_eq!(received, sent.len(), "{label}");
    assert_eq!(allocations, 0, "{label}: receiving allocated");
}

#[test]
fn sending_and_receiving_live_frames_allocates_nothing() {
    let Some(ns) = veth_pair("sending_and_receiving_live_frames_allocates_nothing") else {
        return;
    };
    let (a, b) = ns.enter(|| {
        (
            AfPacket::open("veth-a").unwrap(),
            AfPacket::open("veth-b").unwrap(),
        )
    });
    let (mut a_rx, mut a_tx) = a.split();
    let (mut b_rx, _b_tx) = b.split();
    live_frames_allocate_nothing("AF_PACKET to AF_PACKET", &mut a_tx, &mut b_rx);
    drop(b_rx);

    // AF_XDP both ways, with an AF_PACKET port at the other end.
    let xdp = ns.enter(|| AfXdp::open("veth-b").unwrap());
    let (mut xdp_rx, mut xdp_tx) = xdp.split();
    live_frames_allocate_nothing("AF_PACKET to AF_XDP", &mut a_tx, &mut xdp_rx);
    live_frames_allocate_nothing("AF_XDP to AF_PACKET", &mut xdp_tx, &mut a_rx);
}
