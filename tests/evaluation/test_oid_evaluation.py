"""The Open Images Challenge metric on hand-made cases, and against a plain loop."""

import math

import numpy as np
import pytest

from largedet.data.openimages import ClassHierarchy
from largedet.evaluation.oid_evaluation import (
    OIDDetections,
    OIDGroundTruth,
    average_precision,
    evaluate_detections,
)

ANIMAL, DOG, CAT, CAR = 0, 1, 2, 3
NAMES = ["/m/animal", "/m/dog", "/m/cat", "/m/car"]
# Entity (root) -> Animal -> {Dog, Cat}; Entity -> Car.
HIERARCHY = ClassHierarchy(NAMES, {"/m/dog": ["/m/animal"], "/m/cat": ["/m/animal"]})


def ground_truth(num_images, boxes=(), labels=()):
    """boxes: (image, class, (x0, y0, x1, y1), is_group_of); labels: (image, class, present)."""
    return OIDGroundTruth(
        image_ids=np.array([f"img{i}".encode() for i in range(num_images)]),
        box_images=np.array([b[0] for b in boxes], dtype=np.int64),
        boxes=np.array([b[2] for b in boxes], dtype=np.float64).reshape(-1, 4),
        box_labels=np.array([b[1] for b in boxes], dtype=np.int64),
        box_is_group_of=np.array([b[3] for b in boxes], dtype=bool),
        label_images=np.array([l[0] for l in labels], dtype=np.int64),
        label_classes=np.array([l[1] for l in labels], dtype=np.int64),
        label_is_positive=np.array([l[2] for l in labels], dtype=bool),
        num_classes=len(NAMES),
    )


def detections(dets):
    """dets: (image, class, score, (x0, y0, x1, y1))."""
    return OIDDetections(
        images=np.array([d[0] for d in dets], dtype=np.int64),
        boxes=np.array([d[3] for d in dets], dtype=np.float64).reshape(-1, 4),
        scores=np.array([d[2] for d in dets], dtype=np.float64),
        labels=np.array([d[1] for d in dets], dtype=np.int64),
    )


def ap_of(result, cls):
    return result.average_precision[list(result.class_indices).index(cls)]


def test_regular_matching_and_all_points_interpolation():
    # One image, three Car boxes A, B, C; C is never detected.
    A, B, C = (0, 0, 0.2, 0.2), (0.5, 0.5, 0.7, 0.7), (0.8, 0.8, 1.0, 1.0)
    gt = ground_truth(
        1, [(0, CAR, A, False), (0, CAR, B, False), (0, CAR, C, False)], [(0, CAR, True)]
    )
    det = detections(
        [
            (0, CAR, 0.9, A),  # TP (A)
            (0, CAR, 0.8, (0.3, 0.3, 0.4, 0.4)),  # FP: overlaps nothing
            (0, CAR, 0.7, A),  # FP: A already taken, no other box
            (0, CAR, 0.6, B),  # TP (B)
        ]
    )
    result = evaluate_detections(gt, det, class_indices=[CAR])
    # Ranks TP FP FP TP: precision 1, 1/2, 1/3, 2/4; monotone envelope at the two
    # TPs: max(1, .5, .333, .5) = 1 and .5. AP = (1 + 0.5) / 3 boxes = 0.5.
    assert ap_of(result, CAR) == pytest.approx(0.5)
    assert result.num_ground_truth.tolist() == [3]
    assert result.num_detections.tolist() == [4]
    assert result.mean_ap == pytest.approx(0.5)


def test_a_detection_whose_best_box_is_taken_is_a_false_positive():
    G1, G2 = (0, 0, 0.4, 0.4), (0, 0.1, 0.4, 0.5)
    gt = ground_truth(1, [(0, CAR, G1, False), (0, CAR, G2, False)], [(0, CAR, True)])
    # IoU(G1, G2) = 0.12 / (0.16 + 0.16 - 0.12) = 0.6. The first two detections are
    # G1: IoU 1 with G1, 0.6 with G2. The first matches G1. The second's best box
    # is G1, already matched: an FP, though the unmatched G2 overlaps it by 0.6.
    # The third is G2 (IoU 1 with G2, 0.6 with G1): G2 is still unmatched, a TP.
    det = detections([(0, CAR, 0.9, G1), (0, CAR, 0.8, G1), (0, CAR, 0.7, G2)])
    result = evaluate_detections(gt, det, class_indices=[CAR])
    # Ranks TP FP TP: precision 1, 1/2, 2/3; envelope at the TPs 1 and 2/3;
    # AP = (1 + 2/3) / 2 boxes = 5/6. (Falling back to the unmatched G2 would give
    # TP TP FP: AP = (1 + 1) / 2 = 1.)
    assert ap_of(result, CAR) == pytest.approx(5 / 6)
    assert result.num_detections.tolist() == [3]


