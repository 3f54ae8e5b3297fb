#!/usr/bin/env python3
"""report.py: the multi-GPU run's record (scripts/multigpu/gpu-multi.sh report).

Reads what the phases left in --dir: <name>.json per job (wall time, lanes, output hash),
<name>.stages.jsonl (the job's stage records: worker pid and lane), *-nvml.csv (per-process GPU
memory every 200 ms: timestamp, pid, process name, GPU bus id, MiB) with *-nvml-gpus.csv (index,
bus id, total MiB), and the devices/jobs listings of the hold and placement phases. Writes one
JSON record (docs/bench/) and prints a markdown table. Exit 1 when a check fails.
"""
import argparse, csv, glob, json, os, sys


def load_jobs(d):
    jobs = {}
    for f in sorted(glob.glob(os.path.join(d, "*.json"))):
        try:
            j = json.load(open(f))
        except (ValueError, OSError):
            continue
        if isinstance(j, dict) and "job" in j and "name" in j:
            st = os.path.join(d, j["name"] + ".stages.jsonl")
            j["workers"] = []
            if os.path.exists(st):
                for line in open(st):
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    if r.get("pid"):
                        j["workers"].append({"pid": r["pid"], "worker": r.get("worker"), "lane": r.get("lane"), "stage": r.get("stage"), "section": r.get("section")})
            jobs[j["name"]] = j
    return jobs


def load_nvml(path):
    """pid -> {name, bus, peak_mib}; and the GPUs index -> bus id."""
    procs, gpus = {}, {}
    gp = path[: -len(".csv")] + "-gpus.csv"
    if os.path.exists(gp):
        for row in csv.reader(open(gp)):
            if len(row) >= 3:
                gpus[row[0].strip()] = {"bus": row[1].strip().lower(), "total_mib": float(row[2])}
    if os.path.exists(path):
        for row in csv.reader(open(path)):
            if len(row) < 5:
                continue
            try:
                pid, mib = int(row[1]), float(row[4])
            except ValueError:
                continue
            p = procs.setdefault(pid, {"process": row[2].strip(), "bus": row[3].strip().lower(), "peak_mib": 0.0})
            p["peak_mib"] = max(p["peak_mib"], mib)
    return procs, gpus


def lane_bus(lane, gpus):
    if lane and lane.startswith("cuda:"):
        g = gpus.get(lane.split(":", 1)[1])
        return g and g["bus"]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--gpu", default="")
    ap.add_argument("--lanes", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    jobs = load_jobs(a.dir)
    failures = []
    rec = {"gpu": a.gpu, "lanes": a.lanes.split(","), "jobs": jobs, "checks": {}}

    alone = [j for n, j in sorted(jobs.items()) if n.startswith("alone-")]
    ref = alone[0]["output_sha256"] if alone else None
    for n, j in sorted(jobs.items()):
        if j.get("exit") not in (0, 8):  # 8: finished, frames kept as PNG (no ffmpeg)
            failures.append(f"{n}: CLI exit {j.get('exit')}")
        if ref and n.split("-")[0] in ("alone", "together", "hold") and j.get("output_sha256") != ref:
            failures.append(f"{n}: output differs from {alone[0]['name']}'s")

    # each job's workers on its lane's GPU only (per-process NVML memory)
    per_process = {}
    for f in sorted(glob.glob(os.path.join(a.dir, "*-nvml.csv"))):
        phase = os.path.basename(f)[: -len("-nvml.csv")]
        procs, gpus = load_nvml(f)
        rows = []
        for n, j in sorted(jobs.items()):
            for w in j["workers"]:
                p = procs.get(w["pid"])
                if p is None:
                    continue
                want = lane_bus(w["lane"], gpus)
                ok = want is None or p["bus"].endswith(want[-12:]) or want.endswith(p["bus"][-12:])
                rows.append({"job": n, "worker": w["worker"], "pid": w["pid"], "lane": w["lane"], "gpu_bus_id": p["bus"], "peak_gib": round(p["peak_mib"] / 1024, 2), "on_lane_gpu": ok})
                if not ok:
                    failures.append(f"{phase}: {n}'s {w['worker']} (pid {w['pid']}, lane {w['lane']}) ran on GPU {p['bus']}")
        per_process[phase] = rows
    rec["per_process_memory"] = per_process

    # alone against together
    cmp = []
    for n, j in sorted(jobs.items()):
        if n.startswith("together-"):
            lanes = j.get("lanes", "")
            base = next((x for x in alone if x.get("lanes") == lanes), None)
            cmp.append({"job": n, "lane": lanes, "together_s": j["wall_s"], "alone_s": base and base["wall_s"], "ratio": base and round(j["wall_s"] / base["wall_s"], 3)})
    rec["alone_vs_together"] = cmp
    together_lanes = {j.get("lanes") for n, j in jobs.items() if n.startswith("together-")}
    if len([n for n in jobs if n.startswith("together-")]) >= 2 and len(together_lanes) < 2:
        failures.append(f"together: both jobs ran on {together_lanes}")

    def text(name):
        p = os.path.join(a.dir, name)
        return open(p).read() if os.path.exists(p) else ""

    if "hold-0" in jobs:
        held = text("hold-devices-held.txt")
        rec["checks"]["hold"] = {"devices_while_held": held, "devices_after": text("hold-devices-after.txt"), "lane_events": text("hold-lane-events.log")}
        if "held" not in held:
            failures.append("hold: lane 0 was not listed as held after the kill")
        if "hold-1" in jobs and jobs["hold-1"]["wall_s"] > jobs["hold-0"]["wall_s"]:
            failures.append("hold: lane 1's job did not finish before the held lane's")
    pl = {n: j.get("lanes") for n, j in jobs.items() if n.startswith("placement-")}
    if pl:
        rec["checks"]["placement"] = {"lanes": pl, "pinned_jobs_listing": text("placement-pinned-jobs.txt")}
        lanes = a.lanes.split(",")
        for n in ("placement-least-loaded", "placement-memory", "placement-pinned-1", "placement-pinned-2"):
            if n in pl and len(lanes) > 1 and pl[n] != lanes[1]:
                failures.append(f"{n}: ran on {pl[n]}, want {lanes[1]}")
        if "queued" not in text("placement-pinned-jobs.txt").lower():
            failures.append("placement: the second job pinned to a busy lane was not QUEUED")
    rec["failures"] = failures
    json.dump(rec, open(a.out, "w"), indent=1)

    print(f"# multi-GPU run: {a.gpu}, lanes {a.lanes}\n")
    print("| job | lane | wall s | output = alone-0 |")
    print("|---|---|---|---|")
    for n, j in sorted(jobs.items()):
        print(f"| {n} | {j.get('lanes')} | {j.get('wall_s')} | {'yes' if ref and j.get('output_sha256') == ref else 'no'} |")
    if cmp:
        print("\n| job | lane | alone s | together s | together / alone |\n|---|---|---|---|---|")
        for c in cmp:
            print(f"| {c['job']} | {c['lane']} | {c['alone_s']} | {c['together_s']} | {c['ratio']} |")
    for phase, rows in per_process.items():
        if rows:
            print(f"\n{phase}: per-process GPU memory (NVML)\n\n| job | worker | pid | lane | GPU | peak GiB |\n|---|---|---|---|---|---|")
            for r in rows:
                print(f"| {r['job']} | {r['worker']} | {r['pid']} | {r['lane']} | {r['gpu_bus_id']} | {r['peak_gib']} |")
    print(f"\nrecord: {a.out}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
