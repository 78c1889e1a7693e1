#!/usr/bin/env python3
"""Figures for bench/run.sh: parses load-generator output into one JSON line
per run, and turns the runs into results.md, results.json and PNG plots.

  report.py memaslap LOG [--bench B] --system S --workers W --rep R [--field k=v ...]
  report.py wrk LOG --system S --workers W --rep R --conns C --mode M [--field k=v ...]
  report.py tag --bench B --system S --workers W --rep R [--field k=v ...] < driver-json
  report.py report --runs RUNS.jsonl --machine MACHINE.json --out DIR
"""

import argparse
import json
import re
import statistics
import sys

# memaslap's final per-operation blocks, e.g.
#   Get Statistics (202740 events)
#      Min:        38
#      ...
#      Log2 Dist:
#          4:        0        0        6      285
# Latencies are in microseconds; bucket i of the distribution counts
# latencies in (2^(i-1), 2^i] us (memaslap's ms_local_log2 rounds up).
BLOCK = re.compile(r"^(Get|Set|Total) Statistics \((\d+) events\)$")
FIELD = re.compile(r"^\s+(Min|Max|Avg|Geo|Std):\s+([\d.]+)$")
DIST = re.compile(r"^\s+(\d+):((?:\s+\d+)+)\s*$")
SUMMARY = re.compile(
    r"Run time: ([\d.]+)s Ops: (\d+) TPS: (\d+) Net_rate: ([\d.]+)M/s")
COUNTER = re.compile(r"^(cmd_get|cmd_set|get_misses|verify_misses|verify_failed|expired_get|"
                     r"unexpired_unget|written_bytes|read_bytes|object_bytes): (\d+)$")


def percentile_bucket(dist, q):
    """Upper bound (us) of the log2 bucket holding quantile q."""
    total = sum(dist.values())
    if total == 0:
        return None
    seen = 0
    for i in sorted(dist):
        seen += dist[i]
        if seen >= q * total:
            return 2 ** i
    return None


def parse_memaslap(text):
    out = {"latency_us": {}}
    block = None
    in_dist = False
    for line in text.splitlines():
        line = line.replace("\x1b[1;1H\x1b[2J", "")
        m = BLOCK.match(line)
        if m:
            block = {"events": int(m.group(2)), "log2_dist": {}}
            out["latency_us"][m.group(1).lower()] = block
            in_dist = False
            continue
        if block is not None:
            m = FIELD.match(line)
            if m:
                block[m.group(1).lower()] = float(m.group(2))
                continue
            if line.strip() == "Log2 Dist:":
                in_dist = True
                continue
            m = DIST.match(line) if in_dist else None
            if m:
                first = int(m.group(1))
                for k, c in enumerate(m.group(2).split()):
                    if int(c):
                        block["log2_dist"][first + k] = int(c)
                continue
            block, in_dist = None, False
        m = COUNTER.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
            continue
        m = SUMMARY.search(line)
        if m:
            out["run_seconds"] = float(m.group(1))
            out["ops"] = int(m.group(2))
            out["ops_per_s"] = int(m.group(3))
            out["net_mb_per_s"] = float(m.group(4))
    for b in out["latency_us"].values():
        b["p50_bucket_upper"] = percentile_bucket(b["log2_dist"], 0.50)
        b["p99_bucket_upper"] = percentile_bucket(b["log2_dist"], 0.99)
        b["log2_dist"] = {str(k): v for k, v in sorted(b["log2_dist"].items())}
    # memaslap prints failures (timeouts, unexpected replies) as free text;
    # anything that looks like one is kept so the report can show it.
    # (Its own counters, such as "verify_failed: 0", are not failures.)
    out["error_lines"] = [
        l.strip() for l in text.splitlines()
        if re.search(r"error|fail|unexpected|timeout|refused|exited with status", l, re.I)
        and not COUNTER.match(l)
    ][:20]
    return out


def cmd_memaslap(args):
    with open(args.log, errors="replace") as f:
        text = f.read()
    run = {"bench": args.bench, "system": args.system,
           "workers": args.workers, "rep": args.rep}
    run.update(parse_memaslap(text))
    run["ok"] = "ops_per_s" in run and not run["error_lines"]
    if "ops_per_s" not in run:
        run["error"] = "memaslap printed no summary"
    elif run["error_lines"]:
        run["error"] = "memaslap reported errors: " + run["error_lines"][0]
    elif args.strict:
        # Every key is set before it is read, so a miss or a value that
        # differs from the one set is a wrong reply.
        wrong = {k: run.get(k) for k in ("get_misses", "verify_misses", "verify_failed")
                 if run.get(k)}
        if wrong:
            run["ok"] = False
            run["error"] = "wrong replies: " + ", ".join(f"{k} {v}" for k, v in wrong.items())
    run.update(parse_fields(args.field))
    server_died(run)
    print(json.dumps(run, sort_keys=True))


