//! pcap and pcapng ports: round trips, link types, damaged files, specs.

mod common;

use std::borrow::Cow;
use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use common::{frames, TempFile};
use flick_packet_io::{
    open, read_pcap, write_pcap, PcapRx, PcapTx, PortError, PortSpec, RecvStatus, RxPort,
    TimestampResolution, TxPort,
};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;

/// Reads a port to its end in batches of `batch`.
fn drain(rx: &mut dyn RxPort, batch: usize) -> Vec<(Vec<u8>, u64)> {
    let mut got = Vec::new();
    loop {
        match rx
            .recv_batch(batch, &mut |frame, ts| got.push((frame.to_vec(), ts)))
            .expect("recv_batch")
        {
            RecvStatus::Frames(n) => assert!(n >= 1 && n <= batch, "batch of {n} for max {batch}"),
            RecvStatus::End => return got,
            RecvStatus::Idle => panic!("a file port is never idle"),
        }
    }
}

#[test]
fn pcap_round_trip_batch_by_batch_and_whole() {
    let file = TempFile::new("pcap");
    let sent = frames(7, 500);
    write_pcap(file.path(), &sent).unwrap();

    let port = open(&PortSpec::PcapIn(file.path().to_path_buf())).unwrap();
    assert!(port.tx.is_none());
    let mut rx = port.rx.unwrap();
    assert_eq!(rx.raw_fd(), None);
    let got = drain(rx.as_mut(), 7);
    assert_eq!(got, sent);
    // The end stays the end.
    assert_eq!(
        rx.recv_batch(7, &mut |_, _| panic!("past the end"))
            .unwrap(),
        RecvStatus::End
    );
    let stats = rx.stats();
    assert_eq!(stats.frames, 500);
    assert_eq!(
        stats.bytes,
        sent.iter().map(|(f, _)| f.len() as u64).sum::<u64>()
    );
    assert_eq!(stats.errors, 0);

    assert_eq!(read_pcap(file.path()).unwrap(), sent);
}

