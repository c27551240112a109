"""What makes a verdict of the regime grid fair: both sides tuned alike, on one machine class.

* :func:`machine_class`: the class of machine a row ran on (a CPU model or a GPU), from the
  CSV's ``device``; a verdict compares rows of one class only (a machine moves a row by
  about a seed).
* :func:`tuning_budget`: which recipes a side of a verdict tried and over which dimensions,
  and where the chosen recipe sits at an edge of a swept number (its optimum not bracketed).
* :func:`verdicts`: per machine class and epoch budget, the strongest batch-16 baseline and
  the large-batch recipe the held-out split chooses (each candidate by its seed-0 row), their
  difference by Welch's t, and what is missing where there is no verdict yet.
* :func:`optimizer_table`: the paper's ablation: PMD-LAMB, LAMB and SGD at batch 256, each
  at its best tuned recipe (marked where its own sweep leaves the optimum open), against the
  baseline, and PMD-LAMB minus LAMB.

The one rule for "within X": the one-sided 95% lower bound of Welch's t (unequal variances,
Welch-Satterthwaite degrees of freedom) is at least -X.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Dict, List, Optional, Sequence, Tuple

from .stats import Difference, difference, fmt

#: the margin of the goal (1.4x) and the moonshot (1.0x) on the held-out split, AP
MARGIN = 0.5
#: the epoch budgets a verdict is given for
FACTORS = (1.0, 1.4)
#: seeds a side needs for a verdict
SEEDS = 3
#: the regime grid's large batch
LARGE_BATCH = 256
#: the Cell fields that make a recipe (the seed, the batch and the epochs do not)
RECIPE_FIELDS = ("optimizer", "lr_factor", "warmup_epochs", "lr_schedule", "weight_decay", "pmd_period",
                 "pmd_decay", "agvm", "beta2", "ema", "ramp", "clip")  # fmt: skip
#: the swept numbers whose optimum must be bracketed (None: the grid's default, shown as such)
NUMBERS = {"lr_factor": "LR factor", "warmup_epochs": "warm-up (epochs)", "weight_decay": "weight decay",
           "pmd_period": "PMD period"}  # fmt: skip
DEFAULTS = {"warmup_epochs": "grid's", "weight_decay": "recipe's", "pmd_period": "run/4"}


def welch(a: Sequence[float], b: Sequence[float]) -> Difference:
    """mean(a) - mean(b) by Welch's t: the study's one rule for an interval."""
    return difference(a, b, method="welch")


def machine_class(device: str) -> str:
    """A short name of the machine class in a CSV's ``device`` text: ``EPYC``, ``EPYC-Zen5``
    (an EPYC VM labelled Zen 5: a class of its own; a batch-16 tsm4k cell's process took
    7 to 12 times less wall clock there than in the ``EPYC`` rows), ``Xeon-AMX`` (the Xeon VMs with AMX), ``Xeon-ICL`` (Ice
    Lake, no AMX), ``H100``, ``H200``."""
    if "Ice Lake" in device:
        return "Xeon-ICL"
    if "EPYC" in device and "Zen 5" in device:
        return "EPYC-Zen5"
    if "Xeon" in device:
        return "Xeon-AMX" if "AMX" in device and "no AMX" not in device else "Xeon"
    for short in ("EPYC", "H100", "H200"):
        if short in device:
            return short
    return device or "?"


def cells_by_name() -> Dict[str, object]:
    """The regime grid's cells by the name of their seed-0 row (:class:`~largedet_study.grid.Cell`)."""
    from dataclasses import replace

    from .grid import build_grid

    return {replace(c, seed=None).name: replace(c, seed=None) for c in build_grid("regime").cells}


def _recipe_value(cell, name: str):
    value = getattr(cell, name)
    if value is None and name in DEFAULTS:
        return DEFAULTS[name]
    return value


