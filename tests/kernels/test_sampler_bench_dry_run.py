"""bench/kernels/sampler.py end to end on the CPU (interpreter, a 512-token vocabulary, timing stubbed), so the GPU
run does not die on a typo: each cell over several draws of the race's noise, with the draws' spread printed."""
import re
import sys

import torch

from bench.kernels import sampler as bench


def test_bench_times_each_cell_over_draws(monkeypatch, capsys):
    monkeypatch.setattr(bench, "VOCAB", 512)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(bench, "to_cuda", lambda state: state)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")
    seen = []  # each timed call's tokens: the draws must differ
    times = iter(float(t) for t in range(10, 100))

    def time_graph(fn):
        out = fn()
        seen.append(out.token_ids.clone())
        return next(times)

    monkeypatch.setattr(bench, "time_graph", time_graph)
    monkeypatch.setattr(sys, "argv", ["bench", "--sizes", "4", "--scenarios", "top_p", "--race", "list",
                                      "--compact", "once", "--reject", "0,1", "--draws", "3", "--no-old"])
    bench.main()
    out = capsys.readouterr().out.splitlines()
    row = next(line for line in out if line.startswith("top_p"))
    spread = next(line for line in out if line.startswith("  draws"))
    assert row.split()[2:5:2] == ["11.0", "14.0"]  # the means of 10, 11, 12 and of 13, 14, 15
    assert "0/0" in row  # the first draw checked against the CPU reference: no mismatch
    assert spread.split()[1:] == ["3", "[10.0-12.0]", "[13.0-15.0]"]
    assert len(seen) == 6 and not torch.equal(seen[0], seen[1])  # another draw, other tokens
    assert all(p.shape == (4,) for p in bench.other_positions(torch.zeros(4, dtype=torch.long), 2))


def test_bench_counts_each_draws_undecided_rows(monkeypatch, capsys):
    """--undecided: each draw's rows left to the search; a column without rounds leaves every row to it, and the
    counts are what the kept plan's marks say (a mutation that counts decided rows fails the second column)."""
    monkeypatch.setattr(bench, "VOCAB", 512)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(bench, "to_cuda", lambda state: state)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "cpu")
    monkeypatch.setattr(bench, "time_graph", lambda fn: 1.0)
    monkeypatch.setattr(sys, "argv", ["bench", "--sizes", "6", "--scenarios", "top_p,greedy", "--race", "list",
                                      "--compact", "once", "--reject", "0,3", "--draws", "2", "--no-old",
                                      "--no-check", "--undecided"])
    bench.main()
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  undecided")]
    (_, rows, none, three), (_, _, greedy_none, greedy_three) = lines
    assert rows == "6" and none == "6,6" and greedy_none == greedy_three == "-"
    left = [int(n) for n in three.split(",")]
    assert len(left) == 2 and all(0 <= n < 6 for n in left)  # three rounds decide some of the top_p rows


def test_draws_tool_sets_each_draws_time_beside_its_pending_rows(monkeypatch, capsys):
    """tools/sampler_draws.py on the CPU (timing stubbed): a line a draw, whose counts are the kept plans' marks:
    two rounds never leave more rows pending than one, the pool's rounds ("2p") leave the same rows as the row's own,
    and one round leaves some of these flat rows (a mutation that counts decided rows fails it)."""
    from tools import sampler_draws

    monkeypatch.setattr(bench, "VOCAB", 512)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(bench, "to_cuda", lambda state: state)
    monkeypatch.setattr(bench, "time_graph", lambda fn: float(len(fn().token_ids)))
    monkeypatch.setattr(sys, "argv", ["sampler_draws", "--rows", "16", "--scenario", "top_p_flat", "--reject", "2,2p",
                                      "--draws", "3"])
    sampler_draws.main()
    out = capsys.readouterr().out.splitlines()
    pattern = re.compile(r"draw +(\d+) +pending after 1 round +(\d+) +\| +2: +16\.0 us, +(\d+) left "
                         r"+\| +2p: +16\.0 us, +(\d+) left$")
    lines = [pattern.match(line) for line in out[:-1]]
    assert all(lines) and [int(m[1]) for m in lines] == [0, 1, 2], out
    for m in lines:
        one, later, pooled = int(m[2]), int(m[3]), int(m[4])
        assert 0 <= later == pooled <= one <= 16
    assert any(int(m[2]) > 0 for m in lines)  # flat rows: one round leaves some pending
    assert re.fullmatch(r"mean +2: +16\.0 us +\| +2p: +16\.0 us", out[-1]), out[-1]
