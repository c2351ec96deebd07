import csv, sys, collections, re
def load(f):
    rows = list(csv.DictReader(open(f)))
    rows.sort(key=lambda r: int(r['start']))
    starts = [i for i, r in enumerate(rows) if r['name'].startswith('dk0_')]
    steps = []
    for a, b in zip(starts, starts[1:] + [len(rows)]):
        seg = []
        for r in rows[a:b]:
            if not r['name'].startswith('dk'): break
            seg.append(r)
        steps.append(seg)
    return steps[-4:]
def cls(n): return re.sub(r'^dk\d+_op\d+_', '', n)
for f in sys.argv[1:]:
    steps = load(f)
    agg = collections.defaultdict(lambda: [0, 0.0])
    tot = 0
    for s in steps:
        prev_end = int(s[0]['start'])
        # order by end time: marginal increments of the running max end
        for r in sorted(s, key=lambda r: int(r['end'])):
            en = int(r['end'])
            inc = max(0, en - prev_end)
            prev_end = max(prev_end, en)
            a = agg[cls(r['name'])]; a[0] += 1; a[1] += inc / 1e3
        tot += (prev_end - int(s[0]['start'])) / 1e3
    print('%s: step %.1f us' % (f, tot / len(steps)))
    for k, a in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print('  %-48s n=%5.1f  +%7.1f us/step (%.2f each)' % (k, a[0]/len(steps), a[1]/len(steps), a[1]/a[0]))
