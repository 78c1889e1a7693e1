#!/usr/bin/env bash
# Side-by-side benchmarks of Flick's services against what they replace.
#
# Usage:
#   bench/run.sh             # full run, about 20 minutes once built
#   QUICK=1 bench/run.sh     # short runs, about 6 minutes once built
#
# It installs what it needs and is missing (memcached, libmemcached-tools for
# memaslap, nutcracker (twemproxy), wrk, nginx-light, haproxy, matplotlib),
# builds the release binaries, runs every benchmark REPS times (HTTP:
# HTTP_REPS) with the systems alternating run by run, and writes
# bench/results/results.md, results.json (every figure of every run) and
# PNG plots. It exits non-zero if any run failed or produced wrong output.
#
#   memcached_binary  memaslap (binary protocol, 90% get / 10% set, 64-byte
#                     values) against examples/memcached_proxy.flick with 1
#                     and 2 workers in front of four memcached servers, and
#                     against one memcached server directly.
#   hadoop            8 mapper connections send sorted word-count IFiles to
#                     examples/hadoop_wordcount.flick (1 and 2 workers) and
#                     to the hand-written combiner (bench/ifile_combiner);
#                     MB/s of mapper input, first byte sent to reducer EOF.
#                     Every reducer stream is checked and compared byte for
#                     byte with Hadoop's own merge (interop/hadoop) when Java
#                     and Maven are present.
#   memcached_ascii   memaslap (text protocol, same workload, --verify=0.05)
#                     against examples/memcached_ascii_proxy.flick with 1 and
#                     2 workers and against twemproxy (single-threaded), each
#                     in front of the same four memcached servers, and one
#                     memcached server directly. A get miss or a failed
#                     verification fails the run.
#   http              wrk -t 2 at 100, 400 and 1600 connections (QUICK: 100,
#                     400), keep-alive and one request per connection, GET
#                     of a 137-byte file. Balancing: examples/http_lb.flick
#                     (1 and 2 workers), nginx as a reverse proxy (1 and 2
#                     worker processes) and HAProxy (nbthread 1 and 2), each
#                     in front of the same two nginx backends. Static:
#                     examples/static_web.flick (1 and 2 workers; a fixed
#                     response of 137 bytes, head and body) against nginx
#                     serving the 137-byte file (1 and 2 worker processes).
#                     A run with socket errors or non-2xx responses fails.
#
# Settings (environment): QUICK=1, REPS (default 5, QUICK 3), MC_SECONDS
# (memaslap seconds per run: 10, QUICK 3), HADOOP_WORDS (words over all
# mappers: 4000000, QUICK 1000000), HTTP_REPS (3, QUICK 1), HTTP_SECONDS
# (wrk seconds per run: 4, QUICK 3), HTTP_CONNS ("100 400 1600", QUICK
# "100 400"), BENCHES (space-separated subset of
# "memcached_binary memcached_ascii http hadoop"), PROFILE=0 to skip the
# perf profiles (the aggregator during one extra Hadoop run, the HTTP load
# balancer during one extra keep-alive run), BASE_PORT (default 23100; the ports
# BASE_PORT..BASE_PORT+19 on 127.0.0.1 are used), RESULTS (output
# directory, default bench/results), KEEP_WORK=1 to keep the scratch
# directory (logs, reducer streams, perf data).
#
# Not a test: never run from scripts/test.sh. Only 127.0.0.1 is used, every
# run is bounded in time, and every process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

# Flick's limit of client connections at once, raised (as the peers'
# connection limits are) above the largest connection count wrk opens.
FLICK_MAX_INSTANCES=${FLICK_MAX_INSTANCES:-4096}
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
    REPS=${REPS:-3}; MC_SECONDS=${MC_SECONDS:-3}; HADOOP_WORDS=${HADOOP_WORDS:-1000000}
    HTTP_REPS=${HTTP_REPS:-1}; HTTP_SECONDS=${HTTP_SECONDS:-3}; HTTP_CONNS=${HTTP_CONNS:-"100 400"}
    PROFILE=${PROFILE:-0}
else
    REPS=${REPS:-5}; MC_SECONDS=${MC_SECONDS:-10}; HADOOP_WORDS=${HADOOP_WORDS:-4000000}
    HTTP_REPS=${HTTP_REPS:-3}; HTTP_SECONDS=${HTTP_SECONDS:-4}; HTTP_CONNS=${HTTP_CONNS:-"100 400 1600"}
    PROFILE=${PROFILE:-1}
