#!/usr/bin/env python3
"""Summaries for bench/scale.sh.

  scale_report.py sum --conns N < memaslap runs (one JSON line each)
      one run record: the processes' ops/s summed, the worst p99 bucket
  scale_report.py report --runs RUNS --out DIR [--meta k=v ...]
      DIR/scale.md, DIR/scale.json, DIR/scale.png
"""
import argparse
import json
import statistics
import sys

# Which peers each Flick system is compared with, and the goals:
# Flick's throughput per worker over the peer's at the same worker count.
PEERS = {
    "http": ("flick", [("nginx", 1.3), ("haproxy", 1.1)]),
    "static": ("flick_static", [("nginx_static", 1.1)]),
    "memcached_ascii": ("flick", [("twemproxy", 1.5)]),
    "memcached_binary": ("flick", [("memcached", 0.5)]),
}
NAMES = {
    "flick": "Flick", "flick_static": "Flick", "nginx": "nginx", "nginx_static": "nginx",
    "haproxy": "HAProxy", "twemproxy": "twemproxy (N processes)",
    "memcached": "memcached (N threads)",
}
TITLES = {
    "http": "HTTP balancer (keep-alive, 137-byte file, two nginx backends)",
    "static": "Static web server (keep-alive, 137-byte file)",
    "memcached_ascii": "Memcached text proxy (90% get, four memcached servers)",
    "memcached_binary": "Memcached binary proxy (90% get, four memcached servers)",
}
SCALING_GOAL = 3.8


def cmd_sum(args):
    runs = [json.loads(l) for l in sys.stdin if l.strip()]
    if not runs:
        print(json.dumps({"ok": False, "error": "no memaslap output"}))
        return
    out = {k: runs[0][k] for k in ("bench", "system", "workers", "rep")}
    out["conns"] = args.conns
    out["processes"] = len(runs)
    out["ok"] = all(r.get("ok") for r in runs)
    errors = [r["error"] for r in runs if r.get("error")]
    if errors:
        out["error"] = "; ".join(errors)
    out["ops_per_s"] = sum(r.get("ops_per_s") or 0 for r in runs)
    p99s = [r.get("latency_us", {}).get("total", {}).get("p99_bucket_upper") for r in runs]
    p99s = [p for p in p99s if p]
    out["p99_us"] = max(p99s) if p99s else None
    out["per_process"] = runs
    print(json.dumps(out, sort_keys=True))


def bench_of(run):
    return run.get("scale_bench") or run.get("bench")


def throughput(run):
    return run.get("requests_per_s") or run.get("ops_per_s")


def p99_ms(run):
    if run.get("latency_ms", {}).get("p99") is not None:
        return run["latency_ms"]["p99"]
    return run["p99_us"] / 1000.0 if run.get("p99_us") else None


def summarise(runs):
    points = {}
    for r in runs:
        key = (bench_of(r), r["system"], int(r["workers"]), int(r.get("conns") or 0))
        points.setdefault(key, []).append(r)
    out = []
    for (bench, system, workers, conns), rs in sorted(points.items()):
        good = [r for r in rs if r.get("ok")]
        tp = [throughput(r) for r in good if throughput(r)]
        lat = [p99_ms(r) for r in good if p99_ms(r) is not None]
        out.append({
            "bench": bench, "system": system, "workers": workers, "conns": conns,
            "runs": len(rs), "failed": len(rs) - len(good),
            "errors": sorted({r.get("error", "") for r in rs if not r.get("ok")}),
            "throughput_median": statistics.median(tp) if tp else None,
            "throughput_min": min(tp) if tp else None, "throughput_max": max(tp) if tp else None,
            "p99_ms_median": statistics.median(lat) if lat else None,
        })
    return out


def find(summary, bench, system, workers, conns):
    for s in summary:
        if (s["bench"], s["system"], s["workers"], s["conns"]) == (bench, system, workers, conns):
            return s
    return None


def ratios(summary):
    out = []
    for bench, (mine, peers) in PEERS.items():
        for s in summary:
            if s["bench"] != bench or s["system"] != mine or not s["throughput_median"]:
                continue
            for peer, goal in peers:
                p = find(summary, bench, peer, s["workers"], s["conns"])
                if p and p["throughput_median"]:
                    r = s["throughput_median"] / p["throughput_median"]
                    out.append({"bench": bench, "workers": s["workers"], "conns": s["conns"],
                                "peer": peer, "ratio": round(r, 3), "goal": goal,
                                "met": r >= goal,
                                "p99_no_worse": (s["p99_ms_median"] or 0) <= (p["p99_ms_median"] or 0)})
    return out


def scaling(summary):
    out = []
    for s in summary:
        if s["workers"] == 1 or not s["throughput_median"]:
            continue
        one = find(summary, s["bench"], s["system"], 1, s["conns"])
        if one and one["throughput_median"]:
            out.append({"bench": s["bench"], "system": s["system"], "conns": s["conns"],
                        "workers": s["workers"],
                        "speedup": round(s["throughput_median"] / one["throughput_median"], 2)})
    return out


