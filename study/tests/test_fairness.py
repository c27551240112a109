"""largedet_study.fairness: machine classes, tuning budgets with their edges, and the
optimizer table, on hand-made families."""

import pytest

from largedet_study import fairness
from largedet_study.report import Family

EPYC = "2-core AMD EPYC VM, CPU, 1 thread per run"
AMX = "2-core Intel Xeon VM (AMX), CPU, 1 thread per run"
ICL = "2-core Intel Xeon VM (Ice Lake, model 106, no AMX), CPU, 1 thread per run"


def fam(name, batch, holdouts, device=EPYC, diverged=False):
    rows = tuple(
        dict(cell=name + (f"-s{i}" if i else ""), batch=str(batch), holdout_ap="" if diverged else str(h),
             box_ap="" if diverged else str(h + 1), diverged="yes" if diverged else "no", device=device)
        for i, h in enumerate(holdouts)
    )  # fmt: skip
    return Family(name, rows)


ZEN5 = "2-core AMD EPYC VM (Zen 5, family 26), CPU, 1 thread per run"


@pytest.mark.parametrize("device, cls", [(EPYC, "EPYC"), (AMX, "Xeon-AMX"), (ICL, "Xeon-ICL"), (ZEN5, "EPYC-Zen5"),
                                         ("1x NVIDIA H100 80GB", "H100"), ("", "?")])  # fmt: skip
def test_machine_classes_keep_the_two_xeons_and_the_epycs_apart(device, cls):
    assert fairness.machine_class(device) == cls


def test_a_budget_names_what_was_swept_and_marks_an_optimum_at_its_edge():
    names = ["sgd-bs16-wu0.65-lrwsd", "sgd-bs16-wu0.65-lrx0.5-lrwsd", "sgd-bs16-wu0.65-lrx2-lrwsd", "sgd-bs16-wu0.65"]
    top = fairness.tuning_budget(names, "sgd-bs16-wu0.65-lrx2-lrwsd")
    assert len(top.recipes) == 4
    assert dict(top.swept) == {"LR factor": (0.5, 1.0, 2.0), "lr schedule": ("step", "wsd")}
    assert top.edges == ("LR factor 2.0",)  # the best LR is the largest tried
    assert top.unswept == ("warm-up (epochs)",)
    assert "**the chosen value at an edge of its sweep: LR factor 2.0**" in top.text()
    # with x4 tried too, 2.0 is bracketed
    bracketed = fairness.tuning_budget(names + ["sgd-bs16-wu0.65-lrx4-lrwsd"], "sgd-bs16-wu0.65-lrx2-lrwsd")
    assert bracketed.edges == () and dict(bracketed.swept)["LR factor"] == (0.5, 1.0, 2.0, 4.0)
    one = fairness.tuning_budget(["pmd_lamb-bs256-lrwsd-wd0.01"], "pmd_lamb-bs256-lrwsd-wd0.01")
    assert one.text() == "1 recipe (nothing swept); not swept: LR factor, warm-up (epochs)"


def test_verdicts_compare_rows_of_one_class_and_choose_by_seed_0():
    fams = {f.name: f for f in [
        fam("sgd-bs16-wu0.65-lrwsd", 16, [82.6, 82.8, 82.7]),
        # seed 0 best on held-out, but only one seed: chosen, and the verdict waits for more
        fam("sgd-bs16-wu0.65-lrx2-lrwsd", 16, [83.0]),
        fam("pmd_lamb-bs256-lrwsd-wd0.01", 256, [82.5, 82.6, 82.4]),
        fam("lamb-bs256-lrwsd-wd0.01", 256, [80.0, 80.1, 80.2], device=ICL),
    ]}  # fmt: skip
    (v,) = fairness.verdicts(fams)  # only EPYC has both sides
    assert (v.machine, v.factor, v.baseline.name, v.chosen.name) == (
        "EPYC", 1.0, "sgd-bs16-wu0.65-lrx2-lrwsd", "pmd_lamb-bs256-lrwsd-wd0.01")
    assert v.missing == ("2 more seed(s) of `sgd-bs16-wu0.65-lrx2-lrwsd` on EPYC",) and not v.met
    assert v.held_out.low is None  # one seed on a side: Welch gives no interval
    assert v.pooled_lower_bound is not None  # the pooled figure, shown beside it
    del fams["sgd-bs16-wu0.65-lrx2-lrwsd"]
    (v,) = fairness.verdicts(fams)
    assert v.baseline.name == "sgd-bs16-wu0.65-lrwsd" and not v.missing
    assert v.held_out.lower_bound == pytest.approx(-0.2 - 2.131847 * (0.02 / 3) ** 0.5, abs=1e-4)
    # met, and the line says where and that a side's LR and warm-up were never swept
    assert v.met and fairness.verdict_text(fams).endswith(
        "moonshot (1.0x) **met** on EPYC (a side's tuning still open there: above).")


