"""A user's module on the command line (``--import``, docs/extend.md): the example module
``docs/examples/my_ext.py`` registers an optimizer, a dataset, an evaluator, a backbone and a
hook, and tools/train_net.py trains with all of them on two CPU processes (gloo), each
process importing the module; every tool that builds a model or a dataset takes the flag;
a name that no module registered, and a module that does not import, is one line before
launch."""

import json
import os
import re
import shlex
import subprocess
import sys

import launch_testing
import pytest

from test_train_net import ROOT, TRAIN_NET

EXAMPLES = os.path.join(ROOT, "docs", "examples")
PAGE = os.path.join(ROOT, "docs", "extend.md")
DEMO = os.path.join(ROOT, "configs", "shapes", "faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml")
TOOLS = {
    "train_net": (TRAIN_NET, ["--config", DEMO]),
    "lazyconfig_train_net": (os.path.join(ROOT, "tools", "lazyconfig_train_net.py"),
                             ["--config", os.path.join(ROOT, "configs", "shapes", "lazy",
                                                       "faster_rcnn_R18_FPN_pmdlamb_bs1024.py")]),
    "video": (os.path.join(ROOT, "projects", "video", "train.py"), []),
    "predict": (os.path.join(ROOT, "tools", "predict.py"), ["--config", DEMO, "--input", "x.jpg"]),
    "visualize_json_results": (os.path.join(ROOT, "tools", "visualize_json_results.py"),
                               ["--config", DEMO, "--input", "r.json", "--dataset", "shapes_val",
                                "--output", "pictures"]),
}  # fmt: skip


def _env(tmp_path, *paths):
    """The tests' environment with ``paths`` first on PYTHONPATH and the datasets cached in
    ``tmp_path``."""
    pythonpath = os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
                LARGEDET_DATASETS=str(tmp_path / "ld"), DETECTRON2_DATASETS=str(tmp_path / "d2"))  # fmt: skip


def documented_command():
    """The command of docs/extend.md's first shell block: its environment variables and the
    words after ``python``."""
    block = open(PAGE).read().split("```bash\n", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    start = words.index("python")
    return dict(word.split("=", 1) for word in words[:start]), words[start + 1 :]


def test_train_net_trains_with_what_the_users_module_registered_on_two_processes(tmp_path):
    out = tmp_path / "run"
    variables, args = documented_command()
    assert args[0] == "tools/train_net.py" and args[-2:] == ["--num-gpus", "2"]
    assert variables == {"PYTHONPATH": "docs/examples"}
    args += [  # a few small steps (a flag before them: they follow the command's --num-gpus 2)
        "SOLVER.IMS_PER_BATCH", "4", "SOLVER.MAX_ITER", "2", "SOLVER.WARMUP_ITERS", "1",
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "INPUT.MIN_SIZE_TEST", "64",
        "INPUT.MAX_SIZE_TEST", "64", "DATALOADER.NUM_WORKERS", "0", "OUTPUT_DIR", str(out),
    ]  # fmt: skip
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=_env(tmp_path, os.path.join(ROOT, variables["PYTHONPATH"])), cwd=ROOT,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    logs = [(out / "log.txt").read_text(), (out / "log.txt.rank1").read_text()]
    for rank, log in enumerate(logs):  # each process imported the module and built its parts
        assert "MyRAdam param group 0: " in log
        assert re.search(rf"LowestLoss: \S+ at step \d \(rank {rank}\)", log), log[-3000:]
    assert "world size 2; global batch 4 (SOLVER.IMS_PER_BATCH); 2 image(s) per device" in logs[0]
    assert "Loaded 96 images in COCO format" in logs[0]  # my_shapes_train
    assert "optimizer RAdam (SOLVER.OPTIMIZER MyRAdam)" in logs[0]
    # the evaluator of evaluator_type "shape_count" scored my_shapes_val
    rows = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    (scored,) = [r for r in rows if "shape_count/exact" in r]
    assert 0 <= scored["shape_count/exact"] <= 100 and scored["shape_count/mae"] >= 0
    # the run's config records the module: a rerun from it imports it again
    assert "IMPORTS:\n- my_ext" in (out / "config.yaml").read_text()


def run_rejected(tool, args, tmp_path, *paths):
    script, base = TOOLS[tool]
    return launch_testing.run_rejected(script, [*base, *args], _env(tmp_path, EXAMPLES, *paths), [])


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_tool_imports_the_module_before_its_config_is_checked(tool, tmp_path):
    line = run_rejected(tool, ["--import", "no_such_ext"], tmp_path)
    assert line.startswith("error: --import no_such_ext: ModuleNotFoundError: No module named 'no_such_ext' "
                           "(searched: sys.path and the working directory ")  # fmt: skip


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["SOLVER.OPTIMIZER", "MyAdam"],
         "error: SOLVER.OPTIMIZER: 'MyAdam' is not registered; registered: AdamW, LAMB, LARS, MyRAdam, PMD_LAMB, SGD"),
        (["DATASETS.TRAIN", "('my_shape_train',)"],
         "error: DATASETS.TRAIN: dataset 'my_shape_train' is not registered; registered names close to it: "
         "my_shapes_train"),
        (["HOOKS", "('LowestLos',)"], "error: HOOKS: 'LowestLos' is not registered in HOOK_REGISTRY; registered: LowestLoss"),
        (["MODEL.BACKBONE.NAME", "build_my_backbon"], "error: MODEL.BACKBONE.NAME: 'build_my_backbon' is not registered; "
                                                      "registered: build_basic_resnet_backbone, "),
    ],
)  # fmt: skip
def test_a_name_no_module_registered_is_one_line_naming_the_registered_ones(overrides, expected, tmp_path):
    line = run_rejected("train_net", ["--import", "my_ext", *overrides], tmp_path)
    assert line.startswith(expected)
    if overrides[0] == "MODEL.BACKBONE.NAME":
        assert "build_my_backbone" in line