def fmt(x, digits=0):
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def markdown(meta, summary, rats, scal):
    lines = ["# Flick on a partitioned machine (bench/scale.sh)", ""]
    lines.append(
        f"Machine: {meta.get('cpu')}, {meta.get('nproc')} cores, {meta.get('kernel')}. Cores: proxy {meta.get('proxy_cores')}, "
        f"backends {meta.get('backend_cores')}, load generators {meta.get('load_cores')} "
        f"(partitioned: {meta.get('partitioned')}). Flick {meta.get('commit')}. "
        f"{meta.get('reps')} runs per point of {meta.get('seconds')} s, systems alternating; medians.")
    if str(meta.get("warmup", "0")) not in ("0", "", "None"):
        lines[-1] += (f" Each system was loaded for {meta.get('warmup')} s after it started, "
                      "not measured, before its measured run (steady state, not start-up).")
    else:
        lines[-1] += (" Each run measures from the system's start (its first connections "
                      "included).")
    if meta.get("partitioned") != "true":
        lines += ["", "**Not partitioned**: every role shared every core; these figures say "
                  "nothing per core."]
    if meta.get("pinned") == "false":
        lines += ["", "**Not pinned**: the kernel refused CPU affinity (taskset), so the core "
                  "sets above were not enforced; each system's worker count still held."]
    failed = [s for s in summary if s["failed"]]
    if failed:
        lines += ["", "**Failed runs:**"]
        for s in failed:
            lines.append(f"- {s['bench']} {s['system']} {s['workers']} w {s['conns']} conns: "
                         f"{s['failed']} of {s['runs']}: {'; '.join(s['errors'])[:300]}")
    for bench in PEERS:
        rows = [s for s in summary if s["bench"] == bench]
        if not rows:
            continue
        systems = sorted({s["system"] for s in rows}, key=lambda x: (x not in ("flick", "flick_static"), x))
        lines += ["", f"## {TITLES[bench]}", "",
                  "requests/s (p99 ms), median; " + ("ops/s for memaslap" if "memcached" in bench else "wrk"), ""]
        head = "| workers | conns | " + " | ".join(NAMES[s] for s in systems) + " |"
        lines += [head, "|" + "---|" * (2 + len(systems))]
        for w in sorted({s["workers"] for s in rows}):
            for c in sorted({s["conns"] for s in rows}):
                cells = []
                for sy in systems:
                    s = find(summary, bench, sy, w, c)
                    if not s:
                        cells.append("")
                    elif s["throughput_median"] is None:
                        cells.append("FAILED")
                    else:
                        cells.append(f"{fmt(s['throughput_median'])} ({fmt(s['p99_ms_median'], 1)})")
                lines.append(f"| {w} | {c} | " + " | ".join(cells) + " |")
        rs = [r for r in rats if r["bench"] == bench]
        if rs:
            lines += ["", "| workers | conns | Flick / peer | goal | met | p99 no worse |", "|---|---|---|---|---|---|"]
            for r in rs:
                lines.append(f"| {r['workers']} | {r['conns']} | {r['ratio']:.2f}x {NAMES[r['peer']]} | "
                             f"{r['goal']}x | {'yes' if r['met'] else 'no'} | {'yes' if r['p99_no_worse'] else 'no'} |")
        sc = [x for x in scal if x["bench"] == bench]
        if sc:
            lines += ["", "Scaling from 1 worker (goal for Flick: at least "
                      f"{SCALING_GOAL}x at 4): " + "; ".join(
                          f"{NAMES[x['system']]} {x['workers']} w {x['conns']} conns {x['speedup']}x" for x in sc)]
    return "\n".join(lines) + "\n"


def plot(summary, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    benches = [b for b in PEERS if any(s["bench"] == b for s in summary)]
    if not benches:
        return False
    fig, axes = plt.subplots(2, len(benches), figsize=(5 * len(benches), 8), squeeze=False)
    for col, bench in enumerate(benches):
        rows = [s for s in summary if s["bench"] == bench]
        for sy in sorted({s["system"] for s in rows}):
            for c in sorted({s["conns"] for s in rows}):
                pts = sorted((s["workers"], s["throughput_median"], s["p99_ms_median"])
                             for s in rows if s["system"] == sy and s["conns"] == c and s["throughput_median"])
                if not pts:
                    continue
                lab = NAMES[sy] + (f", {c} conns" if c else "")
                axes[0][col].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lab)
                axes[1][col].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=lab)
        axes[0][col].set_title(bench)
        axes[0][col].set_ylabel("requests/s")
        axes[1][col].set_ylabel("p99 ms")
        for r in (0, 1):
            axes[r][col].set_xlabel("workers")
            axes[r][col].legend(fontsize=7)
        axes[1][col].set_yscale("log")
    fig.tight_layout()
    fig.savefig(f"{out_dir}/scale.png", dpi=90)
    return True


def cmd_report(args):
    runs = [json.loads(l) for l in open(args.runs) if l.strip()]
    meta = dict(m.split("=", 1) for m in args.meta or [])
    summary = summarise(runs)
    rats = ratios(summary)
    scal = scaling(summary)
    with open(f"{args.out}/scale.json", "w") as f:
        json.dump({"meta": meta, "summary": summary, "ratios": rats, "scaling": scal, "runs": runs},
                  f, indent=1, sort_keys=True)
    with open(f"{args.out}/scale.md", "w") as f:
        f.write(markdown(meta, summary, rats, scal))
    plotted = plot(summary, args.out)
    sys.stdout.write(open(f"{args.out}/scale.md").read())
    if not plotted:
        print("(matplotlib unavailable: no scale.png)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("sum")
    a.add_argument("--conns", type=int, required=True)
    a = sub.add_parser("report")
    a.add_argument("--runs", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--meta", action="append")
    args = p.parse_args()
    {"sum": cmd_sum, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
