#!/usr/bin/env python3
"""A fixed scenario with pymemcache (the Memcached text protocol).

Usage: pymemcache_scenario.py HOST PORT

Runs set/get/get_many/gets/cas/add/replace/append/prepend/delete/incr/
decr/touch (with and without noreply), values with every byte value and
with reply-like bytes, keys spread over several servers, version and
stats against HOST:PORT (a memcached, or a proxy in front of several), and
exits non-zero on the first mismatch. The keys carry the process id and
the time, so runs do not meet; nothing is flushed.
"""

import os
import sys
import time

from pymemcache.client.base import Client

checks = 0


def check(what, got, want):
    global checks
    checks += 1
    if got != want:
        print(f"MISMATCH {what}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    run = f"pym{os.getpid()}t{int(time.time() * 1000) % 10**9}"
    c = Client((host, port), connect_timeout=10, timeout=20, no_delay=True,
               default_noreply=False)

    def k(name):
        return f"{run}:{name}"

    values = {
        "empty": b"",
        "plain": b"hello",
        "bytes": bytes(range(256)),
        "lines": b"a\r\nEND\r\nVALUE x 0 1\r\nSTORED\r\nMN\r\n\r\n",
        "big": bytes((i * 7) % 256 for i in range(300_000)),
    }
    for name, v in values.items():
        check(f"set {name}", c.set(k(name), v), True)
        check(f"get {name}", c.get(k(name)), v)

    # Many keys, so that they land on every server behind a proxy.
    many = {k(f"m{i}"): f"value-{i}".encode() * (i + 1) for i in range(40)}
    check("set_many", c.set_many(many), [])
    check("get_many", c.get_many(list(many) + [k("missing")]), many)
    check("get_many in reverse",
          list(c.get_many(list(reversed(list(many)))).items()),
          [(key, many[key]) for key in reversed(list(many))])
    check("get missing", c.get(k("missing")), None)

    # Flags travel with the value.
    check("set flags", c.set(k("flagged"), b"f", flags=42), True)
    check("raw get flags", c.raw_command(f"get {k('flagged')}".encode(), b"END\r\n"),
          f"VALUE {k('flagged')} 42 1\r\nf\r\n".encode())

    # noreply: nothing comes back, and the next reply is the next command's.
    check("set noreply", c.set(k("nr"), b"quiet", noreply=True), True)
    check("get after noreply", c.get(k("nr")), b"quiet")
    check("add noreply (exists)", c.add(k("nr"), b"x", noreply=True), True)
    check("append noreply", c.append(k("nr"), b"+tail", noreply=True), True)
    check("prepend noreply", c.prepend(k("nr"), b"head+", noreply=True), True)
    check("get after noreplies", c.get(k("nr")), b"head+quiet+tail")
    check("delete noreply", c.delete(k("nr"), noreply=True), True)
    check("get deleted", c.get(k("nr")), None)
    check("incr noreply", c.incr(k("plain"), 1, noreply=True), None)
    check("version after noreplies", bool(c.version()), True)

    # add, replace, append, prepend with replies.
    check("add new", c.add(k("a"), b"1"), True)
    check("add exists", c.add(k("a"), b"2"), False)
    check("replace exists", c.replace(k("a"), b"3"), True)
    check("replace missing", c.replace(k("no-such"), b"3"), False)
    check("append", c.append(k("a"), b"4"), True)
    check("prepend", c.prepend(k("a"), b"2"), True)
    check("append missing", c.append(k("no-such"), b"x"), False)
    check("get a", c.get(k("a")), b"234")

    # incr and decr.
    check("set counter", c.set(k("n"), b"10"), True)
    check("incr", c.incr(k("n"), 5), 15)
    check("decr", c.decr(k("n"), 20), 0)
    check("incr", c.incr(k("n"), 10), 10)
    # The sum wraps at 2^64. A stored value of 2^63 or more is not
    # incremented again: memcached 1.6.18's safe_strtoull looks for a '-'
    # with strchr, which reads past the value into whatever follows it in
    # the slab and answers "non-numeric" when that memory holds a '-'.
    check("incr wraps", c.incr(k("n"), 2**64 - 3), 7)
    check("incr missing", c.incr(k("no-such"), 1), None)
    try:
        c.incr(k("plain"), 1)
        check("incr non-numeric raises", False, True)
    except Exception as e:  # MemcacheClientError
        check("incr non-numeric", "non-numeric" in str(e), True)

    # gets and cas.
    value, cas = c.gets(k("a"))
    check("gets value", value, b"234")
    check("cas matches", c.cas(k("a"), b"new", cas), True)
    check("cas stale", c.cas(k("a"), b"newer", cas), False)
    check("cas missing", c.cas(k("no-such"), b"x", cas), None)
    value, cas2 = c.gets(k("a"))
    check("gets after cas", value, b"new")
    check("cas changed", cas2 != cas, True)
    got = c.gets_many([k("a"), k("plain"), k("missing")])
    check("gets_many keys", sorted(got), sorted([k("a"), k("plain")]))
    check("gets_many cas", got[k("a")], (b"new", cas2))

    # touch.
    check("touch", c.touch(k("a"), 3600), True)
    check("touch missing", c.touch(k("no-such"), 3600), False)
    check("touch noreply", c.touch(k("a"), 0, noreply=True), True)
    check("get after touch", c.get(k("a")), b"new")
    check("set expired", c.set(k("gone"), b"x", expire=-1), True)
    check("get expired", c.get(k("gone")), None)

    # delete and delete_many.
    check("delete", c.delete(k("a")), True)
    check("delete again", c.delete(k("a")), False)
    check("delete_many", c.delete_many(list(many)), True)
    check("get_many deleted", c.get_many(list(many)), {})

    # Everything the first loop stored is still there.
    for name, v in values.items():
        check(f"get {name} again", c.get(k(name)), v)

    check("version", c.version().startswith(b"1."), True)
    stats = c.stats()
    check("stats has pid", b"pid" in stats, True)
    check("stats has curr_items", b"curr_items" in stats, True)
    c.close()
    print(f"pymemcache: {checks} checks passed against {host}:{port}")


if __name__ == "__main__":
    main()
