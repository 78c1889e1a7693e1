#!/usr/bin/env python3
"""Writes the input captures of the FlowBlaze use cases' golden tests.

    scripts/gen_flowblaze.py [DIR]      # default examples/flowblaze/testdata

One capture per program and input port, NAME-N.pcap for XL port N, with
timestamps chosen to drive each program's timeouts (classic pcap,
microseconds). Deterministic: a fixed seed per program and fixed times, so
crates/flick/tests/flowblaze_usecases.rs can check the files in the
repository against this script. Frames are built with gen_packets.py's
helpers (correct IPv4, TCP and UDP checksums). The comments say what each
frame is for; the golden tests' assertions say what comes out.
"""
import random
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_packets import ether, ip4, ipv4, l4_csum4, pad, tcp_seg, udp_seg, with_csum  # noqa: E402

# Every capture starts here (microseconds), so times in the scripts below
# read as offsets.
T0 = 1_700_000_000 * 1_000_000
MS = 1000
SEC = 1_000_000

SYN, SYNACK, ACK, PSHACK, FINACK, RST, RSTACK = 0x02, 0x12, 0x10, 0x18, 0x11, 0x04, 0x14


def tcp(src, dst, sport, dport, flags=PSHACK, seq=1, ack=0, payload=b""):
    s, d = ip4(src), ip4(dst)
    seg = tcp_seg(sport, dport, flags, payload, seq=seq, ack=ack)
    seg = with_csum(seg, 16, l4_csum4(s, d, 6, seg))
    return ether(ipv4(s, d, 6, seg), 0x0800)


def udp(src, dst, sport, dport, payload=b""):
    s, d = ip4(src), ip4(dst)
    seg = udp_seg(sport, dport, payload)
    seg = with_csum(seg, 6, l4_csum4(s, d, 17, seg) or 0xFFFF)
    return ether(ipv4(s, d, 17, seg), 0x0800)


