#!/usr/bin/env python3
"""Medians of BenchmarkSideBySide's rows (go test -count N output on stdin),
as a Markdown table: req/s, x-bare (and its spread), p50, p99, allocs/req and allocs over the
bare handler's on the same server type, Redis round trips per request."""
import re
import statistics
import sys

rows = {}
for line in sys.stdin:
    m = re.match(r"BenchmarkSideBySide/(\S+?)-\d+\s+\d+\s+(.*)", line)
    if not m:
        continue
    fields = m.group(2).split()
    metrics = {unit: float(value) for value, unit in zip(fields[::2], fields[1::2])}
    rows.setdefault(m.group(1), []).append(metrics)


def med(name, unit):
    values = [r[unit] for r in rows[name] if unit in r]
    return statistics.median(values) if values else None


def spread(name, unit):
    values = [r[unit] for r in rows[name] if unit in r]
    return f"{min(values):.2f}–{max(values):.2f}" if values else ""


print("| row | req/s | x bare | x bare min–max | p50 µs | p99 µs | allocs/req | allocs over bare | RT/req | runs |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for name in rows:
    server = name.split("/")[0]
    allocs, bare = med(name, "allocs/op"), med(server + "/bare", "allocs/op") if server + "/bare" in rows else None
    cells = [
        name,
        f"{med(name, 'req/s'):.0f}",
        f"{med(name, 'x-bare'):.2f}" if med(name, "x-bare") is not None else "1",
        spread(name, "x-bare"),
        f"{med(name, 'p50-µs'):.0f}",
        f"{med(name, 'p99-µs'):.0f}",
        f"{allocs:.0f}" if allocs is not None else "",
        f"{allocs - bare:+.0f}" if allocs is not None and bare is not None else "",
        f"{med(name, 'RT/req'):.2f}" if med(name, "RT/req") is not None else "",
        str(len(rows[name])),
    ]
    print("| " + " | ".join(cells) + " |")