fi
BENCHES=${BENCHES:-"memcached_binary memcached_ascii http hadoop"}
BASE_PORT=${BASE_PORT:-23100}
RESULTS=${RESULTS:-bench/results}
TARGET=${CARGO_TARGET_DIR:-target}
# memaslap's workload: -c connections over -T threads, keys and values of
# fixed size, 90% get.
MC_CONCURRENCY=128
MC_THREADS=2
KEY_BYTES=16
VALUE_BYTES=64
GET_PERCENT=90
# A run that takes longer than this is a hang, and is reported as one.
HADOOP_TIMEOUT_S=120
# The ASCII benchmark also checks this fraction of the values it gets.
ASCII_VERIFY=0.05
# wrk: threads, and the size of the file the backends serve.
HTTP_THREADS=2
HTTP_BODY_BYTES=137
# High connection counts need file descriptors: as many as the hard limit
# allows, up to 65536.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
FD_LIMIT=$(ulimit -n)

WORK=$(mktemp -d -t flick-bench.XXXXXX)
RUNS="$WORK/runs.jsonl"
SKIPPED="$WORK/skipped.jsonl"
: >"$RUNS"
: >"$SKIPPED"
pids=()

# stop, start_group, finish, wait_port
source bench/procs.sh

cleanup() {
    local p
    for p in "${pids[@]}"; do stop "$p"; done
    if [ "${KEEP_WORK:-0}" = 1 ]; then
        echo "scratch directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a command in the background, logging to $1; its pid is in $LAST_PID.
start() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 &
    LAST_PID=$!
    pids+=("$LAST_PID")
}

skip() {
    echo "== $1: skipped: $2"
    printf '{"bench": "%s", "reason": "%s"}\n' "$1" "$2" >>"$SKIPPED"
}

# ------------------------------------------------------------------ setup

