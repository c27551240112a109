"""Every launch command shown in the documentation passes the check its launcher runs before
any process starts.

The commands are read from the fenced code blocks of README.md, docs/*.md and
projects/video/README.md: ``python tools/train_net.py``, ``python tools/lazyconfig_train_net.py``,
``python projects/video/train.py``, ``torchrun ... <one of them>``, ``python tools/submit.py``
and the installed commands ``largedet-train`` and ``largedet-video-train``.
Each is parsed by its script's own parser and checked by the function its launcher calls
(``check_args``, ``check_lazy_args``, ``check_video_args``, ``tools/submit.py``'s ``check``),
with the process count it names; nothing is trained. The data they read (COCO, Kinetics, a
user's COCO json) is a one-image stand-in in a temporary folder, and ``MODEL.DEVICE`` is
checked as on the GPU nodes the commands are written for (``cpu`` here).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "projects/video/README.md"]
SCRIPTS = {
    "tools/train_net.py": "yacs",
    "tools/lazyconfig_train_net.py": "lazy",
    "projects/video/train.py": "video",
    "tools/submit.py": "submit",
    "largedet-train": "yacs",  # the wheel's console commands
    "largedet-video-train": "video",
}
# values of the shell variables the examples use
SHELL_VARS = {"RANK": "0", "MASTER": "127.0.0.1", "HOST": "127.0.0.1", "PORT": "29500"}
# a placeholder for the reader's own config (CFG, CFG.py) is not a runnable example
PLACEHOLDER = re.compile(r"(^|\s)(--config(-file)?\s+)?CFG(\.py)?(\s|$)|\.\.\.")


def _commands(text: str):
    """Each command of the shell blocks (fenced, untagged or ``bash``/``sh``) of ``text`` that
    names a launcher: continuation lines joined, comment lines dropped."""
    block, shell = None, False
    for line in text.splitlines():
        fence = re.match(r"^```(\S*)(\s.*)?$", line)  # a fence may carry arguments ({largedet-table} X)
        if fence and block is None:
            block, shell = [], fence.group(1) in ("", "bash", "sh", "shell")
        elif fence:
            if shell:
                for command in "\n".join(block).replace("\\\n", " ").splitlines():
                    command = command.strip()
                    if command and not command.startswith("#") and any(s in command for s in SCRIPTS):
                        yield " ".join(command.split())
            block = None
        elif block is not None:
            block.append(line)


def launch_examples():
    """``(doc, command, kind, argv, world_size or None)`` of every documented launch command."""
    found = []
    for doc in DOCS:
        for command in _commands(doc.read_text()):
            words = shlex.split(command, comments=True)
            script = next((w for w in words if w in SCRIPTS), None)
            if script is None or words[0] not in ("python", "torchrun", script):
                continue
            if PLACEHOLDER.search(command):
                continue
            argv = [re.sub(r"\$(\w+)", lambda m: SHELL_VARS[m.group(1)], w)
                    for w in words[words.index(script) + 1:]]  # fmt: skip
            world = None
            if words[0] == "torchrun":
                flags = dict(zip(words[1:words.index(script)], words[2:words.index(script)]))
                world = int(flags.get("--nproc_per_node", 1)) * int(flags.get("--nnodes", 1))
            found.append((doc.relative_to(ROOT).as_posix(), command, SCRIPTS[script], argv, world))
    return found


EXAMPLES = launch_examples()


def test_the_documented_launch_commands_are_found():
    commands = [c for _, c, *_ in EXAMPLES]
    assert len(EXAMPLES) >= 20, commands
    assert {kind for _, _, kind, *_ in EXAMPLES} == {"yacs", "lazy", "video", "submit"}
    # the multi-machine examples of each launcher are among them
    assert any("--num-machines" in c and "r50_fpn_bs1056.yaml" in c for c in commands)
    assert any("submit.py" in c and "--nodes" in c and "r50_fpn_bs1056.yaml" in c for c in commands)
    assert any("torchrun" in c and "video/train.py" in c for c in commands)
    assert any(c.startswith("largedet-video-train") for c in commands)


def _write_coco(json_file: Path, image_root: Path) -> None:
    from PIL import Image

    json_file.parent.mkdir(parents=True, exist_ok=True)
    image_root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8)).save(image_root / "1.jpg")  # the size the json gives
    json_file.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "1.jpg", "width": 8, "height": 8}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 4, 4],
                         "area": 16, "iscrowd": 0}],
        "categories": [{"id": 1, "name": "thing"}],
    }))  # fmt: skip


@pytest.fixture
def stand_in_data(tmp_path, monkeypatch):
    """A working folder holding the checkout's configs and one-image stand-ins for the data
    and weights the examples name; returns the rewrite of the examples' absolute data paths."""
    from detectron2.data import MetadataCatalog

    for name in ("configs", "tools"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "projects" / "video").mkdir(parents=True)
    (tmp_path / "projects" / "video" / "configs").symlink_to(ROOT / "projects/video/configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LARGEDET_DATASETS", str(tmp_path / "largedet_datasets"))
    for name in ("coco_2017_train", "coco_2017_val"):  # Detectron2's paths, under the cwd
        meta = MetadataCatalog.get(name)
        _write_coco(Path(meta.json_file), Path(meta.image_root))
    kinetics = tmp_path / "largedet_datasets" / "kinetics400" / "annotations"
    kinetics.mkdir(parents=True)
    for split in ("train", "validate"):
        (kinetics / f"{split}.csv").write_text(
            f"label,youtube_id,time_start,time_end,split\nabseiling,abc,0,10,{split}\n"
        )
    resnet50 = tmp_path / "home/.cache/torch/hub/checkpoints/resnet50-0676ba61.pth"
    resnet50.parent.mkdir(parents=True)
    resnet50.write_bytes(b"")
    weights = tmp_path / "output/r50_fpn_bs1056/model_final.pth"
    weights.parent.mkdir(parents=True)
    torch.save({"model": {}}, weights)  # a weights file (checked before launch with weights_only)
    user = tmp_path / "data" / "my"
    for split in ("train", "val"):
        _write_coco(user / f"{split}.json", user / split)
    return lambda word: word.replace("/data/my/", f"{user}/")


