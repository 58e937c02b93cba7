import re, sys, statistics as st, collections
for f in sys.argv[1:]:
    d = collections.OrderedDict()
    for line in open(f):
        m = re.search(r'(\S+) (batch|single) (?:cpu_us_per_row=([\d.]+) )?rows/s=([\d.]+)', line)
        if not m: continue
        pre = line.split()[0] if line.startswith('sync') else ''
        k = (pre + ' ' + m.group(1)).strip()
        d.setdefault(k, ([], []))
        if m.group(3): d[k][0].append(float(m.group(3)))
        d[k][1].append(float(m.group(4)))
    print(f"== {f}")
    for k, (c, r) in d.items():
        print(f"{k:28s} cpu_us/row median={st.median(c) if c else '-'} {c}  rows/s median={st.median(r):.0f} {[int(x) for x in r]}")
