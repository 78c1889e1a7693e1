//! AF_PACKET ports on a veth pair in a network namespace of the test's own.

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use common::{
    assert_same_frames, frame, is_marked, marked_frames, marked_now, receive_marked, send_all,
    veth_pair, wait_readable, Rng, MARKER, TEST_DEADLINE,
};
use flick_packet_io::{open, AfPacket, Port, PortSpec, RxPort, TxPort};

#[test]
fn frames_cross_a_veth_pair_exactly() {
    let Some(ns) = veth_pair("frames_cross_a_veth_pair_exactly") else {
        return;
    };
    let (a, b) = ns.enter(|| {
        (
            open(&"afpacket:veth-a".parse().unwrap()).unwrap(),
            open(&PortSpec::AfPacket("veth-b".into())).unwrap(),
        )
    });
    let (
        Port {
            rx: Some(mut a_rx),
            tx: Some(mut a_tx),
        },
        Port {
            rx: Some(mut b_rx),
            tx: Some(mut b_tx),
        },
    ) = (a, b)
    else {
        panic!("AF_PACKET ports have both sides");
    };

    let mut rng = Rng(99);
    let sent = marked_frames(&mut rng, 150, 0);
    // More than one send batch (64), flushed at the end.
    send_all(a_tx.as_mut(), &sent);
    assert_same_frames(&receive_marked(b_rx.as_mut(), sent.len()), &sent, "a to b");
    let tx_stats = a_tx.stats();
    assert_eq!(tx_stats.frames, 150);
    assert_eq!(
        tx_stats.bytes,
        sent.iter().map(|f| f.len() as u64).sum::<u64>()
    );
    assert_eq!((tx_stats.errors, tx_stats.drops), (0, 0));
    assert!(b_rx.stats().frames >= 150);

    // The other way, and a sender does not read its own frames.
    let back: Vec<Vec<u8>> = (0..5u32)
        .map(|seq| frame(&mut rng, 100, MARKER, 1000 + seq))
        .collect();
    for frame in &back {
        b_tx.send(frame, 0).unwrap();
    }
    b_tx.flush().unwrap();
    assert_eq!(receive_marked(a_rx.as_mut(), 5), back);
    assert_eq!(marked_now(b_rx.as_mut()), 0, "b read its own transmissions");

    // A frame shorter than an Ethernet header is refused and counted.
    let error = a_tx.send(&[0u8; 10], 0).unwrap_err();
    assert!(error.is_frame_error(), "{error}");
    assert_eq!(a_tx.stats().errors, 1);
}

#[test]
fn vlan_tags_the_kernel_strips_are_put_back() {
    let Some(ns) = veth_pair("vlan_tags_the_kernel_strips_are_put_back") else {
        return;
    };
    let (a, b) = ns.enter(|| {
        (
            AfPacket::open("veth-a").unwrap(),
            AfPacket::open("veth-b").unwrap(),
        )
    });
    let (_a_rx, mut a_tx) = a.split();
    let (mut b_rx, _b_tx) = b.split();
    // An 802.1Q frame, VLAN 42, priority 3, carrying the marker EtherType.
    let mut tagged = vec![0xff; 6];
    tagged.extend_from_slice(&[0x02, 0, 0, 0, 0x10, 0x01, 0x81, 0x00, 0x60, 0x2a]);
    tagged.extend_from_slice(&MARKER.to_be_bytes());
    tagged.extend((0..80u8).map(|i| i.wrapping_mul(7)));
    a_tx.send(&tagged, 0).unwrap();
    a_tx.flush().unwrap();

    let deadline = Instant::now() + TEST_DEADLINE;
    let mut got = None;
    while got.is_none() && Instant::now() < deadline {
        b_rx.recv_batch(16, &mut |frame, _| {
            if frame.len() >= 18 && frame[16..18] == MARKER.to_be_bytes() {
                got = Some(frame.to_vec());
            }
        })
        .unwrap();
        if got.is_none() {
            wait_readable(b_rx.raw_fd().unwrap(), deadline);
        }
    }
    assert_eq!(got.expect("the tagged frame arrives"), tagged);
}

#[test]
fn a_fanout_group_shares_the_frames_out() {
    let Some(ns) = veth_pair("a_fanout_group_shares_the_frames_out") else {
        return;
    };
    let group = (std::process::id() & 0xffff) as u16;
    let (a, members) = ns.enter(|| {
        (
            AfPacket::open("veth-a").unwrap(),
            [
                AfPacket::open_fanout("veth-b", group).unwrap(),
                AfPacket::open_fanout("veth-b", group).unwrap(),
            ],
        )
    });
    let (_a_rx, mut a_tx) = a.split();
    let [first, second] = members;
    let (mut first_rx, _first_tx) = first.split();
    let (mut second_rx, _second_tx) = second.split();
    let mut rng = Rng(5);
    // Frames of many "flows": the sequence number sits where the hash looks
    // for nothing useful, so vary the source MAC too.
    let sent: Vec<Vec<u8>> = (0..64u32)
        .map(|seq| {
            let mut f = frame(&mut rng, 80, MARKER, seq);
            f[11] = seq as u8;
            f
        })
        .collect();
    for frame in &sent {
        a_tx.send(frame, 0).unwrap();
    }
    a_tx.flush().unwrap();

    let deadline = Instant::now() + TEST_DEADLINE;
    let mut got = Vec::new();
    while got.len() < sent.len() && Instant::now() < deadline {
        for rx in [&mut first_rx, &mut second_rx] {
            rx.recv_batch(64, &mut |frame, _| {
                if is_marked(frame) {
                    got.push(frame.to_vec());
                }
            })
            .unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // Each frame went to exactly one member.
    assert_eq!(got.len(), sent.len());
    let got: BTreeSet<_> = got.into_iter().collect();
    let sent: BTreeSet<_> = sent.into_iter().collect();
    assert_eq!(got, sent);
}

#[test]
fn a_missing_interface_is_named() {
    let Some(ns) = veth_pair("a_missing_interface_is_named") else {
        return;
    };
    let error = ns.enter(|| open(&PortSpec::AfPacket("nosuch0".into())).err().unwrap());
    let message = error.to_string();
    assert!(message.contains("`nosuch0`"), "{message}");
    assert!(message.contains("No such device"), "{message}");
}
