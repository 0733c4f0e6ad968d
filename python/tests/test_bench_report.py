"""bench/report.py, the one module every benchmark driver writes through: the machine line, paired ratios,
the results files and the plots, on hand-made values (the drivers themselves need the peers and minutes)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import report  # noqa: E402


def test_machine_line_spans_the_peaks_and_loads():
    before = {"fma_peak_gflops_2t": 225.4, "bf16_dot_peak_gflops_2t": 451.0, "read_bandwidth_gbs_2t": 31.9, "load": 1.4}
    after = {"fma_peak_gflops_2t": 233.6, "bf16_dot_peak_gflops_2t": 452.2, "read_bandwidth_gbs_2t": 30.2, "load": 1.6}
    line = report.machine_line(before, after, [1.5, 2.25])
    assert line == ("machine (2 threads, bench_attention --peak before and after): fp32 FMA peak 225–234 GFLOP/s, "
                    "bf16 dot-product peak 451–452 GFLOP/s, read bandwidth 30–32 GB/s; load average 1.4–2.2")
    assert report.machine_line({}, {}, [3.0]) == "machine peak not measured; load average 3.0"


def test_paired_ratios_and_their_summary():
    assert report.paired_ratios([2.0, 3.0, 8.0], [1.0, 2.0, 4.0]) == [2.0, 1.5, 2.0]
    assert report.ratio_summary([2.0, 1.5, 2.0]) == "2.00× (1.50–2.00)"
    assert report.ratio_summary([1.234]) == "1.23×"
    with pytest.raises(ValueError, match="paired_ratios: 2 samples against 1"):
        report.paired_ratios([1.0, 2.0], [1.0])


def test_results_files_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [os.path.join(report.ROOT, "bench", "x_bench.py"), "--rounds", "3", "--name", "a b"])
    md = report.write_results("x_bench", report.command_line(), "machine line", "| a | b |\n|---|---|\n| 1 | 2 |\n",
                              {"runs": [1.0, 2.0]})
    assert open(md).read() == "    python3 bench/x_bench.py --rounds 3 --name 'a b'\n\nmachine line\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert json.load(open(tmp_path / "x_bench.json")) == {"runs": [1.0, 2.0], "machine": "machine line"}
    report.bar_plot("x_bench.png", "title", ["g1", "g2"], {"qkv": [2.0, 3.0], "skipped peer": [None, None]},
                    "ratio", "machine line", log=True, ref=1.0)
    png = (tmp_path / "x_bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    h, w = matplotlib.image.imread(str(tmp_path / "x_bench.png")).shape[:2]
    assert (w, h) == (1045, 462)  # 9.5 × 4.2 inches at 110 dpi
    assert sorted(os.listdir(tmp_path)) == ["x_bench.json", "x_bench.md", "x_bench.png"]  # no temporaries left


def test_plot_from_json_reads_figures_and_references(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "OUT", str(tmp_path))
    (tmp_path / "raw.json").write_text(json.dumps({"summary": {"rows": [{"s": 2.5}, {"s": 4.0}]}}))
    spec = {"command": "x", "source": "raw.json",
            "plot": {"title": "t", "groups": ["a", "b"], "ylabel": "s", "log": True,
                     "series": {"kept": [1.5, None], "raw": ["raw.json:summary.rows.0.s", "raw.json:summary.rows.1.s"]}}}
    (tmp_path / "fig.json").write_text(json.dumps(spec))
    drawn = {}
    monkeypatch.setattr(report, "bar_plot", lambda name, title, groups, series, ylabel, note="", log=False, ref=None:
                        drawn.update(name=name, series=series, log=log, ref=ref))
    report.plot_from_json("fig")
    assert drawn == {"name": "fig.png", "series": {"kept": [1.5, None], "raw": [2.5, 4.0]}, "log": True, "ref": None}

    spec["plot"]["series"]["raw"][1] = "raw.json:summary.rows.2.s"
    (tmp_path / "fig.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"fig.json: the value 'raw.json:summary.rows.2.s' does not name a number"):
        report.plot_from_json("fig")
    spec["plot"]["series"]["raw"] = ["raw.json:summary", 1.0]
    (tmp_path / "fig.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"'raw.json:summary' is dict, not a number"):
        report.plot_from_json("fig")
    spec["plot"]["series"]["raw"] = [1.0]
    (tmp_path / "fig.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"series 'raw' has 1 values for 2 groups"):
        report.plot_from_json("fig")


def test_every_kept_plot_resolves_and_is_linked():
    """Each bench/results/NAME.json with a "plot" resolves to numbers (its references point at real figures), says
    what measured it, and its NAME.png exists; BENCHMARKS.md shows every such plot."""
    bench = open(os.path.join(report.ROOT, "BENCHMARKS.md")).read()
    specs = []
    for f in sorted(os.listdir(report.OUT)):
        if f.endswith(".json"):
            with open(os.path.join(report.OUT, f)) as fh:
                d = json.load(fh)
            if isinstance(d, dict) and "plot" in d:
                specs.append(f[:-5])
                assert d["command"] and d["source"], f
                for label, values in d["plot"]["series"].items():
                    assert len(values) == len(d["plot"]["groups"]), (f, label)
                    assert all(v is None or v > 0 for v in (report.resolve(v, f) for v in values)), (f, label)
                assert os.path.exists(os.path.join(report.OUT, f[:-5] + ".png")), f
                assert f"(bench/results/{f[:-5]}.png)" in bench, f
    assert len(specs) >= 10, specs
