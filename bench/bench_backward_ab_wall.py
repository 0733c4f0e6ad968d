"""A/B of bench_backward binaries by wall time, for the two-thread rows (bench_backward_ab.py takes the
one-thread rows by CPU time; bench/results/bwd2_2026-11-28.md):
    python3 bench/bench_backward_ab_wall.py ROUNDS REPS FILTER base=PATH new=PATH ...
Runs the binaries in turn (order flipped each round), each row REPS repetitions, and prints the
median and minimum wall ms per row and the first binary's time over each other's."""
import json, subprocess, sys, os, statistics
rounds, reps, filt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
bins = dict(a.split('=', 1) for a in sys.argv[4:]); res = {k: {} for k in bins}; loads = []
for r in range(rounds):
    for k in (list(bins) if r % 2 == 0 else list(bins)[::-1]):
        loads.append(os.getloadavg()[0])
        j = json.loads(subprocess.run([bins[k], '--benchmark_filter=' + filt, '--benchmark_min_time=0.01s',
            f'--benchmark_repetitions={reps}', '--benchmark_format=json'], capture_output=True, text=True).stdout)
        for b in j['benchmarks']:
            if b.get('run_type') != 'iteration': continue
            res[k].setdefault(b['run_name'].replace('/real_time', ''), []).append(b['real_time'])
ks = list(bins)
print(f'load {min(loads):.1f}-{max(loads):.1f}; {rounds} rounds x {reps} reps; wall ms median (min)')
print('| row | ' + ' | '.join(ks) + ' | ' + ' | '.join(f'{ks[0]}/{k}' for k in ks[1:]) + ' |')
for n in res[ks[0]]:
    med = {k: statistics.median(res[k][n]) for k in ks}; mn = {k: min(res[k][n]) for k in ks}
    print(f'| {n} | ' + ' | '.join(f'{med[k]:.1f} ({mn[k]:.1f})' for k in ks) + ' | ' +
          ' | '.join(f'{med[ks[0]]/med[k]:.3f} ({mn[ks[0]]/mn[k]:.3f})' for k in ks[1:]) + ' |')