def test_an_unregistered_evaluator_type_is_one_line(tmp_path):
    (tmp_path / "odd_ext.py").write_text(
        "from detectron2.data import DatasetCatalog, MetadataCatalog\n"
        "DatasetCatalog.register('odd_val', list)\n"
        "MetadataCatalog.get('odd_val').set(thing_classes=['a'], evaluator_type='odd')\n"
    )
    line = run_rejected("train_net", ["--import", "odd_ext", "DATASETS.TEST", "('odd_val',)"], tmp_path, tmp_path)
    assert line == (
        "error: DATASETS.TEST: dataset 'odd_val' has evaluator_type 'odd', which is not registered in "
        "EVALUATOR_REGISTRY; registered: coco, openimages"
    )


def test_a_module_that_fails_to_import_is_one_line_with_where(tmp_path):
    (tmp_path / "broken_ext.py").write_text("import os\n\nLIMIT = 1 / 0\n")
    line = run_rejected("train_net", ["--import", "broken_ext"], tmp_path, tmp_path)
    assert line == f"error: --import broken_ext: ZeroDivisionError: division by zero ({tmp_path / 'broken_ext.py'}:3)"
    # the config key names itself
    line = run_rejected("train_net", ["IMPORTS", "['broken_ext']"], tmp_path, tmp_path)
    assert line.startswith("error: IMPORTS broken_ext: ZeroDivisionError: division by zero")


def test_a_slurm_job_passes_the_modules_to_the_script_on_every_node():
    from largedet.cli.submit import argument_parser
    from largedet.launch.slurm import Placement, TrainingJob

    args = argument_parser().parse_args(["--import", "my_ext", "--config", DEMO, "SOLVER.OPTIMIZER", "MyRAdam"])
    job = TrainingJob(script="tools/train_net.py", gpus_per_node=2, config_file=DEMO, opts=args.opts,
                      imports=args.imports)  # fmt: skip
    command = job.command(Placement(2, 1, "tcp://gpu-a:12345"))
    assert command[command.index("--import") :][:2] == ["--import", "my_ext"]
    assert command[-2:] == ["SOLVER.OPTIMIZER", "MyRAdam"]
