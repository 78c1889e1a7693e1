#!/usr/bin/env python3
"""Figures for bench/run.sh: parses load-generator output into one JSON line
per run, and turns the runs into results.md, results.json and PNG plots.

  report.py memaslap LOG --system S --workers W --rep R [--note TEXT]
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
COUNTER = re.compile(r"^(cmd_get|cmd_set|get_misses|written_bytes|read_bytes|object_bytes): (\d+)$")


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
    out["error_lines"] = [
        l.strip() for l in text.splitlines()
        if re.search(r"error|fail|unexpected|timeout|refused|exited with status", l, re.I)
    ][:20]
    return out


def cmd_memaslap(args):
    with open(args.log, errors="replace") as f:
        text = f.read()
    run = {"bench": "memcached_binary", "system": args.system,
           "workers": args.workers, "rep": args.rep}
    run.update(parse_memaslap(text))
    run["ok"] = "ops_per_s" in run and not run["error_lines"]
    if "ops_per_s" not in run:
        run["error"] = "memaslap printed no summary"
    elif run["error_lines"]:
        run["error"] = "memaslap reported errors: " + run["error_lines"][0]
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


# ---------------------------------------------------------------- report

LABELS = {
    ("memcached_binary", "flick"): "Flick proxy",
    ("memcached_binary", "memcached"): "memcached directly",
    ("hadoop", "flick"): "Flick aggregator",
    ("hadoop", "combiner"): "hand-written combiner",
}


def label(bench, system, workers):
    name = LABELS.get((bench, system), system)
    return f"{name}, {workers} worker{'s' if workers != 1 else ''}" if system == "flick" else name


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, digits=0):
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def summarise(runs):
    groups = {}
    for r in runs:
        groups.setdefault((r["bench"], r["system"], r["workers"]), []).append(r)
    summary = []
    for (bench, system, workers), rs in groups.items():
        good = [r for r in rs if r.get("ok")]
        s = {"bench": bench, "system": system, "workers": workers,
             "label": label(bench, system, workers),
             "runs": len(rs), "failed_runs": len(rs) - len(good),
             "errors": sorted({r.get("error") or "" for r in rs if not r.get("ok")})}
        if bench == "memcached_binary":
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
        elif bench == "hadoop":
            mbs = [r["mb_per_s"] for r in good]
            s["median_mb_per_s"] = median(mbs)
            s["min_mb_per_s"] = min(mbs) if mbs else None
            s["max_mb_per_s"] = max(mbs) if mbs else None
            s["median_seconds"] = median([r["seconds"] for r in good])
            s["input_bytes"] = good[0]["input_bytes"] if good else None
            s["output_bytes"] = good[0]["output_bytes"] if good else None
            s["reduction"] = good[0]["reduction"] if good else None
        summary.append(s)
    # Ratios against the baseline of each benchmark.
    for bench, base_system, key in (("memcached_binary", "memcached", "median_ops_per_s"),
                                    ("hadoop", "combiner", "median_mb_per_s")):
        base = [s for s in summary if s["bench"] == bench and s["system"] == base_system]
        for s in summary:
            if s["bench"] == bench and base and base[0].get(key) and s.get(key):
                s["ratio_to_baseline"] = s[key] / base[0][key]
    order = {"memcached_binary": 0, "hadoop": 1}
    summary.sort(key=lambda s: (order.get(s["bench"], 9), s["system"] != "flick", s["workers"]))
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
    return made


def markdown(data):
    m = data["machine"]
    st = data["settings"]
    lines = ["# Side-by-side service benchmarks (bench/run.sh)", ""]
    bad = [r for r in data["runs"] if not r.get("ok")]
    if bad:
        lines += ["**WARNING: %d run(s) failed or produced wrong output; their figures are "
                  "left out of the medians:**" % len(bad), ""]
        for r in bad:
            lines.append(f"- {r['bench']} {label(r['bench'], r['system'], r['workers'])} "
                         f"run {r['rep']}: {r.get('error')}")
        lines.append("")
    lines += [
        "Machine: %s, %s cores (nproc), Linux %s; load average %s at the start, %s at the end."
        % (m.get("cpu_model"), m.get("nproc"), m.get("kernel"),
           m.get("loadavg_start"), m.get("loadavg_end")),
        "Flick %s; %s; memcached %s." % (m.get("flick_commit"), m.get("rustc"),
                                         m.get("memcached_version")),
        "Every configuration ran %s times, alternating systems run by run; figures are medians."
        % st.get("reps"),
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
    if data.get("skipped"):
        lines += ["## Not measured", ""]
        for s in data["skipped"]:
            lines.append(f"- {s['bench']}: skipped: {s['reason']}")
        lines.append("")
    if data.get("plots"):
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in data["plots"]] + [""]
    return "\n".join(lines)


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
    if meta.get("profile"):
        data["profile"] = meta["profile"]
    data["summary"] = summarise(runs)
    data["plots"] = plot(data["summary"], runs, args.out)
    with open(f"{args.out}/results.json", "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
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
    a.add_argument("--system", required=True)
    a.add_argument("--workers", type=int, default=0)
    a.add_argument("--rep", type=int, required=True)
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
    return {"memaslap": cmd_memaslap, "tag": cmd_tag, "report": cmd_report}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