#[test]
fn pcap_out_port_writes_what_it_is_sent() {
    let file = TempFile::new("pcap");
    let sent = frames(11, 64);
    let port = open(&PortSpec::PcapOut(file.path().to_path_buf())).unwrap();
    assert!(port.rx.is_none());
    let mut tx = port.tx.unwrap();
    for (frame, ts) in &sent {
        tx.send(frame, *ts).unwrap();
    }
    tx.flush().unwrap();
    assert_eq!(tx.stats().frames, 64);
    assert_eq!(read_pcap(file.path()).unwrap(), sent);
    // Nanosecond magic, little-endian.
    let bytes = std::fs::read(file.path()).unwrap();
    assert_eq!(&bytes[..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
}

#[test]
fn microsecond_pcap_keeps_microseconds() {
    let file = TempFile::new("pcap");
    let sent = frames(3, 20);
    let mut tx = PcapTx::create_with(file.path(), TimestampResolution::Micro).unwrap();
    for (frame, ts) in &sent {
        tx.send(frame, *ts).unwrap();
    }
    drop(tx);
    let got = read_pcap(file.path()).unwrap();
    let expected: Vec<_> = sent
        .iter()
        .map(|(f, ts)| (f.clone(), ts / 1000 * 1000))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn big_endian_microsecond_pcap_from_the_crate_reads() {
    let file = TempFile::new("pcap");
    let sent = frames(5, 30);
    let header = PcapHeader {
        endianness: pcap_file::Endianness::Big,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(File::create(file.path()).unwrap(), header).unwrap();
    for (frame, ts) in &sent {
        writer
            .write_packet(&PcapPacket::new(
                Duration::from_nanos(*ts),
                frame.len() as u32,
                frame,
            ))
            .unwrap();
    }
    drop(writer);
    let got = read_pcap(file.path()).unwrap();
    let expected: Vec<_> = sent
        .iter()
        .map(|(f, ts)| (f.clone(), ts / 1000 * 1000))
        .collect();
    assert_eq!(got, expected);
}

fn interface(linktype: DataLink, resolution: Option<u8>) -> InterfaceDescriptionBlock<'static> {
    InterfaceDescriptionBlock {
        linktype,
        snaplen: 65535,
        options: resolution
            .map(InterfaceDescriptionOption::IfTsResol)
            .into_iter()
            .collect(),
    }
}

fn packet(interface_id: u32, ticks: u64, data: &[u8], comment: bool) -> EnhancedPacketBlock<'_> {
    EnhancedPacketBlock {
        interface_id,
        // The crate writes the duration's nanoseconds as the raw ticks.
        timestamp: Duration::from_nanos(ticks),
        original_len: data.len() as u32,
        data: Cow::Borrowed(data),
        options: if comment {
            vec![EnhancedPacketOption::Comment(Cow::Borrowed("a comment"))]
        } else {
            Vec::new()
        },
    }
}

#[test]
fn pcapng_reads_with_each_interfaces_resolution() {
    let file = TempFile::new("pcapng");
    let sent = frames(9, 100);
    let mut writer = PcapNgWriter::new(File::create(file.path()).unwrap()).unwrap();
    // Interface 0 in nanoseconds, interface 1 at the default microseconds.
    writer
        .write_pcapng_block(interface(DataLink::ETHERNET, Some(9)))
        .unwrap();
    writer
        .write_pcapng_block(interface(DataLink::ETHERNET, None))
        .unwrap();
    let mut expected = Vec::new();
    for (i, (frame, ts)) in sent.iter().enumerate() {
        if i % 2 == 0 {
            writer
                .write_pcapng_block(packet(0, *ts, frame, i % 3 == 0))
                .unwrap();
            expected.push((frame.clone(), *ts));
        } else {
            writer
                .write_pcapng_block(packet(1, ts / 1000, frame, i % 3 == 0))
                .unwrap();
            expected.push((frame.clone(), ts / 1000 * 1000));
        }
    }
    drop(writer);

    let mut rx = PcapRx::open(file.path()).unwrap();
    assert!(rx.is_pcapng());
    assert_eq!(drain(&mut rx, 13), expected);
    assert_eq!(read_pcap(file.path()).unwrap(), expected);
}

#[test]
fn non_ethernet_pcap_is_refused_at_open() {
    let file = TempFile::new("pcap");
    let header = PcapHeader {
        datalink: DataLink::RAW,
        ..PcapHeader::default()
    };
    let mut writer = PcapWriter::with_header(File::create(file.path()).unwrap(), header).unwrap();
    writer
        .write_packet(&PcapPacket::new(Duration::ZERO, 20, &[0x45; 20]))
        .unwrap();
    drop(writer);
    let error = PcapRx::open(file.path())
        .err()
        .expect("a raw-IP capture is refused");
    assert!(matches!(error, PortError::NotEthernet { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("not Ethernet"), "{message}");
    assert!(
        message.contains(&file.path().display().to_string()),
        "{message}"
    );
}

#[test]
fn non_ethernet_pcapng_interface_is_refused_at_its_first_frame() {
    let file = TempFile::new("pcapng");
    let mut writer = PcapNgWriter::new(File::create(file.path()).unwrap()).unwrap();
    writer
        .write_pcapng_block(interface(DataLink::ETHERNET, Some(9)))
        .unwrap();
    writer
        .write_pcapng_block(interface(DataLink::LINUX_SLL, Some(9)))
        .unwrap();
    writer
        .write_pcapng_block(packet(0, 1, &[1; 60], false))
        .unwrap();
    writer
        .write_pcapng_block(packet(1, 2, &[2; 60], false))
        .unwrap();
    drop(writer);
    let mut rx = PcapRx::open(file.path()).unwrap();
    let mut seen = 0;
    let error = rx.recv_batch(10, &mut |_, _| seen += 1).unwrap_err();
    assert_eq!(seen, 1, "the Ethernet frame before it is handed out");
    assert!(matches!(error, PortError::NotEthernet { .. }), "{error:?}");
    assert!(error.to_string().contains("LINUX_SLL"), "{error}");
}

#[test]
fn truncated_files_say_so() {
    let file = TempFile::new("pcap");
    write_pcap(file.path(), &frames(1, 10)).unwrap();
    let whole = std::fs::read(file.path()).unwrap();

    // Cut inside the last frame.
    std::fs::write(file.path(), &whole[..whole.len() - 10]).unwrap();
    let mut rx = PcapRx::open(file.path()).unwrap();
    let mut seen = 0;
    let error = loop {
        match rx.recv_batch(4, &mut |_, _| seen += 1) {
            Ok(RecvStatus::End) => panic!("a truncated file read to an end"),
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert_eq!(seen, 9);
    assert!(matches!(error, PortError::Truncated { .. }), "{error:?}");
    assert!(error.to_string().contains("truncated"), "{error}");

    // Cut inside the file header.
    std::fs::write(file.path(), &whole[..10]).unwrap();
    let error = read_pcap(file.path()).unwrap_err();
    assert!(matches!(error, PortError::Truncated { .. }), "{error:?}");

    // Cut inside a record header.
    std::fs::write(file.path(), &whole[..24 + 8]).unwrap();
    let error = read_pcap(file.path()).unwrap_err();
    assert!(matches!(error, PortError::Truncated { .. }), "{error:?}");
}

#[test]
fn other_files_and_missing_files_are_named() {
    let file = TempFile::new("txt");
    std::fs::write(file.path(), b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let error = read_pcap(file.path()).unwrap_err();
    assert!(matches!(error, PortError::NotPcap { .. }), "{error:?}");

    std::fs::write(file.path(), b"").unwrap();
    assert!(matches!(
        read_pcap(file.path()),
        Err(PortError::NotPcap { .. })
    ));

    let missing = PathBuf::from("/nonexistent/flick/trace.pcap");
    let error = open(&PortSpec::PcapIn(missing)).err().unwrap();
    let message = error.to_string();
    assert!(
        message.contains("/nonexistent/flick/trace.pcap"),
        "{message}"
    );
    assert!(message.contains("No such file"), "{message}");

    let error = open(&PortSpec::PcapOut(PathBuf::from("/nonexistent/out.pcap")))
        .err()
        .unwrap();
    assert!(
        error.to_string().contains("/nonexistent/out.pcap"),
        "{error}"
    );
}

#[test]
fn specs_parse_and_display_back() {
    for text in [
        "pcap:trace.pcap",
        "pcap-out:/tmp/out file.pcap",
        "afpacket:eth0",
        "afxdp:eth1",
        "tun:tun0",
        "pcap:a:b.pcap",
    ] {
        let spec: PortSpec = text.parse().unwrap();
        assert_eq!(spec.to_string(), text);
    }
    assert_eq!(
        "pcap:x.pcapng".parse::<PortSpec>().unwrap(),
        PortSpec::PcapIn("x.pcapng".into())
    );
    assert_eq!(
        "afpacket:veth0".parse::<PortSpec>().unwrap(),
        PortSpec::AfPacket("veth0".into())
    );
    assert_eq!(
        "afxdp:veth0".parse::<PortSpec>().unwrap(),
        PortSpec::AfXdp("veth0".into())
    );
    assert_eq!(
        "tun:t1".parse::<PortSpec>().unwrap(),
        PortSpec::Tun("t1".into())
    );
    assert_eq!(
        PortSpec::parse_named("in=pcap:trace.pcap").unwrap(),
        ("in".to_string(), PortSpec::PcapIn("trace.pcap".into()))
    );
}

#[test]
fn bad_specs_are_explained() {
    let error = "xdp:eth0".parse::<PortSpec>().unwrap_err();
    assert_eq!(
        error.to_string(),
        "unknown port kind `xdp` (pcap:FILE, pcap-out:FILE, afpacket:IFACE, afxdp:IFACE, tun:NAME)"
    );
    let message = |text: &str| text.parse::<PortSpec>().unwrap_err().to_string();
    assert!(
        message("eth0").contains("expected KIND:TARGET"),
        "{}",
        message("eth0")
    );
    assert!(
        message("pcap:").contains("missing FILE"),
        "{}",
        message("pcap:")
    );
    assert!(
        message("afpacket:").contains("missing IFACE"),
        "{}",
        message("afpacket:")
    );
    assert!(
        message("tun:").contains("missing NAME"),
        "{}",
        message("tun:")
    );
    assert!(message("tun:a-name-far-too-long").contains("longer than 15"));
    assert!(message("afpacket:a/b").contains("not a valid interface name"));
    assert!(PortSpec::parse_named("pcap:x").is_err());
    assert!(PortSpec::parse_named("=pcap:x").is_err());
    assert!(matches!(
        PortSpec::parse_named("in=bogus:x"),
        Err(PortError::UnknownKind { .. })
    ));
}
