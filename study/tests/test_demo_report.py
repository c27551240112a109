"""largedet_study.demo_report: the demo's tables in the docs, from demo_speed.csv and
demo_levers.csv, against lines written out by hand from small CSVs."""

from largedet_study import demo_report
from study_csv import write_csv

DEMO_FIELDS = ["date", "cpu", "cpu_family_model", "isa", "cores", "precision", "torch", "iterations",
               "training_s", "s_per_step", "box_ap", "label", "config"]  # fmt: skip
LEVER_FIELDS = ["date", "cpu", "cpu_family_model", "isa", "cores", "torch", "lever", "overrides", "round",
                "iters", "demo_s_per_step", "lever_s_per_step", "speedup", "label", "demo"]  # fmt: skip


def _write(path, fields, rows):
    write_csv(path, fields, [dict(zip(fields, row)) for row in rows])


def test_one_line_per_config_and_class_with_ranges_and_the_target(tmp_path):
    path = tmp_path / "demo_speed.csv"
    cls = ["Xeon", "6/143", "avx2 avx512f", "2", "float32", "2.14.1"]
    _write(path, DEMO_FIELDS, [
        ["2026-11-27", *cls, "898", "290", "0.3229", "61.50", "q", "new.yaml"],
        ["2026-11-28", *cls, "898", "301", "0.3352", "61.50", "q", "new.yaml"],
        ["2026-11-28", *cls, "898", "250", "0.2784", "64.00", "q", "new.yaml SOLVER.MAX_ITER 800"],
        ["2026-11-28", *cls, "898", "280", "0.3118", "59.90", "q", "old.yaml"],
    ])  # fmt: skip
    lines = demo_report.demo_classes_table(str(path)).splitlines()
    assert lines[2:] == [
        "| `new.yaml` | Xeon (6/143) | avx2 avx512f | float32 | 2.14.1 | 2 | 290-301 | 0.323-0.335 | 61.5 "
        "| 2026-11-27, 2026-11-28 | no |",  # 301 s is over 300
        "| `new.yaml SOLVER.MAX_ITER 800` | Xeon (6/143) | avx2 avx512f | float32 | 2.14.1 | 1 | 250 | 0.278 "
        "| 64.0 | 2026-11-28 | yes |",
        "| `old.yaml` | Xeon (6/143) | avx2 avx512f | float32 | 2.14.1 | 1 | 280 | 0.312 | 59.9 | 2026-11-28 | no |",
    ]  # fmt: skip


def test_one_line_per_lever_and_the_demo_it_was_measured_against(tmp_path):
    path = tmp_path / "demo_levers.csv"
    cpu = ["EPYC", "25/1", "avx2", "2", "2.14.1"]
    _write(path, LEVER_FIELDS, [
        ["2026-11-28", *cpu, "w32", "A 1", "1", "60", "0.8000", "0.5000", "1.600", "q", "old.yaml"],
        ["2026-11-28", *cpu, "w32", "A 1", "2", "60", "0.7500", "0.4500", "1.667", "q", "old.yaml"],
        ["2026-11-28", *cpu, "w32", "A 1", "1", "60", "0.4000", "0.4000", "1.000", "q", "new.yaml"],
    ])  # fmt: skip
    lines = demo_report.demo_levers_table(str(path)).splitlines()
    assert lines[2:] == [
        "| `old.yaml` | w32 | `A 1` | EPYC (25/1) | avx2 | 2 | 0.750-0.800 | 0.450-0.500 | 1.60-1.67x | 2026-11-28 |",
        "| `new.yaml` | w32 | `A 1` | EPYC (25/1) | avx2 | 1 | 0.400 | 0.400 | 1.00x | 2026-11-28 |",
    ]  # fmt: skip


def test_gpu_multigrid_line_reads_the_benchmarks_table_and_speed_lines(tmp_path):
    from largedet_study import video_bench_report

    log = tmp_path / "tail.log"
    log.write_text("\n".join([
        "[11/26 12:53:14 largedet_video]: multigrid, 1x epochs: {'epochs': 16}",
        "| schedule               |   epochs |   steps |   training s |   s/step |   top-1 % |   test s | load avg   |",
        "|:-----------------------|---------:|--------:|-------------:|---------:|----------:|---------:|:-----------|",
        "| base shape             |       16 |     800 |           17 |    0.021 |       100 |        1 | 1.6 -> 2.3 |",
        "| multigrid, 1.5x epochs |       24 |     230 |           12 |    0.053 |        97 |        1 | 2.3 -> 2.3 |",
        "multigrid, 1.5x epochs: 1.39x faster training (3.48x fewer steps), top-1 -3.0 points against the base",
    ]))  # fmt: skip
    assert video_bench_report.gpu_multigrid_line(str(log)) == (
        f"the base shape trains 800 steps in 17 s to 100%; multigrid at 1.5x the epochs 1.39x faster to 97% (`{log}`)")


MACHINE = ["2026-11-28", "EPYC", "25/1", "avx2", "2", "2.14.1", "cpu", "a cell"]