def test_iou_threshold_is_inclusive():
    # Detection (0, 0, 0.5, 1) on box (0, 0, 1, 1): IoU = 0.5 / 1 = 0.5 exactly -> TP.
    gt = ground_truth(1, [(0, CAR, (0, 0, 1, 1), False)], [(0, CAR, True)])
    det = detections([(0, CAR, 0.9, (0, 0, 0.5, 1))])
    assert ap_of(evaluate_detections(gt, det, class_indices=[CAR]), CAR) == 1.0
    # (0, 0, 0.49, 1): IoU 0.49 -> FP, AP 0.
    det = detections([(0, CAR, 0.9, (0, 0, 0.49, 1))])
    assert ap_of(evaluate_detections(gt, det, class_indices=[CAR]), CAR) == 0.0


def test_hierarchy_expands_boxes_to_ancestors():
    D = (0.1, 0.1, 0.5, 0.5)
    gt = ground_truth(1, [(0, DOG, D, False)], [(0, DOG, True)])
    det = detections([(0, ANIMAL, 0.9, D), (0, CAT, 0.8, D)])
    with_h = evaluate_detections(gt, det, hierarchy=HIERARCHY)
    # The Dog box also counts as an Animal box: the Animal detection is a TP, AP 1.
    # Dog has a box and no detection: AP 0. Cat has no box anywhere: NaN, left out
    # (its detection is ignored too: Cat is not verified on the image).
    # Car: no box, NaN. mAP = (1 + 0) / 2.
    assert ap_of(with_h, ANIMAL) == 1.0
    assert ap_of(with_h, DOG) == 0.0
    assert math.isnan(ap_of(with_h, CAT)) and math.isnan(ap_of(with_h, CAR))
    assert with_h.num_ground_truth.tolist() == [1, 1, 0, 0]
    assert with_h.mean_ap == pytest.approx(0.5)
    # Without the hierarchy Animal has no box and is not verified: only Dog
    # (AP 0) counts.
    without = evaluate_detections(gt, det)
    assert math.isnan(ap_of(without, ANIMAL))
    assert without.mean_ap == 0.0


def test_detections_of_unverified_classes_are_ignored():
    box = (0.2, 0.2, 0.6, 0.6)
    gt = ground_truth(
        3,
        [(0, CAR, box, False)],
        [(0, CAR, True), (2, CAR, False)],  # image 1: no label for Car at all
    )
    det = detections(
        [
            (0, CAR, 0.5, box),  # TP
            (1, CAR, 0.9, box),  # ignored: Car neither verified present nor absent on image 1
            (2, CAR, 0.8, box),  # FP: Car verified absent on image 2
        ]
    )
    result = evaluate_detections(gt, det)
    # Scored: 0.8 FP, 0.5 TP -> precision 0, 1/2; AP = 0.5 / 1 box = 0.5.
    # (Were the 0.9 detection an FP: FP FP TP, AP = 1/3.)
    assert ap_of(result, CAR) == pytest.approx(0.5)
    assert result.num_detections[CAR] == 2


def test_a_box_verifies_its_class_without_an_image_level_label():
    box = (0.2, 0.2, 0.6, 0.6)
    gt = ground_truth(1, [(0, CAR, box, False)])
    det = detections([(0, CAR, 0.9, (0.7, 0.7, 0.9, 0.9)), (0, CAR, 0.5, box)])
    # FP then TP: AP = (1/2) / 1 = 0.5 (the FP is scored: Car has a box on the image).
    assert ap_of(evaluate_detections(gt, det), CAR) == pytest.approx(0.5)


