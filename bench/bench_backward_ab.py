"""A/B of two bench_backward binaries on one-thread rows (bench/results/fwd_xeon_2026-11-27.md):
    python3 bench/bench_backward_ab.py ROUNDS REPS FILTER base=PATH new=PATH
Runs the binaries in turn (order flipped each round), each row REPS repetitions of one iteration,
and prints after each round the median and minimum CPU ms per row and GFLOP per CPU-second as % of
the median CPU-time FMA peak (bench_backward --peak: fma_peak_gflops_1t_cpu) over the run."""
import json, subprocess, sys, os, statistics, time
rounds = int(sys.argv[1]); reps = int(sys.argv[2]); filt = sys.argv[3]; bins = dict(a.split('=', 1) for a in sys.argv[4:])
res = {k: {} for k in bins}; peaks = {k: [] for k in bins}; loads = []
flop = {}
def report(done):
  ks = list(bins)
  peak = statistics.median([p for v in peaks.values() for p in v])
  print(f'{time.strftime("%H:%M")} UTC, load {min(loads):.1f}-{max(loads):.1f}; {done} rounds x {reps} reps; CPU-time FMA peak median {peak:.1f} GFLOP/s ' +
        '(' + ', '.join(f'{k} {min(v):.1f}-{max(v):.1f}' for k, v in peaks.items()) + ')')
  print('| row | ' + ' | '.join(f'{k} CPU ms med (min)' for k in ks) + f' | {ks[0]}/{ks[-1]} med (min) | ' + ' | '.join(f'{k} % peak med (min-time)' for k in ks) + ' |')
  print('|---' * (2 + 2 * len(ks)) + '|')
  for n in res[ks[0]]:
      med = {k: statistics.median(res[k][n]) for k in ks}; mn = {k: min(res[k][n]) for k in ks}
      pct = lambda t: 100 * flop[n] / (t / 1e3) / peak
      print(f'| {n} | ' + ' | '.join(f'{med[k]:.1f} ({mn[k]:.1f})' for k in ks) + f' | {med[ks[0]]/med[ks[-1]]:.3f} ({mn[ks[0]]/mn[ks[-1]]:.3f}) | ' +
            ' | '.join(f'{pct(med[k]):.1f} % ({pct(mn[k]):.1f} %)' for k in ks) + ' |')

for r in range(rounds):
    order = list(bins) if r % 2 == 0 else list(bins)[::-1]
    for k in order:
        loads.append(os.getloadavg()[0])
        out = subprocess.run([bins[k], '--peak', '--benchmark_filter=' + filt, '--benchmark_min_time=0.01s',
                              f'--benchmark_repetitions={reps}', '--benchmark_format=json'], capture_output=True, text=True).stdout
        j = json.loads(out)
        peaks[k].append(float(j['context']['fma_peak_gflops_1t_cpu']))
        for b in j['benchmarks']:
            if b.get('run_type') != 'iteration': continue
            n = b['run_name'].replace('/real_time', '')
            res[k].setdefault(n, []).append(b['cpu_time'])
            flop[n] = b['GFLOPs_cpu'] * b['cpu_time'] / 1e3
    print(f'round {r} done load {loads[-1]:.1f} {time.strftime("%H:%M:%S")}', file=sys.stderr, flush=True)
    report(r + 1)