@dataclass(frozen=True)
class Budget:
    """The recipes one side of a verdict tried: their names, each dimension that varied among
    them with the values tried, and, among the recipes of the chosen one's optimizer (an LR
    of LAMB's is bracketed by LAMB's sweep, not by PMD-LAMB's), the swept numbers whose chosen
    value is the smallest or largest tried (an optimum not bracketed) and those never swept.
    ``optimizer`` names that optimizer where the side tried more than one."""

    recipes: Tuple[str, ...]
    swept: Tuple[Tuple[str, Tuple], ...]
    edges: Tuple[str, ...]
    unswept: Tuple[str, ...]
    optimizer: Optional[str] = None

    def text(self) -> str:
        dims = "; ".join(f"{name} {', '.join(str(v) for v in values)}" for name, values in self.swept)
        out = f"{len(self.recipes)} recipe{'s' * (len(self.recipes) != 1)}"
        out += f" over {dims}" if dims else " (nothing swept)"
        whose = f"{self.optimizer}'s" if self.optimizer else "its"
        if self.edges:
            out += f"; **the chosen value at an edge of {whose} sweep: {', '.join(self.edges)}**"
        if self.unswept:
            out += f"; not swept{f' for {self.optimizer}' if self.optimizer else ''}: {', '.join(self.unswept)}"
        return out


def tuning_budget(names: Sequence[str], chosen: str, cells: Optional[Dict[str, object]] = None) -> Budget:
    """:class:`Budget` of the recipes ``names`` (seed-0 names of the regime grid's cells), of
    which ``chosen`` is the one the held-out split chose."""
    cells = cells_by_name() if cells is None else cells
    known = [cells[n] for n in names if n in cells]
    opt = cells[chosen].optimizer if chosen in cells else None
    own = [c for c in known if c.optimizer == opt] if opt is not None else known
    swept, edges, unswept = [], [], []
    for f in fields(known[0]) if known else ():
        if f.name not in RECIPE_FIELDS:
            continue
        values = list(dict.fromkeys(_recipe_value(c, f.name) for c in known))
        own_values = list(dict.fromkeys(_recipe_value(c, f.name) for c in own))
        numeric = sorted(v for v in own_values if isinstance(v, (int, float)) and not isinstance(v, bool))
        label = NUMBERS.get(f.name, f.name.replace("_", " "))
        if len(values) > 1:
            swept.append((label, tuple(sorted(values, key=str))))
        mine = _recipe_value(cells[chosen], f.name) if chosen in cells else None
        if f.name in NUMBERS and len(numeric) > 1 and mine in (numeric[0], numeric[-1]):
            edges.append(f"{label} {mine}")
        elif f.name in ("lr_factor", "warmup_epochs") and len(own_values) <= 1:
            unswept.append(NUMBERS[f.name])
    several = len({c.optimizer for c in known}) > 1
    return Budget(tuple(names), tuple(swept), tuple(edges), tuple(unswept), opt if several else None)


def _on(fam, cls: str):
    """``fam`` with only its rows of machine class ``cls``."""
    return type(fam)(fam.name, tuple(r for r in fam.rows if machine_class(r.get("device", "")) == cls))


def seed0(fam, column: str) -> Optional[float]:
    """``fam``'s seed-0 row's ``column`` (None: no trained seed-0 row with it)."""
    for r in fam.trained:
        if r["cell"] == fam.name and r.get(column) not in (None, ""):
            return float(r[column])
    return None


def choose(fams: Sequence, column: str = "holdout_ap") -> Optional[object]:
    """The family whose seed-0 row is best on the held-out split (``column``; the protocol:
    seed 0 per candidate chooses, then more seeds of the chosen one)."""
    scored = [(f, seed0(f, column)) for f in fams]
    scored = [(f, s) for f, s in scored if s is not None]
    return max(scored, key=lambda fs: fs[1])[0] if scored else None


def per_class(fams: Dict[str, object]) -> List[Tuple[str, Dict[str, object], Optional[object]]]:
    """Per machine class of ``fams``' rows, in the order the rows first name it: the class,
    its families cut to that class's rows (families without one left out) and its baseline,
    the batch-16 family whose seed-0 row is best on the held-out split (None: no such row)."""
    classes = list(dict.fromkeys(machine_class(r.get("device", "")) for f in fams.values() for r in f.rows))
    out = []
    for cls in classes:
        mine = {n: _on(f, cls) for n, f in fams.items()}
        mine = {n: f for n, f in mine.items() if f.rows}
        out.append((cls, mine, choose([f for f in mine.values() if f.batch == 16])))
    return out


