#!/usr/bin/env python3
"""Draw a detector's predictions on images (Detectron2's ``demo/demo.py``, for largedet configs).

    python tools/predict.py --config CFG --input photo1.jpg --input 'more/*.jpg' --output out/ \\
        MODEL.WEIGHTS output/run/model_final.pth
    python tools/predict.py --config output/run --input 'photos/*.jpg'   # a run's folder
    python tools/predict.py --config configs/shapes/faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml \\
        --resume --dataset shapes_val --num-images 8      # what `make demo` runs at its end

Inputs: image files or glob patterns (``--input``, repeated), or the first ``--num-images``
images of a registered dataset (``--dataset``). Weights: ``MODEL.WEIGHTS``, or with
``--resume`` the last checkpoint of ``OUTPUT_DIR``. ``--output`` ending in .jpg or .png is one
picture of all the inputs in a grid (default ``OUTPUT_DIR/predictions.jpg``); otherwise a
folder that gets one picture per input, ``<file name>.png``. The weights and each picture's
path are printed. Boxes scoring at least ``--confidence-threshold`` are drawn with
Detectron2's ``Visualizer``, labelled with the class names of ``--dataset`` (else of the
config's first test dataset); a model with another number of classes is a warning naming
both. ``--config`` may be a run's output folder: its own ``config.yaml`` (its datasets and
classes) and, unless ``MODEL.WEIGHTS`` is given, its last checkpoint. Trailing ``KEY VALUE``
pairs override the config; a config error, and weights that are missing or would run code
(read with ``weights_only=True``, whatever the environment), are one line on stderr, exit 2,
before the model is built.
"""

import argparse
import glob
import os
import sys

import cv2
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog
from detectron2.data.detection_utils import read_image

from largedet.checkpoint import UnsafeWeightsError
from largedet.checkpoint.checks import check_output_and_weights
from largedet.config import DeviceUnavailableError, add_largedet_config
from largedet.config.errors import error_lines
from largedet.config.imports import add_import_argument
from largedet.config.validate import ConfigError, merge_checked
from largedet.data import CocoJsonError
from largedet.data.checks import not_registered
from largedet.engine import Predictor, setup_cfg
from largedet.engine.labels import class_labels, run_source
from largedet.utils.visualization import draw_predictions, tile

PICTURE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--config", "--config-file", dest="config_file", metavar="FILE", required=True
    )
    parser.add_argument("--input", action="append", default=[], metavar="FILE_OR_GLOB",
                        help="an image file or a quoted glob pattern; repeat for more")
    parser.add_argument("--dataset", default="", help="a registered dataset: its first images")
    parser.add_argument("--num-images", type=int, default=8, help="images of --dataset (default 8)")
    parser.add_argument("--output", default="", help="a .jpg/.png (one grid) or a folder")
    parser.add_argument("--confidence-threshold", type=float, default=0.5)
    parser.add_argument("--scale", type=float, default=1.0, help="picture size / image size")
    parser.add_argument("--columns", type=int, default=4, help="columns of the grid")
    parser.add_argument(
        "--resume", action="store_true", help="weights: OUTPUT_DIR's last checkpoint"
    )
    parser.add_argument(
        "--allow-python-yaml", action="store_true",
        help="load a config file holding !!python/... tags (they can run code); else refused",
    )  # fmt: skip
    add_import_argument(parser)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides")
    return parser.parse_args(argv)


def input_files(args: argparse.Namespace) -> list:
    """The image files ``--input`` names (globs expanded, in order) or ``--dataset``'s first
    ``--num-images``; ValueError for a name or pattern that matches no file."""
    files = []
    for pattern in args.input:
        matched = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matched:
            raise ValueError(f"{pattern}: no such image file")
        files += matched
    if args.dataset:
        files += [d["file_name"] for d in DatasetCatalog.get(args.dataset)[: args.num_images]]
    if not files:
        raise ValueError("--input or --dataset: no image given")
    return files


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        source = run_source(args.config_file, args.opts)  # a run's folder: its own config
        args.config_file, args.opts = source.config_file, source.opts
        merge_checked(  # the safe yaml loader: a !!python/... tag is one line, before any code
            add_largedet_config(get_cfg()), args.config_file, args.opts,
            allow_python_tags=args.allow_python_yaml,
        )  # fmt: skip
        cfg = setup_cfg(args, log=False)
        # a run's folder: its last checkpoint, unless MODEL.WEIGHTS is given
        resume = args.resume or bool(source.run_dir and "MODEL.WEIGHTS" not in args.opts[0::2])
        check_output_and_weights(cfg, training=False, resume=resume)  # before the model is built
        if args.dataset and args.dataset not in DatasetCatalog.list():
            raise ConfigError(not_registered("--dataset", args.dataset))
    except (ConfigError, DeviceUnavailableError, CocoJsonError) as e:
        print("\n".join(f"error: {line}" for line in error_lines(e)), file=sys.stderr)
        sys.exit(2)
    try:
        files = input_files(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    names = [args.dataset] if args.dataset else [*cfg.DATASETS.TEST, *cfg.DATASETS.TRAIN]
    try:
        predictor = Predictor(cfg, resume=resume)
    except UnsafeWeightsError as e:  # OUTPUT_DIR's last checkpoint (--resume), read weights-only
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"weights: {predictor.weights or 'none (random initialisation)'}")
    labels = class_labels(cfg, names)
    print("\n".join(labels.notes))
    if labels.warning:
        print(labels.warning, file=sys.stderr)
    metadata = labels.metadata

    output = args.output or os.path.join(cfg.OUTPUT_DIR, "predictions.jpg")
    one_picture = output.lower().endswith(PICTURE_EXTENSIONS)
    pictures = []
    for path in files:
        image = read_image(path, format="BGR")
        instances = predictor(image)["instances"]
        picture = draw_predictions(
            image[:, :, ::-1],
            instances,
            metadata,
            threshold=args.confidence_threshold,
            scale=args.scale,
        )
        kept = int((instances.scores >= args.confidence_threshold).sum())
        print(f"{path}: {kept} detection(s) scoring >= {args.confidence_threshold}")
        if one_picture:
            pictures.append(picture)
        else:
            os.makedirs(output, exist_ok=True)
            written = os.path.join(output, os.path.splitext(os.path.basename(path))[0] + ".png")
            cv2.imwrite(written, picture[:, :, ::-1])
            print(f"predictions: {written}")
    if one_picture:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        cv2.imwrite(output, tile(pictures, columns=args.columns)[:, :, ::-1])
        print(f"predictions: {output}")


if __name__ == "__main__":
    main()
