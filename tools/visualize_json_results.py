#!/usr/bin/env python3
"""Draw a COCO results file beside the ground truth (as Detectron2's
``tools/visualize_json_results.py`` does).

    python tools/visualize_json_results.py \\
        --input output/run/inference/coco_instances_results.json \\
        --dataset shapes_val --output output/run/pictures \\
        [--config CFG KEY VALUE ...]     # the config that registers the dataset, with overrides

For each image of ``--dataset`` (the first ``--num-images``, default all), one picture
``<output>/<image file name>.png``: the detections scoring at least ``--conf-threshold`` on the
left, the dataset's annotations on the right, drawn with Detectron2's ``Visualizer``. The
dataset is registered as ``tools/train_net.py`` registers it (``--config`` and the
overrides: the shapes sizes, ``DATASETS.COCO_JSONS``, ...), or from a run's output folder
given as ``--config`` (its own ``config.yaml``); a model whose number of classes is not the
dataset's is a warning naming both. A results file that cannot be
read, or an entry without ``image_id``, ``category_id``, ``bbox`` or ``score`` or with a
category the dataset lacks, is one line on stderr naming the file and entry, exit 2.
"""

import argparse
import os
import sys

import cv2
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.detection_utils import read_image

from largedet.config import DeviceUnavailableError, add_largedet_config
from largedet.config.errors import error_lines
from largedet.config.imports import add_import_argument
from largedet.config.validate import ConfigError, merge_checked
from largedet.data import CocoJsonError
from largedet.data.checks import not_registered
from largedet.engine import setup_cfg
from largedet.engine.labels import class_labels, run_source
from largedet.utils.visualization import (
    ResultsFileError,
    draw_ground_truth,
    draw_predictions,
    load_coco_results,
    results_to_instances,
    side_by_side,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, help="a COCO results file")
    parser.add_argument("--dataset", required=True, help="the registered dataset of the results")
    parser.add_argument("--output", required=True, help="folder of the pictures")
    parser.add_argument("--conf-threshold", type=float, default=0.5)
    parser.add_argument("--num-images", type=int, default=0, help="0: every image of the dataset")
    parser.add_argument("--scale", type=float, default=1.0, help="picture size / image size")
    parser.add_argument("--config", "--config-file", dest="config_file", metavar="FILE", default="")
    parser.add_argument(
        "--allow-python-yaml", action="store_true",
        help="load a config file holding !!python/... tags (they can run code); else refused",
    )  # fmt: skip
    add_import_argument(parser)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE config overrides")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        if args.config_file:  # a run's folder: its own config
            source = run_source(args.config_file, args.opts)
            args.config_file, args.opts = source.config_file, source.opts
        merge_checked(  # the safe yaml loader: a !!python/... tag is one line, before any code
            add_largedet_config(get_cfg()), args.config_file, args.opts,
            allow_python_tags=args.allow_python_yaml,
        )  # fmt: skip
        # only to register datasets: the device is not used, so an unavailable GPU is no error
        opts = [*args.opts, "MODEL.DEVICE", "cpu"]
        cfg = setup_cfg(
            argparse.Namespace(
                config_file=args.config_file, opts=opts, allow_python_yaml=args.allow_python_yaml,
                imports=args.imports,
            ),
            log=False,
        )
        if args.dataset not in DatasetCatalog.list():
            raise ConfigError(not_registered("--dataset", args.dataset))
        results = load_coco_results(args.input)
    except (ConfigError, DeviceUnavailableError, CocoJsonError, ResultsFileError) as e:
        print("\n".join(f"error: {line}" for line in error_lines(e)), file=sys.stderr)
        sys.exit(2)
    dicts = DatasetCatalog.get(args.dataset)  # sets the metadata's category id mapping
    metadata = MetadataCatalog.get(args.dataset)
    if args.config_file:  # the model's classes against the dataset's names
        warning = class_labels(cfg, [args.dataset]).warning
        if warning:
            print(warning, file=sys.stderr)
    to_contiguous = metadata.get("thing_dataset_id_to_contiguous_id", None)
    if to_contiguous is None:
        print(
            f"error: --dataset: {args.dataset!r} is not a COCO-format dataset (no category ids)",
            file=sys.stderr,
        )
        sys.exit(2)
    unmatched = set(results) - {d["image_id"] for d in dicts}
    if args.num_images:
        dicts = dicts[: args.num_images]
    os.makedirs(args.output, exist_ok=True)
    drawn = 0
    for d in dicts:
        image = read_image(d["file_name"], format="RGB")
        try:
            instances = results_to_instances(
                results.get(d["image_id"], []), image.shape[:2], to_contiguous, args.input
            )
        except ResultsFileError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        predicted = draw_predictions(
            image, instances, metadata, threshold=args.conf_threshold, scale=args.scale
        )
        truth = draw_ground_truth(image, d, metadata, scale=args.scale)
        name = os.path.splitext(os.path.basename(d["file_name"]))[0] + ".png"
        cv2.imwrite(os.path.join(args.output, name), side_by_side([predicted, truth])[:, :, ::-1])
        drawn += 1
    if unmatched:
        print(
            f"warning: {len(unmatched)} image id(s) of {args.input} are not in {args.dataset!r}",
            file=sys.stderr,
        )
    print(f"{drawn} picture(s) (predictions | ground truth) in {args.output}")


if __name__ == "__main__":
    main()