wanted() { case " $BENCHES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

install_missing() {
    local need=() sudo=""
    command -v memcached >/dev/null || need+=(memcached)
    command -v curl >/dev/null || need+=(curl)
    command -v memcaslap >/dev/null || command -v memaslap >/dev/null || need+=(libmemcached-tools)
    if wanted memcached_ascii; then
        command -v nutcracker >/dev/null || need+=(nutcracker)
    fi
    if wanted http; then
        command -v wrk >/dev/null || need+=(wrk)
        command -v nginx >/dev/null || need+=(nginx-light)
        command -v haproxy >/dev/null || need+=(haproxy)
    fi
    if [ ${#need[@]} -gt 0 ]; then
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        echo "== installing ${need[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    if ! python3 -c 'import matplotlib' 2>/dev/null; then
        echo "== installing matplotlib"
        python3 -m pip install --user --quiet matplotlib 2>/dev/null \
            || python3 -m pip install --user --quiet --break-system-packages matplotlib 2>/dev/null \
            || {
                [ "$(id -u)" -eq 0 ] || sudo="sudo"
                DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-matplotlib >/dev/null
            } || echo "matplotlib unavailable: no plots"
    fi
}

install_missing
MEMASLAP=$(command -v memcaslap || command -v memaslap)

echo "== building release binaries"
cargo build --release --quiet -p flick -p ifile-combiner
FLICK="$TARGET/release/flick"
COMBINER="$TARGET/release/ifile-combiner"
DRIVER="$TARGET/release/ifile-driver"

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
LOAD_START=$(loadavg)

# ------------------------------------------------------------ memcached

# memcached_binary and memcached_ascii: memaslap against the Flick proxy
# with 1 and 2 workers (and, for ASCII, twemproxy) in front of four
# memcached servers, and against one memcached server directly.
bench_memcached() {
    local bench=$1 proxy=$BASE_PORT twem=$((BASE_PORT + 1)) direct=$((BASE_PORT + 6))
    local backends=() user=() port i rep program proto=() strict=() systems
    [ "$(id -u)" -eq 0 ] && user=(-u root)
    if [ "$bench" = memcached_binary ]; then
        program=examples/memcached_proxy.flick
        proto=(-B)
        systems=("flick 1" "flick 2" "memcached 0")
    else
        program=examples/memcached_ascii_proxy.flick
        proto=(--verify="$ASCII_VERIFY")
        strict=(--strict)
        systems=("flick 1" "flick 2" "twemproxy 1" "memcached 0")
    fi
    echo "== $bench: memaslap ${proto[*]} -c $MC_CONCURRENCY -T $MC_THREADS -t ${MC_SECONDS}s, $REPS runs each"
    # Four backends for the proxy and one server measured directly, all
    # with memcached's default 4 threads; they stay up for every run.
    for i in 2 3 4 5 6; do
        port=$((BASE_PORT + i))
        start "$WORK/memcached-$port.log" memcached -l 127.0.0.1 -p "$port" -U 0 -m 256 "${user[@]}"
        [ "$i" = 6 ] || backends+=("127.0.0.1:$((BASE_PORT + i))")
    done
    for i in 2 3 4 5; do wait_port $((BASE_PORT + i)); done
    wait_port "$direct"
    local backend_list
    backend_list=$(IFS=,; echo "${backends[*]}")
    # memaslap's workload file (it needs an absolute path): key and value
    # sizes "min max proportion", then commands "type proportion" (0 set,
    # 1 get).
    local cfg="$WORK/memaslap.cfg"
    printf 'key\n%s %s 1\nvalue\n%s %s 1\ncmd\n0 %s\n1 %s\n' \
        "$KEY_BYTES" "$KEY_BYTES" "$VALUE_BYTES" "$VALUE_BYTES" \
        "0.$(printf %02d $((100 - GET_PERCENT)))" "0.$GET_PERCENT" >"$cfg"
    # twemproxy: one connection to each server, opened at start, hashing
    # keys with FNV-1a (64-bit) modulo the number of servers, as the Flick
    # proxy hashes and takes a modulus; no server is ever ejected.
    local twem_cfg="$WORK/twemproxy.yml"
    {
        printf 'pool:\n  listen: 127.0.0.1:%s\n  hash: fnv1a_64\n  distribution: modula\n' "$twem"
        printf '  redis: false\n  server_connections: 1\n  auto_eject_hosts: false\n'
        printf '  preconnect: true\n  timeout: 10000\n  servers:\n'
        for i in 2 3 4 5; do printf '   - 127.0.0.1:%s:1\n' $((BASE_PORT + i)); done
    } >"$twem_cfg"

    local n=${#systems[@]}
    for rep in $(seq "$REPS"); do
        for i in $(seq 0 $((n - 1))); do
            # Rotate the order each round so that drift in the machine's
            # load does not always favour the same system.
            local sys=(${systems[$(((i + rep) % n))]}) target pid="" log
            log="$WORK/memaslap-$bench-${sys[0]}-${sys[1]}-$rep.txt"
            if [ "${sys[0]}" = flick ]; then
                start "$WORK/flick-$bench-${sys[1]}-$rep.log" "$FLICK" run "$program" \
                    --listen "client=127.0.0.1:$proxy" --connect "backends=$backend_list" \
                    --workers "${sys[1]}"
                pid=$LAST_PID
                target=$proxy
            elif [ "${sys[0]}" = twemproxy ]; then
                start "$WORK/twemproxy-$rep.out" nutcracker -c "$twem_cfg" \
                    -s $((BASE_PORT + 7)) -a 127.0.0.1 -o "$WORK/twemproxy-$rep.log"
                pid=$LAST_PID
                target=$twem
            else
                target=$direct
            fi
            if [ -n "$pid" ] && ! wait_port "$target"; then
                finish "$pid"
                printf '{"bench": "%s", "system": "%s", "workers": %s, "rep": %s, "ok": false, "error": "the proxy never listened"}\n' \
                    "$bench" "${sys[0]}" "${sys[1]}" "$rep" >>"$RUNS"
                echo "   ${sys[0]}     workers=${sys[1]} run $rep: FAILED: the proxy never listened"
                continue
            fi
            # -S prints the latency statistics at the end; memaslap gets
            # twice its duration before it counts as hung.
            timeout $((2 * MC_SECONDS + 20)) "$MEMASLAP" -s "127.0.0.1:$target" "${proto[@]}" \
                -c "$MC_CONCURRENCY" -T "$MC_THREADS" -t "${MC_SECONDS}s" -S "${MC_SECONDS}s" \
                -F "$cfg" >"$log" 2>&1 || echo "memaslap exited with status $?" >>"$log"
            local alive=true
            if [ -n "$pid" ]; then
                kill -0 "$pid" 2>/dev/null || alive=false
                finish "$pid"
            fi
            python3 bench/report.py memaslap "$log" --bench "$bench" "${strict[@]}" \
                --system "${sys[0]}" --workers "${sys[1]}" \
                --rep "$rep" --field "server_alive_at_end=$alive" >>"$RUNS"
            tail -n1 "$RUNS" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   %-9s workers=%s run %s: %s ops/s%s" % (r["system"], r["workers"], r["rep"], r.get("ops_per_s"), "" if r["ok"] else "  FAILED: " + str(r.get("error"))))'
        done
    done
    local p
    for p in "${pids[@]}"; do finish "$p"; done
}

bench_memcached_binary() { bench_memcached memcached_binary; }
bench_memcached_ascii() { bench_memcached memcached_ascii; }

# ---------------------------------------------------------------- hadoop

HADOOP_INPUT=""
HADOOP_REFERENCE=""
PROFILE_FILE=""

bench_hadoop() {
    local data="$WORK/hadoop" jar="" mappers=$((BASE_PORT + 10)) reducer=$((BASE_PORT + 11))
    mkdir -p "$data"
    if command -v java >/dev/null && command -v mvn >/dev/null && jar=$(interop/hadoop/build.sh); then
        echo "== hadoop: generating $HADOOP_WORDS words of map output with Hadoop's IFile.Writer"
        java -jar "$jar" generate --mappers 8 --words "$HADOOP_WORDS" --seed 42 --vocab 3000 \
            --no-text --out "$data" >/dev/null
        java -jar "$jar" merge --out "$data/reference.ifile" "$data"/mapper-?.ifile >/dev/null
        HADOOP_INPUT="Hadoop's IFile.Writer (interop/hadoop generate --seed 42 --vocab 3000)"
        HADOOP_REFERENCE="Hadoop's reference merge (interop/hadoop merge)"
    else
        jar=""
        echo "== hadoop: no Java/Maven; generating $HADOOP_WORDS words of map output with ifile-driver"
        "$DRIVER" generate --mappers 8 --words "$HADOOP_WORDS" --seed 42 --vocab 3000 --out "$data"
        HADOOP_INPUT="ifile-driver generate --seed 42 --vocab 3000 (no Java here)"
        HADOOP_REFERENCE="the first combiner run's output"
    fi
    local inputs=("$data"/mapper-?.ifile)

    # One run: start the system, drive it, stop it, record the figures.
    hadoop_run() {
        local system=$1 workers=$2 rep=$3 out="$WORK/reducer-$1-$2-$3.ifile" pid log
        log="$WORK/hadoop-$system-$workers-$rep.log"
        if [ "$system" = flick ]; then
            start "$log" "$FLICK" run examples/hadoop_wordcount.flick \
                --listen "mappers=127.0.0.1:$mappers" --fan-in mappers=8 \
                --connect "reducer=127.0.0.1:$reducer" --workers "$workers"
        else
            start "$log" "$COMBINER" --listen "127.0.0.1:$mappers" \
                --connect "127.0.0.1:$reducer" --mappers 8 --once
        fi
        pid=$LAST_PID
        local result
        result=$("$DRIVER" run --mappers "127.0.0.1:$mappers" --reducer "127.0.0.1:$reducer" \
            --timeout-s "$HADOOP_TIMEOUT_S" --expected "$data/expected.tsv" --out "$out" \
            "${inputs[@]}" 2>&1) || true
        local alive=true
        kill -0 "$pid" 2>/dev/null || alive=false
        [ "$system" = combiner ] && alive=true   # --once: it exits after the group
        finish "$pid"
        if [ ! -f "$data/reference.ifile" ] && [ "$system" = combiner ] && [ -s "$out" ]; then
            cp "$out" "$data/reference.ifile"
        fi
        local same=false java_ok=null
        cmp -s "$out" "$data/reference.ifile" && same=true
        if [ -n "$jar" ] && [ "$rep" = 1 ]; then
            java_ok=false
            java -jar "$jar" verify --in "$out" --expected "$data/expected.tsv" >>"$log" 2>&1 && java_ok=true
        fi
        echo "$result" | python3 bench/report.py tag --bench hadoop --system "$system" \
            --workers "$workers" --rep "$rep" --field "identical_to_reference=$same" \
            --field "hadoop_verify_ok=$java_ok" --field "server_alive_at_end=$alive" >>"$RUNS"
        tail -n1 "$RUNS" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   %-9s workers=%s run %s: %s MB/s, %s s%s" % (r["system"], r["workers"], r["rep"], r.get("mb_per_s"), r.get("seconds"), "" if r["ok"] else "  WRONG OR FAILED: " + str(r.get("error"))))'
        if [ "$java_ok" = false ]; then
            echo "   WRONG OUTPUT: Hadoop's IFile.Reader rejects the $system reducer stream:" >&2
            tail -n3 "$log" >&2
        fi
    }

    echo "== hadoop: 8 mappers, $REPS runs each"
    # The combiner first, so that without Java its output is the reference.
    local systems=("combiner 0" "flick 1" "flick 2") n=3 rep i
    for rep in $(seq "$REPS"); do
        for i in $(seq 0 $((n - 1))); do
            local sys=(${systems[$(((i + rep - 1) % n))]})
            hadoop_run "${sys[0]}" "${sys[1]}" "$rep"
        done
    done

    if [ "$PROFILE" = 1 ] && command -v perf >/dev/null; then
        echo "== hadoop: perf profile of the Flick aggregator (1 worker), one extra run"
        start "$WORK/hadoop-profile.log" "$FLICK" run examples/hadoop_wordcount.flick \
            --listen "mappers=127.0.0.1:$mappers" --fan-in mappers=8 \
            --connect "reducer=127.0.0.1:$reducer" --workers 1
        local fpid=$LAST_PID
        sleep 0.3
        start "$WORK/perf-record.log" perf record -F 999 -g -o "$WORK/perf.data" -p "$fpid"
        local ppid=$LAST_PID
        "$DRIVER" run --mappers "127.0.0.1:$mappers" --reducer "127.0.0.1:$reducer" \
            --timeout-s "$HADOOP_TIMEOUT_S" "${inputs[@]}" >/dev/null 2>&1 || true
        kill -INT "$ppid" 2>/dev/null || true
        wait "$ppid" 2>/dev/null || true
        finish "$ppid"
        finish "$fpid"
        perf report -i "$WORK/perf.data" --no-children --sort symbol -g none --stdio 2>/dev/null \
            | grep -E '^ +[0-9.]+%' | sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/ +$//' \
            >"$WORK/perf.txt" || true
        if [ -s "$WORK/perf.txt" ]; then PROFILE_FILE="$WORK/perf.txt"; fi
    fi
}

# ------------------------------------------------------------------ http

HTTP_PROFILE_FILE=""

# Writes an nginx configuration: DIR PORT WORKERS static|proxy. One worker
# runs as a single process (no master); more run under a master process.
# Both stay in the foreground (daemon off) so that `stop` can reach them.
nginx_conf() {
    local dir=$1 port=$2 workers=$3 what=$4
    mkdir -p "$dir"
    {
        [ "$workers" -le 1 ] && echo "master_process off;"
        # A master started as root runs its workers as nobody, who cannot
        # read the scratch directory: keep them as root (127.0.0.1 only).
        [ "$workers" -gt 1 ] && [ "$(id -u)" = 0 ] && echo "user root;"
        echo "daemon off;"
        echo "worker_processes $workers;"
        echo "pid $dir/nginx.pid;"
        echo "error_log $dir/error.log warn;"
        echo "events { worker_connections 16384; }"
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
            echo "        server 127.0.0.1:$HTTP_B1; server 127.0.0.1:$HTTP_B2;"
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

# Writes an HAProxy configuration: FILE PORT THREADS.
haproxy_conf() {
    local maxconn=$(((FD_LIMIT - 200) / 2))
    [ "$maxconn" -gt 20000 ] && maxconn=20000
    cat >"$1" <<EOF
global
    nbthread $3
    maxconn $maxconn
defaults
    mode http
    maxconn $maxconn
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
frontend lb
    bind 127.0.0.1:$2
    default_backend backends
backend backends
    balance roundrobin
    http-reuse always
    server b1 127.0.0.1:$HTTP_B1
    server b2 127.0.0.1:$HTTP_B2
EOF
}

# Starts one system: a balancer in front of the backends (flick, nginx,
# haproxy) or a static web server (flick_static, nginx_static: nginx serving
# the backends' file, with its own worker processes); sets SYS_PID and
# SYS_PORT.
http_start() {
    local system=$1 workers=$2 tag=$3
    SYS_PID=""
    case "$system" in
        flick)
            SYS_PORT=$((BASE_PORT + 14))
            start "$WORK/flick-http-$tag.log" "$FLICK" run examples/http_lb.flick \
                --listen "client=127.0.0.1:$SYS_PORT" \
                --connect "backends=127.0.0.1:$HTTP_B1,127.0.0.1:$HTTP_B2" --workers "$workers" \
                --max-instances "$FLICK_MAX_INSTANCES"
            SYS_PID=$LAST_PID ;;
        nginx)
            SYS_PORT=$((BASE_PORT + 15))
            local dir="$WORK/nginx-proxy-$workers"
            [ -f "$dir/nginx.conf" ] || nginx_conf "$dir" "$SYS_PORT" "$workers" proxy
            start_group "$WORK/nginx-proxy-$tag.log" nginx -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log"
            SYS_PID=$LAST_PID ;;
        haproxy)
            SYS_PORT=$((BASE_PORT + 16))
            [ -f "$WORK/haproxy-$workers.cfg" ] || haproxy_conf "$WORK/haproxy-$workers.cfg" "$SYS_PORT" "$workers"
            start_group "$WORK/haproxy-$tag.log" haproxy -db -f "$WORK/haproxy-$workers.cfg"
            SYS_PID=$LAST_PID ;;
        flick_static)
            SYS_PORT=$((BASE_PORT + 17))
            start "$WORK/flick-static-$tag.log" "$FLICK" run examples/static_web.flick \
                --listen "client=127.0.0.1:$SYS_PORT" --workers "$workers" \
                --max-instances "$FLICK_MAX_INSTANCES"
            SYS_PID=$LAST_PID ;;
        nginx_static)
            SYS_PORT=$((BASE_PORT + 18))
            local dir="$WORK/nginx-static-$workers"
            [ -f "$dir/nginx.conf" ] || nginx_conf "$dir" "$SYS_PORT" "$workers" static
            start_group "$WORK/nginx-static-$tag.log" nginx -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log"
            SYS_PID=$LAST_PID ;;
    esac
}

# Runs wrk: PORT CONNS SECONDS MODE LOG.
http_wrk() {
    local hdr=()
    [ "$4" = close ] && hdr=(-H "Connection: close")
    timeout $(($3 + 30)) wrk -t "$HTTP_THREADS" -c "$2" -d "$3s" --latency "${hdr[@]}" \
        "http://127.0.0.1:$1/index.html" >"$5" 2>&1 || echo "wrk exited with status $?" >>"$5"
}

# One HTTP run: SYSTEM WORKERS MODE CONNS REP RETRY.
http_run() {
    local system=$1 workers=$2 mode=$3 conns=$4 rep=$5 retry=$6
    local tag="$1-$2-$3-$4-$5" log alive=true probe_ok=false code load
    [ "$retry" = true ] && tag="$tag-retry"
    log="$WORK/wrk-$tag.txt"
    http_start "$system" "$workers" "$tag"
    if ! wait_port "$SYS_PORT"; then
        [ -n "$SYS_PID" ] && finish "$SYS_PID"
        printf '{"bench": "http", "system": "%s", "workers": %s, "rep": %s, "mode": "%s", "conns": %s, "ok": false, "error": "the proxy never listened"}\n' \
            "$system" "$workers" "$rep" "$mode" "$conns" >>"$RUNS"
        echo "   $system workers=$workers $mode $conns conns run $rep: FAILED: the proxy never listened"
        return 0
    fi
    # One request first, checked byte for byte: the status and the file
    # (Flick's static server: its fixed page). Its head and body sizes are
    # recorded with the run.
    local hdr=() expect="$WORK/www/index.html" sizes head_bytes=null body_bytes=null
    [ "$mode" = close ] && hdr=(-H "Connection: close")
    [ "$system" = flick_static ] && expect="$WORK/flick-static.body"
    sizes=$(curl -s --max-time 5 "${hdr[@]}" -o "$WORK/probe.body" \
        -w '%{http_code} %{size_header} %{size_download}' \
        "http://127.0.0.1:$SYS_PORT/index.html" 2>/dev/null) || true
    read -r code head_bytes body_bytes <<<"${sizes:-000 null null}"
    [ "$code" = 200 ] && cmp -s "$WORK/probe.body" "$expect" && probe_ok=true
    load=$(cut -d' ' -f1 /proc/loadavg)
    http_wrk "$SYS_PORT" "$conns" "$HTTP_SECONDS" "$mode" "$log"
    if [ -n "$SYS_PID" ]; then
        kill -0 "$SYS_PID" 2>/dev/null || alive=false
        finish "$SYS_PID"
    fi
    python3 bench/report.py wrk "$log" --system "$system" --workers "$workers" \
        --rep "$rep" --conns "$conns" --mode "$mode" --seconds "$HTTP_SECONDS" \
        --field "server_alive_at_end=$alive" --field "probe_ok=$probe_ok" \
        --field "loadavg_at_start=$load" --field "retry_after_stall=$retry" \
        --field "response_head_bytes=$head_bytes" --field "response_body_bytes=$body_bytes" >>"$RUNS"
    tail -n1 "$RUNS" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   %-12s workers=%s %-9s %4s conns run %s%s: %s req/s, p99 %s ms%s" % (r["system"], r["workers"], r["mode"], r["conns"], r["rep"], " (again)" if r.get("retry_after_stall") else "", r.get("requests_per_s"), r.get("latency_ms", {}).get("p99"), "" if r["ok"] else "  FAILED: " + str(r.get("error"))))'
}

bench_http() {
    HTTP_B1=$((BASE_PORT + 12))
    HTTP_B2=$((BASE_PORT + 13))
    local systems=("flick 1" "nginx 1" "haproxy 1" "flick 2" "nginx 2" "haproxy 2"
        "flick_static 1" "nginx_static 1" "flick_static 2" "nginx_static 2")
    local n=${#systems[@]} mode conns rep i b
    mkdir -p "$WORK/www"
    head -c "$HTTP_BODY_BYTES" /dev/zero | tr '\0' 'x' >"$WORK/www/index.html"
    # The body examples/static_web.flick answers with (137 bytes with its
    # head); the probe before each of its runs compares against it.
    printf 'Hello from Flick: a static page of 137 bytes with its head; 72 of body.\n' \
        >"$WORK/flick-static.body"
    # The two backends: nginx, one process each, up for the whole benchmark.
    for b in 1 2; do
        local port=$((BASE_PORT + 11 + b))
        nginx_conf "$WORK/backend-$b" "$port" 1 static
        start_group "$WORK/backend-$b.log" nginx -p "$WORK/backend-$b/" \
            -c "$WORK/backend-$b/nginx.conf" -e "$WORK/backend-$b/error.log"
        wait_port "$port"
    done
    echo "== http: wrk -t $HTTP_THREADS -d ${HTTP_SECONDS}s --latency, connections: $HTTP_CONNS; keep-alive and Connection: close; $HTTP_REPS runs each (fd limit $FD_LIMIT)"
    for mode in keepalive close; do
        for conns in $HTTP_CONNS; do
            for rep in $(seq "$HTTP_REPS"); do
                for i in $(seq 0 $((n - 1))); do
                    local sys=(${systems[$(((i + rep + conns) % n))]})
                    http_run "${sys[0]}" "${sys[1]}" "$mode" "$conns" "$rep" false
                    # The machine is shared: when wrk itself was starved (its
                    # run took far longer than asked), the run says nothing
                    # about the system. It stays recorded, as failed, and is
                    # run once more.
                    if tail -n1 "$RUNS" | grep -q '"load_generator_stalled": true'; then
                        http_run "${sys[0]}" "${sys[1]}" "$mode" "$conns" "$rep" true
                    fi
                done
            done
        done
    done

    if [ "$PROFILE" = 1 ] && command -v perf >/dev/null; then
        local secs=$((HTTP_SECONDS > 6 ? HTTP_SECONDS : 6))
        echo "== http: perf record -g of the Flick load balancer (1 worker), one extra keep-alive run at 400 connections, ${secs}s"
        http_start flick 1 profile
        local fpid=$SYS_PID
        wait_port "$SYS_PORT"
        start "$WORK/perf-http-record.log" perf record -F 999 -g -o "$WORK/perf-http.data" -p "$fpid"
        local ppid=$LAST_PID
        sleep 0.3
        http_wrk "$SYS_PORT" 400 "$secs" keepalive "$WORK/wrk-profile.txt"
        kill -INT "$ppid" 2>/dev/null || true
        wait "$ppid" 2>/dev/null || true
        finish "$ppid"
        finish "$fpid"
        perf report -i "$WORK/perf-http.data" --no-children --sort symbol -g none --stdio 2>/dev/null \
            | grep -E '^ +[0-9.]+%' | sed -E 's/[[:space:]]+-[[:space:]]+-[[:space:]]*$//; s/ +$//' \
            >"$WORK/perf-http.txt" || true
        if [ -s "$WORK/perf-http.txt" ]; then HTTP_PROFILE_FILE="$WORK/perf-http.txt"; fi
        grep -E '^Requests/sec' "$WORK/wrk-profile.txt" | sed 's/^/   (under perf) /' || true
    fi
    local p
    for p in "${pids[@]}"; do finish "$p"; done
}

# ------------------------------------------------------------------ run

for b in $BENCHES; do
    case "$b" in
        memcached_binary) bench_memcached_binary ;;
        hadoop) bench_hadoop ;;
        http) bench_http ;;
        memcached_ascii) bench_memcached_ascii ;;
        *) echo "unknown benchmark $b" >&2; exit 2 ;;
    esac
