import os, hashlib, zlib, struct
ROOT = '/work/main/fuzz/corpus'

def h(s): return bytes(int(b, 16) for b in s.split())

seeds = {}
def add(g, unit, stream, cuts=(0, 128, 255)):
    for c in cuts:
        seeds.setdefault(g, []).append(bytes([unit, c]) + stream)

# ---------------- http: header 0, chunk 1, request 2, response 3
P = [b"GET /index.html HTTP/1.1\r\nHost: example.com\r\nConnection: keep-alive\r\n\r\n",
     b"POST /up HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\n\r\nhello",
     b"PUT /c HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5;x=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nTrailer: t\r\n\r\n",
     b"GET /old HTTP/1.0\r\n\r\n"]
add('http', 2, b"".join(P), cuts=(0, 40, 128, 200, 255))
for m in P: add('http', 2, m)
for m in [b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
          b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
          b"GET / HTTP/1.1\r\nX-A: b\r\n  folded\r\n\r\n",
          b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
          b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
          b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
          b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n",
          b"GET / HTTP/2.0\r\n\r\n",
          b"POST / HTTP/1.1\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\nx",
          b"GET /a?b=c HTTP/1.1\r\nHost:example.com\r\nAccept:  */*\r\n\r\n",
          b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
          b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n",
          b"GET /index.html HTTP/1.1\r\nHost: example.com\r\nUser-Agent: test\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n" * 3]:
    add('http', 2, m, cuts=(0, 128))
R = [b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
     b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
     b"HTTP/1.0 200 OK\r\n\r\nuntil the connection closes"]
