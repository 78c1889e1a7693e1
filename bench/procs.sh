# Process helpers shared by the benchmark scripts (sourced, not run).
# The caller declares `pids=()`; every process started through these is
# recorded there, and the caller's EXIT trap stops what is left.

# Stops one process we started: TERM (Flick then drains and exits), KILL
# if it is still there after 10 s. A process that leads its own process
# group (started with setsid: nginx's master and its workers) gets the
# signals as a group.
stop() {
    local pid=$1 i target=$1
    [ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$pid" ] && target=-$pid
    kill -TERM -- "$target" 2>/dev/null || return 0
    for i in $(seq 100); do
        kill -0 -- "$target" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "$target" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# Starts a command in a new process group (setsid), logging to $1, so that
# `stop` reaches whatever it forks; its pid is in $LAST_PID.
start_group() {
    local log=$1
    shift
    setsid "$@" >"$log" 2>&1 &
    LAST_PID=$!
    pids+=("$LAST_PID")
}

# Stops a process started here and forgets it.
finish() {
    local pid=$1 p keep=()
    stop "$pid"
    for p in "${pids[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
    pids=("${keep[@]+"${keep[@]}"}")
}

# Waits until something accepts connections on 127.0.0.1:PORT (at most
# 10 s). Only where a probe connection is harmless (not fan-in).
wait_port() {
    local port=$1 i
    for i in $(seq 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "nothing listening on 127.0.0.1:$port after 10 s" >&2
    return 1
}