done

# ------------------------------------------------------------------ report

mkdir -p "$RESULTS"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff-index --quiet HEAD -- crates grammars examples 2>/dev/null; then
    commit="$commit (with uncommitted changes)"
fi
export MC_CONCURRENCY MC_THREADS MC_SECONDS KEY_BYTES VALUE_BYTES GET_PERCENT REPS QUICK \
    HADOOP_WORDS HADOOP_INPUT HADOOP_REFERENCE PROFILE_FILE LOAD_START SKIPPED commit \
    ASCII_VERIFY HTTP_REPS HTTP_SECONDS HTTP_CONNS HTTP_THREADS HTTP_BODY_BYTES HTTP_PROFILE_FILE \
    FD_LIMIT BENCHES
export LOAD_END
LOAD_END=$(loadavg)
# Versions of the other systems this run used (`wrk -v` exits 1).
first_line() { { "$@" 2>&1 || true; } | head -n1 || true; }
TOOLS=""
if wanted memcached_ascii; then
    TOOLS="$TOOLS|twemproxy $(first_line nutcracker --version | sed 's/.*nutcracker-//')"
fi
if wanted http; then
    TOOLS="$TOOLS|nginx $(first_line nginx -v | sed 's|.*nginx/||')"
    TOOLS="$TOOLS|HAProxy $(first_line haproxy -v | awk '{print $3}')"
    TOOLS="$TOOLS|wrk $(first_line wrk -v | awk '{print $2}' | sed 's|debian/||')"
