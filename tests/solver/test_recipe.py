"""The recipe command: its keys for batch 1056 on COCO are configs/r50_fpn_bs1056.yaml's, its
rules are those of the study rows it names, and docs/recipes.md shows its output as it is."""

import csv
import os
import re
import subprocess
import sys

import pytest
from detectron2.config import get_cfg

from largedet.cli.recipe import report, yaml_lines
from largedet.config import add_largedet_config
from largedet.config.validate import lookup_key, merge_checked
from largedet.solver.recipe import EVIDENCE_GRID, RecipeError, detection_recipe

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
R50 = os.path.join(ROOT, "configs", "r50_fpn_bs1056.yaml")
REGIME_CSV = os.path.join(ROOT, "study", "results", "batch_scaling_regime.csv")
COCO = dict(batch=1056, images=118287, gpus=8)


def merged(config_file=None, opts=()):
    cfg = add_largedet_config(get_cfg())
    merge_checked(cfg, config_file, list(opts))
    return cfg


def test_the_recipe_for_batch_1056_on_coco_is_the_r50_configs_keys(tmp_path):
    recipe = detection_recipe(**COCO)
    config = merged(R50)
    for key, value in recipe.yaml_keys():
        assert lookup_key(config, key)[1] == value, key
    # the printed yaml block merges to the same values
    printed = tmp_path / "recipe.yaml"
    printed.write_text("\n".join(yaml_lines(recipe)) + "\n")
    from_print = merged(str(printed))
    for key, _ in recipe.yaml_keys():
        assert lookup_key(from_print, key)[1] == lookup_key(config, key)[1], key
    assert recipe.accumulation == 33  # 1056 / (8 x 4), as the config's comment says


def test_the_rules_are_the_evidence_rows_own():
    grid, batch, images = EVIDENCE_GRID
    from largedet_study.grid import REGIME_NUM_TRAIN

    assert (grid, images) == ("regime", REGIME_NUM_TRAIN)
    with open(REGIME_CSV) as f:
        rows = {row["cell"]: row for row in csv.DictReader(f)}
    one_x = rows["pmd_lamb-bs256-lrwsd-wd0.01"]
    for factor in (1.0, 1.4, 2.0):
        recipe = detection_recipe(batch, images, 1, 1, factor)
        cell = re.search(r"rows (\S+) and", recipe.evidence()).group(1)
        row = rows[cell]
        assert int(row["batch"]) == batch and f"{cell}-s1" in rows and f"{cell}-s2" in rows
        # the run's length, warm-up and PMD period relative to the 1x schedule's, as the row has them
        assert recipe.max_iter / recipe.one_x_steps == pytest.approx(int(row["iterations"]) / int(one_x["iterations"]), abs=1e-3)
        assert recipe.warmup_iters / recipe.one_x_steps == pytest.approx(int(row["warmup_iters"]) / int(one_x["iterations"]), abs=2e-3)
        assert int(row["pmd_period"]) == round(int(row["iterations"]) / 4)
        assert recipe.pmd_period == int(recipe.max_iter / 4 + 0.5)  # half up: 477.5 -> 478
    assert "not measured at 3x; nearest 2x" in detection_recipe(batch, images, 1, 1, 3.0).evidence()


def test_a_batch_that_does_not_split_names_what_does():
    with pytest.raises(RecipeError, match=r"on 64 GPUs, batch 1024 or 1280$"):
        detection_recipe(1056, 118287, 64)
    assert "warning: " in "\n".join(report(detection_recipe(1024, 20000, 8)))  # 5% of the data per step


def test_the_command_prints_it_and_the_recipes_page_shows_that_output():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "recipe.py"), "--batch", "1056",
                           "--images", "118287", "--gpus", "8"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == report(detection_recipe(**COCO))
    with open(os.path.join(ROOT, "docs", "recipes.md"), encoding="utf-8") as f:
        page = f.read()
    block = re.search(r"\$ largedet-recipe --batch 1056 --images 118287 --gpus 8\n(.*?)```", page, re.S)
    assert block, "docs/recipes.md shows the command's output"
    assert block.group(1).rstrip("\n").splitlines() == proc.stdout.rstrip("\n").splitlines()
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "recipe.py"), "--batch", "1056",
                          "--images", "118287", "--gpus", "64"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("error: --batch 1056 is not a whole multiple")
