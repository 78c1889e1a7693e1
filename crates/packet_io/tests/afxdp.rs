//! AF_XDP ports on a veth pair in a network namespace of the test's own,
//! with an AF_PACKET port at the other end.

mod common;

use common::{assert_same_frames, marked_frames, receive_marked, send_all, veth_pair, Rng};
use flick_packet_io::{open, AfPacket, AfXdp, AfXdpConfig, Port, PortError, TxPort};

#[test]
fn frames_cross_an_afxdp_port_exactly_both_ways() {
    let Some(ns) = veth_pair("frames_cross_an_afxdp_port_exactly_both_ways") else {
        return;
    };
    // Few send frames, so sending 300 reuses each several times.
    let config = AfXdpConfig {
        tx_frames: 32,
        tx_batch: 8,
        ..AfXdpConfig::default()
    };
    let (xdp, packet) = ns.enter(|| {
        (
            AfXdp::open_with("veth-b", &config).unwrap(),
            AfPacket::open("veth-a").unwrap(),
        )
    });
    assert!(
        ns.has_xdp_program("veth-b"),
        "the port attached its program"
    );
    let (mut xdp_rx, mut xdp_tx) = xdp.split();
    let (mut packet_rx, mut packet_tx) = packet.split();

    let mut rng = Rng(7);
    let sent = marked_frames(&mut rng, 150, 0);
    send_all(&mut packet_tx, &sent);
    assert_same_frames(&receive_marked(&mut xdp_rx, sent.len()), &sent, "in");
    let rx_stats = flick_packet_io::RxPort::stats(&xdp_rx);
    assert!(rx_stats.frames >= 150, "{rx_stats:?}");
    assert_eq!(rx_stats.errors, 0, "{rx_stats:?}");

    // Out through the UMEM's send frames, each used about ten times; sent
    // in bursts the peer's ring takes whole.
    let back = marked_frames(&mut rng, 300, 1000);
    let mut got = Vec::new();
    for burst in back.chunks(30) {
        send_all(&mut xdp_tx, burst);
        got.extend(receive_marked(&mut packet_rx, burst.len()));
    }
    assert_same_frames(&got, &back, "out");
    let tx_stats = xdp_tx.stats();
    assert_eq!(tx_stats.frames, 300);
    assert_eq!(
        tx_stats.bytes,
        back.iter().map(|f| f.len() as u64).sum::<u64>()
    );
    assert_eq!((tx_stats.errors, tx_stats.drops), (0, 0));

    // A frame longer than a UMEM frame, or shorter than an Ethernet
    // header, is refused and counted.
    for len in [10, 2049] {
        let error = xdp_tx.send(&vec![0u8; len], 0).unwrap_err();
        assert!(
            matches!(error, PortError::FrameSize { .. }) && error.is_frame_error(),
            "{error}"
        );
    }
    assert_eq!(xdp_tx.stats().errors, 2);
}

#[test]
fn the_xdp_program_lives_as_long_as_the_port() {
    let Some(ns) = veth_pair("the_xdp_program_lives_as_long_as_the_port") else {
        return;
    };
    let spec = "afxdp:veth-b".parse().unwrap();
    let first = ns.enter(|| open(&spec).unwrap());
    assert!(ns.has_xdp_program("veth-b"));
    // The queue is taken: a second port on it fails, saying why.
    let error = ns
        .enter(|| open(&spec).err())
        .expect("a second port on the same queue fails");
    let text = error.to_string();
    assert!(text.contains("AF_XDP port on `veth-b`"), "{text}");
    // One side dropped keeps the program; both dropped take it away.
    let Port { rx, tx } = first;
    drop(rx);
    assert!(ns.has_xdp_program("veth-b"));
    drop(tx);
    assert!(
        !ns.has_xdp_program("veth-b"),
        "the program outlived its port"
    );
    // And the queue can be opened again.
    let again = ns.enter(|| open(&spec));
    assert!(again.is_ok(), "{:?}", again.err());
    // An interface that does not exist is named in the error.
    let error = ns
        .enter(|| AfXdp::open("nosuch0").err())
        .expect("no such interface");
    assert!(error.to_string().contains("nosuch0"), "{error}");
}
