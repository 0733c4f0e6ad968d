"""The GIL is released while a kernel runs, so Python threads compute at the same time.

Two measurements, each made robust to load (these two cores are shared with other work):
  1. GIL release, deterministic: while one thread sits inside a long qkv call, the main thread
     keeps executing Python. With the GIL held, the main thread would record no tick for the whole
     duration of the call; we require its longest pause to be under half of it.
  2. Overlap, deterministic: while one thread is inside a long qkv call, a second thread
     completes short qkv calls all through it (longest pause under half the long call).
How much faster two threads are than one is a speed figure, for bench/, not a test here.
"""

import threading
import time

import numpy as np

import qkv


def one_call():
    """One qkv call (never several: between calls any thread may take the GIL, so only a single
    call shows whether the GIL is free *during* a kernel). The reference kernel on one thread keeps
    its length fixed, 0.2 to 1 s here, as the fast kernels get faster."""
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((1, 4, 256, 64)).astype(np.float32) for _ in range(3))
    return lambda: qkv.attention(q, k, v, kernel="reference", num_threads=1)


def longest_pause(t0, t1, ticks):
    """Longest stretch of [t0, t1] with no tick in it."""
    inside = [t0] + [t for t in ticks if t0 < t < t1] + [t1]
    return max(b - a for a, b in zip(inside, inside[1:]))


def test_gil_is_released_during_the_kernel():
    # While a worker thread is inside one long qkv call, the main thread keeps running Python.
    long_call = one_call()
    span = {}

    def worker():
        span["t0"] = time.perf_counter()
        long_call()
        span["t1"] = time.perf_counter()

    ticks = []
    th = threading.Thread(target=worker)
    th.start()
    while th.is_alive():
        ticks.append(time.perf_counter())
    th.join()
    t0, t1 = span["t0"], span["t1"]
    pause = longest_pause(t0, t1, ticks)
    print(f"kernel call {t1 - t0:.3f} s; longest pause of the main thread inside it {pause:.4f} s")
    assert pause < 0.5 * (t1 - t0)


def test_two_threads_compute_in_qkv_at_the_same_time():
    # While one thread is inside one long qkv call, a second thread completes short qkv calls all
    # through it. A held GIL or any global lock in qkv would stop the second thread for the whole
    # long call; load only slows both down.
    long_call = one_call()
    rng = np.random.default_rng(14)
    q, k, v = (rng.standard_normal((1, 1, 64, 32)).astype(np.float32) for _ in range(3))
    span, done = {}, []

    def worker():
        span["t0"] = time.perf_counter()
        long_call()
        span["t1"] = time.perf_counter()

    th = threading.Thread(target=worker)
    th.start()
    while th.is_alive():
        qkv.attention(q, k, v, num_threads=1)
        done.append(time.perf_counter())
    th.join()
    t0, t1 = span["t0"], span["t1"]
    pause = longest_pause(t0, t1, done)
    n = sum(t0 < t < t1 for t in done)
    print(f"long call {t1 - t0:.3f} s; {n} short calls finished inside it, longest pause {pause:.4f} s")
    assert pause < 0.5 * (t1 - t0)