def server_died(run):
    if run.get("server_alive_at_end") is False:
        run["ok"] = False
        run["error"] = ((run.get("error") or "") + " the server exited during the run").strip()


def parse_fields(fields):
    out = {}
    for f in fields or []:
        k, _, v = f.partition("=")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def cmd_tag(args):
    raw = sys.stdin.read().strip()
    try:
        run = json.loads(raw.splitlines()[-1]) if raw else {}
    except ValueError:
        run = {"ok": False, "error": "unreadable driver output: " + raw[-200:]}
    if not raw:
        run = {"ok": False, "error": "the driver printed nothing"}
    run.update({"bench": args.bench, "system": args.system,
                "workers": args.workers, "rep": args.rep})
    run.update(parse_fields(args.field))
    if run.get("identical_to_reference") is False:
        run["ok"] = False
        run["error"] = ((run.get("error") or "") + " output differs from the reference merge").strip()
    if run.get("hadoop_verify_ok") is False:
        run["ok"] = False
        run["error"] = ((run.get("error") or "") + " Hadoop's IFile.Reader rejects it").strip()
    server_died(run)
    print(json.dumps(run, sort_keys=True))


# wrk's report, e.g.
#     Latency     3.81ms    1.25ms  19.24ms   85.13%
#   Latency Distribution
#      99%    8.91ms
#   78952 requests in 3.00s, 28.16MB read
#   Socket errors: connect 0, read 45156, write 0, timeout 0
#   Non-2xx or 3xx responses: 13105
# Requests/sec:  26305.93
UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0, "h": 3600000.0}
TIME = r"([\d.]+)(us|ms|s|m|h)"
WRK_LAT = re.compile(r"^\s+Latency\s+" + TIME + r"\s+" + TIME + r"\s+" + TIME)
WRK_PCT = re.compile(r"^\s+(50|75|90|99)%\s+" + TIME + r"\s*$")
WRK_TOTAL = re.compile(r"^\s+(\d+) requests in " + TIME + r", ([\d.]+\w+) read")
WRK_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
WRK_NON2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
WRK_RPS = re.compile(r"^Requests/sec:\s+([\d.]+)")


def ms(value, unit):
    return round(float(value) * UNITS_MS[unit], 3)


def parse_wrk(text):
    out = {"latency_ms": {}, "socket_errors": {"connect": 0, "read": 0, "write": 0, "timeout": 0},
           "non_2xx_3xx": 0}
    for line in text.splitlines():
        m = WRK_LAT.match(line)
        if m:
            out["latency_ms"].update(avg=ms(*m.group(1, 2)), stdev=ms(*m.group(3, 4)),
                                     max=ms(*m.group(5, 6)))
            continue
        m = WRK_PCT.match(line)
        if m:
            out["latency_ms"]["p" + m.group(1)] = ms(*m.group(2, 3))
            continue
        m = WRK_TOTAL.match(line)
        if m:
            out["requests"] = int(m.group(1))
            out["run_seconds"] = ms(*m.group(2, 3)) / 1000.0
            out["bytes_read"] = m.group(4)
            continue
        m = WRK_SOCKET.search(line)
        if m:
            out["socket_errors"] = dict(zip(("connect", "read", "write", "timeout"),
                                            map(int, m.groups())))
            continue
        m = WRK_NON2XX.search(line)
        if m:
            out["non_2xx_3xx"] = int(m.group(1))
            continue
        m = WRK_RPS.match(line)
        if m:
            out["requests_per_s"] = float(m.group(1))
    out["socket_errors_total"] = sum(out["socket_errors"].values())
    return out


def cmd_wrk(args):
    with open(args.log, errors="replace") as f:
        text = f.read()
    run = {"bench": "http", "system": args.system, "workers": args.workers, "rep": args.rep,
           "conns": args.conns, "mode": args.mode}
    run.update(parse_wrk(text))
    run.update(parse_fields(args.field))
    problems = []
    if "requests_per_s" not in run:
        tail = [l.strip() for l in text.splitlines() if l.strip()][-2:]
        problems.append("wrk printed no summary" + (": " + " / ".join(tail) if tail else ""))
    if run["socket_errors_total"]:
        problems.append("socket errors " + ", ".join(
            f"{k} {v}" for k, v in run["socket_errors"].items() if v))
    if run["non_2xx_3xx"]:
        problems.append(f"{run['non_2xx_3xx']} non-2xx/3xx responses")
    if run.get("probe_ok") is False:
        problems.append("the probe request before the run got a wrong response")
    # wrk stops sending at its duration; a run that took much longer means
    # wrk itself got no CPU (the machine is shared), whatever the server did.
    run["seconds_asked"] = args.seconds
    run["load_generator_stalled"] = bool(run.get("run_seconds")) and \
        run["run_seconds"] > 1.5 * args.seconds + 0.5
    if run["load_generator_stalled"]:
        problems.insert(0, "wrk ran %.1f s for a %d s run: the load generator was starved" % (
            run["run_seconds"], args.seconds))
    run["ok"] = not problems
    if problems:
        run["error"] = "; ".join(problems)
    server_died(run)
    print(json.dumps(run, sort_keys=True))