add('http', 3, b"".join(R), cuts=(0, 60, 128, 200, 255))
for m in R + [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 304 Not Modified\r\nConnection: close\r\n\r\n"]:
    add('http', 3, m)
for m in [b"Host: example.com\r\n", b"X-A: b\r\nContent-Length: 5\r\n", b"Transfer-Encoding:  chunked\r\n"]:
    add('http', 0, m)
for m in [b"5;x=1\r\nhello\r\n", b"0\r\nTrailer: t\r\n\r\n", b"10\r\n0123456789abcdef\r\n", b"0\r\n\r\n3\r\nabc\r\n0\r\n\r\n"]:
    add('http', 1, m)

# ---------------- memcached_binary: cmd 0
GETQ = "80 00 00 05 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 00 00 00 00 00 48 65 6c 6c 6f"
GETR = "81 00 00 00 04 00 00 00 00 00 00 09 00 00 00 00 00 00 00 00 00 00 00 01 de ad be ef 57 6f 72 6c 64"
ADD = "80 02 00 05 08 00 00 00 00 00 00 12 00 00 00 00 00 00 00 00 00 00 00 00 de ad be ef 00 00 0e 10 48 65 6c 6c 6f 57 6f 72 6c 64"
for m in [GETQ, GETR, ADD]:
    add('memcached_binary', 0, h(m))
add('memcached_binary', 0, h(GETQ) + h(ADD) + h(GETR) + h(GETQ), cuts=(0, 30, 64, 128, 200, 255))
setq = bytes([0x80, 0x01, 0, 5, 8, 0, 0, 0, 0, 0, 0, 18, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0x0e, 0x10]) + b"HelloWorld"
add('memcached_binary', 0, setq)
b = bytearray(h(GETQ)); b[0] = 0x42; add('memcached_binary', 0, bytes(b), cuts=(0,))
b = bytearray(h(GETQ)); b[8:12] = b"\xff\xff\xff\xff"; add('memcached_binary', 0, bytes(b), cuts=(0,))
b = bytearray(h(GETQ)); b[2:4] = b"\x01\x00"; add('memcached_binary', 0, bytes(b), cuts=(0,))
def bin_cmd(magic, op, key=b"", extras=b"", value=b"", status=0, opaque=0, cas=0):
    return struct.pack(">BBHBBHIIQ", magic, op, len(key), len(extras), 0, status, len(key)+len(extras)+len(value), opaque, cas) + extras + key + value
for m in [bin_cmd(0x80, 0x05, b"cnt", struct.pack(">QQI", 1, 0, 0)),
          bin_cmd(0x80, 0x1c, b"k", struct.pack(">I", 10)),
          bin_cmd(0x80, 0x1b, b"", struct.pack(">I", 1)),
          bin_cmd(0x80, 0x08, b"", struct.pack(">I", 0)),
          bin_cmd(0x80, 0x0a),
          bin_cmd(0x81, 0x0b, value=b"1.6.21"),
          bin_cmd(0x80, 0x10, b"slabs"),
          bin_cmd(0x81, 0x0c, b"key", struct.pack(">I", 7), b"value", cas=99),
          bin_cmd(0x80, 0x21, b"PLAIN", value=b"\0user\0pass"),
          bin_cmd(0x80, 0x30, b"k", b"xyz", b"v")]:
    add('memcached_binary', 0, m, cuts=(0, 128))

# ---------------- memcached_ascii: arg 0, noreply_arg 1, cas_arg 2, request 3, response 4
REQ = [b"set foo 0 0 3\r\nbar\r\n", b"set foo 4294967295 -1 5 noreply\r\nhello\r\n", b"add k 1 100 0\r\n\r\n",
       b"replace k 7 2592000 4\r\nr\r\nx\r\n", b"append k 0 0 2\r\n\r\n\r\n", b"prepend k 0 0 1 noreply\r\nx\r\n",
       b"cas k 3 60 3 18446744073709551615\r\nabc\r\n", b"cas k 0 0 1 42 noreply\r\nz\r\n", b"get foo\r\n",
       b"gets a bb ccc dddd\r\n", b"gat 100 a b\r\n", b"gats -1 k\r\n", b"touch k 10\r\n", b"touch k 10 noreply\r\n",
       b"delete k\r\n", b"delete k noreply\r\n", b"incr n 5\r\n", b"decr n 18446744073709551615 noreply\r\n",
       b"flush_all\r\n", b"flush_all 60\r\n", b"flush_all noreply\r\n", b"flush_all 60 noreply\r\n", b"version\r\n",
       b"verbosity 1\r\n", b"verbosity 2 noreply\r\n", b"stats\r\n", b"stats cachedump 1 10\r\n", b"quit\r\n",
       b"mg foo s v t f k O123\r\n", b"mg foo\r\n", b"ms foo 2 T90 F5 I\r\nhi\r\n", b"ms foo 0 q\r\n\r\n",
       b"md foo q\r\n", b"ma foo N0 J10 D5 MI v\r\n", b"mn\r\n", b"me foo\r\n"]
RSP = [b"VALUE foo 0 3\r\nbar\r\n", b"VALUE foo 5 4 99\r\n\r\nab\r\n", b"VALUE k 0 0\r\n\r\n",
       b"CLIENT_ERROR bad data chunk\r\n", b"SERVER_ERROR out of memory storing object\r\n", b"STAT pid 1234\r\n",
       b"STAT version 1.6.21 (beta)\r\n", b"VERSION 1.6.21\r\n", b"18446744073709551615\r\n", b"9  \r\n", b"HD\r\n",
       b"HD c5 kfoo O123\r\n", b"VA 2 s2 f0 t-1\r\nhi\r\n", b"VA 0\r\n\r\n", b"NF\r\n", b"NS O1\r\n", b"EX c7\r\n",
       b"ME foo exp=-1 la=3 cas=2 fetch=no cls=1 size=63\r\n"] + \
      [r.encode() + b"\r\n" for r in ["END", "STORED", "NOT_STORED", "EXISTS", "NOT_FOUND", "DELETED", "TOUCHED", "OK", "ERROR", "EN", "MN"]]
for m in REQ: add('memcached_ascii', 3, m, cuts=(0, 128))
for m in RSP: add('memcached_ascii', 4, m, cuts=(0, 128))
add('memcached_ascii', 3, b"".join(REQ), cuts=(0, 50, 128, 255))
add('memcached_ascii', 4, b"".join(RSP), cuts=(0, 50, 128, 255))
BAD = [b"set k 0 0 abc\r\nabc\r\n", b"set k 0 0 -3\r\nabc\r\n", b"set k x 0 3\r\nabc\r\n", b"set k 4294967296 0 3\r\nabc\r\n",
       b"incr k -1\r\n", b"incr k 18446744073709551616\r\n", b"ms k two\r\nhi\r\n", b"flush_all soon\r\n",
       b"set k 0 0 3\r\nabcd\r\n", b"ms k 1 T0\r\nab\r\n", b"set k 0 0 1048577\r\n", b"bogus k\r\n", b"GET k\r\n", b"\r\n",
       b"lru_crawler_metadump all\r\n", b"get\r\n", b"get \r\n", b"get a  b\r\n", b"set k 0 0\r\nabc\r\n",
       b"cas k 0 0 3\r\nabc\r\n", b"delete k 0 noreply\r\n", b"delete k noreply noreply\r\n", b"touch k\r\n",
       b"flush_all 1 2\r\n", b"flush_all noreply 10\r\n", b"flush_all noreply noreply\r\n", b"version now\r\n",
       b"mn\n", b"get k\n", b"get " + b"k" * 300]
for m in BAD: add('memcached_ascii', 3, m, cuts=(0,))
for m in [b"FOO\r\n", b"STORED \r\n", b"VALUE k 0 3\r\nabcd\r\n", b"VALUE k 0\r\n", b"VALUE k 0 1 x\r\na\r\n", b"VA x\r\n",
          b"CLIENT_ERROR\r\n", b"12a\r\n"]:
    add('memcached_ascii', 4, m, cuts=(0,))
for m in [b" foo ", b" k\r\n", b" a b c\r\n"]: add('memcached_ascii', 0, m)
for m in [b" noreply", b" noreply noreply"]: add('memcached_ascii', 1, m)
for m in [b" 42\r\n", b" 18446744073709551615 "]: add('memcached_ascii', 2, m)

# ---------------- hadoop_ifile: record 0, text 1, int_writable 2, long_writable 3, text_int_record 4
def vlong(i):
    if -112 <= i <= 127: return bytes([i & 0xff])
    ln = -112
    if i < 0: i = ~i; ln = -120
    t = i
    while t: t >>= 8; ln -= 1
    out = bytes([ln & 0xff])
    n = -(ln + 120) if ln < -120 else -(ln + 112)
    for idx in range(n, 0, -1): out += bytes([(i >> ((idx - 1) * 8)) & 0xff])
    return out
def record(k, v): return vlong(len(k)) + vlong(len(v)) + k + v
def ifile(recs):
    out = b"".join(record(k, v) for k, v in recs) + vlong(-1) + vlong(-1)
    return out + struct.pack(">I", zlib.crc32(out))
def text(s): return vlong(len(s)) + s
recs = [(b"hello", b"world"), (b"", b""), (b"\xab" * 200, b"\xcd" * 300), (text(b"the"), struct.pack(">i", 7))]
add('hadoop_ifile', 0, ifile(recs), cuts=(0, 10, 64, 128, 200, 255))
add('hadoop_ifile', 0, ifile([(b"k1", b"v1"), (b"\x01" * 130, b"\x02" * 260), (b"", b"x")]), cuts=(0, 128))
for n in [0, 1, 127, 128, 255, 256, 1000]:
    add('hadoop_ifile', 0, record(b"k" * min(n, 1000), b"v" * min(n, 1000)), cuts=(0,))
for bad in [b"\xfe\x00", b"\xff\x00", b"\x00\xff", b"\x05\xfe", b"\x8d\x01\x00\x01"]:
    add('hadoop_ifile', 0, bad + b"\0" * 6, cuts=(0,))
for w in [b"apple", b"", b"x" * 200, "héllo".encode()]:
    add('hadoop_ifile', 1, text(w))
for v in [42, -5, 0]: add('hadoop_ifile', 2, struct.pack(">i", v))
add('hadoop_ifile', 2, struct.pack(">iii", 1, 2, 3))
for v in [-1234567890123, 2**63 - 1]: add('hadoop_ifile', 3, struct.pack(">q", v))
tir = b"".join(record(text(w), struct.pack(">i", n)) for w, n in [(b"a", 1), (b"long" * 40, -300), (b"", 0)])
add('hadoop_ifile', 4, tir, cuts=(0, 64, 128, 255))
add('hadoop_ifile', 4, record(text(b"apple"), struct.pack(">i", 42)))
add('hadoop_ifile', 4, bytes([7, 4, 5]) + b"apple" + bytes([0, 0, 0, 42, 0]), cuts=(0,))

# ---------------- packet: ethernet 0, arp 1, ipv4 2, ipv6 3, tcp 4, udp 5, icmp 6
SYN_ETH = "00 1a a0 3b 7c 21 f0 de f1 2c 9e 6b 08 00"
SYN_IP = "45 00 00 3c 8f 3c 40 00 40 06 b3 e5 c0 a8 01 17 5d b8 d8 22"
SYN_TCP = "c8 e8 00 50 3a 1c 5e 77 00 00 00 00 a0 02 fa f0 4a 85 00 00 02 04 05 b4 04 02 08 0a 00 32 a8 f1 00 00 00 00 01 03 03 07"
VLAN = "ff ff ff ff ff ff 00 1b 21 3a 4f 5e 81 00 a0 7b 08 06"
ARP = "00 01 08 00 06 04 00 01 00 1b 21 3a 4f 5e 0a 00 00 01 00 00 00 00 00 00 0a 00 00 02"
IP6 = "60 01 23 45 00 25 11 40 20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 01 20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 02"
UDP = "d4 31 00 35 00 25 54 8d"
ICMP = "08 00 4d 31 00 01 00 2a"
RA = "46 c0 00 20 00 00 40 00 01 02 42 42 c0 a8 01 17 e0 00 00 16 94 04 00 00"
TCP2 = "00 50 c8 e8 00 00 00 01 3a 1c 5e 78 50 12 ff ff 00 00 00 00"
UNREACH = "03 03 fc fc 00 00 00 00"
for unit, msgs in [(0, [SYN_ETH, VLAN]), (1, [ARP]), (2, [SYN_IP, RA]), (3, [IP6]), (4, [SYN_TCP, TCP2]), (5, [UDP]), (6, [ICMP, UNREACH])]:
    for m in msgs: add('packet', unit, h(m))
    add('packet', unit, b"".join(h(m) for m in msgs) * 2, cuts=(0, 64, 128, 200, 255))
for bad in ["44 00 00 14", "65 00 00 14", "46 00 00 14"]:
    add('packet', 2, h(bad) + b"\0" * 56, cuts=(0,))
add('packet', 5, h("00 01 00 02 00 07 00 00"), cuts=(0,))
add('packet', 3, h(SYN_IP), cuts=(0,))
a = bytearray(h(ARP)); a[1] = 6; add('packet', 1, bytes(a), cuts=(0,))

for g, ss in seeds.items():
    d = os.path.join(ROOT, 'wire_' + g)
    os.makedirs(d, exist_ok=True)
    n = 0
    for s in ss:
        name = 'seed-' + hashlib.sha1(s).hexdigest()[:16]
        open(os.path.join(d, name), 'wb').write(s)
        n += 1
    print(g, n, len(os.listdir(d)))
