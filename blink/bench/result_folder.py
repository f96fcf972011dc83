"""The interference result folder: every repeat of every point kept, runs merged into one folder.

    points/<mode>__<layout>__<attack>-x<level>[__<variant>]__rate-<rate>/<run id>-r<repeat>.json
        one repeat of one point: its metrics, metadata and the raw per-request latencies
        ("requests": success, input/output lengths, TTFT, ITLs, E2E latency, send time and error per
        request; seconds),
        so that any percentile can be recomputed later;
    runs/<run id>.json   one call of `blink bench interference`: its arguments, plan, knobs, idle power;
    results.md, summary.json, *.png   regenerated from all repeats (interference_report.py);
    logs/                server logs.
A run id is unique per call, so a second run (another GPU session) adds repeats instead of replacing
them, and `merge_folder` copies one folder's repeats into another. A flat points/<name>.json (the
layout before repeats) is read as one repeat of run "legacy".
"""
from __future__ import annotations

import base64
import datetime
import filecmp
import glob
import json
import os
import shutil
import zlib
from collections import defaultdict

import numpy as np

from blink.bench.metrics import RequestResult, per_request_details

ISOLATED = "none"


def condition(row: dict) -> str:
    """The attack condition (and knob variant) of a point, as a legend label."""
    base = "isolated" if row["attack_kind"] == ISOLATED else f"{row['attack_kind']} x{row['attack_level']:g}"
    return f"{base} [{row['variant']}]" if row.get("variant") else base


KEY_FIELDS = ("mode", "layout", "attack_kind", "attack_level", "variant", "request_rate")


def new_run_id() -> str:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{os.getpid()}"


def point_key(point: dict) -> tuple:
    """What identifies a point across repeats (a point without `variant` has the plain one, "")."""
    return tuple(point.get(k, "") for k in KEY_FIELDS)


def point_name(mode: str, layout: str, attack_kind: str, attack_level: float, rate: float,
               variant: str = "") -> str:
    middle = f"__{variant}" if variant else ""
    return f"{mode}__{layout}__{attack_kind}-x{attack_level:g}{middle}__rate-{rate:g}"


def pack_gaps(itls: list[list[float]]) -> dict:
    """Every request's inter-token gaps as one zlib'd little-endian int32 array of microseconds (base64),
    with the count per request: ~4x smaller than JSON floats, so a point at saturation stays ~0.5 MB."""
    flat = np.asarray([g for gaps in itls for g in gaps], dtype=np.float64)
    us = np.clip(np.rint(flat * 1e6), 0, np.iinfo(np.int32).max).astype("<i4")
    return {"counts": [len(gaps) for gaps in itls],
            "us_zlib_b64": base64.b64encode(zlib.compress(us.tobytes(), 6)).decode("ascii")}


def unpack_gaps(packed: dict) -> list[list[float]]:
    flat = np.frombuffer(zlib.decompress(base64.b64decode(packed["us_zlib_b64"])), dtype="<i4") / 1e6
    ends = np.cumsum(packed["counts"])
    return [flat[end - n:end].tolist() for n, end in zip(packed["counts"], ends, strict=True)]


def first_send(results: list[RequestResult]) -> float:
    """The perf_counter time of the first request sent: time zero of a repeat's raw lists."""
    return min((r.start_time for r in results if r.start_time > 0), default=0.0)


def raw_requests(results: list[RequestResult]) -> dict:
    """Per-request lists (seconds, rounded to the microsecond), the gaps packed (pack_gaps). The lists are in
    completion order; `sent_s` (each request's send time from the first send) puts them on one clock."""
    details = per_request_details(results)
    us = lambda x: round(x, 6)
    first = first_send(results)
    return {"success": [r.success for r in results], "input_lens": details["input_lens"],
            "output_lens": details["output_lens"], "ttfts": [us(x) for x in details["ttfts"]],
            "e2els": [us(x) for x in details["e2els"]], "itls": pack_gaps(details["itls"]),
            "sent_s": [us(r.start_time - first) if r.start_time > 0 else None for r in results],
            "errors": details["errors"]}


def save_repeat(result_dir: str, point: dict) -> str:
    """Write one repeat of a point (point["run_id"], point["repeat"]); returns its path."""
    name = point_name(point["mode"], point["layout"], point["attack_kind"], point["attack_level"],
                      point["request_rate"], point.get("variant", ""))
    folder = os.path.join(result_dir, "points", name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{point['run_id']}-r{point['repeat']}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(point, f)
    return path


def save_run(result_dir: str, run_id: str, metadata: dict) -> str:
    os.makedirs(os.path.join(result_dir, "runs"), exist_ok=True)
    path = os.path.join(result_dir, "runs", f"{run_id}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(metadata, f, indent=2)
    return path


def load_runs(result_dir: str) -> list[dict]:
    runs = []
    for path in sorted(glob.glob(os.path.join(result_dir, "runs", "*.json"))):
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    return runs


def load_points(result_dir: str) -> list[dict]:
    """Every repeat of every point, sorted by point then by run and repeat."""
    points = []
    paths = glob.glob(os.path.join(result_dir, "points", "*", "*.json"))
    legacy = glob.glob(os.path.join(result_dir, "points", "*.json"))
    for path in sorted(paths) + sorted(legacy):
        with open(path, encoding="utf-8") as f:
            point = json.load(f)
        point.setdefault("run_id", "legacy")
        point.setdefault("repeat", 0)
        point.setdefault("variant", "")
        points.append(point)
    return sorted(points, key=lambda p: (p["layout"], p["mode"], p["attack_kind"] != ISOLATED,
                                         p["attack_kind"], p["attack_level"], p["variant"],
                                         p["request_rate"], p["run_id"], p["repeat"]))


def group_repeats(points: list[dict]) -> dict[tuple, list[dict]]:
    """point_key -> its repeats, in load order."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for p in points:
        groups[point_key(p)].append(p)
    return dict(groups)


def merge_folder(dst: str, src: str) -> dict[str, int]:
    """Copy src's repeats and run records into dst. A file already in dst with the same content is
    skipped; the same name with other content is an error (run ids are unique, so it is not a repeat)."""
    counts = {"copied": 0, "skipped": 0}
    for pattern in (os.path.join("points", "*", "*.json"), os.path.join("runs", "*.json"),
                    os.path.join("points", "*.json")):
        for path in sorted(glob.glob(os.path.join(src, pattern))):
            rel = os.path.relpath(path, src)
            target = os.path.join(dst, rel)
            if os.path.exists(target):
                if not filecmp.cmp(path, target, shallow=False):
                    raise ValueError(f"{rel} differs between {src} and {dst}: not merging it")
                counts["skipped"] += 1
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(path, target)
            counts["copied"] += 1
    return counts


def request_samples(point: dict, metric: str) -> list[float]:
    """One repeat's per-request samples of ttft, tpot, itl or e2el (seconds), successful requests only,
    from its raw lists; [] for a repeat saved without them."""
    raw = point.get("requests")
    if not raw:
        return []
    ok = [i for i, s in enumerate(raw["success"]) if s]
    if metric == "ttft":
        return [raw["ttfts"][i] for i in ok]
    if metric == "e2el":
        return [raw["e2els"][i] for i in ok]
    if metric == "itl":
        gaps = unpack_gaps(raw["itls"])
        return [gap for i in ok for gap in gaps[i]]
    if metric == "tpot":  # metrics.RequestResult.tpot
        return [(raw["e2els"][i] - raw["ttfts"][i]) / (raw["output_lens"][i] - 1) for i in ok
                if raw["output_lens"][i] > 1]
    raise ValueError(f"unknown metric {metric!r}")