def test_verified_negatives_go_down_and_positives_up():
    D = (0.1, 0.1, 0.5, 0.5)
    gt = ground_truth(
        3,
        [(1, DOG, D, False)],
        [
            (0, ANIMAL, False),  # -> Dog and Cat verified absent on image 0
            (1, DOG, True),  # -> Animal verified present on image 1 (and the box copy)
            (2, CAT, True),  # -> Animal verified present on image 2; no box at all
        ],
    )
    det = detections(
        [
            (0, DOG, 0.9, D),  # FP (Dog absent via Animal)
            (1, DOG, 0.8, D),  # TP
            (2, ANIMAL, 0.95, (0.6, 0.6, 0.9, 0.9)),  # FP (Animal present via Cat, no Animal box)
            (1, ANIMAL, 0.6, D),  # TP (the Dog box copied to Animal)
        ]
    )
    result = evaluate_detections(gt, det, hierarchy=HIERARCHY)
    # Dog: 0.9 FP, 0.8 TP -> AP = (1/2) / 1 = 0.5 (ignored without the downward
    # propagation: AP 1). Animal: 0.95 FP, 0.6 TP -> AP 0.5 (ignored without the
    # upward propagation: AP 1). Cat: a positive label but no box: NaN.
    assert ap_of(result, DOG) == pytest.approx(0.5)
    assert ap_of(result, ANIMAL) == pytest.approx(0.5)
    assert math.isnan(ap_of(result, CAT))
    assert result.mean_ap == pytest.approx(0.5)


def test_group_of_boxes():
    G, R, H = (0, 0, 0.5, 0.5), (0.6, 0.6, 0.9, 0.9), (0.2, 0.2, 0.6, 0.6)
    gt = ground_truth(
        2,
        [(0, CAR, G, True), (0, CAR, R, False), (1, CAR, H, True)],  # H is never detected
        [(0, CAR, True), (1, CAR, True)],
    )
    det = detections(
        [
            (0, CAR, 0.9, (0.05, 0.05, 0.2, 0.2)),  # inside G (IoA 1): absorbed
            (0, CAR, 0.7, (0.1, 0.1, 0.3, 0.3)),  # inside G: absorbed
            (0, CAR, 0.4, (0.3, 0.3, 0.6, 0.6)),  # IoA with G = 0.04 / 0.09 = 0.44 < 0.5: FP
            (0, CAR, 0.5, R),  # TP
        ]
    )
    result = evaluate_detections(gt, det)
    # Scored: G as one TP with its best score 0.9, R's TP 0.5, the FP 0.4;
    # boxes: G, R, H = 3. Precision 1, 1, 2/3 -> AP = (1 + 1) / 3 = 2/3.
    assert ap_of(result, CAR) == pytest.approx(2 / 3)
    assert result.num_ground_truth[CAR] == 3
    assert result.num_detections[CAR] == 2  # the absorbed ones are not scored


def test_group_of_only_after_regular_matching():
    R, G = (0, 0, 0.4, 0.4), (0, 0, 1, 1)
    gt = ground_truth(1, [(0, CAR, R, False), (0, CAR, G, True)], [(0, CAR, True)])
    det = detections(
        [
            (0, CAR, 0.9, R),  # TP on R, though inside G too
            (0, CAR, 0.8, R),  # R taken: inside G, absorbed -> G hit at 0.8
            (0, CAR, 0.3, (0.6, 0.6, 0.8, 0.8)),  # inside G: absorbed
        ]
    )
    # Scored: 0.9 TP (R), 0.8 TP (G); two boxes -> AP = 1.
    result = evaluate_detections(gt, det)
    assert ap_of(result, CAR) == pytest.approx(1.0)
    assert result.num_detections[CAR] == 1