def _factor(name: str) -> float:
    import re

    m = re.search(r"-ep([\d.]+)x", name)
    return float(m.group(1)) if m else 1.0


@dataclass(frozen=True)
class Verdict:
    """One machine class's check at one epoch budget (None fields: not there yet)."""

    machine: str
    factor: float
    baseline: Optional[object]
    chosen: Optional[object]
    base_budget: Optional[Budget]
    large_budget: Optional[Budget]
    held_out: Optional[Difference]
    reported: Optional[Difference]
    pooled_lower_bound: Optional[float]
    missing: Tuple[str, ...]

    @property
    def met(self) -> bool:
        return not self.missing and self.held_out is not None and self.held_out.lower_bound is not None \
            and self.held_out.lower_bound >= -MARGIN


def verdicts(fams: Dict[str, object]) -> List[Verdict]:
    """Per machine class with rows on both sides, and per epoch budget of :data:`FACTORS`: the
    :class:`Verdict` of the regime grid's families ``fams`` (report.families("regime"))."""
    cells = cells_by_name()
    out = []
    for cls, mine, base in per_class(fams):
        small = [f for f in mine.values() if f.batch == 16]
        if not small:
            continue
        for factor in FACTORS:
            large = [f for f in mine.values() if f.batch == LARGE_BATCH and _factor(f.name) == factor]
            if not large:
                continue
            chosen = choose(large)
            missing = []
            if base is None:
                missing.append(f"a batch-16 row with AP on {cls}")
            elif len(base.trained) < SEEDS:
                missing.append(f"{SEEDS - len(base.trained)} more seed(s) of `{base.name}` on {cls}")
            if chosen is None:
                missing.append(f"a batch-{LARGE_BATCH} row with AP at {factor:g}x on {cls}")
            elif len(chosen.trained) < SEEDS:
                missing.append(f"{SEEDS - len(chosen.trained)} more seed(s) of `{chosen.name}` on {cls}")
            held = rep = None
            pooled = None
            if base is not None and chosen is not None and base.trained and chosen.trained:
                held = welch(chosen.values("holdout_ap"), base.values("holdout_ap"))
                rep = welch(chosen.values("box_ap"), base.values("box_ap"))
                pooled = difference(chosen.values("holdout_ap"), base.values("holdout_ap")).lower_bound
            out.append(Verdict(
                cls, factor, base, chosen,
                tuning_budget([f.name for f in small], base.name, cells) if base else None,
                tuning_budget([f.name for f in large], chosen.name, cells) if chosen else None,
                held, rep, pooled, tuple(missing),
            ))  # fmt: skip
    return out


def _interval(d: Optional[Difference]) -> str:
    if d is None:
        return "-"
    if d.low is None:
        return f"{fmt(d.diff, sign=True)} (one seed on a side: no interval)"
    return f"{d.interval()}, lower bound {fmt(d.lower_bound, sign=True)}"


def verdict_text(fams: Dict[str, object]) -> str:
    """The generated verdict: one paragraph per machine class and epoch budget."""
    lines = []
    found = verdicts(fams)
    for v in found:
        what = "goal" if v.factor > 1.0 else "moonshot"
        head = f"- **{v.machine}, {v.factor:.1f}x** ({what}: Welch's one-sided 95% lower bound >= -{MARGIN:g} held-out):"
        if v.chosen is None or v.baseline is None:
            lines.append(f"{head} no rows on both sides.")
            continue
        body = (f" `{v.chosen.name}` (n={len(v.chosen.trained)}) minus `{v.baseline.name}` "
                f"(n={len(v.baseline.trained)}): held-out {_interval(v.held_out)}; `shapes_val` "
                f"{_interval(v.reported)}")  # fmt: skip
        if v.pooled_lower_bound is not None:
            body += f" (pooled, beside it: held-out lower bound {fmt(v.pooled_lower_bound, sign=True)})"
        if v.missing:
            status = "**no verdict yet**: missing " + "; ".join(v.missing)
        else:
            status = "**met**" if v.met else "**not met**"
        if any(b.edges or b.unswept for b in (v.base_budget, v.large_budget)):
            status += " (tuning not yet bracketed on both sides: below)"
        lines.append(f"{head}{body}. {status}.")
        lines.append(f"  - tuning, batch 16: {v.base_budget.text()}")
        lines.append(f"  - tuning, batch {LARGE_BATCH} at {v.factor:.1f}x: {v.large_budget.text()}")
    settled = [v for v in found if not v.missing]

    def said(big: bool) -> str:
        met = [v for v in settled if v.met and (v.factor > 1.0) == big]
        if not met:
            return "**not shown**"
        out = "**met** on " + ", ".join(v.machine for v in met)
        if any(b.edges or b.unswept for v in met for b in (v.base_budget, v.large_budget)):
            out += " (a side's tuning still open there: above)"
        return out

    lines.append(f"- On one machine class with {SEEDS} seeds a side: goal (1.4x) {said(True)}, "
                 f"moonshot (1.0x) {said(False)}.")
    return "\n".join(lines)


