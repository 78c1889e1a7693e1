//! Header edits through a whole program: `examples/packets/static_nat.flick`
//! on random IPv4 traffic (TCP, UDP with and without a checksum, ICMP,
//! VLAN-tagged, later fragments; addresses in and out of the mapped
//! networks; TTLs about to run out), against
//! `flick_testkit::packet_model::static_nat`, which makes the same edits
//! and recomputes every checksum from scratch: Flick's incremental
//! checksums must give the same bytes.

use flick_testkit::packet_model::{fix_checksums, static_nat};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

#[derive(Debug, Clone)]
struct Frame {
    proto: u8,
    src: u32,
    dst: u32,
    ttl: u8,
    vlan: bool,
    fragment: bool,
    udp_sum: bool,
    sport: u16,
    dport: u16,
    payload: usize,
}

fn addr() -> impl Strategy<Value = u32> {
    prop_oneof![
        (0u32..4).prop_map(|n| 0x0a00_0000 + n),
        (0u32..4).prop_map(|n| 0xc000_0200 + n),
        Just(0x0a00_0100u32),
        any::<u32>(),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (
        prop_oneof![Just(6u8), Just(17), Just(1)],
        addr(),
        addr(),
        prop_oneof![Just(0u8), Just(1), Just(2), Just(64), Just(255)],
        any::<bool>(),
        prop::bool::weighted(0.1),
        any::<bool>(),
        any::<u16>(),
        any::<u16>(),
        0usize..64,
    )
        .prop_map(
            |(proto, src, dst, ttl, vlan, fragment, udp_sum, sport, dport, payload)| Frame {
                proto,
                src,
                dst,
                ttl,
                vlan,
                fragment,
                udp_sum,
                sport,
                dport,
                payload,
            },
        )
}

fn bytes_of(f: &Frame) -> Vec<u8> {
    let mut b = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    if f.vlan {
        b.extend_from_slice(&[0x81, 0, 0, 5]);
    }
    b.extend_from_slice(&[8, 0]);
    let mut l4 = Vec::new();
    match f.proto {
        6 => {
            l4.extend_from_slice(&f.sport.to_be_bytes());
            l4.extend_from_slice(&f.dport.to_be_bytes());
            l4.extend_from_slice(&[0, 0, 0, 7, 0, 0, 0, 0, 0x50, 0x10, 0x20, 0, 0, 0, 0, 0]);
        }
        17 => {
            l4.extend_from_slice(&f.sport.to_be_bytes());
            l4.extend_from_slice(&f.dport.to_be_bytes());
            l4.extend_from_slice(&((8 + f.payload) as u16).to_be_bytes());
            // A non-zero placeholder where the checksum is to be computed.
            l4.extend_from_slice(if f.udp_sum { &[0, 1] } else { &[0, 0] });
        }
        _ => l4.extend_from_slice(&[8, 0, 0, 0, 0, 1, 0, 1]),
    }
    l4.extend((0..f.payload).map(|i| i as u8 ^ 0x5a));
    let frag: u16 = if f.fragment { 0x0020 } else { 0x4000 };
    b.extend_from_slice(&[0x45, 0]);
    b.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    b.extend_from_slice(&[0, 9]);
    b.extend_from_slice(&frag.to_be_bytes());
    b.extend_from_slice(&[f.ttl, f.proto, 0, 0]);
    b.extend_from_slice(&f.src.to_be_bytes());
    b.extend_from_slice(&f.dst.to_be_bytes());
    b.extend_from_slice(&l4);
    fix_checksums(&mut b);
    if f.proto == 1 {
        let at = b.len() - l4.len();
        let c = flick_testkit::packet_model::checksum(&b[at..]);
        b[at + 2..at + 4].copy_from_slice(&c.to_be_bytes());
    }
    b
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch() -> Scratch {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("flick-nat-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn frames_of(p: &Path) -> Vec<Vec<u8>> {
    flick_packet_io::read_pcap(p)
        .unwrap()
        .into_iter()
        .map(|(f, _)| f)
        .collect()
}

fn run_nat(
    inside: &[Vec<u8>],
    outside: &[Vec<u8>],
    workers: usize,
) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let dir = scratch();
    let stamp = |fs: &[Vec<u8>]| -> Vec<(Vec<u8>, u64)> {
        fs.iter()
            .enumerate()
            .map(|(i, f)| (f.clone(), i as u64 * 1000))
            .collect()
    };
    let (i, o) = (dir.0.join("inside.pcap"), dir.0.join("outside.pcap"));
    flick_packet_io::write_pcap(&i, &stamp(inside)).unwrap();
    flick_packet_io::write_pcap(&o, &stamp(outside)).unwrap();
    let (to_o, to_i) = (dir.0.join("to_outside.pcap"), dir.0.join("to_inside.pcap"));
    let out = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args([
            "run",
            "examples/packets/static_nat.flick",
            "--workers",
            &workers.to_string(),
        ])
        .arg("--port")
        .arg(format!("inside=pcap:{}", i.display()))
        .arg("--port")
        .arg(format!("outside=pcap:{}", o.display()))
        .arg("--port")
        .arg(format!("to_outside=pcap-out:{}", to_o.display()))
        .arg("--port")
        .arg(format!("to_inside=pcap-out:{}", to_i.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("malformed 0; faults 0"), "{stderr}");
    (frames_of(&to_o), frames_of(&to_i))
}

#[test]
fn a_mapped_frame_leaves_with_its_address_ttl_and_checksums_changed() {
    let f = Frame {
        proto: 6,
        src: 0x0a00_0003,
        dst: 0x0808_0808,
        ttl: 64,
        vlan: false,
        fragment: false,
        udp_sum: true,
        sport: 40000,
        dport: 443,
        payload: 10,
    };
    let (out, _) = run_nat(&[bytes_of(&f)], &[], 1);
    assert_eq!(out.len(), 1);
    let o = &out[0];
    assert_eq!(&o[26..30], &[192, 0, 2, 3], "the source is mapped");
    assert_eq!(o[22], 63, "the TTL is decremented");
    assert_eq!(
        flick_testkit::packet_model::checksum(&o[14..34]),
        0,
        "the IPv4 header checksum is right"
    );
    assert_eq!(Some(o.clone()), static_nat(&bytes_of(&f), true));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn static_nat_agrees_with_checksums_recomputed(
        inside in prop::collection::vec(frame(), 0..40),
        outside in prop::collection::vec(frame(), 0..40),
        workers in 1usize..3,
    ) {
        let inside: Vec<Vec<u8>> = inside.iter().map(bytes_of).collect();
        let outside: Vec<Vec<u8>> = outside.iter().map(bytes_of).collect();
        let (to_outside, to_inside) = run_nat(&inside, &outside, workers);
        let want_out: Vec<Vec<u8>> = inside.iter().filter_map(|f| static_nat(f, true)).collect();
        let want_in: Vec<Vec<u8>> = outside.iter().filter_map(|f| static_nat(f, false)).collect();
        prop_assert_eq!(to_outside, want_out);
        prop_assert_eq!(to_inside, want_in);
    }
}
