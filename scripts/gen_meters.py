#!/usr/bin/env python3
"""Writes the input captures of the meter and Bloom filter examples.

    scripts/gen_meters.py [DIR]       # default examples/packets/testdata

Deterministic, like scripts/gen_packets.py (whose frame builders it
uses), but with timestamps of its own, since a meter's colours depend on
when frames arrive (microsecond pcap timestamps):

  policer.pcap    traffic for policer.flick over 1 s: a source under the
                  rate (500-byte frames, 100 a second), one at twice the
                  rate (1000-byte frames, 250 a second), one in bursts of
                  8 1400-byte frames twice a second, an IPv6 source over
                  the rate, and ARP (not metered)
  new_flows.pcap  traffic for new_flows.flick: 200 IPv4 TCP and UDP flows
                  and 10 IPv6 ones, each of 1 to 6 frames, interleaved,
                  with ARP between them
"""
import random
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_packets import arp, pad, tcp4, tcp6, udp4, udp6  # noqa: E402

START_US = 1_700_000_000 * 1_000_000


def write_timed_pcap(path: Path, frames):
    """`frames`: (microseconds from the start, frame), in any order; written
    in time order (stable for equal times)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for at, frame in sorted(frames, key=lambda x: x[0]):
            ts = START_US + at
            f.write(struct.pack("<IIII", ts // 1_000_000, ts % 1_000_000, len(frame), len(frame)))
            f.write(frame)


def sized_udp4(src, dst, sport, dport, total):
    # Ethernet 14 + IPv4 20 + UDP 8 = 42 bytes of headers.
    return udp4(src, dst, sport, dport, pad(total - 42))


def policer(rng: random.Random):
    dst = "192.168.9.1"
    frames = []
    # Under the rate: 500 B x 100/s = 50 kB/s of 125 kB/s.
    for i in range(100):
        frames.append((i * 10_000 + rng.randrange(0, 500), sized_udp4("10.0.3.1", dst, 40001, 9000, 500)))
    # Twice the rate: 1000 B x 250/s = 250 kB/s.
    for i in range(250):
        frames.append((i * 4_000 + rng.randrange(0, 100), sized_udp4("10.0.3.2", dst, 40002, 9000, 1000)))
    # Bursts: 8 frames of 1400 B back to back, twice a second.
    for burst in range(2):
        for i in range(8):
            frames.append((burst * 500_000 + 3_000 + i * 10, tcp4("10.0.3.3", dst, 40003, 80, payload=pad(1400 - 54))))
    # IPv6, over the rate: 1200-byte frames (a 62-byte header), 150 a second.
    for i in range(150):
        frames.append((i * 6_667 + 1_234, udp6("fd00::7", "fd00::1", 40007, 9000, pad(1200 - 62))))
    # Not IP: passes unmetered.
    for i in range(5):
        frames.append((i * 200_000 + 77, arp("10.0.3.1", dst)))
    return frames


def new_flows(rng: random.Random):
    scripts = []
    for i in range(200):
        src = "10.1.%d.%d" % (i // 50, 1 + i % 50)
        dst = "192.168.%d.%d" % (i % 3, 10 + i % 7)
        sport = 30000 + rng.randrange(0, 2000)
        dport = rng.choice([53, 80, 443, 8080])
        n = rng.randrange(1, 7)
        if i % 4 == 0:
            scripts.append([udp4(src, dst, sport, dport, pad(rng.randrange(0, 300))) for _ in range(n)])
        else:
            scripts.append([tcp4(src, dst, sport, dport, payload=pad(rng.randrange(0, 300))) for _ in range(n)])
    for i in range(10):
        src, dst = "fd00::%x" % (0x100 + i), "fd00::1"
        n = rng.randrange(1, 7)
        make = tcp6 if i % 2 else udp6
        scripts.append([make(src, dst, 50000 + i, 443, pad(40)) for _ in range(n)])
    # A flow seen again after others: still not new.
    scripts.append([tcp4("10.1.0.1", "192.168.0.10", 29999, 80) for _ in range(3)])
    scripts.append([arp("10.1.0.%d" % (1 + i), "10.1.0.254") for i in range(5)])
    frames = []
    cursors = [0] * len(scripts)
    t = 0
    while any(c < len(s) for c, s in zip(cursors, scripts)):
        live = [i for i, s in enumerate(scripts) if cursors[i] < len(s)]
        i = rng.choice(live)
        frames.append((t, scripts[i][cursors[i]]))
        cursors[i] += 1
        t += 1000
    return frames


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/packets/testdata")
    out.mkdir(parents=True, exist_ok=True)
    write_timed_pcap(out / "policer.pcap", policer(random.Random(11)))
    write_timed_pcap(out / "new_flows.pcap", new_flows(random.Random(12)))


if __name__ == "__main__":
    main()
