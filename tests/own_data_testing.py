"""A user's own COCO dataset, as a newcomer brings one: two classes with non-contiguous
category ids (3 "apple", 7 "pear"), written from a generated shapes split (circles become
apples, squares pears, triangles are dropped)."""

import json
import os

#: the user's categories: ids as their annotation tool wrote them, not 1..K
CATEGORIES = [{"id": 3, "name": "apple"}, {"id": 7, "name": "pear"}]
_FROM_SHAPES = {1: 3, 2: 7}  # circle -> apple, square -> pear; triangles (3) dropped


def write_own_split(spec, split: str, json_file) -> tuple:
    """``(json_file, image_root)`` of ``spec``'s ``split`` as a 2-class COCO json with ids
    3 and 7 (the images stay where the shapes generator wrote them)."""
    with open(spec.json_file(split)) as f:
        coco = json.load(f)
    coco["annotations"] = [
        dict(a, category_id=_FROM_SHAPES[a["category_id"]])
        for a in coco["annotations"]
        if a["category_id"] in _FROM_SHAPES
    ]
    coco["categories"] = CATEGORIES
    with open(json_file, "w") as f:
        json.dump(coco, f)
    return str(json_file), spec.image_root(split)


def own_data_opts(spec, folder) -> list:
    """``DATASETS.COCO_JSONS`` registering ``my_train`` and ``my_val`` from ``spec``'s
    splits in ``folder``, and DATASETS.TRAIN / TEST naming them."""
    train = write_own_split(spec, "train", os.path.join(folder, "my_train.json"))
    val = write_own_split(spec, "val", os.path.join(folder, "my_val.json"))
    jsons = f"[['my_train', '{train[0]}', '{train[1]}'], ['my_val', '{val[0]}', '{val[1]}']]"
    return ["DATASETS.COCO_JSONS", jsons, "DATASETS.TRAIN", "('my_train',)", "DATASETS.TEST", "('my_val',)"]
