#!/usr/bin/env bash
# Resident memory per idle client connection: Flick against nginx and HAProxy.
#
# Usage:
#   bench/idle.sh                      # 1k and 10k connections, about 5 minutes once built
#   IDLE_CONNS=1000 bench/idle.sh      # one count
#   SYSTEMS="flick_lb nginx_lb" bench/idle.sh
#
# For each system, bench/idle_client.py opens N connections, sends one
# request on each and reads its reply, holds them all idle for IDLE_HOLD
# seconds, closes them and waits IDLE_SETTLE seconds. The server's resident
# memory (VmRSS, summed over its process group: nginx's master and workers)
# is read before the first connection, while the connections are idle and
# after they closed. Reported: KB per idle connection ((idle - before) / N)
# and the share of that growth given back after closing.
#
#   flick_lb        examples/http_lb.flick in front of two nginx backends
#   flick_static    examples/static_web.flick
#   flick_mc        examples/memcached_ascii_proxy.flick in front of two
#                   memcached servers
#   nginx_lb        nginx as a reverse proxy to the same backends
#                   (keepalive 64 to the upstream)
#   nginx_static    nginx serving a 137-byte file
#   haproxy_lb      HAProxy (mode http, http-reuse always) to the same backends
#
# Every server runs with WORKERS workers (Flick --workers, nginx
# worker_processes, HAProxy nbthread; default 2). Flick runs with its
# defaults unless FLICK_ARGS says otherwise (e.g. FLICK_ARGS="--max-instances
# 20000" for a build whose default is lower than the count).
#
# Writes bench/results/idle.md (table) and idle.json (every figure). Only
# 127.0.0.1 ports BASE_PORT..BASE_PORT+9 are used (default 23200); every
# process started here is stopped on exit; each run is bounded in time. Not
# a test: never run from scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

IDLE_CONNS=${IDLE_CONNS:-"1000 10000"}
SYSTEMS=${SYSTEMS:-"flick_lb flick_static flick_mc nginx_lb nginx_static haproxy_lb"}
WORKERS=${WORKERS:-2}
IDLE_HOLD=${IDLE_HOLD:-5}
IDLE_SETTLE=${IDLE_SETTLE:-5}
BASE_PORT=${BASE_PORT:-23200}
RESULTS=${RESULTS:-bench/results}
TARGET=${CARGO_TARGET_DIR:-target}
FLICK=${FLICK:-$TARGET/release/flick}
FLICK_ARGS=${FLICK_ARGS:-}
# Every connection is a descriptor in the client and in the server (and
# in HAProxy one more while its backend connection is open).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
FD_LIMIT=$(ulimit -n)

B1=$BASE_PORT
B2=$((BASE_PORT + 1))
M1=$((BASE_PORT + 8))
M2=$((BASE_PORT + 9))

WORK=$(mktemp -d -t flick-idle.XXXXXX)
RUNS="$WORK/runs.jsonl"
: >"$RUNS"
pids=()

# stop, start_group, finish, wait_port
source bench/procs.sh