def test_throughput_tables_take_medians_and_ratios_within_each_invocation(tmp_path):
    """projects/video/benchmarks/throughput.py --csv: clips/s as the median (range) over the
    invocations; TSM / I3D and the shift's cost (1 - TSM / TSN) taken within one invocation;
    decoders against PyAV per CPU-second, within one invocation."""
    from largedet_study import video_bench_report

    fields = ["date", "invocation", "cpu", "cpu_family_model", "isa", "cores", "torch", "device", "load", "depth",
              "width", "size", "frames", "batch", "threads", "rounds", "steps", "model", "clips_s", "clips_cpu_s",
              "gflops", "params_m"]  # fmt: skip

    def row(inv, model, clips, cpu_clips):
        m = MACHINE[:1] + [inv] + MACHINE[1:]
        return m + ["50", "64", "112", "8", "2", "1", "7", "2", model, clips, cpu_clips, "8.70", "24.30"]

    _write(tmp_path / "t_training.csv", fields, [
        row("a", "TSN", "2.00", "2.00"), row("a", "TSM", "1.90", "1.96"), row("a", "I3D 3x3x3", "2.50", "2.50"),
        row("b", "TSN", "2.20", "2.20"), row("b", "TSM", "2.20", "2.20"), row("b", "I3D 3x3x3", "2.00", "2.00"),
        row("c", "TSN", "2.10", "2.10"), row("c", "TSM", "2.00", "2.10"), row("c", "I3D 3x3x3", "2.00", "2.00"),
    ])  # fmt: skip
    table, ratios = video_bench_report.throughput_training_table(str(tmp_path / "t")).split("\n\n")
    lines = table.splitlines()
    assert lines[3] == ("| R50, 2 x 8 x 112^2 | EPYC (25/1) | 2.14.1 | a cell | TSM | 3 | 2.00 (1.90-2.20) "
                        "| 2.10 (1.96-2.20) | 8.7 | 24.3 | 2026-11-28 |")  # fmt: skip
    # TSM / I3D: 0.76, 1.10, 1.00; shift cost: +5.0, 0.0, +4.8 (wall); +2.0, 0.0, 0.0 (CPU)
    assert ratios.splitlines()[2] == ("| R50, 2 x 8 x 112^2 | EPYC (25/1) | a cell | 3 | 1.00x (0.76x-1.10x) | - "
                                      "| +4.8% (+0.0%-+5.0%) | +0.0% (+0.0%-+2.0%) | - |")  # fmt: skip

    fields = ["date", "invocation", "cpu", "cpu_family_model", "isa", "cores", "torch", "device", "load",
              "video_set", "decoder", "rounds", "seconds", "clips_s", "clips_s_min", "clips_s_max", "clips_cpu_s"]

    def drow(inv, decoder, clips, cpu_clips):
        return MACHINE[:1] + [inv] + MACHINE[1:] + ["set", decoder, "3", "2", clips, clips, clips, cpu_clips]

    _write(tmp_path / "t_decoding.csv", fields, [
        drow("a", "pyav", "80.0", "290"), drow("a", "opencv", "90.0", "348"),
        drow("b", "pyav", "86.0", "300"), drow("b", "opencv", "88.0", "330"),
    ])  # fmt: skip
    lines = video_bench_report.throughput_decoding_table(str(tmp_path / "t")).splitlines()
    assert lines[2:] == [
        "| EPYC (25/1) | 2.14.1 | a cell | set | pyav | 2 | 83.00 (80.00-86.00) | 295.0 (290.0-300.0) | - | 2026-11-28 |",
        "| EPYC (25/1) | 2.14.1 | a cell | set | opencv | 2 | 89.00 (88.00-90.00) | 339.0 (330.0-348.0) "
        "| 1.15x (1.10x-1.20x) | 2026-11-28 |",
    ]  # fmt: skip


def test_gpu_throughput_line_joins_the_runs_printed_figures(tmp_path):
    from largedet_study import video_bench_report

    paths = []
    for k, (tsn, tsm, ratio, shift) in enumerate([("197.30", "182.13", "0.65", "+7.7"), ("201.46", "186.15", "0.63", "+7.6")]):
        log = tmp_path / f"{k}.log"
        log.write_text("\n".join([
            "Device: NVIDIA H100 80GB HBM3; torch 2.11.0+cu130",
            f"  TSN                  {tsn} clips/s    32.9 GFLOPs/clip   24.3M params",
            f"  TSM                  {tsm} clips/s    32.9 GFLOPs/clip   24.3M params",
            "  TSM (naive shift)    140.00 clips/s    32.9 GFLOPs/clip   24.3M params",
            "  I3D 3x3x3            280.00 clips/s    22.9 GFLOPs/clip   47.0M params",
            "  I3D 3x1x1            184.00 clips/s    41.9 GFLOPs/clip   32.5M params",
            f"  TSM / I3D 3x3x3:  {ratio}x   (paper: 1.6x)",
            "  TSM / I3D 3x1x1:  0.99x   (paper: 2.9x)",
            f"  shift cost vs TSN: {shift}% wall; naive shift +28.9% wall (goal <= 3%)",
        ]))  # fmt: skip
        paths.append(str(log))
    line = video_bench_report.gpu_throughput_line(paths)
    assert line.startswith("training clips/s (runs: 2): TSN 197.30 / 201.46, TSM 182.13 / 186.15, ")
    assert "TSM / I3D 3x3x3 0.65x / 0.63x (paper 1.6x), TSM / I3D 3x1x1 0.99x / 0.99x (paper 2.9x)" in line
    assert line.endswith("the shift +7.7% / +7.6% against TSN (goal <= 3%), the naive shift +28.9% / +28.9%.")
