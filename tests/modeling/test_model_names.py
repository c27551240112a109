"""largedet.modeling.checks: the model's parts the config names are registered in
Detectron2's registries, checked where the model reads them, each error one line naming
the key and the registered names."""

import pytest
from detectron2.config import get_cfg

from largedet.config import add_largedet_config
from largedet.config.errors import ConfigError
from largedet.modeling.checks import check_model_names


def _cfg(**values):
    cfg = add_largedet_config(get_cfg())
    cfg.MODEL.BACKBONE.NAME = "build_basic_resnet_fpn_backbone"  # largedet's, registered on import
    for key, value in values.items():
        node = cfg
        *parents, last = key.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return cfg


def test_registered_names_pass():
    check_model_names(_cfg())
    check_model_names(_cfg(MODEL__PROPOSAL_GENERATOR__NAME="PrecomputedProposals", MODEL__RPN__HEAD_NAME="x"))
    check_model_names(_cfg(MODEL__ROI_MASK_HEAD__NAME="x"))  # MASK_ON false: not read


@pytest.mark.parametrize(
    "key, registered",
    [("MODEL__META_ARCHITECTURE", "GeneralizedRCNN"), ("MODEL__BACKBONE__NAME", "build_basic_resnet_backbone"),
     ("MODEL__ROI_HEADS__NAME", "StandardROIHeads"), ("MODEL__RPN__HEAD_NAME", "StandardRPNHead")],
)  # fmt: skip
def test_an_unregistered_name_is_one_line_with_the_registered_ones(key, registered):
    with pytest.raises(ConfigError) as e:
        check_model_names(_cfg(**{key: "Nope"}))
    message = str(e.value)
    assert message.startswith(f"{key.replace('__', '.')}: 'Nope' is not registered; registered: ")
    assert registered in message and "\n" not in message


def test_the_mask_head_is_checked_with_mask_on():
    with pytest.raises(ConfigError, match=r"^MODEL.ROI_MASK_HEAD.NAME: 'Nope' is not registered"):
        check_model_names(_cfg(MODEL__MASK_ON=True, MODEL__ROI_MASK_HEAD__NAME="Nope"))