def test_the_optimizer_table_compares_pmd_lamb_with_lamb_on_one_class():
    fams = {f.name: f for f in [
        fam("pmd_lamb-bs256-lrwsd-wd0.01", 256, [82.5, 82.6, 82.4], device=ICL),
        fam("lamb-bs256-lrwsd-wd0.01", 256, [82.0, 82.2, 82.1], device=ICL),
        fam("sgd-bs256", 256, [0], device=ICL, diverged=True),
    ]}  # fmt: skip
    table = fairness.optimizer_table(fams)
    rows = {tuple(c.strip() for c in line.split("|")[1:4]): line for line in table.splitlines() if line.startswith("| Xeon-ICL")}
    assert "every run diverged (`sgd-bs256`)" in rows[("Xeon-ICL", "SGD", "1.0x")]
    pmd_minus_lamb = rows[("Xeon-ICL", "PMD-LAMB minus LAMB", "1.0x")]
    # +0.40 held-out, SDs 0.1 each on three seeds: Welch's t with 4 degrees of freedom
    assert "+0.40 [+0.17, +0.63], lower bound +0.23" in pmd_minus_lamb
    # one recipe each: the best recipe's LR and warm-up are open, and the table says so
    assert "`pmd_lamb-bs256-lrwsd-wd0.01` (LR factor not swept; warm-up (epochs) not swept)" in \
        rows[("Xeon-ICL", "PMD-LAMB", "1.0x")]
    assert table.endswith("Xeon-ICL: no batch-16 row yet.")


def test_an_optimum_is_bracketed_by_its_own_optimizers_sweep():
    # PMD-LAMB swept the LR (0.5, 1, 2); LAMB tried only 1.0: the side's LR values bracket
    # 1.0, LAMB's own do not
    names = ["pmd_lamb-bs256-lrwsd-wd0.01", "pmd_lamb-bs256-lrx0.5-lrwsd-wd0.01", "pmd_lamb-bs256-lrx2-lrwsd-wd0.01",
             "lamb-bs256-lrwsd-wd0.01"]  # fmt: skip
    lamb = fairness.tuning_budget(names, "lamb-bs256-lrwsd-wd0.01")
    assert dict(lamb.swept)["LR factor"] == (0.5, 1.0, 2.0) and lamb.optimizer == "lamb"
    assert lamb.edges == () and lamb.unswept == ("LR factor", "warm-up (epochs)")
    assert lamb.text().endswith("; not swept for lamb: LR factor, warm-up (epochs)")
    # PMD-LAMB's best at 0.5 is the low edge of its own sweep, whatever LAMB tried
    pmd = fairness.tuning_budget(names + ["lamb-bs256-lrx0.25-lrwsd-wd0.01"], "pmd_lamb-bs256-lrx0.5-lrwsd-wd0.01")
    assert pmd.edges == ("LR factor 0.5",) and pmd.unswept == ("warm-up (epochs)",)
    assert "**the chosen value at an edge of pmd_lamb's sweep: LR factor 0.5**" in pmd.text()