fi
export TOOLS
MEMCACHED_VERSION=$(memcached -V 2>/dev/null | awk '{print $2}') RUSTC=$(rustc --version) \
python3 - "$WORK/meta.json" <<'EOF'
import json, os, platform, sys
cpu = "unknown"
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
e = os.environ


def profile_groups(lines):
    """Self time summed by module (crate::module), the kernel, and the rest."""
    groups = {}
    for line in lines:
        pct, _, rest = line.strip().partition("%")
        kind, _, sym = rest.strip().partition(" ")
        sym = sym.strip()
        if kind == "[k]":
            name = "kernel"
        else:
            path = sym.lstrip("<").split(" ")[0].split("::")
            name = "::".join(path[:2]) if path[0].startswith("flick_") else (
                path[0] if path[0] in ("crossbeam_queue", "alloc", "core", "std", "mio") else "libc, vdso and other")
        groups[name] = groups.get(name, 0.0) + float(pct)
    return sorted(([k, round(v, 2)] for k, v in groups.items()), key=lambda kv: -kv[1])


meta = {
    "machine": {
        "nproc": os.cpu_count(), "cpu_model": cpu, "kernel": platform.release(),
        "loadavg_start": e["LOAD_START"], "loadavg_end": e["LOAD_END"],
        "flick_commit": e["commit"], "rustc": e.get("RUSTC"),
        "memcached_version": e.get("MEMCACHED_VERSION"),
        "tools": [t for t in e.get("TOOLS", "").split("|") if t],
        "fd_limit": int(e["FD_LIMIT"]),
    },
    "settings": {
        "quick": e["QUICK"] == "1", "reps": int(e["REPS"]),
        "memaslap_concurrency": int(e["MC_CONCURRENCY"]), "memaslap_threads": int(e["MC_THREADS"]),
        "memaslap_seconds": int(e["MC_SECONDS"]), "key_bytes": int(e["KEY_BYTES"]),
        "value_bytes": int(e["VALUE_BYTES"]), "get_percent": int(e["GET_PERCENT"]),
        "hadoop_words": int(e["HADOOP_WORDS"]), "hadoop_input": e["HADOOP_INPUT"],
        "hadoop_reference": e["HADOOP_REFERENCE"],
        "ascii_verify": float(e["ASCII_VERIFY"]),
        "twemproxy_config": "hash fnv1a_64, distribution modula, server_connections 1, "
                            "preconnect, auto_eject_hosts false",
        "http_reps": int(e["HTTP_REPS"]), "http_seconds": int(e["HTTP_SECONDS"]),
        "http_conns": [int(c) for c in e["HTTP_CONNS"].split()],
        "http_threads": int(e["HTTP_THREADS"]), "http_body_bytes": int(e["HTTP_BODY_BYTES"]),
        "benches": e["BENCHES"].split(),
    },
    "skipped": [json.loads(l) for l in open(e["SKIPPED"]) if l.strip()],
}
if e.get("PROFILE_FILE"):
    lines = open(e["PROFILE_FILE"]).read().splitlines()
    meta["profile"] = {"what": "1 worker, perf record -F 999", "top": lines[:25],
                       "groups": profile_groups(lines)}
if e.get("HTTP_PROFILE_FILE"):
    lines = open(e["HTTP_PROFILE_FILE"]).read().splitlines()
    meta["http_profile"] = {
        "what": "1 worker, perf record -F 999 -g, wrk keep-alive at 400 connections",
        "top": lines[:25], "groups": profile_groups(lines)}
json.dump(meta, open(sys.argv[1], "w"))
EOF
echo
status=0
python3 bench/report.py report --runs "$RUNS" --machine "$WORK/meta.json" --out "$RESULTS" || status=$?
echo
if [ "$status" -ne 0 ]; then
    echo "SOME RUNS FAILED OR PRODUCED WRONG OUTPUT: see the warning at the top of $RESULTS/results.md"
fi
echo "results: $RESULTS/results.md, $RESULTS/results.json, $RESULTS/*.png"
exit "$status"
