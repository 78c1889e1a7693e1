//! AF_XDP ports on a veth pair in a network namespace of the test's own,
//! with an AF_PACKET port at the other end.

mod common;

use common::{frame, receive_marked, veth_pair, Rng, MARKER};
use flick_packet_io::{open, AfPacket, AfXdp, AfXdpConfig, Port, PortError, TxPort};

/// Whether `dev` in the namespace has an XDP program attached.
fn has_xdp_program(ns: &common::Netns, dev: &str) -> bool {
    let out: std::process::Output = ns
        .command("ip")
        .args(["-details", "link", "show", "dev", dev])
        .output()
        .expect("ip runs");
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

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
        has_xdp_program(&ns, "veth-b"),
        "the port attached its program"
    );
    let (mut xdp_rx, mut xdp_tx) = xdp.split();
    let (mut packet_rx, mut packet_tx) = packet.split();

    let mut rng = Rng(7);
    let sent: Vec<Vec<u8>> = (0..150u32)
        .map(|seq| {
            let len = rng.range(60, 1514);
            frame(&mut rng, len, MARKER, seq)
        })
        .collect();
    for frame in &sent {
        packet_tx.send(frame, 0).unwrap();
    }
    packet_tx.flush().unwrap();
    let got = receive_marked(&mut xdp_rx, sent.len());
    assert_eq!(got.len(), sent.len(), "frames lost on the way in");
    for (i, (got, sent)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(got, sent, "frame {i} differs on the way in");
    }
    let rx_stats = flick_packet_io::RxPort::stats(&xdp_rx);
    assert!(rx_stats.frames >= 150, "{rx_stats:?}");
    assert_eq!(rx_stats.errors, 0, "{rx_stats:?}");

    // Out through the UMEM's send frames, each used about ten times; sent
    // in bursts the peer's ring takes whole.
    let back: Vec<Vec<u8>> = (0..300u32)
        .map(|seq| {
            let len = rng.range(60, 1514);
            frame(&mut rng, len, MARKER, 1000 + seq)
        })
        .collect();
    let mut got = Vec::new();
    for burst in back.chunks(30) {
        for frame in burst {
            xdp_tx.send(frame, 0).unwrap();
        }
        xdp_tx.flush().unwrap();
        got.extend(receive_marked(&mut packet_rx, burst.len()));
    }
    assert_eq!(got.len(), back.len(), "frames lost on the way out");
    for (i, (got, sent)) in got.iter().zip(&back).enumerate() {
        assert_eq!(got, sent, "frame {i} differs on the way out");
    }
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
    assert!(has_xdp_program(&ns, "veth-b"));
    // The queue is taken: a second port on it fails, saying why.
    let error = ns
        .enter(|| open(&spec).err())
        .expect("a second port on the same queue fails");
    let text = error.to_string();
    assert!(text.contains("AF_XDP port on `veth-b`"), "{text}");
    // One side dropped keeps the program; both dropped take it away.
    let Port { rx, tx } = first;
    drop(rx);
    assert!(has_xdp_program(&ns, "veth-b"));
    drop(tx);
    assert!(
        !has_xdp_program(&ns, "veth-b"),
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
