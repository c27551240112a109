"""The ``SOLVER.AGVM`` keys (AGVM: per-part LR multipliers from each part's gradient
variance, :class:`largedet.optim.AGVM`), each commented and declared once, as the other keys
of :func:`~largedet.config.defaults.add_largedet_config`."""

from detectron2.config import CfgNode as CN

from .keys import clamp, declare, fraction, int_at_least, non_negative, pair_of, when_agvm

__all__ = ["add_agvm_config"]


def add_agvm_config(cfg: CN) -> None:
    """Add ``SOLVER.AGVM`` (with defaults) to a config that has largedet's solver keys."""
    # --- AGVM: per-part LR from gradient variance (largedet.optim.agvm) ----------
    cfg.SOLVER.AGVM = CN()
    # Adaptive gradient variance modulation (Xue et al., NeurIPS 2022), for any
    # SOLVER.OPTIMIZER. Every PERIOD optimizer steps from START_ITER, each model part
    # (GROUPS) compares two independent estimates g_A, g_B of the step's gradient:
    # phi = 1 - cos(g_A, g_B) (on g / (sqrt(v_hat) + eps) for Adam-type optimizers);
    # mu = sqrt(clamp(phi_REFERENCE / phi, CLAMP)), averaged over estimates with
    # MOMENTUM, multiplies the part's LR at every step (the LR schedule stays the one
    # owner of the base LR: mu is applied around optimizer.step() only). The two
    # estimates are the first and second halves of the K = IMS_PER_BATCH / (world size x
    # IMS_PER_DEVICE) accumulated micro-batches (all-reduced under DDP), or, with K = 1
    # under DDP, the first and second halves of the processes. One process with K = 1
    # has no two estimates: an error. Logged per part: agvm/phi/<part>, agvm/mu/<part>.
    # true or false.
    declare(cfg, "SOLVER.AGVM.ENABLED", False, lazy="agvm.enabled")
    # Model parts, as (part name, module-name prefix) pairs. A trainable parameter
    # belongs to the part of the longest prefix its name (as in model.named_parameters(),
    # without DDP's "module.") starts with; a parameter that matches none is an error.
    # A part may be named by several pairs. Each part gets its own optimizer param groups
    # (with the usual weight-decay / trust-ratio splits inside it), carrying the part's
    # name. The defaults fit Detectron2's GeneralizedRCNN: backbone (ResNet), fpn (the
    # rest of the backbone), rpn, box_head (box head and predictor), mask_head. For the
    # video project's classifier: (("backbone", "backbone"), ("head", "head")).
    declare(
        cfg,
        "SOLVER.AGVM.GROUPS",
        [
            ["backbone", "backbone.bottom_up"],
            ["fpn", "backbone"],
            ["rpn", "proposal_generator"],
            ["box_head", "roi_heads.box_"],
            ["mask_head", "roi_heads.mask_"],
        ],
        lazy="agvm.groups",
    )
    # The part the others are aligned with; its mu stays 1. A name in GROUPS.
    declare(cfg, "SOLVER.AGVM.REFERENCE", "backbone", lazy="agvm.reference")
    # Optimizer steps between two variance estimates (tau in the paper); an integer >= 1.
    declare(
        cfg,
        "SOLVER.AGVM.PERIOD",
        10,
        ("an integer >= 1", int_at_least(1)),
        when=when_agvm,
        lazy="agvm.period",
    )
    # First optimizer step (0-based iteration) that estimates; mu is 1 before it.
    # -1 means SOLVER.WARMUP_ITERS: AGVM starts when the warmup ends.
    declare(
        cfg,
        "SOLVER.AGVM.START_ITER",
        -1,
        ("an integer >= 0, or -1", int_at_least(-1)),
        when=when_agvm,
        lazy="agvm.start_iter",
    )
    # (lo, hi) bounds of phi_REFERENCE / phi before the square root, so mu_hat lies in
    # [sqrt(lo), sqrt(hi)]; 0 < lo <= 1 <= hi.
    declare(
        cfg,
        "SOLVER.AGVM.CLAMP",
        (0.5, 10.0),
        ("(lo, hi) with 0 < lo <= 1 <= hi", clamp),
        when=when_agvm,
        lazy="agvm.clamp",
    )
    # Momentum m of the moving average mu <- m mu + (1 - m) mu_hat, updated once per
    # estimate (every PERIOD steps); in [0, 1). mu starts at 1.
    declare(
        cfg,
        "SOLVER.AGVM.MOMENTUM",
        0.97,
        ("a number in [0, 1)", fraction),
        when=when_agvm,
        lazy="agvm.momentum",
    )
    # Gradient-norm clipping around the end of warmup, where the LR peaks and mu starts
    # to move: the total L2 norm of all gradients (after averaging over micro-batches
    # and devices) is clipped to CLIP_MAX_NORM at the iterations in
    # [SOLVER.WARMUP_ITERS - CLIP_ITERS[0], SOLVER.WARMUP_ITERS + CLIP_ITERS[1]).
    # A float >= 0; 0 turns it off. Only when AGVM is enabled.
    declare(
        cfg,
        "SOLVER.AGVM.CLIP_MAX_NORM",
        0.0,
        ("a number >= 0 (0: off)", non_negative),
        when=when_agvm,
        lazy="agvm.clip_max_norm",
    )
    # (before, after): optimizer steps before and after the end of warmup that clip;
    # integers >= 0.
    declare(
        cfg,
        "SOLVER.AGVM.CLIP_ITERS",
        (50, 50),
        ("two integers >= 0", pair_of(int_at_least(0))),
        when=when_agvm,
        lazy="agvm.clip_iters",
    )