# ---------------------------------------------------------------- report

LABELS = {
    ("memcached_binary", "flick"): "Flick proxy",
    ("memcached_binary", "memcached"): "memcached directly",
    ("memcached_ascii", "flick"): "Flick ASCII proxy",
    ("memcached_ascii", "twemproxy"): "twemproxy",
    ("memcached_ascii", "memcached"): "memcached directly",
    ("hadoop", "flick"): "Flick aggregator",
    ("hadoop", "combiner"): "hand-written combiner",
    ("http", "flick"): "Flick load balancer",
    ("http", "nginx"): "nginx reverse proxy",
    ("http", "haproxy"): "HAProxy",
    ("http", "flick_static"): "Flick static web server",
    ("http", "nginx_static"): "nginx static file",
}

# The HTTP systems that serve the page themselves (the static web server
# comparison); the others balance over two backends.
HTTP_STATIC = ("flick_static", "nginx_static")


def label(bench, system, workers):
    name = LABELS.get((bench, system), system)
    if system in ("flick", "flick_static") or (bench == "http" and system in ("nginx", "nginx_static")):
        return f"{name}, {workers} worker{'s' if workers != 1 else ''}"
    if system in ("haproxy", "twemproxy"):
        return f"{name}, {workers} thread{'s' if workers != 1 else ''}"
    return name


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, digits=0):
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def summarise(runs):
    groups = {}
    for r in runs:
        groups.setdefault((r["bench"], r["system"], r["workers"], r.get("mode"), r.get("conns")),
                          []).append(r)
    summary = []
    for (bench, system, workers, mode, conns), rs in groups.items():
        good = [r for r in rs if r.get("ok")]
        s = {"bench": bench, "system": system, "workers": workers,
             "label": label(bench, system, workers),
             "runs": len(rs), "failed_runs": len(rs) - len(good),
             "errors": sorted({r.get("error") or "" for r in rs if not r.get("ok")})}
        if bench in ("memcached_binary", "memcached_ascii"):
            ops = [r["ops_per_s"] for r in good]
            s["median_ops_per_s"] = median(ops)
            s["min_ops_per_s"] = min(ops) if ops else None
            s["max_ops_per_s"] = max(ops) if ops else None
            for kind in ("get", "set", "total"):
                lat = [r["latency_us"][kind] for r in good if kind in r.get("latency_us", {})]
                s[f"median_{kind}_avg_us"] = median([l["avg"] for l in lat if "avg" in l])
                s[f"median_{kind}_geo_us"] = median([l["geo"] for l in lat if "geo" in l])
                s[f"median_{kind}_p99_bucket_us"] = median(
                    [l["p99_bucket_upper"] for l in lat if l.get("p99_bucket_upper")])
                s[f"max_{kind}_max_us"] = max([l["max"] for l in lat if "max" in l], default=None)
            for k in ("get_misses", "verify_misses", "verify_failed"):
                s[f"total_{k}"] = sum(r.get(k) or 0 for r in rs)
        elif bench == "hadoop":
            mbs = [r["mb_per_s"] for r in good]
            s["median_mb_per_s"] = median(mbs)
            s["min_mb_per_s"] = min(mbs) if mbs else None
            s["max_mb_per_s"] = max(mbs) if mbs else None
            s["median_seconds"] = median([r["seconds"] for r in good])
            s["input_bytes"] = good[0]["input_bytes"] if good else None
            s["output_bytes"] = good[0]["output_bytes"] if good else None
            s["reduction"] = good[0]["reduction"] if good else None
        elif bench == "http":
            s["mode"], s["conns"] = mode, conns
            # Runs with errors are flagged; when every run of a configuration
            # had them, its figures come from those runs (marked), since a
            # blank would hide how it failed.
            use = good or [r for r in rs if r.get("requests_per_s") is not None]
            s["figures_from_failed_runs"] = bool(use) and not good
            rps = [r["requests_per_s"] for r in use]
            s["median_requests_per_s"] = median(rps)
            s["min_requests_per_s"] = min(rps) if rps else None
            s["max_requests_per_s"] = max(rps) if rps else None
            for q in ("p50", "p99"):
                s[f"median_{q}_ms"] = median([r["latency_ms"][q] for r in use
                                              if q in r.get("latency_ms", {})])
            s["median_non_2xx_3xx"] = median([r.get("non_2xx_3xx", 0) for r in rs])
            s["median_socket_errors"] = median([r.get("socket_errors_total", 0) for r in rs])
            for k in ("response_head_bytes", "response_body_bytes"):
                s[k] = median([r[k] for r in rs if isinstance(r.get(k), (int, float))])
        summary.append(s)
    # Ratios against the baseline of each benchmark.
    for bench, base_system, key in (("memcached_binary", "memcached", "median_ops_per_s"),
                                    ("memcached_ascii", "memcached", "median_ops_per_s"),
                                    ("hadoop", "combiner", "median_mb_per_s")):
        base = [s for s in summary if s["bench"] == bench and s["system"] == base_system]
        for s in summary:
            if s["bench"] == bench and base and base[0].get(key) and s.get(key):
                s["ratio_to_baseline"] = s[key] / base[0][key]
    # Memcached ASCII: Flick against twemproxy (one thread), the goal's peer.
    peer = [s for s in summary if s["bench"] == "memcached_ascii" and s["system"] == "twemproxy"]
    for s in summary:
        if s["bench"] == "memcached_ascii" and peer and peer[0].get("median_ops_per_s") \
                and s.get("median_ops_per_s"):
            s["ratio_to_twemproxy"] = s["median_ops_per_s"] / peer[0]["median_ops_per_s"]
    # HTTP: Flick against nginx and HAProxy with as many workers (threads),
    # under the same load style and connection count; the static web server
    # against nginx serving the file.
    for s in summary:
        if s["bench"] != "http" or s["system"] not in ("flick", "flick_static") \
                or not s.get("median_requests_per_s") or s.get("figures_from_failed_runs"):
            continue
        others = ("nginx", "haproxy") if s["system"] == "flick" else ("nginx_static",)
        for other in others:
            peer = [p for p in summary if p["bench"] == "http" and p["system"] == other
                    and p["mode"] == s["mode"] and p["conns"] == s["conns"]
                    and p["workers"] == s["workers"]]
            if peer and peer[0].get("median_requests_per_s") \
                    and not peer[0].get("figures_from_failed_runs"):
                s[f"ratio_to_{other}"] = s["median_requests_per_s"] / peer[0]["median_requests_per_s"]
    order = {"memcached_binary": 0, "memcached_ascii": 1, "http": 2, "hadoop": 3}
    sysorder = {"flick": 0, "twemproxy": 1, "nginx": 1, "haproxy": 2, "flick_static": 3,
                "nginx_static": 4}
    summary.sort(key=lambda s: (order.get(s["bench"], 9), s.get("mode") or "", s.get("conns") or 0,
                                sysorder.get(s["system"], 5), s["workers"]))
    return summary