def test_a_duplicate_inside_a_group_of_box_is_absorbed():
    R1, R2, G = (0, 0, 0.4, 0.4), (0, 0.1, 0.4, 0.5), (0, 0, 0.6, 0.6)
    gt = ground_truth(
        1, [(0, CAR, R1, False), (0, CAR, R2, False), (0, CAR, G, True)], [(0, CAR, True)]
    )
    det = detections(
        [
            (0, CAR, 0.9, R1),  # TP (R1)
            # Best box R1, taken: not a TP (though IoU 0.6 with the free R2); inside
            # G (IoA 1): absorbed, not an FP -> G scored 0.8.
            (0, CAR, 0.8, R1),
            (0, CAR, 0.3, (0.7, 0.7, 0.9, 0.9)),  # outside every box: FP
        ]
    )
    result = evaluate_detections(gt, det)
    # Scored: 0.9 TP (R1), 0.8 TP (G), 0.3 FP; boxes R1, R2, G = 3. Precision 1, 1,
    # 2/3 -> AP = (1 + 1) / 3 = 2/3. (Were the duplicate an FP and G undetected:
    # TP FP FP, AP = 1/3.)
    assert ap_of(result, CAR) == pytest.approx(2 / 3)
    assert result.num_ground_truth[CAR] == 3
    assert result.num_detections[CAR] == 2  # 0.9 and 0.3; the duplicate is absorbed


def test_a_group_of_box_hit_only_at_score_0_counts_nothing():
    R, G = (0.6, 0.6, 0.9, 0.9), (0, 0, 0.5, 0.5)
    gt = ground_truth(1, [(0, CAR, R, False), (0, CAR, G, True)], [(0, CAR, True)])
    det = detections(
        [
            (0, CAR, 0.9, R),  # TP (R)
            (0, CAR, 0.0, (0.1, 0.1, 0.2, 0.2)),  # inside G: absorbed, G's score stays 0
            (0, CAR, 0.0, (0.2, 0.2, 0.3, 0.3)),  # inside G: absorbed, G's score stays 0
        ]
    )
    result = evaluate_detections(gt, det)
    # G has score 0: no TP, yet it is ground truth. Scored: 0.9 TP over 2 boxes:
    # AP = 1 / 2 = 0.5. (A TP for G at score 0 would give AP = (1 + 1) / 2 = 1.)
    assert ap_of(result, CAR) == pytest.approx(0.5)
    assert result.num_ground_truth[CAR] == 2
    assert result.num_detections[CAR] == 1


def test_a_detection_is_absorbed_by_one_group_of_box_only():
    G1, G2 = (0, 0, 0.5, 0.5), (0.2, 0.2, 1, 1)
    gt = ground_truth(1, [(0, CAR, G1, True), (0, CAR, G2, True)], [(0, CAR, True)])
    # Area 0.09; IoA with G1 = 0.09 / 0.09 = 1, with G2 = 0.0625 / 0.09 = 0.69: it
    # goes to G1 (the larger ratio). G2 stays undetected: AP = 1 / 2 boxes = 0.5.
    det = detections([(0, CAR, 0.9, (0.15, 0.15, 0.45, 0.45))])
    assert ap_of(evaluate_detections(gt, det), CAR) == pytest.approx(0.5)


def test_hierarchy_copies_group_of_boxes_with_their_flag():
    G = (0, 0, 0.5, 0.5)
    gt = ground_truth(1, [(0, DOG, G, True)], [(0, DOG, True)])
    det = detections(
        [(0, ANIMAL, 0.9, (0.0, 0.0, 0.1, 0.1)), (0, ANIMAL, 0.8, (0.1, 0.1, 0.2, 0.2))]
    )
    # The Animal copy of the group-of Dog box absorbs both: one TP of one box.
    result = evaluate_detections(gt, det, hierarchy=HIERARCHY)
    assert ap_of(result, ANIMAL) == 1.0
    assert result.num_detections[ANIMAL] == 0


def test_unknown_images_and_class_subset():
    box = (0.2, 0.2, 0.6, 0.6)
    gt = ground_truth(
        1, [(0, CAR, box, False), (0, DOG, box, False)], [(0, CAR, True), (0, DOG, True)]
    )
    det = detections([(-1, CAR, 0.9, box), (0, CAR, 0.5, box), (0, DOG, 0.9, (0.7, 0.7, 0.8, 0.8))])
    result = evaluate_detections(gt, det, class_indices=[CAR])
    # Only Car is evaluated; the detection on an unknown image (-1) is ignored.
    assert result.class_indices.tolist() == [CAR]
    assert result.average_precision.tolist() == [1.0]
    with pytest.raises(ValueError, match="class indices"):
        evaluate_detections(gt, detections([(0, 7, 0.5, box)]))


