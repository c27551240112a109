"""largedet_video.evaluation.last_classification_metric: the last value of a test set's metric
in a run's metrics.json rows, with or without the set's name in front."""

from largedet_video.evaluation import last_classification_metric

ROWS = [
    {"iteration": 9, "total_loss": 1.0},
    {"iteration": 99, "val/classification/top1": 50.0, "holdout/classification/top1": 40.0},
    {"iteration": 199, "val/classification/top1": 62.5, "val/classification/num_videos": 64},
    {"iteration": 200, "total_loss": 0.5},
]


def test_the_last_value_of_the_named_set():
    assert last_classification_metric(ROWS, "val") == 62.5
    assert last_classification_metric(ROWS, "holdout") == 40.0
    assert last_classification_metric(ROWS, "val", "num_videos") == 64.0
    assert last_classification_metric(ROWS, "other") is None
    assert last_classification_metric(ROWS, "val", "top5") is None


def test_a_run_of_one_test_set_has_no_name_in_front():
    rows = [{"classification/top1": 10.0}, {"classification/top1": 12.0}]
    assert last_classification_metric(rows, "moving_shapes_val") == 12.0
