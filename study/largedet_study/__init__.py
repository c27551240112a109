"""The batch-scaling study: box AP against global batch for each optimizer (the grids and
the plan of each cell in :mod:`.grid`, the runner in :mod:`.runner`)."""

from .grid import (
    CSV_FIELDS,
    GRID_NAMES,
    HOLDOUT_SET,
    OPTIMIZERS,
    REFERENCE_BATCH,
    Cell,
    Grid,
    OptimizerRecipe,
    Plan,
    build_grid,
    cell_kind,
    final_ap,
    plan_cell,
    cell_config,
    cell_run_plan,
)

__all__ = [
    "CSV_FIELDS",
    "GRID_NAMES",
    "HOLDOUT_SET",
    "OPTIMIZERS",
    "REFERENCE_BATCH",
    "Cell",
    "Grid",
    "OptimizerRecipe",
    "Plan",
    "build_grid",
    "cell_kind",
    "final_ap",
    "plan_cell",
    "cell_config",
    "cell_run_plan",
]