cleanup() {
    local p
    for p in "${pids[@]+"${pids[@]}"}"; do stop "$p"; done
    if [ "${KEEP_WORK:-0}" = 1 ]; then echo "scratch directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# nginx configuration: DIR PORT WORKERS static|proxy (as bench/run.sh's).
nginx_conf() {
    local dir=$1 port=$2 workers=$3 what=$4
    mkdir -p "$dir"
    {
        [ "$workers" -le 1 ] && echo "master_process off;"
        [ "$workers" -gt 1 ] && [ "$(id -u)" = 0 ] && echo "user root;"
        echo "daemon off;"
        echo "worker_processes $workers;"
        echo "worker_rlimit_nofile $FD_LIMIT;"
        echo "pid $dir/nginx.pid;"
        echo "error_log $dir/error.log warn;"
        echo "events { worker_connections $((FD_LIMIT - 100)); }"
        echo "http {"
        echo "    access_log off;"
        local t
        for t in client_body proxy fastcgi uwsgi scgi; do echo "    ${t}_temp_path $dir/$t;"; done
        echo "    keepalive_requests 1000000000;"
        echo "    keepalive_timeout 120s;"
        if [ "$what" = static ]; then
            echo "    server { listen 127.0.0.1:$port backlog=4096; root $WORK/www; location / { } }"
        else
            echo "    upstream backends {"
            echo "        server 127.0.0.1:$B1; server 127.0.0.1:$B2;"
            echo "        keepalive 64; keepalive_requests 1000000000;"
            echo "    }"
            echo "    server {"
            echo "        listen 127.0.0.1:$port backlog=4096;"
            echo "        location / {"
            echo "            proxy_pass http://backends;"
            echo "            proxy_http_version 1.1;"
            echo "            proxy_set_header Connection \"\";"
            echo "        }"
            echo "    }"
        fi
        echo "}"
    } >"$dir/nginx.conf"
}

haproxy_conf() {
    # HAProxy reserves two descriptors per connection it may proxy; idle
    # clients use one (backend connections are reused), so a limit above
    # half the descriptors is allowed (no strict-limits) where the largest
    # count needs it.
    local maxconn=$(((FD_LIMIT - 200) / 2)) most
    most=$(printf '%s\n' $IDLE_CONNS | sort -n | tail -n1)
    [ "$maxconn" -lt $((most + 100)) ] && maxconn=$((most + 100))
    cat >"$1" <<EOF
global
    no strict-limits
    nbthread $3
    maxconn $maxconn
defaults
    mode http
    maxconn $maxconn
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 120s
frontend lb
    bind 127.0.0.1:$2
    default_backend backends
backend backends
    balance roundrobin
    http-reuse always
    server b1 127.0.0.1:$B1
    server b2 127.0.0.1:$B2
EOF
}

# Starts SYSTEM; sets SYS_PID, SYS_PORT and PROTO.
sys_start() {
    local system=$1 log="$WORK/$1.log"
    PROTO=http
    case "$system" in
        flick_lb)
            SYS_PORT=$((BASE_PORT + 2))
            # shellcheck disable=SC2086
            start_group "$log" "$FLICK" run examples/http_lb.flick --listen "client=127.0.0.1:$SYS_PORT" \
                --connect "backends=127.0.0.1:$B1,127.0.0.1:$B2" --workers "$WORKERS" $FLICK_ARGS ;;
        flick_static)
            SYS_PORT=$((BASE_PORT + 3))
            # shellcheck disable=SC2086
            start_group "$log" "$FLICK" run examples/static_web.flick --listen "client=127.0.0.1:$SYS_PORT" \
                --workers "$WORKERS" $FLICK_ARGS ;;
        flick_mc)
            SYS_PORT=$((BASE_PORT + 4))
            PROTO=memcached
            # shellcheck disable=SC2086
            start_group "$log" "$FLICK" run examples/memcached_ascii_proxy.flick \
                --listen "client=127.0.0.1:$SYS_PORT" \
                --connect "backends=127.0.0.1:$M1,127.0.0.1:$M2" --workers "$WORKERS" $FLICK_ARGS ;;
        nginx_lb | nginx_static)
            local what=proxy
            SYS_PORT=$((BASE_PORT + 5))
            [ "$system" = nginx_static ] && { what=static; SYS_PORT=$((BASE_PORT + 6)); }
            nginx_conf "$WORK/$system" "$SYS_PORT" "$WORKERS" "$what"
            start_group "$log" nginx -p "$WORK/$system/" -c "$WORK/$system/nginx.conf" -e "$WORK/$system/error.log" ;;
        haproxy_lb)
            SYS_PORT=$((BASE_PORT + 7))
            haproxy_conf "$WORK/haproxy.cfg" "$SYS_PORT" "$WORKERS"
            start_group "$log" haproxy -db -f "$WORK/haproxy.cfg" ;;
        *) echo "unknown system $system" >&2; exit 2 ;;
    esac
    SYS_PID=$LAST_PID
}

# The backends, up for the whole run: two single-process nginx serving the
# 137-byte file, and two memcached servers.
mkdir -p "$WORK/www"
head -c 137 /dev/zero | tr '\0' 'x' >"$WORK/www/index.html"
for port in "$B1" "$B2"; do
    nginx_conf "$WORK/backend-$port" "$port" 1 static
    start_group "$WORK/backend-$port.log" nginx -p "$WORK/backend-$port/" \
        -c "$WORK/backend-$port/nginx.conf" -e "$WORK/backend-$port/error.log"
done
for port in "$M1" "$M2"; do
    start_group "$WORK/memcached-$port.log" memcached -u "$(id -un)" -l 127.0.0.1 -p "$port" -U 0 -t 1 -c 1024
done
for port in "$B1" "$B2" "$M1" "$M2"; do wait_port "$port"; done
if [[ " $SYSTEMS " == *" flick_"* ]] && [ ! -x "$FLICK" ]; then
    echo "== building flick (release)"
    cargo build --release -q -p flick
fi

