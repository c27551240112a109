"""``add_largedet_config(cfg)``: every key largedet adds to Detectron2's config.

Each key is commented where it is defined: meaning, unit, scope (per device or
global), allowed values and the paper's symbol. Derived values (accumulation
steps, scaled LR) are never stored here; they are computed and logged at start.
"""

from detectron2.config import CfgNode as CN


def add_largedet_config(cfg: CN) -> CN:
    """Add largedet's keys (with defaults) to a Detectron2 config, in place; returns it."""
    _add_data_config(cfg)
    _add_solver_config(cfg)
    _add_openimages_config(cfg)
    return cfg


def _add_data_config(cfg: CN) -> None:
    # --- built-in synthetic "shapes" dataset (largedet.data.shapes) -------------
    cfg.DATASETS.SHAPES = CN()
    # Folder where the generated dataset is cached; "" means $LARGEDET_DATASETS
    # or ~/.cache/largedet/datasets.
    cfg.DATASETS.SHAPES.ROOT = ""
    # Number of generated training / validation images.
    cfg.DATASETS.SHAPES.NUM_TRAIN = 1500
    cfg.DATASETS.SHAPES.NUM_VAL = 150
    # Side length of the square generated images, in pixels.
    cfg.DATASETS.SHAPES.IMAGE_SIZE = 128
    # Seed of the generator: the same seed writes the same bytes.
    cfg.DATASETS.SHAPES.SEED = 0


def _add_solver_config(cfg: CN) -> None:
    # --- optimizers (largedet.optim, largedet.solver) ----------------------------
    pass


def _add_openimages_config(cfg: CN) -> None:
    # --- OpenImages (largedet.data.openimages, largedet.evaluation) --------------
    pass