def plot(summary, runs, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["(no plots: matplotlib is not installed)"]
    made = []
    for bench, key, run_key, ylabel, title, fname in (
        ("memcached_binary", "median_ops_per_s", "ops_per_s", "operations per second",
         "Memcached binary, memaslap 90% get / 10% set", "memcached_binary.png"),
        ("memcached_ascii", "median_ops_per_s", "ops_per_s", "operations per second",
         "Memcached ASCII, memaslap 90% get / 10% set", "memcached_ascii.png"),
        ("hadoop", "median_mb_per_s", "mb_per_s", "MB/s of mapper input (log scale)",
         "Hadoop word-count aggregation, 8 mappers", "hadoop.png"),
    ):
        rows = [s for s in summary if s["bench"] == bench and s.get(key)]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=90)
        names = [s["label"].replace(", ", "\n") for s in rows]
        values = [s[key] for s in rows]
        colors = ["#4c72b0" if s["system"] == "flick" else "#999999" for s in rows]
        ax.bar(range(len(rows)), values, color=colors, width=0.6)
        for i, s in enumerate(rows):
            pts = [r[run_key] for r in runs if r.get("ok") and r["bench"] == bench
                   and r["system"] == s["system"] and r["workers"] == s["workers"]]
            ax.scatter([i] * len(pts), pts, color="black", s=8, zorder=3)
            ax.annotate(fmt(s[key], 0 if key == "median_ops_per_s" else 1),
                        (i, s[key]), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 3), textcoords="offset points")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(title + " (bars: median, dots: runs)", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        if bench == "hadoop":
            ax.set_yscale("log")
        ax.margins(y=0.15)
        fig.tight_layout()
        fig.savefig(f"{out_dir}/{fname}")
        plt.close(fig)
        made.append(fname)
    made += plot_http(summary, plt, out_dir)
    return made


HTTP_STYLE = {"flick": ("#4c72b0", "o"), "nginx": ("#dd8452", "s"), "haproxy": ("#55a868", "^"),
              "flick_static": ("#4c72b0", "o"), "nginx_static": ("#999999", "D")}


def plot_http(summary, plt, out_dir):
    """Requests/s and p99 latency against connections (the paper's Figures
    4-6): for the balancers one figure per load style, for the static web
    servers one figure (http_static.png) with a row per load style. Points
    whose runs all had errors are drawn as red crosses."""
    made = []
    modes = (("keepalive", "keep-alive connections"), ("close", "one request per connection"))
    http = [s for s in summary if s["bench"] == "http" and s.get("median_requests_per_s") is not None]
    for mode, title in modes:
        rows = [s for s in http if s["mode"] == mode and s["system"] not in HTTP_STATIC]
        if not rows:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6), dpi=90)
        plot_http_axes(rows, axes)
        fig.suptitle(f"HTTP balancing, wrk, {title} (medians; red x: every run had errors)",
                     fontsize=9)
        fig.tight_layout()
        fname = f"http_{mode}.png"
        fig.savefig(f"{out_dir}/{fname}")
        plt.close(fig)
        made.append(fname)
    static = [(mode, title, [s for s in http if s["mode"] == mode and s["system"] in HTTP_STATIC])
              for mode, title in modes]
    static = [m for m in static if m[2]]
    if static:
        fig, axes = plt.subplots(len(static), 2, figsize=(9.6, 3.4 * len(static)), dpi=90,
                                 squeeze=False)
        for (mode, title, rows), ax_row in zip(static, axes):
            plot_http_axes(rows, ax_row)
            ax_row[0].set_title(title, fontsize=8)
            ax_row[1].set_title(title, fontsize=8)
        fig.suptitle("HTTP static web server, wrk (medians; red x: every run had errors)",
                     fontsize=9)
        fig.tight_layout()
        fig.savefig(f"{out_dir}/http_static.png")
        plt.close(fig)
        made.append("http_static.png")
    return made


