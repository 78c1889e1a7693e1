#!/usr/bin/env python3
"""Writes the input captures of the packet examples' golden tests.

    scripts/gen_packets.py [DIR]      # default examples/packets/testdata

Deterministic: the same files every run (a fixed seed, fixed timestamps),
so the captures in the repository can be checked against this script
(crates/flick/tests/packet_examples.rs does). Plain Python, no packages:
frames are built byte by byte with correct IPv4, TCP, UDP and ICMP
checksums, and written as classic pcap (microsecond timestamps,
Ethernet link type).

  tracker.pcap   flows for flow_tracker.flick: IPv4 TCP and UDP flows of
                 varied sizes, IPv6 TCP and UDP, ICMP echo, a VLAN-tagged
                 UDP flow, an IPv4 fragment, ARP (not IP: not counted)
  dpi.pcap       traffic for dpi_balancer.flick: TCP and UDP conversations
                 in both directions, DNS queries and answers, ARP
  knock.pcap     traffic for port_knocking.flick: sources that knock right,
                 in the wrong order, not at all, and knock then reach other
                 ports; interleaved
"""
import random
import struct
import sys
from pathlib import Path

MAC_A = bytes.fromhex("020000000001")
MAC_B = bytes.fromhex("020000000002")


def csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ip4(a: str) -> int:
    return struct.unpack("!I", bytes(int(x) for x in a.split(".")))[0]


def ip6(a: str) -> bytes:
    # Only the forms this script uses: "fd00::N" and full groups.
    head, _, tail = a.partition("::")
    hg = [int(x, 16) for x in head.split(":") if x]
    tg = [int(x, 16) for x in tail.split(":") if x]
    groups = hg + [0] * (8 - len(hg) - len(tg)) + tg
    return struct.pack("!8H", *groups)


def ether(payload: bytes, ethertype: int, vlan=None) -> bytes:
    if vlan is None:
        return MAC_B + MAC_A + struct.pack("!H", ethertype) + payload
    return MAC_B + MAC_A + struct.pack("!HHH", 0x8100, vlan, ethertype) + payload


def ipv4(src: int, dst: int, proto: int, l4: bytes, ttl=64, ident=0, frag=0x4000) -> bytes:
    total = 20 + len(l4)
    hdr = struct.pack("!BBHHHBBHII", 0x45, 0, total, ident, frag, ttl, proto, 0, src, dst)
    hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
    return hdr + l4


def l4_csum4(src: int, dst: int, proto: int, seg: bytes) -> int:
    pseudo = struct.pack("!IIBBH", src, dst, 0, proto, len(seg))
    return csum(pseudo + seg)


def l4_csum6(src: bytes, dst: bytes, proto: int, seg: bytes) -> int:
    pseudo = src + dst + struct.pack("!IxxxB", len(seg), proto)
    return csum(pseudo + seg)


def tcp_seg(sport, dport, flags, payload=b"", seq=1, ack=0) -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload


def udp_seg(sport, dport, payload=b"") -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def with_csum(seg: bytes, at: int, value: int) -> bytes:
    return seg[:at] + struct.pack("!H", value) + seg[at + 2:]


def tcp4(src, dst, sport, dport, flags=0x18, payload=b"", vlan=None, ttl=64) -> bytes:
    s, d = ip4(src), ip4(dst)
    seg = tcp_seg(sport, dport, flags, payload)
    seg = with_csum(seg, 16, l4_csum4(s, d, 6, seg))
    return ether(ipv4(s, d, 6, seg, ttl=ttl), 0x0800, vlan)


def udp4(src, dst, sport, dport, payload=b"", vlan=None) -> bytes:
    s, d = ip4(src), ip4(dst)
    seg = udp_seg(sport, dport, payload)
    seg = with_csum(seg, 6, l4_csum4(s, d, 17, seg) or 0xFFFF)
    return ether(ipv4(s, d, 17, seg), 0x0800, vlan)


def icmp4(src, dst, ident, seqno, payload=b"") -> bytes:
    s, d = ip4(src), ip4(dst)
    msg = struct.pack("!BBHHH", 8, 0, 0, ident, seqno) + payload
    msg = with_csum(msg, 2, csum(msg))
    return ether(ipv4(s, d, 1, msg), 0x0800)


def frag4(src, dst, payload: bytes) -> bytes:
    # A later fragment (offset 64 bytes): no UDP header of its own.
    return ether(ipv4(ip4(src), ip4(dst), 17, payload, ident=77, frag=8), 0x0800)


def l4_6(src, dst, proto, seg) -> bytes:
    s, d = ip6(src), ip6(dst)
    at = 16 if proto == 6 else 6
    seg = with_csum(seg, at, l4_csum6(s, d, proto, seg))
    hdr = struct.pack("!IHBB", 6 << 28, len(seg), proto, 64) + s + d
    return ether(hdr + seg, 0x86DD)


def tcp6(src, dst, sport, dport, payload=b"") -> bytes:
    return l4_6(src, dst, 6, tcp_seg(sport, dport, 0x18, payload))


def udp6(src, dst, sport, dport, payload=b"") -> bytes:
    return l4_6(src, dst, 17, udp_seg(sport, dport, payload))


def arp(spa, tpa) -> bytes:
    body = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + MAC_A + struct.pack("!I", ip4(spa))
    body += b"\0" * 6 + struct.pack("!I", ip4(tpa))
    return bytes.fromhex("ffffffffffff") + MAC_A + struct.pack("!H", 0x0806) + body


def dns_query(name: str, ident: int) -> bytes:
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + q + struct.pack("!HH", 1, 1)


