"""run and partition release the GIL: Python threads go on while fusebox works, and two runs
overlap in time."""

import threading
import time

import numpy as np
import fusebox

from conftest import CPU_TOML, ROOT



def big_cnn() -> str:
    # The small CNN on a 1024x1024 image: a run takes a tenth of a second or more.
    return (ROOT / "examples" / "small_cnn.relax").read_text().replace("(1, 3, 32, 32)", "(1, 3, 1024, 1024)")


def test_two_threads_run_at_once_while_python_goes_on(tmp_path):
    path = tmp_path / "big_cnn.relax"
    path.write_text(big_cnn())
    m = fusebox.load(path)
    reference = fusebox.run(m, config=CPU_TOML, seed=0)
    intervals = {}
    results = {}
    start = threading.Barrier(3)

    def worker(name):
        start.wait()
        spans = []
        for _ in range(2):
            t0 = time.perf_counter()
            out = fusebox.run(m, config=CPU_TOML, seed=0)
            spans.append((t0, time.perf_counter()))
        intervals[name] = spans
        results[name] = out

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    # Meanwhile this thread samples the clock in pure Python: it only gets to run while the
    # workers are inside fusebox if fusebox released the GIL.
    start.wait()
    samples = []
    while any(t.is_alive() for t in threads):
        samples.append(time.perf_counter())
    for t in threads:
        t.join()
    for name in ("a", "b"):
        np.testing.assert_array_equal(results[name]["logits"], reference["logits"])
    a, b = intervals["a"], intervals["b"]
    # Some run of a overlaps some run of b.
    assert any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b), (a, b)
    # Python went on during every run: no gap in the samples as long as half a run (with the
    # GIL held through a run, the gap would be the whole run).
    shortest = min(e - s for s, e in a + b)
    gaps = [y - x for x, y in zip(samples, samples[1:])]
    assert len(samples) > 100 and max(gaps) < shortest / 2, (max(gaps), shortest)
