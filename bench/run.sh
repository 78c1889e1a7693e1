#!/usr/bin/env bash
# Side-by-side benchmarks of Flick's services against what they replace.
#
# Usage:
#   bench/run.sh             # full run, about 8 minutes once built (at most ~15)
#   QUICK=1 bench/run.sh     # short runs, about 3 minutes once built
#
# It installs what it needs and is missing (memcached, libmemcached-tools for
# memaslap, matplotlib), builds the release binaries, runs every benchmark
# REPS times with the systems alternating run by run, and writes
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
#   http, memcached_ascii   not yet: printed as skipped.
#
# Settings (environment): QUICK=1, REPS (default 5, QUICK 3), MC_SECONDS
# (memaslap seconds per run: 10, QUICK 3), HADOOP_WORDS (words over all
# mappers: 4000000, QUICK 1000000), BENCHES (space-separated subset of
# "memcached_binary hadoop http memcached_ascii"), PROFILE=0 to skip the
# perf profile of the aggregator, BASE_PORT (default 23100; the ports
# BASE_PORT..BASE_PORT+19 on 127.0.0.1 are used), RESULTS (output
# directory, default bench/results), KEEP_WORK=1 to keep the scratch
# directory (logs, reducer streams, perf data).
#
# Not a test: never run from scripts/test.sh. Only 127.0.0.1 is used, every
# run is bounded in time, and every process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
    REPS=${REPS:-3}; MC_SECONDS=${MC_SECONDS:-3}; HADOOP_WORDS=${HADOOP_WORDS:-1000000}
    PROFILE=${PROFILE:-0}
else
    REPS=${REPS:-5}; MC_SECONDS=${MC_SECONDS:-10}; HADOOP_WORDS=${HADOOP_WORDS:-4000000}
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

WORK=$(mktemp -d -t flick-bench.XXXXXX)
RUNS="$WORK/runs.jsonl"
SKIPPED="$WORK/skipped.jsonl"
: >"$RUNS"
: >"$SKIPPED"
pids=()

# Stops one process we started: TERM (Flick then drains and exits), KILL
# if it is still there after 10 s.
stop() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

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

# Stops a process started with `start` and forgets it.
finish() {
    local pid=$1 p keep=()
    stop "$pid"
    for p in "${pids[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
    pids=("${keep[@]+"${keep[@]}"}")
}

# Waits until something accepts connections on the port (at most 10 s).
# Only for services where a probe connection is harmless (not fan-in).
wait_port() {
    local port=$1 i
    for i in $(seq 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "nothing listening on 127.0.0.1:$port after 10 s" >&2
    return 1
}

skip() {
    echo "== $1: skipped: $2"
    printf '{"bench": "%s", "reason": "%s"}\n' "$1" "$2" >>"$SKIPPED"
}

# ------------------------------------------------------------------ setup

install_missing() {
    local need=() sudo=""
    command -v memcached >/dev/null || need+=(memcached)
    command -v memcaslap >/dev/null || command -v memaslap >/dev/null || need+=(libmemcached-tools)
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

# ------------------------------------------------------ memcached binary

bench_memcached_binary() {
    local proxy=$BASE_PORT direct=$((BASE_PORT + 6)) backends=() user=() port i rep
    [ "$(id -u)" -eq 0 ] && user=(-u root)
    echo "== memcached_binary: memaslap -B -c $MC_CONCURRENCY -T $MC_THREADS -t ${MC_SECONDS}s, $REPS runs each"
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

    local systems=("flick 1" "flick 2" "memcached 0") n=3
    for rep in $(seq "$REPS"); do
        for i in $(seq 0 $((n - 1))); do
            # Rotate the order each round so that drift in the machine's
            # load does not always favour the same system.
            local sys=(${systems[$(((i + rep) % n))]}) target pid="" log
            log="$WORK/memaslap-${sys[0]}-${sys[1]}-$rep.txt"
            if [ "${sys[0]}" = flick ]; then
                start "$WORK/flick-mc-${sys[1]}-$rep.log" "$FLICK" run examples/memcached_proxy.flick \
                    --listen "client=127.0.0.1:$proxy" --connect "backends=$backend_list" \
                    --workers "${sys[1]}"
                pid=$LAST_PID
                if ! wait_port "$proxy"; then
                    finish "$pid"
                    printf '{"bench": "memcached_binary", "system": "flick", "workers": %s, "rep": %s, "ok": false, "error": "the proxy never listened"}\n' \
                        "${sys[1]}" "$rep" >>"$RUNS"
                    echo "   flick     workers=${sys[1]} run $rep: FAILED: the proxy never listened"
                    continue
                fi
                target=$proxy
            else
                target=$direct
            fi
            # -S prints the latency statistics at the end; memaslap gets
            # twice its duration before it counts as hung.
            timeout $((2 * MC_SECONDS + 20)) "$MEMASLAP" -s "127.0.0.1:$target" -B \
                -c "$MC_CONCURRENCY" -T "$MC_THREADS" -t "${MC_SECONDS}s" -S "${MC_SECONDS}s" \
                -F "$cfg" >"$log" 2>&1 || echo "memaslap exited with status $?" >>"$log"
            local alive=true
            if [ -n "$pid" ]; then
                kill -0 "$pid" 2>/dev/null || alive=false
                finish "$pid"
            fi
            python3 bench/report.py memaslap "$log" --system "${sys[0]}" --workers "${sys[1]}" \
                --rep "$rep" --field "server_alive_at_end=$alive" >>"$RUNS"
            tail -n1 "$RUNS" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("   %-9s workers=%s run %s: %s ops/s%s" % (r["system"], r["workers"], r["rep"], r.get("ops_per_s"), "" if r["ok"] else "  FAILED: " + str(r.get("error"))))'
        done
    done
    local p
    for p in "${pids[@]}"; do finish "$p"; done
}

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

# ------------------------------------------------- not yet available

bench_http() {
    skip http "no HTTP load balancer service yet (wrk against Flick, nginx and HAProxy)"
}

bench_memcached_ascii() {
    skip memcached_ascii "no Memcached ASCII proxy service yet (memaslap ASCII against Flick and twemproxy)"
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
    HADOOP_WORDS HADOOP_INPUT HADOOP_REFERENCE PROFILE_FILE LOAD_START SKIPPED commit
export LOAD_END
LOAD_END=$(loadavg)
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
    },
    "settings": {
        "quick": e["QUICK"] == "1", "reps": int(e["REPS"]),
        "memaslap_concurrency": int(e["MC_CONCURRENCY"]), "memaslap_threads": int(e["MC_THREADS"]),
        "memaslap_seconds": int(e["MC_SECONDS"]), "key_bytes": int(e["KEY_BYTES"]),
        "value_bytes": int(e["VALUE_BYTES"]), "get_percent": int(e["GET_PERCENT"]),
        "hadoop_words": int(e["HADOOP_WORDS"]), "hadoop_input": e["HADOOP_INPUT"],
        "hadoop_reference": e["HADOOP_REFERENCE"],
    },
    "skipped": [json.loads(l) for l in open(e["SKIPPED"]) if l.strip()],
}
if e.get("PROFILE_FILE"):
    lines = open(e["PROFILE_FILE"]).read().splitlines()
    meta["profile"] = {"what": "1 worker, perf record -F 999", "top": lines[:25],
                       "groups": profile_groups(lines)}
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
