#!/usr/bin/env python3
"""Score detections with the Open Images Challenge metric; ends with ``mAP@0.5: <fraction>``.

    python tools/oid_eval.py --boxes validation-annotations-bbox.csv \\
        --image-labels validation-annotations-human-imagelabels-boxable.csv \\
        --hierarchy bbox_labels_600_hierarchy.json \\
        --class-descriptions class-descriptions-boxable.csv \\
        --detections DET.csv [--per-class per_class_ap.csv]

DET.csv has the columns ImageID,LabelName,Score,XMin,XMax,YMin,YMax (normalised). The
command line is ``largedet.evaluation.oid_cli``.
"""

import sys

from largedet.evaluation.oid_cli import main

if __name__ == "__main__":
    sys.exit(main())
