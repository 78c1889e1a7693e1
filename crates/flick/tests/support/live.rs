//! Frames sent and received on AF_PACKET ports inside a network
//! namespace of the test's own.

use flick_packet_io::{PortSpec, RecvStatus};
use flick_testkit::netns::Netns;
use std::time::{Duration, Instant};

/// Sends `frames` (with their times) into `iface`, then reads what
/// arrives at `out` (if any) until `expected` frames came and nothing
/// more for 300 ms, or 5 s pass.
pub fn send_and_collect(
    ns: &Netns,
    iface: &str,
    frames: &[(Vec<u8>, u64)],
    out: Option<&str>,
    expected: usize,
) -> Vec<Vec<u8>> {
    ns.enter(|| {
        let mut rx = out.map(|o| {
            flick_packet_io::open(&PortSpec::AfPacket(o.into()))
                .unwrap()
                .rx
                .unwrap()
        });
        let mut tx = flick_packet_io::open(&PortSpec::AfPacket(iface.into()))
            .unwrap()
            .tx
            .unwrap();
        for (f, ts) in frames {
            tx.send(f, *ts).unwrap();
            tx.flush().unwrap();
        }
        let mut got = Vec::new();
        let Some(rx) = rx.as_mut() else {
            return got;
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut quiet_since = Instant::now();
        while Instant::now() < deadline {
            let status = rx.recv_batch(64, &mut |f, _| got.push(f.to_vec())).unwrap();
            match status {
                RecvStatus::Frames(n) if n > 0 => quiet_since = Instant::now(),
                _ => {
                    if got.len() >= expected && quiet_since.elapsed() > Duration::from_millis(300) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        got
    })
}
