"""Each config key is declared once (largedet.config.keys): its default, value rule and
LazyConfig name in one ``declare`` call (largedet's keys) or one ``DETECTRON2_KEYS`` entry
(Detectron2's), and the checks before launch and the LazyConfig mapping are derived from
the declarations."""

import glob
import os
import re

from detectron2.config import get_cfg

from largedet.config import add_largedet_config
from largedet.config.keys import DETECTRON2_KEYS, declared_rules, declared_train_keys
from largedet.config.lazy import TRAIN_KEYS
from largedet.config.validate import TRAINING_RULES

LARGEDET = os.path.join(os.path.dirname(__file__), "..", "..", "largedet")
# a key named where it is declared: declare(cfg, "KEY", ...), _detectron2("KEY", ...) or,
# as before, Rule("KEY", ...) or a "train.name": "KEY" table entry
DECLARATION = re.compile(r'(?:declare\(\s*cfg,\s*|_detectron2\(\s*|Rule\(\s*|"[a-z_.]+":\s*)"([A-Z_][A-Z0-9_.]*)"')


def _lookup(cfg, key):
    for part in key.split("."):
        assert part in cfg, key
        cfg = cfg[part]
    return cfg


def test_the_checks_and_the_lazy_mapping_are_the_declarations():
    assert TRAINING_RULES == declared_rules()
    assert TRAIN_KEYS == declared_train_keys()
    # a rule per key, a train name per key; every key is a key of the full config
    keys = [rule.key for rule in TRAINING_RULES]
    assert len(keys) == len(set(keys))
    assert len(set(TRAIN_KEYS.values())) == len(TRAIN_KEYS)
    cfg = add_largedet_config(get_cfg())
    for key in [*keys, *TRAIN_KEYS.values()]:
        _lookup(cfg, key)
    # both kinds of keys are there: Detectron2's (SOLVER.MAX_ITER) and largedet's
    assert {"SOLVER.MAX_ITER", "SOLVER.PMD.PERIOD", "LOG_PERIOD", "MODEL_EMA.DECAY"} <= set(keys)
    assert TRAIN_KEYS["max_iter"] == "SOLVER.MAX_ITER" and TRAIN_KEYS["lsr.rule"] == "SOLVER.LSR.RULE"


def test_declaring_again_changes_nothing():
    before_rules, before_names = declared_rules(), declared_train_keys()
    add_largedet_config(get_cfg())
    assert declared_rules() == before_rules and declared_train_keys() == before_names


def test_each_key_is_declared_in_one_place_in_the_sources():
    named = {}
    for path in glob.glob(os.path.join(LARGEDET, "**", "*.py"), recursive=True):
        with open(path) as f:
            for key in DECLARATION.findall(f.read()):
                named.setdefault(key, []).append(os.path.relpath(path, LARGEDET))
    declared = {rule.key for rule in TRAINING_RULES} | set(TRAIN_KEYS.values())
    for key in declared:
        assert len(named.get(key, [])) == 1, (key, named.get(key))
    detectron2 = {key for key, _, _ in DETECTRON2_KEYS}
    for key in declared:
        where = named[key][0]
        # Detectron2's in keys.py; largedet's in defaults.py, the SOLVER.AGVM topic in agvm_keys.py
        home = "keys.py" if key in detectron2 else "agvm_keys.py" if key.startswith("SOLVER.AGVM.") else "defaults.py"
        assert where == os.path.join("config", home), (key, where)


def test_the_keys_name_what_the_solver_and_the_optimizers_define():
    """The config declares the allowed values of the keys whose meaning lives in other rooms
    (it imports none of them); each is exactly what that room defines."""
    from largedet.config import defaults, keys
    from largedet.optim import COMPILED_STEP_MODES, MOMENT_DECAYS
    from largedet.solver import lr_scheduler, plan

    assert defaults.LSR_RULES == tuple(plan.LSR_RULES)
    assert defaults.MOMENT_DECAYS == tuple(MOMENT_DECAYS)
    assert defaults.COMPILED_STEP_MODES == tuple(COMPILED_STEP_MODES)
    assert keys.LR_SCHEDULES is lr_scheduler.LR_SCHEDULES
