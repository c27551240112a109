"""End to end: tools/lazyconfig_train_net.py trains the batch-1024 LazyConfig example, shrunk
to a few steps on a tiny shapes set, with accumulation, and evaluates it."""

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "tools", "lazyconfig_train_net.py")
CONFIG = os.path.join(ROOT, "configs", "shapes", "lazy", "faster_rcnn_R18_FPN_pmdlamb_bs1024.py")


def tiny_overrides(spec, out_dir):
    """The example on ``spec`` at 64 px: 3 steps of 4 images as 2 micro-batches of 2."""
    return [
        f"datasets.shapes.spec.root={spec.root}", f"datasets.shapes.spec.num_train={spec.num_train}",
        f"datasets.shapes.spec.num_val={spec.num_val}", f"datasets.shapes.spec.image_size={spec.image_size}",
        f"datasets.shapes.spec.seed={spec.seed}",
        "dataloader.train.mapper.augmentations.0.short_edge_length=[64]",
        "dataloader.train.mapper.augmentations.0.max_size=64",
        "dataloader.test.mapper.augmentations.0.short_edge_length=64",
        "dataloader.test.mapper.augmentations.0.max_size=64",
        "dataloader.train.num_workers=0", "train.ims_per_batch=4", "train.ims_per_device=2",
        "train.max_iter=3", "train.warmup.iters=1", "lr_multiplier.milestones=[2]",
        "lr_multiplier.values=[1.0,0.1]", "optimizer.period=2", f"train.output_dir={out_dir}",
    ]  # fmt: skip


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, "--config", CONFIG, *args],
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_lazyconfig_train_net_trains_and_evaluates_the_example(tiny_shapes, tmp_path):
    out_dir = tmp_path / "run"
    proc = run(*tiny_overrides(tiny_shapes, out_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (out_dir / "log.txt").read_text()
    block = log[log.index("Large-batch run:") :].splitlines()[:5]
    assert (
        "global batch 4 (SOLVER.IMS_PER_BATCH); 2 image(s) per device per pass; 2 accumulation step(s)"
        in block[1]
    )
    assert "optimizer PMDLAMB" in block[2] and "LR 0.0025 = sqrt scaling rule" in block[2]
    assert "linear warmup over 1 iterations" in block[3]
    # the config file's contents are logged highlighted for the console, not in the file
    assert "Contents of args.config_file=" in log and "\x1b[" not in log
    assert (out_dir / "model_final.pth").is_file() and (out_dir / "config.yaml").is_file()
    printed = [line for line in proc.stdout.splitlines() if line.startswith("box AP: ")]
    assert len(printed) == 1

    # --eval-only on the final weights prints the same AP
    weights = f"train.init_checkpoint={out_dir / 'model_final.pth'}"
    proc = run("--eval-only", *tiny_overrides(tiny_shapes, tmp_path / "eval"), weights)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in proc.stdout.splitlines() if line.startswith("box AP: ")] == printed
    # and writes what it measured beside its outputs, the AP the line prints
    results = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
    assert printed == [f"box AP: {results['bbox']['AP']:.1f}"]


def test_lazyconfig_train_net_refuses_a_batch_that_does_not_split(tiny_shapes, tmp_path):
    proc = run(*tiny_overrides(tiny_shapes, tmp_path / "run"), "train.ims_per_device=3")
    assert proc.returncode == 2
    assert (
        "SOLVER.IMS_PER_BATCH 4 is not a whole multiple of world size 1 x SOLVER.IMS_PER_DEVICE 3"
        in proc.stderr
    )
    assert not (tmp_path / "run").exists()


def test_a_short_trial_of_the_example_drops_the_milestones_past_its_end(tiny_shapes, tmp_path):
    # the example's milestones (225, 275) as written, the run cut to 6 steps: the schedule
    # follows train.max_iter as the yacs path's SOLVER.STEPS do, with one warning
    overrides = [o for o in tiny_overrides(tiny_shapes, tmp_path / "run")
                 if not o.startswith(("lr_multiplier.", "train.max_iter=", "train.ims_per_"))]  # fmt: skip
    proc = run(*overrides, "train.max_iter=6", "train.ims_per_batch=2", "train.ims_per_device=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "lr_multiplier: milestones (225, 275) past the run's 6 steps (train.max_iter) are ignored" in log
    assert (tmp_path / "run" / "model_final.pth").is_file()


def test_three_lazyconfig_mistakes_are_three_lines_in_one_run(tiny_shapes, tmp_path):
    proc = run(*tiny_overrides(tiny_shapes, tmp_path / "run"), "train.max_iterr=5", "optimizer.perod=5",
               "train.checkpointer.period=0")  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error: ")] == [
        "error: train.max_iterr: not a largedet training key; did you mean train.max_iter?",
        "error: optimizer.perod: not an argument of PMDLAMB; did you mean period?",
        "error: train.checkpointer.period (SOLVER.CHECKPOINT_PERIOD): must be an integer >= 1, got 0",
    ]
    assert not (tmp_path / "run").exists()
