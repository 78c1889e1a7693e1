#!/usr/bin/env bash
# Flick against nginx, HAProxy, twemproxy and memcached on a partitioned
# multi-core machine: each system's workers on the proxy cores, the
# backends on cores of their own, the load generators on the rest, so
# that a worker is a core and ratios are per core.
#
# Usage:
#   bench/scale.sh                      # defaults below; needs 16 cores
#   bench/scale.sh --workers "1 2" --seconds 5 --benches "http static"
#   BUNDLE=dir bench/scale.sh ...       # a bare machine: peers from a
#                                       # bundle made by ../shared/tools/bundle.sh
#
# Options (flags; each has a default):
#   --proxy-cores LIST    cores for the system measured (0-3); N workers
#                         run on the first N of them
#   --backend-cores LIST  cores for the backends (4-7)
#   --load-cores LIST     cores for wrk and memaslap (8-15)
#   --workers "LIST"      worker counts ("1 2 4"); at most as many as proxy cores
#   --conns "LIST"        client connections (HTTP: "400 1600"; memaslap
#                         uses --mc-conns, default 256)
#   --mc-conns N          memaslap connections (256)
#   --seconds S           seconds per run (10)
#   --warmup S            load each system for S seconds, not measured, after
#                         it starts and before its measured run (0: measure
#                         from a cold start, connections and all)
#   --reps R              runs per point, systems alternating (3)
#   --benches "LIST"      any of: http static memcached_ascii memcached_binary
#   --out DIR             results (bench/results/scale)
#   --base-port P         127.0.0.1 ports P..P+29 (24200)
#   --allow-overlap       run even where the core sets overlap or the
#                         machine has fewer cores (the figures then say
#                         nothing per core; for trying the script)
#   --flick PATH          the flick binary (default: built here in release)
#
# What runs (the same load for every system at a point):
#   http              wrk -t T -c C --latency, GET of a 137-byte file through
#                     examples/http_lb.flick, nginx (upstream keepalive, N
#                     worker processes) and HAProxy (nbthread N), each in front
#                     of two nginx backends on the backend cores.
#   static            examples/static_web.flick against nginx serving the file.
#   memcached_ascii   memaslap (text, 90% get, 16-byte keys, 64-byte values)
#                     through examples/memcached_ascii_proxy.flick with N
#                     workers, and through N twemproxy processes (one per
#                     core); N memaslap processes each take 1/N of the
#                     connections, one per twemproxy, all to Flick's port.
#   memcached_binary  memaslap -B through examples/memcached_proxy.flick with
#                     N workers, and to memcached itself with N threads.
#   Four memcached servers (backend cores) serve both Memcached proxies.
#
# Writes OUT/scale.md (table of requests/s and p99 per system and worker
# count, ratios per worker, scaling 1 -> max workers), OUT/runs.jsonl (each
# run as it ends), OUT/scale.json (every
# figure of every run) and OUT/scale.png. Not a test: never run from
# scripts/test.sh. Every process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

PROXY_CORES=0-3
BACKEND_CORES=4-7
LOAD_CORES=8-15
WORKERS="1 2 4"
CONNS="400 1600"
MC_CONNS=256
SECONDS_PER_RUN=10
WARMUP=0
REPS=3
BENCHES="http static memcached_ascii memcached_binary"
OUT=bench/results/scale
BASE_PORT=24200
ALLOW_OVERLAP=0
FLICK=""
BUNDLE=${BUNDLE:-}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --proxy-cores) PROXY_CORES=$2; shift 2 ;;
        --backend-cores) BACKEND_CORES=$2; shift 2 ;;
        --load-cores) LOAD_CORES=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        --conns) CONNS=$2; shift 2 ;;
        --mc-conns) MC_CONNS=$2; shift 2 ;;
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --warmup) WARMUP=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --benches) BENCHES=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --base-port) BASE_PORT=$2; shift 2 ;;
        --allow-overlap) ALLOW_OVERLAP=1; shift ;;
        --flick) FLICK=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "scale.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

