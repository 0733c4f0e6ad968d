"""The scaling model of docs/scaling.md, fed with the figures measured by ring_bench.py.

    python bench/ring_model.py [bench/results/ring_S32768_D64_causal.json]

Per ring step of a causal, load-balanced forward (L = S / P tokens per rank):
    compute   T_c = 4·H·D·L²/2 / R                (every rank does L²/2 scores per step)
    transfer  T_x = alpha + 2·Hkv·L·D·b / beta      (one k, v block to the next rank)
    step      max(T_c, T_x) + sigma                 (sigma: exposed per-step overhead, measured)
    efficiency E = T_c / (max(T_c, T_x) + sigma);   time of one layer's attention = P·(max + sigma)
The backward moves the k, v block and the dk, dv partials (float32: 2x the bytes of a bfloat16
block) and computes bwd_ratio x as much; its efficiency uses the same formula with those.
R is the measured forward throughput of one single-threaded rank (the median ring step), scaled
linearly to a node of 32 cores (an assumption: qkv's kernels split over heads and query blocks,
which the shapes below give plenty of); a GPU-class rank of 400 TFLOP/s is shown for comparison
with the GPU figures of the literature. sigma is taken twice: as measured when the compute of a
step exceeds its transfer (the median exposed wait, tens of microseconds), and as the skew
between ranks measured with small blocks on this loaded machine (SIGMA_LOADED).
"""

import json
import statistics
import sys

MODEL = {"H": 32, "Hkv": 8, "D": 128, "b": 2}   # a Llama-3-8B-like layer, bfloat16 blocks on the wire
ALPHA = 20e-6                                   # assumed one-way latency across a network (s)
SIGMA_LOADED = 4e-3   # median exposed wait per step at S = 512 .. 2048 (ring_overlap_P2.json): rank skew
RANKS = {"CPU node, 32 cores": None, "GPU-class, 400 TFLOP/s": 400e12}


def measured(path):
    d = json.load(open(path))
    a, s = d["args"], d["summary"]
    c = a["S"] // (2 * a["P"])
    step_flop = 4 * a["H"] * a["D"] * 2 * c * c          # 2c² scores per causal step, per rank
    fwd = [x for rd in d["rounds"] for rk in rd["ring"] for x in rk["steps"]["forward"]["compute"]]
    bwd = [x for rd in d["rounds"] for rk in rd["ring"] for x in rk["steps"]["backward"]["compute"]]
    waits = [w for rd in d["rounds"] for rk in rd["ring"] for w in rk["steps"]["forward"]["wait"][:-1]]
    return {"R_core": step_flop / statistics.median(fwd), "bwd_ratio": statistics.median(bwd) / statistics.median(fwd),
            "sigma": statistics.median(waits), "beta_loopback": s["block_bytes"] / s["block_transfer_s"],
            "alpha_loopback": s["pingpong_one_way_s"]["8"]}


def predict(m, P, S, gbit, R, sigma):
    H, Hkv, D, b = MODEL["H"], MODEL["Hkv"], MODEL["D"], MODEL["b"]
    beta, L = gbit * 1e9 / 8, S / P
    Tc = 4 * H * D * L * L / 2 / R
    Tx = ALPHA + 2 * Hkv * L * D * b / beta
    Tcb, Txb = m["bwd_ratio"] * Tc, ALPHA + 2 * Hkv * L * D * (b + 4) / beta
    Ef = Tc / (max(Tc, Tx) + sigma)
    Eb = Tcb / (max(Tcb, Txb) + sigma)
    return {"L": L, "Tc_ms": Tc * 1e3, "Tx_ms": Tx * 1e3, "E_fwd": Ef, "E_bwd": Eb,
            "layer_fwd_s": P * (max(Tc, Tx) + sigma), "L_star": 2 * Hkv * b * R / (2 * H * beta)}


def main():
    m = measured(sys.argv[1] if len(sys.argv) > 1 else "bench/results/ring_S32768_D64_causal.json")
    print("measured:", {k: f"{v:.3g}" for k, v in m.items()})
    print(f"model layer: {MODEL}, alpha = {ALPHA * 1e6:.0f} us")
    print("| rank | net | S | P | L = S/P | T_c / step | T_x / step | E fwd | E bwd | E fwd, skew 4 ms "
          "| attention fwd per layer | L* |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, R in RANKS.items():
        R = R or 32 * m["R_core"]
        for gbit in (25, 100):
            for S in (2 ** 20, 10 * 2 ** 20):
                for P in (8, 64, 512):
                    p = predict(m, P, S, gbit, R, m["sigma"])
                    q = predict(m, P, S, gbit, R, SIGMA_LOADED)
                    print(f"| {name} | {gbit} Gb/s | {S / 2 ** 20:.0f} Mi | {P} | {p['L']:.0f} | {p['Tc_ms']:.3g} ms | "
                          f"{p['Tx_ms']:.3g} ms | {p['E_fwd']:.2f} | {p['E_bwd']:.2f} | {q['E_fwd']:.2f} | "
                          f"{p['layer_fwd_s']:.3g} s | {p['L_star']:.0f} |")

if __name__ == "__main__":
    main()