class Capture:
    """Frames by input port, each with its time (offset from T0, us)."""

    def __init__(self):
        self.ports = {}

    def add(self, port, t, frame):
        self.ports.setdefault(port, []).append((t, frame))

    def write(self, out: Path, name: str):
        times = set()
        for port, frames in sorted(self.ports.items()):
            frames.sort(key=lambda f: f[0])
            for t, _ in frames:
                # Distinct times: the order across ports is the time order.
                assert t not in times, (name, t)
                times.add(t)
            with open(out / ("%s-%d.pcap" % (name, port)), "wb") as f:
                f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
                for t, frame in frames:
                    ts = T0 + t
                    f.write(struct.pack("<IIII", ts // SEC, ts % SEC, len(frame), len(frame)))
                    f.write(frame)


VIP = "10.0.0.100"


def server_load_balancer(rng):
    c = Capture()
    clients = ["198.51.100.%d" % i for i in range(1, 21)]
    # Two connections: the first goes to A, the second to B; each stays.
    for i in range(4):
        c.add(1, i * 100 * MS + 1, tcp(clients[0], VIP, 40001, 80, SYN if i == 0 else PSHACK, payload=pad(10 * i)))
        c.add(1, i * 100 * MS + 2, tcp(clients[1], VIP, 40002, 80, SYN if i == 0 else PSHACK, payload=pad(10 * i)))
    # Replies from each server go back to the clients.
    c.add(2, 150 * MS, tcp(VIP, clients[0], 80, 40001, SYNACK))
    c.add(3, 160 * MS, tcp(VIP, clients[1], 80, 40002, SYNACK))
    # A third connection of the first client: the turn is A's again.
    c.add(1, 500 * MS, tcp(clients[0], VIP, 40003, 80, SYN))
    # 11 s later the first connection has expired: it starts over, on B.
    c.add(1, 11 * SEC, tcp(clients[0], VIP, 40001, 80, payload=pad(5)))
    # 20 s: 18 new connections within a second fill the table (16
    # contexts: two buckets of four and the stash; the three above have
    # expired and give way): the last ones find no room and go to A
    # without a context.
    order = list(range(2, 20))
    rng.shuffle(order)
    for n, i in enumerate(order):
        c.add(1, 20 * SEC + n * 10 * MS, tcp(clients[i], VIP, 41000 + i, 80, SYN))
    # Their second packets: kept connections follow their server, the
    # ones without a context are new connections again.
    for n, i in enumerate(order):
        c.add(1, 21 * SEC + n * 10 * MS, tcp(clients[i], VIP, 41000 + i, 80, payload=pad(3)))
    return c


def flowlet_lb(rng):
    c = Capture()
    flows = [
        lambda p: tcp("10.1.0.1", "10.2.0.1", 5001, 80, payload=pad(p)),
        lambda p: tcp("10.1.0.2", "10.2.0.1", 5002, 80, payload=pad(p)),
        lambda p: udp("10.1.0.3", "10.2.0.2", 5003, 53, pad(p)),
    ]
    t = 0
    # Bursts of each flow 10 ms apart, gaps of 40, 50 (still one flowlet:
    # the gap must exceed 50 ms) and 51 or 200 ms (a new flowlet).
    gaps = [10, 10, 40, 10, 50, 10, 51, 10, 200, 10, 10]
    for f in range(3):
        t = f * 3 * MS + 1
        for g in gaps:
            c.add(1, t, flows[f](rng.randrange(0, 200)))
            t += g * MS
    return c


def traffic_policer(rng):
    c = Capture()
    big = lambda src, n: udp(src, "10.9.0.1", 7000, 7001, pad(n))
    # s1: four 1000-byte frames at once: three fit the burst, the fourth
    # does not; then frames 10 ms apart (the rate) all pass, frames 1 ms
    # apart mostly do not.
    t = 1000
    for i in range(4):
        c.add(1, t + i, big("10.0.0.1", 958))
    t += 30 * MS
    for i in range(5):
        c.add(1, t + i * 10 * MS, big("10.0.0.1", 958))
    t += 60 * MS
    for i in range(6):
        c.add(1, t + i * MS, big("10.0.0.1", 958))
    # s1 idle for more than a second: a full burst again.
    t += 2 * SEC
    for i in range(4):
        c.add(1, t + i, big("10.0.0.1", 958))
    # s2: small frames, well under the rate, all pass.
    for i in range(20):
        c.add(1, 5 + i * 7 * MS, big("10.0.0.2", rng.randrange(0, 50)))
    return c


def syn_flood(rng):
    c = Capture()
    server = "10.0.0.80"
    # Attacker: eight SYNs in 700 ms: five pass, the sixth blocks it.
    for i in range(8):
        c.add(1, 1 + i * 100 * MS, tcp("198.51.100.66", server, 30000 + i, 80, SYN))
    # Blocked: data and SYNs dropped across later windows.
    for i in range(4):
        c.add(1, 2 * SEC + i * SEC + 3, tcp("198.51.100.66", server, 30100 + i, 80, SYN if i % 2 else ACK))
    # 5 s after the blocking SYN (at 500 ms): passes and starts over.
    c.add(1, 5 * SEC + 600 * MS, tcp("198.51.100.66", server, 30200, 80, ACK))
    c.add(1, 5 * SEC + 700 * MS, tcp("198.51.100.66", server, 30201, 80, SYN))
    # A busy client: five SYNs a window, three windows: never blocked.
    for w in range(3):
        for i in range(5):
            c.add(1, w * 1100 * MS + i * 150 * MS + 7, tcp("198.51.100.7", server, 31000 + 5 * w + i, 80, SYN))
            c.add(1, w * 1100 * MS + i * 150 * MS + 9, tcp("198.51.100.7", server, 31000 + 5 * w + i, 80, ACK, payload=pad(rng.randrange(50))))
    # The server answers both.
    for i in range(5):
        c.add(2, i * 100 * MS + 50 * MS, tcp(server, "198.51.100.66", 80, 30000 + i, SYNACK))
        c.add(2, i * 150 * MS + 60 * MS, tcp(server, "198.51.100.7", 80, 31000 + i, SYNACK))
    return c


def tcp_optimistic_ack(rng):
    c = Capture()
    server = "10.0.0.80"

    def conn(client, sport, t, optimistic_after, isn=5000):
        # Handshake, then the server sends 1000-byte segments and the client
        # acknowledges each; after `optimistic_after` segments the client
        # acknowledges 3000 bytes more than it got.
        c.add(1, t, tcp(client, server, sport, 80, SYN, seq=100))
        c.add(2, t + 1 * MS, tcp(server, client, 80, sport, SYNACK, seq=isn, ack=101))
        c.add(1, t + 2 * MS, tcp(client, server, sport, 80, ACK, seq=101, ack=isn + 1))
        nxt = isn + 1
        for i in range(4):
            c.add(2, t + (3 + 2 * i) * MS, tcp(server, client, 80, sport, PSHACK, seq=nxt, ack=101, payload=pad(1000)))
            nxt += 1000
            ack = nxt + 3000 if i == optimistic_after else nxt
            c.add(1, t + (4 + 2 * i) * MS, tcp(client, server, sport, 80, ACK, seq=101, ack=ack))
        return nxt

    conn("198.51.100.1", 40001, 10, 99)  # honest: everything passes
    conn("198.51.100.2", 40002, 20, 1)  # optimistic at its second ACK
    # An ACK exactly one past the last byte sent plus one (allowed), then
    # one past that (optimistic).
    nxt = conn("198.51.100.3", 40003, 30, 99, isn=9000)
    c.add(1, 40 * MS, tcp("198.51.100.3", server, 40003, 80, ACK, seq=101, ack=nxt + 1))
    c.add(1, 41 * MS, tcp("198.51.100.3", server, 40003, 80, ACK, seq=101, ack=nxt + 2))
    # The optimistic client 31 s later: forgotten, so its new connection
    # on the same ports passes.
    conn("198.51.100.2", 40002, 31 * SEC, 99)
    return c


def super_spreader(rng):
    c = Capture()
    send = lambda t, s, d: c.add(1, t, udp(s, d, 9999, 80, pad(rng.randrange(20))))
    # Scanner: six destinations 100 ms apart, each twice: the first four
    # pass, the fifth makes it a spreader; dropped (old destinations too)
    # until its window ends 10 s after its first packet.
    for i in range(6):
        send(1 + i * 100 * MS, "10.0.0.66", "10.1.0.%d" % (i + 1))
        send(2 + i * 100 * MS + 10 * MS, "10.0.0.66", "10.1.0.%d" % (i + 1))
    send(5 * SEC, "10.0.0.66", "10.1.0.1")
    # After the window: counting afresh. Its pair with the first
    # destination was seen 6 s ago (not new: passes); the others were
    # seen more than 10 s ago, so they count again: four pass, the fifth
    # makes it a spreader again.
    for i in range(6):
        send(11 * SEC + i * MS, "10.0.0.66", "10.1.0.%d" % (i + 1))
    # A client talking to three servers, many times: never a spreader.
    for i in range(30):
        send(3 + i * 400 * MS, "10.0.0.7", "10.2.0.%d" % (1 + i % 3))
    # A client reaching four servers in each of two windows: passes.
    for w in range(2):
        for i in range(4):
            send(4 + w * 10500 * MS + i * 50 * MS, "10.0.0.8", "10.3.%d.%d" % (w, i + 1))
    return c


def dynamic_nat(rng):
    c = Capture()
    web = "192.0.2.80"
    pubs = ["203.0.113.1", "203.0.113.2", "203.0.113.3"]
    hosts = ["10.0.0.%d" % i for i in range(1, 6)]
    out = lambda t, h, sp: c.add(1, t, tcp(h, web, sp, 80, payload=pad(rng.randrange(30))))
    back = lambda t, pub, dp: c.add(2, t, tcp(web, pub, 80, dp, payload=pad(rng.randrange(30))))
    # Hosts 1 to 3 take the three addresses; host 4 is refused.
    for i in range(4):
        out(1 + i * 100 * MS, hosts[i], 1000 + i)
    for i in range(3):
        back(50 * MS + i * 100 * MS, pubs[i], 1000 + i)
    back(500 * MS, "203.0.113.9", 1000)  # not in the pool: dropped
    # Hosts 2 and 3 stay busy; host 1 falls silent after 1 s.
    out(1 * SEC, hosts[0], 1000)
    for t in range(1, 9):
        out(t * SEC + 10, hosts[1], 1001)
        out(t * SEC + 20, hosts[2], 1002)
    # At 6.5 s host 1's address (lent until 6 s) is free: host 4 gets it,
    # and replies to it go to host 4; host 5 is refused.
    out(6 * SEC + 500 * MS, hosts[3], 1003)
    back(6 * SEC + 600 * MS, pubs[0], 1003)
    out(6 * SEC + 700 * MS, hosts[4], 1004)
    # Host 1 comes back: its context has expired and the pool is full.
    out(7 * SEC, hosts[0], 1000)
    # Everyone silent from 9 s: at 20 s host 5 takes the first address.
    out(20 * SEC, hosts[4], 1004)
    back(20 * SEC + 100 * MS, pubs[0], 1004)
    back(20 * SEC + 200 * MS, pubs[1], 1001)  # lent to nobody now: dropped
    return c


def tcp_conntrack(rng):
    c = Capture()
    h, w = "10.0.0.5", "192.0.2.80"

    def hs(t, sport, cisn=1000, sisn=50000):
        c.add(1, t, tcp(h, w, sport, 80, SYN, seq=cisn))
        c.add(2, t + 1 * MS, tcp(w, h, 80, sport, SYNACK, seq=sisn, ack=cisn + 1))
        c.add(1, t + 2 * MS, tcp(h, w, sport, 80, ACK, seq=cisn + 1, ack=sisn + 1))

    # A: handshake, data both ways, a segment far outside the window
    # (dropped), a retransmission (passes), FINs from both sides and the
    # last ACK, then a late segment (dropped).
    hs(1, 40001)
    c.add(1, 10 * MS, tcp(h, w, 40001, 80, PSHACK, seq=1001, ack=50001, payload=pad(100)))
    c.add(2, 11 * MS, tcp(w, h, 80, 40001, PSHACK, seq=50001, ack=1101, payload=pad(1000)))
    c.add(2, 12 * MS, tcp(w, h, 80, 40001, PSHACK, seq=51001, ack=1101, payload=pad(1000)))
    c.add(2, 13 * MS, tcp(w, h, 80, 40001, PSHACK, seq=250000, ack=1101, payload=pad(10)))
    c.add(2, 14 * MS, tcp(w, h, 80, 40001, PSHACK, seq=50001, ack=1101, payload=pad(1000)))
    c.add(1, 15 * MS, tcp(h, w, 40001, 80, ACK, seq=1101, ack=52001))
    c.add(1, 16 * MS, tcp(h, w, 40001, 80, FINACK, seq=1101, ack=52001))
    c.add(2, 17 * MS, tcp(w, h, 80, 40001, ACK, seq=52001, ack=1102))
    c.add(2, 18 * MS, tcp(w, h, 80, 40001, FINACK, seq=52001, ack=1102))
    c.add(1, 19 * MS, tcp(h, w, 40001, 80, ACK, seq=1102, ack=52002))
    c.add(2, 20 * MS, tcp(w, h, 80, 40001, PSHACK, seq=52002, ack=1102, payload=pad(5)))
    # B: refused (RST-ACK), forgotten, then opened again; a SYN-ACK with
    # the wrong ACK number is dropped.
    c.add(1, 30 * MS, tcp(h, w, 40002, 80, SYN, seq=7000))
    c.add(2, 31 * MS, tcp(w, h, 80, 40002, RSTACK, seq=0, ack=7001))
    c.add(2, 32 * MS, tcp(w, h, 80, 40002, PSHACK, seq=1, ack=7001))
    c.add(1, 33 * MS, tcp(h, w, 40002, 80, SYN, seq=8000))
    c.add(1, 34 * MS, tcp(h, w, 40002, 80, SYN, seq=8000))  # retransmitted SYN
    c.add(2, 35 * MS, tcp(w, h, 80, 40002, SYNACK, seq=90000, ack=8005))
    c.add(2, 36 * MS, tcp(w, h, 80, 40002, SYNACK, seq=90000, ack=8001))
    c.add(2, 37 * MS, tcp(w, h, 80, 40002, SYNACK, seq=90000, ack=8001))  # retransmitted
    c.add(1, 38 * MS, tcp(h, w, 40002, 80, ACK, seq=8001, ack=90001))
    c.add(1, 39 * MS, tcp(h, w, 40002, 80, PSHACK, seq=8001, ack=90001, payload=pad(40)))
    # C: established, then a RST from outside; later segments dropped.
    hs(50 * MS, 40003)
    c.add(2, 60 * MS, tcp(w, h, 80, 40003, RST, seq=50001))
    c.add(1, 61 * MS, tcp(h, w, 40003, 80, PSHACK, seq=1001, ack=50001, payload=pad(10)))
    # D: established, then 31 s idle: forgotten, so its segments drop.
    hs(70 * MS, 40004)
    c.add(1, 80 * MS, tcp(h, w, 40004, 80, PSHACK, seq=1001, ack=50001, payload=pad(10)))
    c.add(1, 31 * SEC, tcp(h, w, 40004, 80, PSHACK, seq=1011, ack=50001, payload=pad(10)))
    # Not connections from inside: a SYN from outside, a stray segment,
    # UDP.
    c.add(2, 90 * MS, tcp(w, h, 80, 40009, SYN, seq=1))
    c.add(1, 91 * MS, tcp(h, w, 40010, 80, PSHACK, seq=1, ack=1))
    c.add(1, 92 * MS, udp(h, w, 5353, 53, pad(12)))
    # E: teardown begun from outside, with a RST-ACK from inside before
    # the end.
    hs(100 * MS, 40005)
    c.add(2, 110 * MS, tcp(w, h, 80, 40005, FINACK, seq=50001, ack=1001))
    c.add(1, 111 * MS, tcp(h, w, 40005, 80, RSTACK, seq=1001, ack=50002))
    c.add(2, 112 * MS, tcp(w, h, 80, 40005, ACK, seq=50002, ack=1001))
    # F: FIN from outside, then inside's, the last ACK from outside; then a
    # late segment from inside (dropped).
    hs(120 * MS, 40006)
    c.add(2, 130 * MS, tcp(w, h, 80, 40006, FINACK, seq=50001, ack=1001))
    c.add(1, 131 * MS, tcp(h, w, 40006, 80, FINACK, seq=1001, ack=50002))
    c.add(2, 132 * MS, tcp(w, h, 80, 40006, ACK, seq=50002, ack=1002))
    c.add(1, 133 * MS, tcp(h, w, 40006, 80, PSHACK, seq=1002, ack=50002, payload=pad(5)))
    # G: a RST-ACK from outside; H: a RST from inside. Each passes; what
    # follows does not.
    hs(140 * MS, 40007)
    c.add(2, 150 * MS, tcp(w, h, 80, 40007, RSTACK, seq=50001, ack=1001))
    c.add(2, 151 * MS, tcp(w, h, 80, 40007, PSHACK, seq=50001, ack=1001, payload=pad(5)))
    hs(160 * MS, 40008)
    c.add(1, 170 * MS, tcp(h, w, 40008, 80, RST, seq=1001))
    c.add(2, 171 * MS, tcp(w, h, 80, 40008, PSHACK, seq=50001, ack=1001, payload=pad(5)))
    return c


# The examples written before these, so the .flick versions of all of
# them run over captures too.
def port_knocking(rng):
    c = Capture()
    srv = "10.0.0.22"
    knock = lambda t, s, p: c.add(1, t, tcp(s, srv, 40000, p, SYN))
    for s, ports, t0 in [
        ("198.51.100.1", [1111, 2222, 3333, 22, 22, 80], 1),
        ("198.51.100.2", [1111, 3333, 22], 2),
        ("198.51.100.3", [22, 1111, 2222], 3),
    ]:
        for i, p in enumerate(ports):
            knock(t0 + i * SEC, s, p)
    knock(20 * SEC, "198.51.100.1", 22)  # idle 14 s: closed again
    knock(20 * SEC + 1, "198.51.100.3", 3333)  # idle too: starts over
    c.add(2, 5 * SEC + 5, tcp(srv, "198.51.100.1", 22, 40000, SYNACK))
    return c


def udp_firewall(rng):
    c = Capture()
    h, d = "10.0.0.1", "8.8.8.8"
    c.add(1, 1 * SEC, udp(h, d, 5000, 53, pad(12)))
    c.add(2, 1 * SEC + 1, udp(d, h, 53, 5001, pad(12)))
    c.add(2, 2 * SEC, udp(d, h, 53, 5000, pad(12)))
    c.add(1, 3 * SEC, tcp(h, d, 5000, 53))
    c.add(2, 40 * SEC, udp(d, h, 53, 5000, pad(12)))
    c.add(1, 41 * SEC, udp(h, d, 5000, 53, pad(12)))
    c.add(2, 42 * SEC, udp(d, h, 53, 5000, pad(12)))
    return c


def big_flows(rng):
    c = Capture()
    for i in range(6):
        c.add(1, i * 10 * MS + 1, udp("10.0.0.1", "10.0.0.2", 1, 2, pad(958)))
        c.add(1, i * 10 * MS + 2, udp("10.0.0.1", "10.0.0.3", 1, 2, pad(rng.randrange(100))))
    c.add(1, 1200 * MS, udp("10.0.0.1", "10.0.0.2", 1, 2, pad(958)))
    return c


PROGRAMS = [
    server_load_balancer,
    flowlet_lb,
    traffic_policer,
    syn_flood,
    tcp_optimistic_ack,
    super_spreader,
    dynamic_nat,
    tcp_conntrack,
    port_knocking,
    udp_firewall,
    big_flows,
]


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/flowblaze/testdata")
    out.mkdir(parents=True, exist_ok=True)
    for seed, program in enumerate(PROGRAMS):
        program(random.Random(100 + seed)).write(out, program.__name__)


if __name__ == "__main__":
    main()