def write_pcap(path: Path, frames):
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i, frame in enumerate(frames):
            ts = 1_700_000_000 * 1_000_000 + i * 1000
            f.write(struct.pack("<IIII", ts // 1_000_000, ts % 1_000_000, len(frame), len(frame)))
            f.write(frame)


def pad(n: int) -> bytes:
    return bytes((i * 7) & 0xFF for i in range(n))


def tracker(rng: random.Random):
    flows = []
    for i in range(12):
        src = "10.0.%d.%d" % (i // 4, 1 + i)
        dst = "192.168.1.%d" % (10 + i % 3)
        if i % 3 == 0:
            flows.append(lambda n, s=src, d=dst, p=40000 + i: udp4(s, d, p, 5000 + i % 2, pad(n)))
        else:
            flows.append(lambda n, s=src, d=dst, p=40000 + i: tcp4(s, d, p, 80, payload=pad(n)))
    flows.append(lambda n: tcp6("fd00::1", "fd00::2", 51000, 443, pad(n)))
    flows.append(lambda n: udp6("fd00::3", "fd00::2", 51001, 53, pad(n)))
    flows.append(lambda n: udp4("10.9.0.1", "10.9.0.2", 7000, 7001, pad(n), vlan=42))
    frames = []
    for _ in range(240):
        f = rng.randrange(len(flows))
        frames.append(flows[f](rng.randrange(0, 900)))
        r = rng.random()
        if r < 0.05:
            frames.append(icmp4("10.0.0.1", "192.168.1.10", 9, rng.randrange(100), pad(56)))
        elif r < 0.08:
            frames.append(arp("10.0.0.1", "10.0.0.254"))
        elif r < 0.10:
            frames.append(frag4("10.0.0.5", "192.168.1.10", pad(120)))
    return frames


def dpi(rng: random.Random):
    convs = []
    for i in range(16):
        a = "10.1.%d.%d" % (i % 4, 10 + i)
        b = "172.16.0.%d" % (1 + i % 5)
        proto = "tcp" if i % 4 else "udp"
        convs.append((a, b, 30000 + i, 443 if proto == "tcp" else 8443, proto))
    frames = []
    for n in range(300):
        r = rng.random()
        if r < 0.12:
            ident = rng.randrange(65536)
            host = "10.1.0.%d" % rng.randrange(10, 26)
            if rng.random() < 0.5:
                frames.append(udp4(host, "10.53.0.1", 33000 + n, 53, dns_query("example%d.org" % (n % 7), ident)))
            else:
                frames.append(udp4("10.53.0.1", host, 53, 33000 + n, dns_query("example%d.org" % (n % 7), ident)))
        elif r < 0.15:
            frames.append(arp("10.1.0.1", "10.1.0.254"))
        else:
            a, b, pa, pb, proto = convs[rng.randrange(len(convs))]
            size = rng.randrange(0, 600)
            forward = rng.random() < 0.6
            if proto == "tcp":
                frames.append(tcp4(a, b, pa, pb, payload=pad(size)) if forward else tcp4(b, a, pb, pa, payload=pad(size)))
            else:
                frames.append(udp4(a, b, pa, pb, pad(size)) if forward else udp4(b, a, pb, pa, pad(size)))
    return frames


KNOCKS = [5123, 6234, 7345, 8456]


def knock(rng: random.Random):
    server = "10.0.0.22"
    scripts = []

    def knocks(src, ports):
        return [tcp4(src, server, 41000 + i, p, flags=0x02) for i, p in enumerate(ports)]

    def ssh(src, n, sport=50022):
        return [tcp4(src, server, sport, 22, flags=0x02 if i == 0 else 0x18, payload=pad(20 * i)) for i in range(n)]

    # A: the right sequence, then SSH (passes), then port 80 (dropped).
    scripts.append(knocks("10.0.1.1", KNOCKS) + ssh("10.0.1.1", 4) + [tcp4("10.0.1.1", server, 50080, 80)])
    # B: the right ports in the wrong order, then SSH: dropped.
    scripts.append(knocks("10.0.1.2", [6234, 5123, 7345, 8456]) + ssh("10.0.1.2", 2))
    # C: SSH without knocking: dropped.
    scripts.append(ssh("10.0.1.3", 3))
    # D: a wrong knock part way, then the whole sequence again: passes.
    scripts.append(knocks("10.0.1.4", [5123, 6234, 9999]) + knocks("10.0.1.4", KNOCKS) + ssh("10.0.1.4", 3))
    # E: three of four knocks, then SSH: dropped.
    scripts.append(knocks("10.0.1.5", KNOCKS[:3]) + ssh("10.0.1.5", 2))
    # F: knocks by UDP, then SSH: passes (a knock is a destination port).
    scripts.append([udp4("10.0.1.6", server, 42000 + i, p) for i, p in enumerate(KNOCKS)] + ssh("10.0.1.6", 2))
    # Noise: other hosts to other ports, ICMP, ARP.
    noise = [tcp4("10.0.2.%d" % (1 + i % 5), server, 43000 + i, 80) for i in range(12)]
    noise += [icmp4("10.0.2.9", server, 3, i) for i in range(3)] + [arp("10.0.2.1", server)]
    scripts.append(noise)
    # Interleave the scripts, keeping each one's order.
    frames = []
    cursors = [0] * len(scripts)
    while any(c < len(s) for c, s in zip(cursors, scripts)):
        live = [i for i, s in enumerate(scripts) if cursors[i] < len(s)]
        i = rng.choice(live)
        frames.append(scripts[i][cursors[i]])
        cursors[i] += 1
    return frames


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/packets/testdata")
    out.mkdir(parents=True, exist_ok=True)
    write_pcap(out / "tracker.pcap", tracker(random.Random(1)))
    write_pcap(out / "dpi.pcap", dpi(random.Random(2)))
    write_pcap(out / "knock.pcap", knock(random.Random(3)))


if __name__ == "__main__":
    main()
