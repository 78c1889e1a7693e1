#!/usr/bin/env python3
"""Idle-connection memory: opens N connections to a server, sends one request
on each and reads its reply, holds them all idle, then closes them, and
measures the server's resident memory (VmRSS, summed over its process group)
before, while idle and after. Prints one JSON object.

Used by bench/idle.sh; runs on its own too:

    python3 bench/idle_client.py --port 8080 --pgid 1234 --conns 1000 --proto http
"""
import argparse
import json
import os
import socket
import sys
import time

REQUESTS = {
    "http": b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    # A miss answers END; a hit VALUE ... END: either way the reply ends so.
    "memcached": b"get idle_key\r\n",
}


def rss_kb(pgid):
    """VmRSS of every process in group `pgid`, summed, in KB."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            # Fields after the command (which may hold spaces) in parentheses.
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid:
                continue
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total


def reply_done(proto, buf):
    if proto == "memcached":
        return buf.endswith(b"END\r\n") or buf.endswith(b"ERROR\r\n")
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return True


def exchange(sock, proto, deadline):
    sock.sendall(REQUESTS[proto])
    buf = b""
    while not reply_done(proto, buf):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the reply was whole")
        buf += chunk
    if proto == "http" and not buf.startswith(b"HTTP/1.1 200"):
        raise ConnectionError("status " + buf.split(b"\r\n", 1)[0].decode(errors="replace"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pgid", type=int, required=True)
    ap.add_argument("--conns", type=int, required=True)
    ap.add_argument("--proto", choices=sorted(REQUESTS), default="http")
    ap.add_argument("--hold", type=float, default=5.0, help="seconds held idle before measuring")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds after closing before measuring")
    ap.add_argument("--timeout", type=float, default=120.0, help="bound on opening all connections")
    a = ap.parse_args()

    time.sleep(1.0)
    before = rss_kb(a.pgid)
    socks, errors, first_error = [], 0, None
    start = time.monotonic()
    deadline = start + a.timeout
    for _ in range(a.conns):
        if time.monotonic() > deadline:
            errors += 1
            first_error = first_error or "timed out opening connections"
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            s.settimeout(10)
            s.connect(("127.0.0.1", a.port))
            exchange(s, a.proto, time.monotonic() + 10)
            socks.append(s)
        except (OSError, ConnectionError) as e:
            errors += 1
            first_error = first_error or f"{type(e).__name__}: {e}"
            s.close()
    opened = time.monotonic() - start
    # Right after the last reply, then after holding every connection idle.
    busy = rss_kb(a.pgid)
    time.sleep(a.hold)
    idle = rss_kb(a.pgid)
    # Every connection must still be open: a reset or close while idle is
    # a failure.
    dropped = 0
    for s in socks:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                dropped += 1
        except BlockingIOError:
            pass
        except OSError:
            dropped += 1
    for s in socks:
        s.close()
    time.sleep(a.settle)
    after = rss_kb(a.pgid)
    held = len(socks)
    growth = idle - before
    print(
        json.dumps(
            {
                "conns": a.conns,
                "held": held,
                "errors": errors,
                "first_error": first_error,
                "dropped_while_idle": dropped,
                "open_seconds": round(opened, 2),
                "rss_kb_before": before,
                "rss_kb_busy": busy,
                "rss_kb_idle": idle,
                "rss_kb_after": after,
                "kb_per_idle_conn": round(growth / held, 2) if held else None,
                # Of what the idle connections added, the share given back
                # once they closed.
                "returned_fraction": round((idle - after) / growth, 2) if growth > 0 else None,
                "ok": errors == 0 and dropped == 0,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