def test_average_precision_function():
    # Scores unsorted on purpose: sorted, TP FP TP -> precision 1, 1/2, 2/3;
    # envelope at the TPs 1 and 2/3; 4 boxes: AP = (1 + 2/3) / 4 = 5/12.
    assert average_precision(
        np.array([0.2, 0.9, 0.5]), np.array([True, True, False]), 4
    ) == pytest.approx(5 / 12)
    assert average_precision(np.array([]), np.array([], dtype=bool), 2) == 0.0
    assert math.isnan(average_precision(np.array([0.5]), np.array([False]), 0))


# ---------------------------------------------------------------- against a plain loop


def _reference(gt_boxes, gt_labels, dets, parents, num_images, num_classes):
    """The rules written as directly as possible: loops over images, classes, detections.

    gt_boxes: (image, class, box, group_of); gt_labels: (image, class, present);
    dets: (image, class, score, box). Returns (per-class APs, counts of the events
    that tell the official rules from others).
    """

    def ancestors(c):
        out = set()
        for p in parents.get(c, ()):
            out |= {p} | ancestors(p)
        return out

    def descendants(c):
        return {k for k in range(num_classes) if c in ancestors(k)}

    boxes = [(i, k, b, g) for i, c, b, g in gt_boxes for k in {c} | ancestors(c)]
    verified = {(i, k) for i, k, _, _ in boxes}
    for i, c, present in gt_labels:
        verified |= {(i, k) for k in {c} | (ancestors(c) if present else descendants(c))}

    def iou(a, b):
        iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = iw * ih
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union if union > 0 else 0.0

    def ioa(d, g):
        iw = max(0.0, min(d[2], g[2]) - max(d[0], g[0]))
        ih = max(0.0, min(d[3], g[3]) - max(d[1], g[1]))
        area = (d[2] - d[0]) * (d[3] - d[1])
        return iw * ih / area if area > 0 else 0.0

    records = {c: [] for c in range(num_classes)}
    events = dict.fromkeys(
        ["duplicate", "duplicate, another box free", "absorbed", "duplicate absorbed"], 0
    )
    num_gt = [0] * num_classes
    for _, k, _, _ in boxes:
        num_gt[k] += 1
    for i in range(num_images):
        for c in range(num_classes):
            if (i, c) not in verified:
                continue
            regular = [b for j, k, b, g in boxes if j == i and k == c and not g]
            groups = [b for j, k, b, g in boxes if j == i and k == c and g]
            mine = sorted([d for d in dets if d[0] == i and d[1] == c], key=lambda d: -d[2])
            # Non-group-of pass: the best box over all regular boxes, matched or not.
            detected = [False] * len(regular)
            is_tp = [False] * len(mine)
            duplicate = [False] * len(mine)  # best box already detected
            for n, (_, _, _, box) in enumerate(mine):
                if not regular:
                    break
                ious = [iou(box, g) for g in regular]
                j = ious.index(max(ious))
                if ious[j] >= 0.5 and not detected[j]:
                    detected[j] = is_tp[n] = True
                elif ious[j] >= 0.5:
                    duplicate[n] = True
                    events["duplicate"] += 1
                    if any(v >= 0.5 and not detected[k] for k, v in enumerate(ious)):
                        events["duplicate, another box free"] += 1
            # Group-of pass: the other detections, against the best group-of box.
            group_score = [0.0] * len(groups)
            for n, (_, _, score, box) in enumerate(mine):
                if is_tp[n]:
                    records[c].append((score, True))
                    continue
                ioas = [ioa(box, g) for g in groups]
                if ioas and max(ioas) >= 0.5:
                    j = ioas.index(max(ioas))
                    group_score[j] = max(group_score[j], score)
                    events["absorbed"] += 1
                    events["duplicate absorbed"] += duplicate[n]
                else:
                    records[c].append((score, False))
            records[c] += [(s, True) for s in group_score if s > 0]

    aps = []
    for c in range(num_classes):
        if num_gt[c] == 0:
            aps.append(float("nan"))
            continue
        recs = sorted(records[c], key=lambda r: -r[0])
        tp = fp = 0
        recall, precision = [0.0], [0.0]
        for _, hit in recs:
            tp += hit
            fp += not hit
            recall.append(tp / num_gt[c])
            precision.append(tp / (tp + fp))
        recall.append(1.0)
        precision.append(0.0)
        for j in range(len(precision) - 2, -1, -1):
            precision[j] = max(precision[j], precision[j + 1])
        aps.append(
            sum(
                (recall[j] - recall[j - 1]) * precision[j]
                for j in range(1, len(recall))
                if recall[j] != recall[j - 1]
            )
        )
    return aps, events


