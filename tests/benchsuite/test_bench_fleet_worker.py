"""A simulator worker process outlives no bench: when its pipe closes, it stops."""

from __future__ import annotations

import multiprocessing

from bench.fleet import _worker_main


def test_a_worker_whose_bench_went_away_exits() -> None:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_worker_main, args=(child, "127.0.0.1:1", [], [], 1, False, "delta"))
    process.start()
    try:
        child.close()
        parent.send(("status", 0))
        assert parent.poll(60), "the worker answers while its bench is there"
        parent.recv()
        parent.close()  # as when the bench is killed
        process.join(30)
        assert process.exitcode == 0, "the worker kept reading a closed pipe"
    finally:
        if process.is_alive():
            process.kill()
            process.join(5)
