#!/usr/bin/env python3
"""A fixed scenario with python-binary-memcached (module `bmemcached`, the
Memcached binary protocol).

Usage: bmemcached_scenario.py HOST PORT

Runs set/get/get_multi (quiet GETKQ requests fenced by a no-op)/set_multi
(quiet SETQ requests)/gets/cas/add/replace/delete/delete_multi/incr/decr,
values with every byte value and with reply-like bytes, keys spread over
several servers, and stats against HOST:PORT (a memcached, or a proxy in
front of several), and exits non-zero on the first mismatch. The keys
carry the process id and the time, so runs do not meet; nothing is
flushed.
"""

import os
import struct
import sys
import time

import bmemcached

checks = 0


def check(what, got, want):
    global checks
    checks += 1
    if got != want:
        print(f"MISMATCH {what}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    run = f"bmc{os.getpid()}t{int(time.time() * 1000) % 10**9}"
    # raw_data: values are bytes in and bytes out, never pickled.
    c = bmemcached.Client([f"{host}:{port}"], socket_timeout=20, raw_data=True)

    def k(name):
        return f"{run}:{name}"

    values = {
        "empty": b"",
        "plain": b"hello",
        "bytes": bytes(range(256)),
        "frames": struct.pack(">BBHBBHIIQ", 0x81, 0, 0, 0, 0, 0, 0, 0, 0) * 3,
        "big": bytes((i * 7) % 256 for i in range(300_000)),
    }
    for name, v in values.items():
        check(f"set {name}", c.set(k(name), v), True)
        check(f"get {name}", c.get(k(name)), v)

    # Many keys, so that they land on every server behind a proxy: set_multi
    # sends quiet sets, get_multi quiet gets, each batch ended by a no-op.
    many = {k(f"m{i}"): f"value-{i}".encode() * (i + 1) for i in range(40)}
    check("set_multi (keys that failed)", c.set_multi(many, time=0), [])
    check("get_multi", c.get_multi(list(many) + [k("missing")]), many)
    check("get missing", c.get(k("missing")), None)

    # add, replace.
    check("add new", c.add(k("a"), b"1"), True)
    check("add exists", c.add(k("a"), b"2"), False)
    check("replace exists", c.replace(k("a"), b"3"), True)
    check("replace missing", c.replace(k("no-such"), b"3"), False)
    check("get a", c.get(k("a")), b"3")

    # incr and decr: a missing key takes the default.
    check("incr creates", c.incr(k("n"), 5), 0)
    check("incr", c.incr(k("n"), 5), 5)
    check("decr", c.decr(k("n"), 20), 0)
    check("incr", c.incr(k("n"), 10), 10)
    # The sum wraps at 2^64. A stored value of 2^63 or more is not
    # incremented again: memcached 1.6.18's safe_strtoull looks for a '-'
    # with strchr, which reads past the value into whatever follows it in
    # the slab and answers "non-numeric" when that memory holds a '-'.
    check("incr wraps", c.incr(k("n"), 2**64 - 3), 7)
    # memcached keeps the length the number had, padded with spaces.
    check("get counter", c.get(k("n")).rstrip(b" "), b"7")

    # gets and cas.
    value, cas = c.gets(k("a"))
    check("gets value", value, b"3")
    check("cas matches", c.cas(k("a"), b"new", cas), True)
    check("cas stale", c.cas(k("a"), b"newer", cas), False)
    check("get after cas", c.get(k("a")), b"new")
    ok, new_cas = c.set(k("a"), b"again", get_cas=True)
    check("set with cas", (ok, new_cas != cas), (True, True))
    check("gets cas is set's", c.gets(k("a")), (b"again", new_cas))
    got = c.get_multi([k("a"), k("plain")], get_cas=True)
    check("get_multi with cas", got[k("a")], (b"again", new_cas))

    # delete and delete_multi.
    check("delete with a stale cas", c.delete(k("a"), cas=cas), False)
    check("get after a refused delete", c.get(k("a")), b"again")
    check("delete", c.delete(k("a")), True)
    # The library reports a missing key as deleted too.
    check("delete again", c.delete(k("a")), True)
    check("get deleted", c.get(k("a")), None)
    check("delete_multi", c.delete_multi(list(many)), True)
    check("get_multi deleted", c.get_multi(list(many)), {})

    # Everything the first loop stored is still there.
    for name, v in values.items():
        check(f"get {name} again", c.get(k(name)), v)

    stats = c.stats()
    check("stats of one server", len(stats), 1)
    server_stats = next(iter(stats.values()))
    check("stats has pid", "pid" in server_stats or b"pid" in server_stats, True)
    c.disconnect_all()
    print(f"bmemcached: {checks} checks passed against {host}:{port}")


if __name__ == "__main__":
    main()