echo "== idle connections: $IDLE_CONNS; hold ${IDLE_HOLD}s, settle ${IDLE_SETTLE}s; $WORKERS workers; fd limit $FD_LIMIT"
for conns in $IDLE_CONNS; do
    for system in $SYSTEMS; do
        sys_start "$system"
        if ! wait_port "$SYS_PORT"; then
            printf '{"system": "%s", "conns": %s, "ok": false, "first_error": "never listened"}\n' \
                "$system" "$conns" >>"$RUNS"
            finish "$SYS_PID"
            continue
        fi
        line=$(timeout $((IDLE_HOLD + IDLE_SETTLE + 200)) python3 bench/idle_client.py \
            --port "$SYS_PORT" --pgid "$SYS_PID" --conns "$conns" --proto "$PROTO" \
            --hold "$IDLE_HOLD" --settle "$IDLE_SETTLE" --timeout 150) ||
            line='{"ok": false, "first_error": "the client failed or timed out"}'
        alive=true
        kill -0 "$SYS_PID" 2>/dev/null || alive=false
        finish "$SYS_PID"
        python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r.update(system=sys.argv[2], conns=int(sys.argv[3]), server_alive=sys.argv[4]=="true"); r["ok"]=r.get("ok", False) and r["server_alive"]; print(json.dumps(r))' \
            "$line" "$system" "$conns" "$alive" >>"$RUNS"
        tail -n1 "$RUNS" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   %-13s %6d conns: %s KB/conn idle, before %s KB, idle %s KB, after %s KB%s" % (r["system"], r["conns"], r.get("kb_per_idle_conn"), r.get("rss_kb_before"), r.get("rss_kb_idle"), r.get("rss_kb_after"), "" if r["ok"] else "  FAILED: %s (errors %s, dropped %s)" % (r.get("first_error"), r.get("errors"), r.get("dropped_while_idle"))))'
    done
done

mkdir -p "$RESULTS"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff-index --quiet HEAD -- crates 2>/dev/null || commit="$commit (with uncommitted changes)"
COMMIT=$commit FD_LIMIT=$FD_LIMIT WORKERS=$WORKERS IDLE_HOLD=$IDLE_HOLD IDLE_SETTLE=$IDLE_SETTLE \
    FLICK_ARGS=$FLICK_ARGS NGINX_V=$(nginx -v 2>&1 | sed 's|.*/||') \
    HAPROXY_V=$(haproxy -v 2>/dev/null | head -n1 | awk '{print $3}') \
    python3 - "$RUNS" "$RESULTS" <<'EOF'
import json, os, platform, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
e = os.environ
meta = {
    "commit": e["COMMIT"], "workers": int(e["WORKERS"]), "hold_s": float(e["IDLE_HOLD"]),
    "settle_s": float(e["IDLE_SETTLE"]), "fd_limit": int(e["FD_LIMIT"]), "flick_args": e["FLICK_ARGS"],
    "nginx": e["NGINX_V"], "haproxy": e["HAPROXY_V"], "kernel": platform.release(),
    "cpus": os.cpu_count(),
}
json.dump({"meta": meta, "runs": runs}, open(os.path.join(sys.argv[2], "idle.json"), "w"), indent=1)
failed = [r for r in runs if not r.get("ok")]
out = ["# Idle connections: resident memory per connection", ""]
if failed:
    out += ["**%d run(s) failed**: %s" % (len(failed), "; ".join(
        "%s at %s: %s" % (r["system"], r["conns"], r.get("first_error")) for r in failed)), ""]
out += ["Commit %s; %d workers each; one request per connection, then held idle %gs; "
        "measured again %gs after closing. VmRSS summed over each server's processes. "
        "Flick arguments: `%s`. nginx %s, HAProxy %s, Linux %s, %d CPUs." % (
        meta["commit"], meta["workers"], meta["hold_s"], meta["settle_s"], meta["flick_args"] or "(defaults)",
        meta["nginx"], meta["haproxy"], meta["kernel"], meta["cpus"]), "",
        "| system | conns | held | KB per idle conn | RSS before (KB) | RSS after last reply (KB) | RSS idle (KB) | RSS after close (KB) | growth returned | ok |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
for r in runs:
    rf = r.get("returned_fraction")
    out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        r["system"], r["conns"], r.get("held", "-"), r.get("kb_per_idle_conn", "-"),
        r.get("rss_kb_before", "-"), r.get("rss_kb_busy", "-"), r.get("rss_kb_idle", "-"), r.get("rss_kb_after", "-"),
        "-" if rf is None else "%d%%" % round(100 * rf), "yes" if r.get("ok") else "**no**"))
open(os.path.join(sys.argv[2], "idle.md"), "w").write("\n".join(out) + "\n")
print("\n".join(out))
sys.exit(1 if failed else 0)
EOF