def goal_met(fams: Dict[str, object]) -> bool:
    """Whether some machine class settles the goal (1.4x) by Welch's bound."""
    return any(v.met and not v.missing for v in verdicts(fams) if v.factor > 1.0)


OPTIMIZERS = (("pmd_lamb", "PMD-LAMB"), ("lamb", "LAMB"), ("sgd", "SGD"), ("lars", "LARS"))


def optimizer_table(fams: Dict[str, object]) -> str:
    """The paper's ablation, one machine class at a time: PMD-LAMB, LAMB and SGD (and LARS
    where it ran) at batch 256, the best recipe of each by its seed-0 held-out AP at 1.0x and
    1.4x, minus that class's strongest batch-16 baseline by Welch's t, then PMD-LAMB minus
    LAMB on the same class."""
    head = ("| machine | optimizer | epochs | best recipe (held-out, seed 0) | recipes tried | n | "
            "held-out minus baseline | `shapes_val` minus baseline |")  # fmt: skip
    lines = [head, "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    notes = []
    cells = cells_by_name()
    for cls, mine, base in per_class(fams):
        if not any(f.batch == LARGE_BATCH for f in mine.values()):
            continue
        notes.append(f"{cls}: " + (f"`{base.name}` (n={len(base.trained)})" if base else "no batch-16 row yet"))
        best: Dict[Tuple[str, float], object] = {}
        for opt, label in OPTIMIZERS:
            for factor in FACTORS:
                cands = [f for f in mine.values() if f.batch == LARGE_BATCH and f.name.startswith(f"{opt}-bs")
                         and _factor(f.name) == factor]  # fmt: skip
                row = f"| {cls} | {label} | {factor:.1f}x |"
                if not cands:
                    if opt != "lars":
                        lines.append(f"{row} not run yet | 0 | - | - | - |")
                    continue
                chosen = choose(cands)
                if chosen is None:
                    lines.append(f"{row} every run diverged ({', '.join(f'`{f.name}`' for f in cands)}) "
                                 f"| {len(cands)} | - | - | - |")  # fmt: skip
                    continue
                best[(opt, factor)] = chosen
                h = r = None
                if base is not None:
                    h = welch(chosen.values("holdout_ap"), base.values("holdout_ap"))
                    r = welch(chosen.values("box_ap"), base.values("box_ap"))
                b = tuning_budget([f.name for f in cands], chosen.name, cells)
                open_ = [f"{e} at an edge" for e in b.edges] + [f"{u} not swept" for u in b.unswept]
                mark = f" ({'; '.join(open_)})" if open_ else ""
                lines.append(f"{row} `{chosen.name}`{mark} | {len(cands)} | {len(chosen.trained)} | "
                             f"{_interval(h)} | {_interval(r)} |")  # fmt: skip
        for factor in FACTORS:
            p, q = best.get(("pmd_lamb", factor)), best.get(("lamb", factor))
            if p is None or q is None:
                continue
            h = welch(p.values("holdout_ap"), q.values("holdout_ap"))
            r = welch(p.values("box_ap"), q.values("box_ap"))
            lines.append(f"| {cls} | PMD-LAMB minus LAMB | {factor:.1f}x | `{p.name}` - `{q.name}` | - | "
                         f"{len(p.trained)}/{len(q.trained)} | {_interval(h)} | {_interval(r)} |")  # fmt: skip
    return "\n".join(lines) + "\n\nBaselines (the strongest batch-16 recipe of each class): " + "; ".join(notes) + "."
