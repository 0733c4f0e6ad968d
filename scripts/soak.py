#!/usr/bin/env python3
"""Soak test of qkv's threading (issue #16): many Python threads calling qkv at once, with forks.

--threads Python threads (default 8) call, in turn, qkv.attention (2 threads of qkv's own pool
each), qkv.attention_backward, and Model.generate (each thread its own qkv.Model), for --minutes
minutes (default 10). Every --fork-every seconds (default 3) the main thread forks a child, which
makes the same three calls and must finish within --child-timeout seconds. Checks:
  - every result equals the single-threaded run made before the soak (bit for bit: the kernels
    and the model are deterministic, whatever the thread count);
  - nothing hangs: a worker silent for --hang-timeout seconds, or a child past its timeout, fails;
  - RSS stays flat: printed at the start (after warm-up), the middle and the end; the end may
    exceed the middle by at most 5 % + 16 MiB.
Exit status 0 when every check passed, 1 otherwise. Run it niced on a shared machine:

  nice -n 10 python3 scripts/soak.py --minutes 10
"""

import argparse
import os
import pathlib
import signal
import sys
import threading
import time

import numpy as np

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "data/models/stories260K/stories260K.bin"
TOKENIZER = ROOT / "data/models/stories260K/tok512.bin"
PROMPTS = ["Once upon a time", "Lily saw a cat", "The sun was"]


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_inputs(seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 8, 384, 64)).astype(np.float32)
    k = rng.standard_normal((1, 4, 384, 64)).astype(np.float32)
    v = rng.standard_normal((1, 4, 384, 64)).astype(np.float32)
    dout = rng.standard_normal((1, 8, 384, 64)).astype(np.float32)
    return q, k, v, dout


INPUTS = [make_inputs(s) for s in range(3)]


def attend(i, threads):
    q, k, v, _ = INPUTS[i]
    r = qkv.attention(q, k, v, causal=True, return_lse=True, num_threads=threads)
    return r.out, r.lse


def backward(i, threads):
    q, k, v, dout = INPUTS[i]
    out, lse = attend(i, threads)
    g = qkv.attention_backward(q, k, v, out, dout, lse, causal=True, num_threads=threads)
    return tuple(g)


class Generator:
    def __init__(self):
        self.model = qkv.Model.load(MODEL)
        self.tok = qkv.Tokenizer.load(TOKENIZER, self.model.config["vocab_size"])

    def __call__(self, i):
        return self.model.generate(self.tok, PROMPTS[i], steps=48, temperature=0)


def same(a, b):
    if isinstance(a, str):
        return a == b
    return all(np.array_equal(x, y) for x, y in zip(a, b))


def expected_results():
    gen = Generator()
    return {("attention", i): attend(i, 1) for i in range(3)} | \
           {("backward", i): backward(i, 1) for i in range(3)} | \
           {("generate", i): gen(i) for i in range(3)}


def one_call(kind, i, gen):
    if kind == "attention":
        return attend(i, 2)
    if kind == "backward":
        return backward(i, 2)
    return gen(i)


KINDS = ["attention", "backward", "generate"]


def child(expected):
    """In a forked child: one call of each kind on a fresh Model, compared; exit status 0 if equal."""
    try:
        gen = Generator()
        ok = all(same(one_call(kind, 0, gen), expected[(kind, 0)]) for kind in KINDS)
    except BaseException:  # noqa: BLE001 - any failure in the child is a failed check
        ok = False
    os._exit(0 if ok else 1)


def wait_child(pid, timeout):
    """'ok', 'failed' or 'hung' (killed after timeout seconds)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return "ok" if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else "failed"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--fork-every", type=float, default=3.0)
    ap.add_argument("--child-timeout", type=float, default=120.0)
    ap.add_argument("--hang-timeout", type=float, default=120.0)
    a = ap.parse_args()

    expected = expected_results()
    stop = threading.Event()
    lock = threading.Lock()
    calls = {k: 0 for k in KINDS}
    mismatches = []
    errors = []
    heartbeat = [time.monotonic()] * a.threads

    def worker(w):
        gen = Generator()
        n = w
        try:
            while not stop.is_set():
                kind, i = KINDS[n % 3], (n // 3) % 3
                got = one_call(kind, i, gen)
                with lock:
                    calls[kind] += 1
                    if not same(got, expected[(kind, i)]):
                        mismatches.append((w, kind, i))
                heartbeat[w] = time.monotonic()
                n += 1
        except BaseException as e:  # noqa: BLE001 - reported below, fails the soak
            with lock:
                errors.append(f"thread {w}: {e!r}")

    # Warm up (every thread's pool and Model exist) before the first RSS figure.
    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(a.threads)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(min(5.0, a.minutes * 60 / 4))
    rss = {"start": rss_mib()}
    print(f"start: RSS {rss['start']:.1f} MiB, load {os.getloadavg()}", flush=True)
    children = {"ok": 0, "failed": 0, "hung": 0}
    end = t0 + a.minutes * 60
    next_fork = time.monotonic()
    hung_worker = None
    while time.monotonic() < end and hung_worker is None:
        now = time.monotonic()
        if "middle" not in rss and now >= t0 + a.minutes * 30:
            rss["middle"] = rss_mib()
            print(f"middle: RSS {rss['middle']:.1f} MiB, calls {calls}, children {children}, "
                  f"load {os.getloadavg()}", flush=True)
        if now >= next_fork:
            pid = os.fork()
            if pid == 0:
                child(expected)
            children[wait_child(pid, a.child_timeout)] += 1
            next_fork = time.monotonic() + a.fork_every
        for w, beat in enumerate(heartbeat):
            if time.monotonic() - beat > a.hang_timeout:
                hung_worker = w
        time.sleep(0.1)
    rss["end"] = rss_mib()  # while the threads still run, as at the start and middle
    stop.set()
    for t in threads:
        t.join(timeout=a.hang_timeout)
    still = [i for i, t in enumerate(threads) if t.is_alive()]
    rss.setdefault("middle", rss["end"])
    minutes = (time.monotonic() - t0) / 60
    print(f"end: RSS {rss['end']:.1f} MiB after {minutes:.1f} min, calls {calls}, children {children}, "
          f"load {os.getloadavg()}")
    failed = []
    if mismatches:
        failed.append(f"{len(mismatches)} results differ from the single-threaded run, first {mismatches[:5]}")
    if errors:
        failed.append(f"errors: {errors[:5]}")
    if hung_worker is not None or still:
        failed.append(f"hung: worker {hung_worker} silent for {a.hang_timeout} s; not joined: {still}")
    if children["failed"] or children["hung"]:
        failed.append(f"forked children: {children}")
    if rss["end"] > rss["middle"] * 1.05 + 16:
        failed.append(f"RSS grew from {rss['middle']:.1f} MiB (middle) to {rss['end']:.1f} MiB (end)")
    for f in failed:
        print("FAILED:", f)
    print("soak passed" if not failed else "soak failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