def _submit_module():
    spec = importlib.util.spec_from_file_location("largedet_docs_submit", ROOT / "tools/submit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_check(kind: str, argv: list[str], world: int | None, monkeypatch) -> None:
    """The check ``kind``'s launcher runs before starting any process, on ``argv``."""
    from largedet.engine import largedet_argument_parser

    if world is not None:  # what torchrun sets in each process it starts
        for key, value in {"WORLD_SIZE": world, "LOCAL_WORLD_SIZE": min(world, 8), "RANK": 0,
                           "LOCAL_RANK": 0, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 29500,
                           "TORCHELASTIC_RUN_ID": "docs"}.items():  # fmt: skip
            monkeypatch.setenv(key, str(value))
    if kind == "submit":
        submit = _submit_module()
        args = submit.argument_parser().parse_args(argv)
        script = "video" if args.video else "lazy" if args.config_file.endswith(".py") else "yacs"
        if script == "video":  # checked at job start, on the nodes: the same check here
            from largedet_video.engine.checks import check_video_args

            check_video_args(_video_args(args.config_file, args.opts, args.gpus_per_node, args.nodes))
        else:
            submit.check(script, args)
        return
    args = largedet_argument_parser().parse_args(argv)
    if kind == "yacs":
        from largedet.engine import check_args

        args.check_device = False  # the GPUs are the nodes' the command is written for
        check_args(args)
    elif kind == "lazy":
        from largedet.engine.lazy import check_lazy_args

        args.check_device = False
        check_lazy_args(args)
    else:
        from largedet_video.engine.checks import check_video_args

        video = _video_args(args.config_file, args.opts, args.num_gpus, args.num_machines)
        video.eval_only, video.resume = args.eval_only, args.resume
        check_video_args(video)


def _video_args(config_file, opts, num_gpus, num_machines):
    import argparse

    return argparse.Namespace(
        config_file=config_file, opts=[*opts, "MODEL.DEVICE", "cpu"], eval_only=False,
        resume=False, num_gpus=num_gpus, num_machines=num_machines, allow_python_yaml=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "doc, command, kind, argv, world",
    EXAMPLES,
    ids=[f"{doc}:{' '.join(argv)[:70]}" for doc, _, _, argv, _ in EXAMPLES],
)
def test_documented_launch_command_passes_its_check(
    doc, command, kind, argv, world, stand_in_data, monkeypatch
):
    import largedet_video  # noqa: F401  (registers the video models and keys)

    argv = [stand_in_data(w) for w in argv]
    try:
        run_check(kind, argv, world, monkeypatch)
    except ValueError as e:  # ConfigError, BatchArithmeticError: what the launcher prints
        pytest.fail(f"{doc}: `{command}` is refused before launch: error: {e}")