def plot_http_axes(rows, axes):
    """Draws requests/s (axes[0]) and p99 (axes[1]) against connections, a
    line per system and worker count."""
    from matplotlib.ticker import ScalarFormatter
    for (system, workers) in sorted({(s["system"], s["workers"]) for s in rows},
                                    key=lambda k: (not k[0].startswith("flick"), k)):
        pts = sorted((s for s in rows if s["system"] == system and s["workers"] == workers),
                     key=lambda s: s["conns"])
        color, marker = HTTP_STYLE.get(system, ("black", "x"))
        style = "-" if workers <= 1 else "--"
        for ax, key in ((axes[0], "median_requests_per_s"), (axes[1], "median_p99_ms")):
            xs = [s["conns"] for s in pts if s.get(key) is not None]
            ys = [s[key] for s in pts if s.get(key) is not None]
            ax.plot(xs, ys, style, color=color, marker=marker, markersize=4,
                    label=pts[0]["label"], linewidth=1.2)
            bad = [(s["conns"], s[key]) for s in pts
                   if s.get(key) is not None and s.get("figures_from_failed_runs")]
            if bad:
                ax.scatter(*zip(*bad), color="red", marker="x", s=60, zorder=4)
    for ax, ylabel in ((axes[0], "requests per second"), (axes[1], "p99 latency, ms (log)")):
        ax.set_xscale("log")
        ax.set_xticks(sorted({s["conns"] for s in rows}))
        ax.get_xaxis().set_major_formatter(ScalarFormatter())
        ax.minorticks_off()
        ax.set_xlabel("concurrent connections", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
    axes[1].set_yscale("log")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(fontsize=6, loc="best")


def markdown(data):
    m = data["machine"]
    st = data["settings"]
    lines = ["# Side-by-side service benchmarks (bench/run.sh)", ""]
    bad = [r for r in data["runs"] if not r.get("ok")]
    if bad:
        lines += ["**WARNING: %d run(s) failed or produced wrong output; their figures are "
                  "left out of the medians (except HTTP rows where every run failed, which are "
                  "marked ERRORS):**" % len(bad), ""]
        for r in bad:
            where = f" {r['mode']} {r['conns']} conns" if r["bench"] == "http" else ""
            lines.append(f"- {r['bench']}{where} {label(r['bench'], r['system'], r['workers'])} "
                         f"run {r['rep']}: {r.get('error')}")
        lines.append("")
    lines += [
        "Machine: %s, %s cores (nproc), Linux %s; load average %s at the start, %s at the end."
        % (m.get("cpu_model"), m.get("nproc"), m.get("kernel"),
           m.get("loadavg_start"), m.get("loadavg_end")),
        "Flick %s; %s; memcached %s." % (m.get("flick_commit"), m.get("rustc"),
                                         m.get("memcached_version")),
    ]
    if m.get("tools"):
        lines.append("Also: %s." % ", ".join(m["tools"]))
    lines += [
        "Every configuration ran %s times (HTTP: %s), alternating systems run by run; figures "
        "are medians." % (st.get("reps"), st.get("http_reps", "-")),
        "",
    ]
    mc = [s for s in data["summary"] if s["bench"] == "memcached_binary"]
    if mc:
        lines += [
            "## Memcached binary protocol",
            "",
            "`memaslap -B -c %s -T %s -t %ss`, %s-byte keys, %s-byte values, %s%% get / %s%% set. "
            "The Flick proxy (`examples/memcached_proxy.flick`) stands in front of four memcached "
            "servers; \"memcached directly\" is one memcached server with no proxy. memaslap "
            "reports latency in microseconds; p99 is the upper bound of memaslap's log2 bucket."
            % (st["memaslap_concurrency"], st["memaslap_threads"], st["memaslap_seconds"],
               st["key_bytes"], st["value_bytes"], st["get_percent"], 100 - st["get_percent"]),
            "",
            "| system | ops/s (median) | min-max | ratio to direct | avg latency us | geo mean us | p99 <= us | failed runs |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in mc:
            lines.append("| %s | %s | %s-%s | %s | %s | %s | %s | %d of %d |" % (
                s["label"], fmt(s.get("median_ops_per_s")), fmt(s.get("min_ops_per_s")),
                fmt(s.get("max_ops_per_s")), fmt(s.get("ratio_to_baseline"), 2),
                fmt(s.get("median_total_avg_us")), fmt(s.get("median_total_geo_us")),
                fmt(s.get("median_total_p99_bucket_us")), s["failed_runs"], s["runs"]))
        lines.append("")
    lines += markdown_memcached_ascii(data)
    lines += markdown_http(data)
    hd = [s for s in data["summary"] if s["bench"] == "hadoop"]
    if hd:
        lines += [
            "## Hadoop word-count aggregation",
            "",
            "8 mapper connections each send one sorted, uncombined word-count IFile (%s words in "
            "all, %s bytes); the time runs from the first byte sent to the reducer's EOF. Input: %s. "
            "Every run's reducer stream is checked (CRC32, key order, every count) and compared "
            "byte for byte with %s." % (
                fmt(st.get("hadoop_words")), fmt(hd[0].get("input_bytes")),
                st.get("hadoop_input"), st.get("hadoop_reference")),
            "",
            "| system | MB/s (median) | min-max | seconds (median) | ratio to combiner | input/output bytes | failed runs |",
            "|---|---|---|---|---|---|---|",
        ]
        for s in hd:
            lines.append("| %s | %s | %s-%s | %s | %s | %s | %d of %d |" % (
                s["label"], fmt(s.get("median_mb_per_s"), 1), fmt(s.get("min_mb_per_s"), 1),
                fmt(s.get("max_mb_per_s"), 1), fmt(s.get("median_seconds"), 3),
                fmt(s.get("ratio_to_baseline"), 3), fmt(s.get("reduction"), 1),
                s["failed_runs"], s["runs"]))
        lines.append("")
    if data.get("profile"):
        lines += ["## Where Flick's aggregator spends its time", "",
                  "`perf record` on `flick run` (%s) during one extra Hadoop run; self time by "
                  "symbol, top entries:" % data["profile"]["what"], "", "```"]
        lines += data["profile"]["top"]
        lines += ["```", "", "Self time by module:", "", "| module | % of samples |", "|---|---|"]
        lines += [f"| `{k}` | {v:.1f} |" for k, v in data["profile"].get("groups", [])[:12]]
        lines += [""]
    if data.get("http_profile"):
        lines += ["## Where Flick's HTTP load balancer spends its time", "",
                  "`perf record -g` on `flick run examples/http_lb.flick` (%s); self time by "
                  "symbol, top entries:" % data["http_profile"]["what"], "", "```"]
        lines += data["http_profile"]["top"]
        lines += ["```", "", "Self time by module:", "", "| module | % of samples |", "|---|---|"]
        lines += [f"| `{k}` | {v:.1f} |" for k, v in data["http_profile"].get("groups", [])[:12]]
        lines += [""]
    if data.get("skipped"):
        lines += ["## Not measured", ""]
        for s in data["skipped"]:
            lines.append(f"- {s['bench']}: skipped: {s['reason']}")
        lines.append("")
    if data.get("plots"):
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in data["plots"]] + [""]
    return "\n".join(lines)


def markdown_memcached_ascii(data):
    st = data["settings"]
    rows = [s for s in data["summary"] if s["bench"] == "memcached_ascii"]
    if not rows:
        return []
    lines = [
        "## Memcached ASCII protocol",
        "",
        "`memaslap -c %s -T %s -t %ss --verify=%s` (text protocol), %s-byte keys, %s-byte values, "
        "%s%% get / %s%% set. The Flick proxy (`examples/memcached_ascii_proxy.flick`) and "
        "twemproxy (%s) each stand in front of the same four memcached servers; twemproxy is "
        "single-threaded. \"memcached directly\" is one memcached server with no proxy. "
        "Latencies in microseconds; p99 is the upper bound of memaslap's log2 bucket. A run "
        "with a get miss or a failed verification counts as failed."
        % (st["memaslap_concurrency"], st["memaslap_threads"], st["memaslap_seconds"],
           st.get("ascii_verify"), st["key_bytes"], st["value_bytes"], st["get_percent"],
           100 - st["get_percent"], st.get("twemproxy_config")),
        "",
        "| system | ops/s (median) | min-max | ratio to twemproxy | ratio to direct | avg latency us | p99 <= us | misses / verify failures | failed runs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        lines.append("| %s | %s | %s-%s | %s | %s | %s | %s | %d / %d | %d of %d |" % (
            s["label"], fmt(s.get("median_ops_per_s")), fmt(s.get("min_ops_per_s")),
            fmt(s.get("max_ops_per_s")), fmt(s.get("ratio_to_twemproxy"), 2),
            fmt(s.get("ratio_to_baseline"), 2), fmt(s.get("median_total_avg_us")),
            fmt(s.get("median_total_p99_bucket_us")),
            s.get("total_get_misses", 0), s.get("total_verify_failed", 0),
            s["failed_runs"], s["runs"]))
    lines.append("")
    flick = [s for s in rows if s["system"] == "flick" and s.get("ratio_to_twemproxy")]
    peer = [s for s in rows if s["system"] == "twemproxy"]
    if flick and peer:
        best = max(flick, key=lambda s: s["ratio_to_twemproxy"])
        p99s = [s.get("median_total_p99_bucket_us") for s in flick]
        peer_p99 = peer[0].get("median_total_p99_bucket_us")
        lines += ["Goals (from the issue): throughput at least 1.5x twemproxy's: best Flick "
                  "configuration (%s) %.2fx, **%s**. p99 no worse than the best peer's "
                  "(twemproxy, <= %s us): Flick's p99 <= %s us, **%s**." % (
                      best["label"], best["ratio_to_twemproxy"],
                      "met" if best["ratio_to_twemproxy"] >= 1.5 else "not met",
                      fmt(peer_p99), " / ".join(fmt(p) for p in p99s),
                      "met" if peer_p99 and all(p and p <= peer_p99 for p in p99s) else "not met"),
                  ""]
    return lines


