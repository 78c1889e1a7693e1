//! A TUN port in a network namespace of the test's own: IP packets in with
//! a synthetic Ethernet header, frames out with it stripped.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::Instant;

use common::{netns_available, unique, wait_readable, Netns, TEST_DEADLINE};
use flick_packet_io::{open, PortError, PortSpec, TUN_DST_MAC, TUN_SRC_MAC};

const PORT_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const PEER_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);

/// The ones' complement sum of `bytes` as 16-bit words, folded.
fn ones_complement_sum(bytes: &[u8], mut sum: u32) -> u32 {
    for chunk in bytes.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// An Ethernet frame carrying an IPv4 UDP datagram, both checksums right.
fn udp_frame(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let total_len = 20 + udp_len;
    let mut ip = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&(total_len as u16).to_be_bytes());
    ip.extend_from_slice(&src.ip().octets());
    ip.extend_from_slice(&dst.ip().octets());
    let checksum = !(ones_complement_sum(&ip, 0) as u16);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());

    let mut udp = Vec::new();
    udp.extend_from_slice(&src.port().to_be_bytes());
    udp.extend_from_slice(&dst.port().to_be_bytes());
    udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.ip().octets());
    pseudo.extend_from_slice(&dst.ip().octets());
    pseudo.extend_from_slice(&[0, 17]);
    pseudo.extend_from_slice(&(udp_len as u16).to_be_bytes());
    let sum = ones_complement_sum(&udp, ones_complement_sum(&pseudo, 0));
    let checksum = match !(sum as u16) {
        0 => 0xffff,
        c => c,
    };
    udp[6..8].copy_from_slice(&checksum.to_be_bytes());

    // Any MACs: the port strips them.
    let mut frame = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00];
    frame.extend_from_slice(&ip);
    frame.extend_from_slice(&udp);
    frame
}

#[test]
fn ip_packets_in_and_out_of_a_tun_device() {
    if !netns_available("ip_packets_in_and_out_of_a_tun_device") {
        return;
    }
    let ns = Netns::new("flkpio");
    let name = unique("ft").chars().take(15).collect::<String>();
    let spec: PortSpec = format!("tun:{name}").parse().unwrap();
    // The device and the sending socket are made inside the namespace.
    let (port, sender) = ns.enter(|| (open(&spec).unwrap(), UdpSocket::bind("0.0.0.0:0").unwrap()));
    ns.ip(&["addr", "add", "10.9.0.1/24", "dev", &name]);
    ns.ip(&["link", "set", "dev", &name, "up"]);
    // Bound once the address exists.
    let receiver = ns.enter(|| UdpSocket::bind(SocketAddrV4::new(PORT_ADDRESS, 0)).unwrap());
    receiver.set_read_timeout(Some(TEST_DEADLINE)).unwrap();
    let (mut rx, mut tx) = (port.rx.unwrap(), port.tx.unwrap());

    // In: a datagram routed to the device comes out of the port as an
    // Ethernet frame.
    let payload = b"to the tun, via the routing table";
    sender
        .send_to(payload, SocketAddrV4::new(PEER_ADDRESS, 5555))
        .unwrap();
    let deadline = Instant::now() + TEST_DEADLINE;
    let mut got = None;
    while got.is_none() && Instant::now() < deadline {
        rx.recv_batch(8, &mut |frame, ts| {
            assert!(ts > 0);
            // Skip what the kernel sends by itself (IPv6 neighbour
            // discovery and the like): the datagram is IPv4, UDP, to 5555.
            if frame.len() > 14 + 28
                && frame[14] >> 4 == 4
                && frame[14 + 9] == 17
                && frame[14 + 22..14 + 24] == 5555u16.to_be_bytes()
            {
                got = Some(frame.to_vec());
            }
        })
        .unwrap();
        if got.is_none() {
            wait_readable(rx.raw_fd().unwrap(), deadline);
        }
    }
    let frame = got.expect("the datagram reaches the port");
    assert_eq!(&frame[0..6], &TUN_DST_MAC);
    assert_eq!(&frame[6..12], &TUN_SRC_MAC);
    assert_eq!(&frame[12..14], &[0x08, 0x00]);
    assert_eq!(&frame[14 + 16..14 + 20], &PEER_ADDRESS.octets());
    assert_eq!(&frame[14 + 28..], payload);
    assert!(rx.stats().frames >= 1);

    // Out: a frame sent to the port arrives at a socket as a datagram.
    let std::net::SocketAddr::V4(to) = receiver.local_addr().unwrap() else {
        panic!("IPv4");
    };
    let reply = b"from the tun, checksums computed";
    let from = SocketAddrV4::new(PEER_ADDRESS, 5555);
    tx.send(&udp_frame(from, to, reply), 0).unwrap();
    tx.flush().unwrap();
    let mut buffer = [0u8; 128];
    let (len, source) = receiver
        .recv_from(&mut buffer)
        .expect("the datagram arrives");
    assert_eq!(&buffer[..len], reply);
    assert_eq!(source, std::net::SocketAddr::V4(from));
    assert_eq!(tx.stats().frames, 1);

    // Not IP: refused, counted, and the port goes on.
    let mut arp = udp_frame(from, to, reply);
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let error = tx.send(&arp, 0).unwrap_err();
    assert!(
        matches!(
            error,
            PortError::NotIp {
                ethertype: 0x0806,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.is_frame_error());
    assert!(error.to_string().contains("0x0806"), "{error}");
    let error = tx.send(&[0u8; 14], 0).unwrap_err();
    assert!(matches!(error, PortError::FrameSize { .. }), "{error:?}");
    assert_eq!(tx.stats().errors, 2);
    tx.send(&udp_frame(from, to, b"again"), 0).unwrap();
    let (len, _) = receiver
        .recv_from(&mut buffer)
        .expect("the port still sends");
    assert_eq!(&buffer[..len], b"again");
}