def _random_case(rng, num_images=40, num_classes=6):
    parents = {1: [0], 2: [0], 3: [1], 4: [1, 5]}  # 4 has two parents
    gt_boxes, gt_labels, dets = [], [], []
    for i in range(num_images):
        for _ in range(int(rng.integers(0, 6))):
            c = int(rng.integers(num_classes))
            x0, y0 = rng.uniform(0, 0.6, 2)
            w, h = rng.uniform(0.1, 0.4, 2)
            box = (x0, y0, x0 + w, y0 + h)
            gt_boxes.append((i, c, box, bool(rng.random() < 0.2)))
            if rng.random() < 0.3:  # a heavily overlapping neighbour of the same class
                gt_boxes.append((i, c, (x0 + 0.02, y0, x0 + w + 0.02, y0 + h), False))
            for _ in range(int(rng.integers(0, 4))):  # detections around the box
                j = rng.normal(0, 0.05, 4)
                dets.append(
                    (
                        i,
                        c if rng.random() < 0.8 else int(rng.integers(num_classes)),
                        0.0,
                        (
                            box[0] + j[0],
                            box[1] + j[1],
                            box[0] + j[0] + w * (1 + j[2]),
                            box[1] + j[1] + h * (1 + j[3]),
                        ),
                    )
                )
        for c in range(num_classes):
            if rng.random() < 0.3:
                gt_labels.append((i, c, bool(rng.random() < 0.5)))
        for _ in range(int(rng.integers(0, 4))):  # detections anywhere
            x0, y0 = rng.uniform(0, 0.7, 2)
            dets.append((i, int(rng.integers(num_classes)), 0.0, (x0, y0, x0 + 0.2, y0 + 0.25)))
    scores = rng.permutation(len(dets)) / len(dets) + 0.001  # distinct scores
    dets = [(i, c, float(s), tuple(float(v) for v in b)) for (i, c, _, b), s in zip(dets, scores)]
    return parents, gt_boxes, gt_labels, dets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_a_plain_loop_implementation(seed):
    rng = np.random.default_rng(seed)
    num_images, num_classes = 40, 6
    parents, gt_boxes, gt_labels, dets = _random_case(rng, num_images, num_classes)
    names = [f"/m/c{k}" for k in range(num_classes)]
    hierarchy = ClassHierarchy(
        names, {names[c]: [names[p] for p in ps] for c, ps in parents.items()}
    )
    gt = OIDGroundTruth(
        image_ids=np.array([f"i{k}".encode() for k in range(num_images)]),
        box_images=np.array([b[0] for b in gt_boxes]),
        boxes=np.array([b[2] for b in gt_boxes]),
        box_labels=np.array([b[1] for b in gt_boxes]),
        box_is_group_of=np.array([b[3] for b in gt_boxes]),
        label_images=np.array([l[0] for l in gt_labels]),
        label_classes=np.array([l[1] for l in gt_labels]),
        label_is_positive=np.array([l[2] for l in gt_labels]),
        num_classes=num_classes,
    )
    result = evaluate_detections(gt, detections(dets), hierarchy=hierarchy)
    expected, events = _reference(gt_boxes, gt_labels, dets, parents, num_images, num_classes)
    np.testing.assert_allclose(result.average_precision, expected, rtol=1e-12, atol=1e-12)
    # The case exercises every path: group-of absorption, duplicates (with another
    # free box), ignored detections.
    assert np.isfinite(result.average_precision).sum() >= 4
    assert min(events.values()) > 0, events
