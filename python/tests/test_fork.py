"""qkv keeps working in a process forked after the parent used it (issue #16, item 2).

multiprocessing's default start method on Linux and PyTorch's DataLoader workers fork the
process. Before qkv had its own thread pool, a child that called qkv after its parent had run a
parallel kernel hung forever (libgomp's worker threads do not exist in the child). Every wait
below has a timeout, so a regression fails instead of hanging the test run.

Oracle: the parent's own results for the same inputs; the kernels and the model are
deterministic (a row's result does not depend on the thread count), so the child's results must
be equal bit for bit.
"""

import multiprocessing
import pathlib

import numpy as np
import pytest

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "data/models/stories260K/stories260K.bin"
TOKENIZER = ROOT / "data/models/stories260K/tok512.bin"
TIMEOUT = 120  # seconds; the work below takes well under one on two busy cores
CHILD_TIMEOUT = 20  # seconds for one child's 40-token generation (milliseconds of work)


def inputs(seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 4, 300, 64)).astype(np.float32)
    k = rng.standard_normal((2, 2, 300, 64)).astype(np.float32)
    v = rng.standard_normal((2, 2, 300, 64)).astype(np.float32)
    return q, k, v


def attend(seed):
    # Two threads and many work items: the call runs on the caller's thread pool.
    return qkv.attention(*inputs(seed), causal=True, num_threads=2).out


def generate(prompt):
    model = qkv.Model.load(MODEL)
    tok = qkv.Tokenizer.load(TOKENIZER, model.config["vocab_size"])
    return model.generate(tok, prompt, steps=40, temperature=0)


def child_work(seed):
    return attend(seed), generate("Once upon a time")


def test_multiprocessing_fork_children_compute_what_the_parent_does():
    expected = [attend(s) for s in range(4)]  # the parent's pool now has workers
    text = generate("Once upon a time")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        try:
            results = pool.map_async(child_work, range(4)).get(timeout=TIMEOUT)
        except multiprocessing.TimeoutError:
            pool.terminate()
            pytest.fail(f"forked children did not finish within {TIMEOUT} s: qkv hangs after fork")
    for (out, got_text), want in zip(results, expected):
        np.testing.assert_array_equal(out, want)
        assert got_text == text
    # And the parent still computes after its children.
    np.testing.assert_array_equal(attend(0), expected[0])


def test_torch_dataloader_workers_call_qkv():
    torch = pytest.importorskip("torch")
    expected = [attend(s) for s in range(6)]

    class Attended(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return torch.from_numpy(attend(i))

    loader = torch.utils.data.DataLoader(Attended(), batch_size=1, num_workers=2, timeout=TIMEOUT,
                                         multiprocessing_context="fork")
    got = [batch[0].numpy() for batch in loader]  # a worker silent for TIMEOUT s raises RuntimeError
    assert len(got) == 6
    for g, want in zip(got, expected):
        np.testing.assert_array_equal(g, want)


def test_fork_while_another_thread_runs_the_same_model():
    # A thread generates on a model in a loop while this one forks; each child generates on that
    # same model. Before fork() waited for running models (python/src/bindings.cpp, model_gate),
    # the child inherited the model's lock held by a thread it does not have: 10 children of 10
    # hung. Oracle: the same greedy generation made before the thread started.
    import os
    import signal
    import threading

    model = qkv.Model.load(MODEL)
    tok = qkv.Tokenizer.load(TOKENIZER, model.config["vocab_size"])
    want = model.generate(tok, "Once upon a time", steps=40, temperature=0)
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            model.generate(tok, "The little dog", steps=200, temperature=0)

    t = threading.Thread(target=busy)
    t.start()
    failures = []
    try:
        for i in range(10):
            pid = os.fork()
            if pid == 0:  # the child: one generation under an alarm, then out without cleanup
                signal.alarm(CHILD_TIMEOUT)
                os._exit(0 if model.generate(tok, "Once upon a time", steps=40, temperature=0) == want else 1)
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                failures.append(f"child {i} killed by signal {os.WTERMSIG(status)} (SIGALRM: it hung)")
            elif os.WEXITSTATUS(status) != 0:
                failures.append(f"child {i} generated another text")
            if failures:
                break
    finally:
        stop.set()
        t.join()
    assert failures == []