# A core list (0-3,8,10-11) as one core per line.
expand_cores() {
    local part a b
    for part in ${1//,/ }; do
        if [[ $part == *-* ]]; then
            a=${part%-*}; b=${part#*-}
            seq "$a" "$b"
        else
            echo "$part"
        fi
    done
}
mapfile -t proxy_cores < <(expand_cores "$PROXY_CORES")
mapfile -t backend_cores < <(expand_cores "$BACKEND_CORES")
mapfile -t load_cores < <(expand_cores "$LOAD_CORES")
NPROC=$(nproc)
max_workers=0
for w in $WORKERS; do [ "$w" -gt "$max_workers" ] && max_workers=$w; done
problems=()
[ "$max_workers" -le "${#proxy_cores[@]}" ] \
    || problems+=("--workers asks for $max_workers workers on ${#proxy_cores[@]} proxy cores")
overlap=$(printf '%s\n' "${proxy_cores[@]}" "${backend_cores[@]}" "${load_cores[@]}" | sort -n | uniq -d | tr '\n' ' ')
[ -z "$overlap" ] || problems+=("cores given to more than one role: $overlap")
for c in "${proxy_cores[@]}" "${backend_cores[@]}" "${load_cores[@]}"; do
    if [ "$c" -ge "$NPROC" ]; then problems+=("core $c does not exist (nproc $NPROC)"); break; fi
done
if [ ${#problems[@]} -gt 0 ]; then
    if [ "$ALLOW_OVERLAP" != 1 ]; then
        printf 'scale.sh: %s\n' "${problems[@]}" >&2
        echo "scale.sh: a partitioned run needs 16 cores; --allow-overlap runs anyway (no per-core figures)" >&2
        exit 2
    fi
    # Unpartitioned: every role may use every core.
    mapfile -t proxy_cores < <(seq 0 $((NPROC - 1)))
    backend_cores=("${proxy_cores[@]}")
    load_cores=("${proxy_cores[@]}")
fi
PARTITIONED=$([ ${#problems[@]} -eq 0 ] && echo true || echo false)
join() { local IFS=,; echo "$*"; }
# The first N proxy cores (wrapped where there are fewer: unpartitioned only).
first_cores() {
    local n=$1 i out=()
    for ((i = 0; i < n; i++)); do out+=("${proxy_cores[$((i % ${#proxy_cores[@]}))]}"); done
    join "${out[@]}"
}
BACKEND_SET=$(join "${backend_cores[@]}")
LOAD_SET=$(join "${load_cores[@]}")
LOAD_THREADS=${#load_cores[@]}
[ "$LOAD_THREADS" -gt 8 ] && LOAD_THREADS=8

# Programs: from the bundle if one is given, else from PATH.
prog() {
    if [ -n "$BUNDLE" ] && [ -x "$BUNDLE/bin/$1" ]; then
        echo "$BUNDLE/run $1"
    else
        command -v "$1" || { echo "scale.sh: $1 is not installed${BUNDLE:+ nor in $BUNDLE}" >&2; return 1; }
    fi
}
need() { local p; p=$(prog "$1") || exit 2; echo "$p"; }
wanted() { case " $BENCHES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
NGINX="" HAPROXY="" WRK="" MEMCACHED="" MEMASLAP="" NUTCRACKER=""
if wanted http || wanted static; then
    NGINX=$(need nginx); WRK=$(need wrk)
fi
wanted http && HAPROXY=$(need haproxy)
if wanted memcached_ascii || wanted memcached_binary; then
    MEMCACHED=$(need memcached)
    MEMASLAP=$(prog memcaslap 2>/dev/null || need memaslap)
fi
wanted memcached_ascii && NUTCRACKER=$(need nutcracker)
if [ -z "$FLICK" ]; then
    if [ -n "$BUNDLE" ] && [ -x "$BUNDLE/bin/flick" ]; then
        FLICK="$BUNDLE/run flick"
    else
        echo "== building flick (release)"
        cargo build --release --quiet -p flick
        FLICK="${CARGO_TARGET_DIR:-target}/release/flick"
    fi
fi

# Pinning: taskset where the kernel honours affinity; a sandboxed kernel
# that refuses it gets the run unpinned, and the report says so.
PINNED=true
if ! taskset -c "${proxy_cores[0]}" true 2>/dev/null; then
    echo "scale.sh: taskset cannot pin processes here; running unpinned" >&2
    PINNED=false
fi
# The words that pin a command to CORES (none when unpinned).
pin() { $PINNED && echo "taskset -c $1" || true; }
# Flick's workers each on a core of the set, as nginx's
# `worker_cpu_affinity auto` below (from 2 workers, where pinning can matter).
flick_pin() { $PINNED && [ "$1" -gt 1 ] && echo "--pin-workers" || true; }

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
WORK=$(mktemp -d -t flick-scale.XXXXXX)
# Each run's figures go to OUT as they come, so a run stopped part way
# (a time limit on a borrowed machine) still leaves what it measured.
mkdir -p "$OUT"
RUNS="$OUT/runs.jsonl"
: >"$RUNS"
pids=()

# stop, finish, wait_port
source bench/procs.sh

cleanup() {
    local p
    for p in "${pids[@]}"; do stop "$p"; done
    [ "${KEEP_WORK:-0}" = 1 ] && echo "scratch directory kept: $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a command pinned to CORES in its own process group; logs to LOG.
# Usage: start LOG CORES CMD...; the pid is in LAST_PID.
start() {
    local log=$1 cores=$2
    shift 2
    # shellcheck disable=SC2086
    # shellcheck disable=SC2046
    setsid $(pin "$cores") $1 "${@:2}" >"$log" 2>&1 &
    LAST_PID=$!
    pids+=("$LAST_PID")
}
record_failure() { # BENCH SYSTEM WORKERS REP CONNS WHY
    printf '{"bench": "%s", "system": "%s", "workers": %s, "rep": %s, "conns": %s, "ok": false, "error": "%s"}\n' \
        "$1" "$2" "$3" "$4" "$5" "$6" >>"$RUNS"
}

# ---------------------------------------------------------------- peers

# nginx: DIR PORT WORKERS static|proxy
nginx_conf() {
    local dir=$1 port=$2 workers=$3 what=$4 t
    mkdir -p "$dir"
    {
        [ "$workers" -le 1 ] && echo "master_process off;"
        [ "$workers" -gt 1 ] && [ "$(id -u)" = 0 ] && echo "user root;"
        echo "daemon off; worker_processes $workers; pid $dir/nginx.pid;"
        # One worker per core of the set the master was started on.
        [ "$workers" -gt 1 ] && echo "worker_cpu_affinity auto;"
        echo "error_log $dir/error.log warn;"
        echo "events { worker_connections 16384; }"
        echo "http { access_log off; keepalive_requests 1000000000; keepalive_timeout 120s;"
        for t in client_body proxy fastcgi uwsgi scgi; do echo "  ${t}_temp_path $dir/$t;"; done
        if [ "$what" = static ]; then
            echo "  server { listen 127.0.0.1:$port backlog=8192; root $WORK/www; location / { } }"
        else
            echo "  upstream backends { server 127.0.0.1:$B1; server 127.0.0.1:$B2;"
            echo "    keepalive 256; keepalive_requests 1000000000; }"
            echo "  server { listen 127.0.0.1:$port backlog=8192; location / {"
            echo "    proxy_pass http://backends; proxy_http_version 1.1;"
            echo "    proxy_set_header Connection \"\"; } }"
        fi
        echo "}"
    } >"$dir/nginx.conf"
}
haproxy_conf() { # FILE PORT THREADS
    # HAProxy needs two descriptors per connection under the open-file limit.
    local maxconn=$((($(ulimit -n) - 200) / 2))
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
    server b1 127.0.0.1:$B1
    server b2 127.0.0.1:$B2
EOF
}

# ----------------------------------------------------------------- http

B1=$((BASE_PORT + 1))
B2=$((BASE_PORT + 2))
SYS_PORT=$((BASE_PORT + 3))
backends_up=false
http_backends() {
    $backends_up && return 0
    mkdir -p "$WORK/www"
    head -c 137 /dev/zero | tr '\0' 'x' >"$WORK/www/index.html"
    local b half=$(((${#backend_cores[@]} + 1) / 2)) cores
    for b in 1 2; do
        # Each backend gets half the backend cores, a worker per core.
        if [ "$b" = 1 ]; then cores=$(join "${backend_cores[@]:0:$half}")
        else cores=$(join "${backend_cores[@]:$half}"); fi
        [ -n "$cores" ] || cores=$BACKEND_SET
        local n; n=$(echo "$cores" | tr ',' '\n' | wc -l)
        nginx_conf "$WORK/backend-$b" $((BASE_PORT + b)) "$n" static
        start "$WORK/backend-$b.log" "$cores" "$NGINX" -p "$WORK/backend-$b/" \
            -c "$WORK/backend-$b/nginx.conf" -e "$WORK/backend-$b/error.log"
        wait_port $((BASE_PORT + b))
    done
    backends_up=true
}

# Starts SYSTEM with WORKERS on the first WORKERS proxy cores; SYS_PID.
http_start() {
    local system=$1 workers=$2 cores tag=$3
    cores=$(first_cores "$workers")
    case "$system" in
        flick)
            start "$WORK/$tag.log" "$cores" "$FLICK" run examples/http_lb.flick \
                --listen "client=127.0.0.1:$SYS_PORT" --connect "backends=127.0.0.1:$B1,127.0.0.1:$B2" \
                --workers "$workers" $(flick_pin "$workers") ;;
        flick_static)
            start "$WORK/$tag.log" "$cores" "$FLICK" run examples/static_web.flick \
                --listen "client=127.0.0.1:$SYS_PORT" --workers "$workers" $(flick_pin "$workers") ;;
        nginx | nginx_static)
            local dir="$WORK/$system-$workers"
            nginx_conf "$dir" "$SYS_PORT" "$workers" "$([ "$system" = nginx ] && echo proxy || echo static)"
            start "$WORK/$tag.log" "$cores" "$NGINX" -p "$dir/" -c "$dir/nginx.conf" -e "$dir/error.log" ;;
        haproxy)
            haproxy_conf "$WORK/haproxy-$workers.cfg" "$SYS_PORT" "$workers"
            start "$WORK/$tag.log" "$cores" "$HAPROXY" -db -f "$WORK/haproxy-$workers.cfg" ;;
    esac
    SYS_PID=$LAST_PID
}

http_point() { # BENCH SYSTEM WORKERS CONNS REP
    local bench=$1 system=$2 workers=$3 conns=$4 rep=$5 tag log alive=true
    tag="$bench-$system-$workers-$conns-$rep"
    log="$WORK/wrk-$tag.txt"
    http_start "$system" "$workers" "$tag"
    if ! wait_port "$SYS_PORT"; then
        finish "$SYS_PID"
        record_failure "$bench" "$system" "$workers" "$rep" "$conns" "never listened"
        return 0
    fi
    if [ "$WARMUP" -gt 0 ]; then
        # shellcheck disable=SC2086
        timeout $((WARMUP + 30)) $(pin "$LOAD_SET") $WRK -t "$LOAD_THREADS" -c "$conns" \
            -d "${WARMUP}s" "http://127.0.0.1:$SYS_PORT/index.html" >"$WORK/warmup-$tag.txt" 2>&1 || true
    fi
    # shellcheck disable=SC2086
    timeout $((SECONDS_PER_RUN + 30)) $(pin "$LOAD_SET") $WRK -t "$LOAD_THREADS" -c "$conns" \
        -d "${SECONDS_PER_RUN}s" --latency "http://127.0.0.1:$SYS_PORT/index.html" >"$log" 2>&1 \
        || echo "wrk exited with status $?" >>"$log"
    kill -0 "$SYS_PID" 2>/dev/null || alive=false
    finish "$SYS_PID"
    python3 bench/report.py wrk "$log" --system "$system" --workers "$workers" --rep "$rep" \
        --conns "$conns" --mode keepalive --seconds "$SECONDS_PER_RUN" \
        --field "server_alive_at_end=$alive" --field "scale_bench=\"$bench\"" >>"$RUNS"
    tail -n1 "$RUNS" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   %-13s %s w %5s conns run %s: %s req/s, p99 %s ms%s" % (r["system"], r["workers"], r["conns"], r["rep"], r.get("requests_per_s"), r.get("latency_ms", {}).get("p99"), "" if r["ok"] else "  FAILED: " + str(r.get("error"))))'
}

bench_http_like() { # BENCH SYSTEMS...
    local bench=$1 w conns rep i
    shift
    local systems=("$@")
    http_backends
    echo "== $bench: wrk -t $LOAD_THREADS -d ${SECONDS_PER_RUN}s on cores $LOAD_SET; systems: ${systems[*]}"
    for w in $WORKERS; do
        for conns in $CONNS; do
            for rep in $(seq "$REPS"); do
                for i in $(seq 0 $((${#systems[@]} - 1))); do
                    http_point "$bench" "${systems[$(((i + rep) % ${#systems[@]}))]}" "$w" "$conns" "$rep"
                done
            done
        done
    done
}

# ------------------------------------------------------------ memcached

MC_PROXY=$((BASE_PORT + 10))
mc_up=false
mc_backends() {
    $mc_up && return 0
    local i user=()
    [ "$(id -u)" -eq 0 ] && user=(-u root)
    MC_BACKENDS=()
    for i in 1 2 3 4; do
        start "$WORK/memcached-$i.log" "$BACKEND_SET" "$MEMCACHED" -l 127.0.0.1 -p $((BASE_PORT + 10 + i)) \
            -U 0 -m 256 -t 2 -c 8192 "${user[@]}"
        MC_BACKENDS+=("127.0.0.1:$((BASE_PORT + 10 + i))")
    done
    for i in 1 2 3 4; do wait_port $((BASE_PORT + 10 + i)); done
    printf 'key\n16 16 1\nvalue\n64 64 1\ncmd\n0 0.10\n1 0.90\n' >"$WORK/memaslap.cfg"
    mc_up=true
}

# Runs memaslap against PORTS (one process per port, the connections and
# threads split among them) and sums what they report. Usage: mc_load
# BENCH SYSTEM WORKERS REP PROTO_ARGS -- PORT...
mc_load() {
    local bench=$1 system=$2 workers=$3 rep=$4 proto=$5
    shift 6
    local ports=("$@") n=${#ports[@]} j lp=() logs=()
    local conns=$((MC_CONNS / n)) threads=$((LOAD_THREADS / n))
    [ "$threads" -ge 1 ] || threads=1
    # memaslap needs its concurrency to be a multiple of its threads.
    conns=$((conns / threads * threads))
    [ "$conns" -ge "$threads" ] || conns=$threads
    if [ "$WARMUP" -gt 0 ]; then
        for j in "${!ports[@]}"; do
            # shellcheck disable=SC2086
            timeout $((WARMUP + 20)) $(pin "$LOAD_SET") $MEMASLAP -s "127.0.0.1:${ports[$j]}" \
                $proto -c "$conns" -T "$threads" -t "${WARMUP}s" \
                -F "$WORK/memaslap.cfg" >"$WORK/warmup-memaslap-$bench-$system-$workers-$rep-$j.txt" 2>&1 &
            lp+=($!)
        done
        for j in "${lp[@]}"; do wait "$j" || true; done
        lp=()
    fi
    for j in "${!ports[@]}"; do
        local log="$WORK/memaslap-$bench-$system-$workers-$rep-$j.txt"
        # shellcheck disable=SC2086
        timeout $((2 * SECONDS_PER_RUN + 20)) $(pin "$LOAD_SET") $MEMASLAP -s "127.0.0.1:${ports[$j]}" \
            $proto -c "$conns" -T "$threads" -t "${SECONDS_PER_RUN}s" -S "${SECONDS_PER_RUN}s" \
            -F "$WORK/memaslap.cfg" >"$log" 2>&1 &
        lp+=($!)
        logs+=("$log")
    done
    for j in "${lp[@]}"; do wait "$j" || true; done
    for j in "${logs[@]}"; do
        python3 bench/report.py memaslap "$j" --bench "$bench" --system "$system" --workers "$workers" --rep "$rep"
    done | python3 bench/scale_report.py sum --conns "$MC_CONNS" >>"$RUNS"
    tail -n1 "$RUNS" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   %-13s %s w run %s: %s ops/s, p99 <= %s us%s" % (r["system"], r["workers"], r["rep"], r.get("ops_per_s"), r.get("p99_us"), "" if r["ok"] else "  FAILED: " + str(r.get("error"))))'
}

mc_point() { # BENCH SYSTEM WORKERS REP
    local bench=$1 system=$2 workers=$3 rep=$4 cores proto="" program ports=() k started=()
    cores=$(first_cores "$workers")
    [ "$bench" = memcached_binary ] && proto="-B"
    [ "$bench" = memcached_ascii ] && proto="--verify=0.05"
    program=examples/memcached_ascii_proxy.flick
    [ "$bench" = memcached_binary ] && program=examples/memcached_proxy.flick
    case "$system" in
        flick)
            start "$WORK/$bench-flick-$workers-$rep.log" "$cores" "$FLICK" run "$program" \
                --listen "client=127.0.0.1:$MC_PROXY" --connect "backends=$(join "${MC_BACKENDS[@]}")" \
                --workers "$workers" $(flick_pin "$workers")
            started+=("$LAST_PID")
            # As many memaslap processes as the peer has (N twemproxies).
            for ((k = 0; k < workers; k++)); do ports+=("$MC_PROXY"); done ;;
        twemproxy)
            for ((k = 0; k < workers; k++)); do
                local cfg="$WORK/twemproxy-$k.yml" port=$((BASE_PORT + 20 + k)) s
                {
                    printf 'pool:\n  listen: 127.0.0.1:%s\n  hash: fnv1a_64\n  distribution: modula\n' "$port"
                    printf '  redis: false\n  server_connections: 1\n  auto_eject_hosts: false\n'
                    printf '  preconnect: true\n  timeout: 10000\n  servers:\n'
                    for s in "${MC_BACKENDS[@]}"; do printf '   - %s:1\n' "$s"; done
                } >"$cfg"
                start "$WORK/twemproxy-$k-$rep.log" "${proxy_cores[$((k % ${#proxy_cores[@]}))]}" \
                    "$NUTCRACKER" -c "$cfg" -s $((BASE_PORT + 40 + k)) -a 127.0.0.1 -o "$WORK/twemproxy-$k-$rep.out"
                started+=("$LAST_PID")
                ports+=("$port")
            done ;;
        memcached)
            local user=()
            [ "$(id -u)" -eq 0 ] && user=(-u root)
            start "$WORK/memcached-direct-$rep.log" "$cores" "$MEMCACHED" -l 127.0.0.1 -p "$MC_PROXY" \
                -U 0 -m 1024 -t "$workers" -c 8192 "${user[@]}"
            started+=("$LAST_PID")
            for ((k = 0; k < workers; k++)); do ports+=("$MC_PROXY"); done ;;
    esac
    local p ok=true
    for p in "${ports[@]}"; do wait_port "$p" || ok=false; done
    if $ok; then
        mc_load "$bench" "$system" "$workers" "$rep" "$proto" -- "${ports[@]}"
    else
        record_failure "$bench" "$system" "$workers" "$rep" "$MC_CONNS" "never listened"
    fi
    for p in "${started[@]}"; do finish "$p"; done
}

bench_mc() { # BENCH SYSTEMS...
    local bench=$1 w rep i
    shift
    local systems=("$@")
    mc_backends
    echo "== $bench: memaslap -c $MC_CONNS over $LOAD_THREADS threads, ${SECONDS_PER_RUN}s, on cores $LOAD_SET; systems: ${systems[*]}"
    for w in $WORKERS; do
        for rep in $(seq "$REPS"); do
            for i in $(seq 0 $((${#systems[@]} - 1))); do
                mc_point "$bench" "${systems[$(((i + rep) % ${#systems[@]}))]}" "$w" "$rep"
            done
        done
    done
}

# ------------------------------------------------------------------ run

echo "== cores: proxy $(join "${proxy_cores[@]}"), backends $BACKEND_SET, load $LOAD_SET (partitioned: $PARTITIONED)"
for b in $BENCHES; do
    case "$b" in
        http) bench_http_like http flick nginx haproxy ;;
        static) bench_http_like static flick_static nginx_static ;;
        memcached_ascii) bench_mc memcached_ascii flick twemproxy ;;
        memcached_binary) bench_mc memcached_binary flick memcached ;;
        *) echo "scale.sh: unknown benchmark $b" >&2; exit 2 ;;
    esac
done

mkdir -p "$OUT"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 bench/scale_report.py report --runs "$RUNS" --out "$OUT" \
    --meta "commit=$commit" --meta "partitioned=$PARTITIONED" --meta "pinned=$PINNED" --meta "nproc=$NPROC" \
    --meta "kernel=$(uname -sr)" \
    --meta "proxy_cores=$(join "${proxy_cores[@]}")" --meta "backend_cores=$BACKEND_SET" \
    --meta "load_cores=$LOAD_SET" --meta "seconds=$SECONDS_PER_RUN" --meta "warmup=$WARMUP" --meta "reps=$REPS" \
    --meta "load_threads=$LOAD_THREADS" --meta "mc_conns=$MC_CONNS" \
    --meta "cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "results: $OUT/scale.md, $OUT/scale.json, $OUT/scale.png"