def http_table(title, rows, ratios):
    """A Markdown table of HTTP rows, with a column per (header, key) ratio."""
    heads = " | ".join(h for h, _ in ratios)
    lines = [f"#### {title}", "",
             f"| conns | system | requests/s (median) | min-max | p99 ms | {heads} | non-2xx per run | socket errors per run | failed runs |",
             "|---|---|---|---|---|" + "---|" * len(ratios) + "---|---|---|"]
    for s in rows:
        cells = [str(s["conns"]),
                 s["label"] + (" **ERRORS**" if s.get("figures_from_failed_runs") else ""),
                 fmt(s.get("median_requests_per_s")),
                 "%s-%s" % (fmt(s.get("min_requests_per_s")), fmt(s.get("max_requests_per_s"))),
                 fmt(s.get("median_p99_ms"), 2)]
        cells += [fmt(s.get(k), 2) for _, k in ratios]
        cells += [fmt(s.get("median_non_2xx_3xx")), fmt(s.get("median_socket_errors")),
                  "%d of %d" % (s["failed_runs"], s["runs"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def markdown_http(data):
    st = data["settings"]
    rows = [s for s in data["summary"] if s["bench"] == "http"]
    if not rows:
        return []
    lines = [
        "## HTTP",
        "",
        "`wrk -t %s -c CONNS -d %ss --latency`, GET of a %s-byte file. Two load styles: "
        "keep-alive (wrk's default) and one request per connection (`-H \"Connection: close\"`). "
        "p99 is wrk's, in milliseconds. A run with socket errors or non-2xx/3xx responses is "
        "failed; when every run of a row failed, its figures come from the failed runs and are "
        "marked **ERRORS**."
        % (st.get("http_threads"), st.get("http_seconds"), st.get("http_body_bytes")),
        "",
    ]
    modes = (("keepalive", "keep-alive connections"),
             ("close", "one request per connection (`Connection: close`)"))
    balancing = [s for s in rows if s["system"] not in HTTP_STATIC]
    if balancing:
        lines += [
            "### Load balancing",
            "",
            "The Flick load balancer (`examples/http_lb.flick`, run with `--max-instances 4096`, which picks the backend by "
            "`hash(client)`, a hash of the connection's addresses and ports, so wrk's "
            "connections spread over both backends; it passes each request on with the "
            "hop-by-hop headers removed, `Connection: keep-alive` toward the backend and "
            "`X-Forwarded-For` added, so `Connection: close` clients reuse pooled backend "
            "connections); nginx as a reverse proxy (`upstream` of both backends, `keepalive 64`, "
            "HTTP/1.1 to the backends); HAProxy (`mode http`, `balance roundrobin`, "
            "`http-reuse always`, `nbthread` = workers). Each proxies to the same two nginx "
            "backends (one process each) serving the file.",
            "",
        ]
        for mode, title in modes:
            mrows = [s for s in balancing if s["mode"] == mode]
            if not mrows:
                continue
            lines += http_table(f"Balancing, {title}", mrows,
                                [("Flick/nginx", "ratio_to_nginx"), ("Flick/HAProxy", "ratio_to_haproxy")])
    static = [s for s in rows if s["system"] in HTTP_STATIC]
    if static:
        def size(system):
            # Keep-alive probes: a `Connection: close` one adds that field.
            rows_of = [s for s in static if s["system"] == system and s["mode"] == "keepalive"]
            heads = [s["response_head_bytes"] for s in rows_of
                     if s.get("response_head_bytes") is not None]
            bodies = [s["response_body_bytes"] for s in rows_of
                      if s.get("response_body_bytes") is not None]
            if not heads or not bodies:
                return "not measured"
            h, b = median(heads), median(bodies)
            return "%s bytes in all (head %s, body %s)" % (fmt(h + b), fmt(h), fmt(b))
        lines += [
            "### Static web server",
            "",
            "Flick's static web server (`examples/static_web.flick`, `--workers` 1 and 2), which "
            "answers every request with the same page, against nginx serving the %s-byte file "
            "(`worker_processes` 1 and 2, `access_log off`, `keepalive_requests` unlimited). "
            "Flick runs with `--max-instances 4096`, above every connection count. "
            "Response sizes, as the keep-alive probe before each run received them: Flick %s; nginx %s "
            "(its head carries `Server`, `Date`, `Content-Type`, `Last-Modified`, `ETag` and "
            "`Accept-Ranges`). Flick/nginx compares the same worker count, load style and "
            "connection count."
            % (st.get("http_body_bytes"), size("flick_static"), size("nginx_static")),
            "",
        ]
        for mode, title in modes:
            mrows = [s for s in static if s["mode"] == mode]
            if not mrows:
                continue
            lines += http_table(f"Static, {title}", mrows, [("Flick/nginx", "ratio_to_nginx_static")])
    return lines


def write_json(data, f):
    """The report's data, one list element per line, to keep the file small
    and its diffs readable."""
    compact = dict(sort_keys=True, separators=(",", ":"))
    items = sorted(data.items())
    f.write("{\n")
    for i, (k, v) in enumerate(items):
        if isinstance(v, list) and v:
            body = "[\n" + ",\n".join("  " + json.dumps(x, **compact) for x in v) + "\n ]"
        else:
            body = json.dumps(v, **compact)
        f.write(f" {json.dumps(k)}: {body}{',' if i < len(items) - 1 else ''}\n")
    f.write("}\n")


def cmd_report(args):
    runs = []
    with open(args.runs) as f:
        for line in f:
            if line.strip():
                runs.append(json.loads(line))
    with open(args.machine) as f:
        meta = json.load(f)
    data = {"machine": meta["machine"], "settings": meta["settings"],
            "skipped": meta.get("skipped", []), "runs": runs}
    for k in ("profile", "http_profile"):
        if meta.get(k):
            data[k] = meta[k]
    data["summary"] = summarise(runs)
    data["plots"] = plot(data["summary"], runs, args.out)
    with open(f"{args.out}/results.json", "w") as f:
        write_json(data, f)
    md = markdown(data)
    with open(f"{args.out}/results.md", "w") as f:
        f.write(md + "\n")
    print(md)
    return 1 if any(not r.get("ok") for r in runs) else 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("memaslap")
    a.add_argument("log")
    a.add_argument("--bench", default="memcached_binary")
    a.add_argument("--strict", action="store_true",
                   help="a get miss or failed verification is a wrong reply")
    a.add_argument("--system", required=True)
    a.add_argument("--workers", type=int, default=0)
    a.add_argument("--rep", type=int, required=True)
    a.add_argument("--field", action="append")
    a = sub.add_parser("wrk")
    a.add_argument("log")
    a.add_argument("--system", required=True)
    a.add_argument("--workers", type=int, default=0)
    a.add_argument("--rep", type=int, required=True)
    a.add_argument("--conns", type=int, required=True)
    a.add_argument("--mode", required=True, choices=("keepalive", "close"))
    a.add_argument("--seconds", type=int, required=True, help="wrk's -d")
    a.add_argument("--field", action="append")
    a = sub.add_parser("tag")
    a.add_argument("--bench", required=True)
    a.add_argument("--system", required=True)
    a.add_argument("--workers", type=int, default=0)
    a.add_argument("--rep", type=int, required=True)
    a.add_argument("--field", action="append")
    a = sub.add_parser("report")
    a.add_argument("--runs", required=True)
    a.add_argument("--machine", required=True)
    a.add_argument("--out", required=True)
    args = p.parse_args()
    return {"memaslap": cmd_memaslap, "wrk": cmd_wrk, "tag": cmd_tag,
            "report": cmd_report}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
