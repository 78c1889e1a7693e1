//! Sends the port-knocking firewall's traffic into one interface and
//! counts what comes out of another, for `bench/packets_veth.sh`, which
//! puts Flick (`examples/packets/port_knocking.flick` over AF_PACKET) or
//! nftables (the same firewall as kernel rules on a bridge) between them.
//!
//!   packet-veth --tx IFACE --rx IFACE [--frames N] [--sources K]
//!
//! Each of K sources first knocks (5123, 6234, 7345, 8456) and opens SSH,
//! paced so the firewall has seen the knocks; then N frames of SSH
//! traffic from those sources (which pass), with one in eight to port 80
//! (dropped), are sent as fast as the interface takes them. Prints one
//! JSON line: frames sent, frames received, the seconds from the first
//! frame sent to the last received, and the rate that gives.

use flick_packet_io::{PortSpec, RecvStatus, RxPort, TxPort};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn frame(src: u32, sport: u16, dport: u16, syn: bool) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, 0, 46, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src.to_be_bytes());
    f.extend_from_slice(&0x0a00_0016u32.to_be_bytes());
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    let flags = if syn { 0x02 } else { 0x18 };
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(64, 0);
    // A right header checksum: a bridge with br_netfilter drops others.
    let mut sum = f[14..34]
        .chunks(2)
        .fold(0u32, |s, w| s + u16::from_be_bytes([w[0], w[1]]) as u32);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let sum = !(sum as u16);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f
}

fn open_rx(iface: &str) -> Box<dyn RxPort> {
    flick_packet_io::open(&PortSpec::AfPacket(iface.into()))
        .unwrap_or_else(|e| panic!("{iface}: {e}"))
        .rx
        .unwrap()
}

fn open_tx(iface: &str) -> Box<dyn TxPort> {
    flick_packet_io::open(&PortSpec::AfPacket(iface.into()))
        .unwrap_or_else(|e| panic!("{iface}: {e}"))
        .tx
        .unwrap()
}

fn main() {
    let (mut tx_if, mut rx_if, mut frames, mut sources) =
        (String::new(), String::new(), 2_000_000usize, 64u32);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--tx" => tx_if = v,
            "--rx" => rx_if = v,
            "--frames" => frames = v.parse().unwrap(),
            "--sources" => sources = v.parse().unwrap(),
            _ => panic!("unknown flag {flag} (--tx, --rx, --frames, --sources)"),
        }
    }
    assert!(
        !tx_if.is_empty() && !rx_if.is_empty(),
        "--tx and --rx are needed"
    );
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut rx = open_rx(&rx_if);
    let counter = {
        let (received, stop) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let mut n = 0u64;
                match rx.recv_batch(256, &mut |_, _| n += 1) {
                    Ok(RecvStatus::Frames(_)) if n > 0 => {
                        last = Instant::now();
                        received.fetch_add(n, Ordering::Relaxed);
                    }
                    _ => std::thread::sleep(Duration::from_micros(50)),
                }
            }
            last
        })
    };
    let mut tx = open_tx(&tx_if);
    // The knocks and each source's SSH opening, paced.
    for s in 0..sources {
        let src = 0x0a01_0000 + s;
        for (i, port) in [5123u16, 6234, 7345, 8456].into_iter().enumerate() {
            tx.send(&frame(src, 40000 + i as u16, port, true), 0)
                .unwrap();
            tx.flush().unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
        tx.send(&frame(src, 50022, 22, true), 0).unwrap();
        tx.flush().unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let opened = received.load(Ordering::Relaxed);
    let load: Vec<Vec<u8>> = (0..4096u32)
        .map(|i| {
            let src = 0x0a01_0000 + i % sources;
            if i % 8 == 7 {
                frame(src, 50080, 80, false)
            } else {
                frame(src, 50022, 22, false)
            }
        })
        .collect();
    let start = Instant::now();
    for i in 0..frames {
        // A full ring drops and counts; the count below is what arrived.
        let _ = tx.send(&load[i % load.len()], 0);
    }
    let _ = tx.flush();
    let send_s = start.elapsed().as_secs_f64();
    // Done once nothing more arrives for half a second.
    let mut seen = received.load(Ordering::Relaxed);
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = received.load(Ordering::Relaxed);
        if now == seen {
            break;
        }
        seen = now;
    }
    stop.store(true, Ordering::Relaxed);
    let span = counter
        .join()
        .unwrap()
        .saturating_duration_since(start)
        .as_secs_f64();
    let got = received.load(Ordering::Relaxed) - opened;
    let passing = frames - frames / 8;
    println!(
        "{{\"sent\":{frames},\"passing\":{passing},\"received\":{got},\"send_s\":{send_s:.3},\"receive_span_s\":{span:.3},\"received_per_s\":{:.0},\"opened\":{opened}}}",
        got as f64 / span.max(1e-9)
    );
}
