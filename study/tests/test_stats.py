"""largedet_study.stats: t quantiles against published tables, the pooled and Welch intervals
against values worked by hand, and the rule for "within X"."""

import math

import pytest

from largedet_study.stats import claim, difference, fmt, summarize, t_cdf, t_quantile


# Student's t quantiles as printed in the standard tables (six significant figures)
@pytest.mark.parametrize(
    "p, df, expected",
    [
        (0.975, 1, 12.7062),
        (0.975, 2, 4.30265),
        (0.975, 3, 3.18245),
        (0.95, 3, 2.35336),
        (0.95, 4, 2.13185),
        (0.975, 30, 2.04227),
        (0.995, 10, 3.16927),
    ],
)
def test_t_quantile_matches_the_tables(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-4)


def test_t_cdf_closed_forms():
    # df = 1 is Cauchy: F(t) = 1/2 + atan(t)/pi; df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    # a fractional df (Welch) lies between its whole neighbours
    assert t_quantile(0.975, 2) > t_quantile(0.975, 2.5) > t_quantile(0.975, 3)


def test_summary_uses_the_sample_sd():
    s = summarize([1.0, 2.0, 3.0, 6.0])
    assert (s.n, s.mean) == (4, 3.0)
    assert s.sd == pytest.approx(math.sqrt(14.0 / 3.0))
    assert summarize([5.0]).sd is None
    # (83.27 + 82.94) / 2 = 83.105, rounded half up as written in decimal
    assert summarize([83.27, 82.94]).text() == "83.11 ± 0.23 (n=2)"


def test_fmt_rounds_halves_up_as_written():
    assert fmt(74.915) == "74.92"  # f"{74.915:.2f}" is "74.91"
    assert fmt(-0.125, sign=True) == "-0.13"
    assert fmt(0.0, sign=True) == "+0.00"
    assert fmt(-0.001, sign=True) == "+0.00"  # no "-0.00"
    assert fmt(1.25, digits=1) == "1.3"


def test_pooled_interval_by_hand():
    # a = 1, 2, 3 (mean 2, var 1); b = 2, 4 (mean 3, var 2); pooled var (2*1 + 1*2) / 3 = 4/3
    # se = sqrt(4/3 * (1/3 + 1/2)) = sqrt(10/9); df 3: t.975 = 3.182446, t.95 = 2.353363
    d = difference([1, 2, 3], [2, 4])
    se = math.sqrt(10 / 9)
    assert d.diff == pytest.approx(-1.0)
    assert d.df == 3
    assert d.low == pytest.approx(-1 - 3.182446 * se, abs=1e-5)
    assert d.high == pytest.approx(-1 + 3.182446 * se, abs=1e-5)
    assert d.lower_bound == pytest.approx(-1 - 2.353363 * se, abs=1e-5)


def test_welch_interval_by_hand():
    # var/n: 1/3 and 2/2; se = sqrt(4/3); df = (4/3)^2 / ((1/3)^2/2 + 1^2/1) = 32/19
    d = difference([1, 2, 3], [2, 4], method="welch")
    assert d.df == pytest.approx(32 / 19)
    se = math.sqrt(4 / 3)
    assert d.lower_bound == pytest.approx(-1 - t_quantile(0.95, 32 / 19) * se)
    assert d.lower_bound < difference([1, 2, 3], [2, 4]).lower_bound  # wider than pooled here


def test_one_value_each_has_no_interval():
    d = difference([1.0], [2.0])
    assert d.low is None and d.lower_bound is None
    assert "no interval" in d.interval()
    assert "not shown within" in claim(d, 0.5)


def test_within_only_where_the_lower_bound_allows():
    # the regime grid at 1.0x as the docs read it before the strong baseline: three seeds of
    # the recipe against two of the baseline, +0.07 [-0.46, +0.59] on shapes_val
    recipe, base = [83.14, 83.33, 83.04], [83.27, 82.94]
    d = difference(recipe, base)
    assert d.interval() == "+0.07 [-0.46, +0.59]"
    assert claim(d, 0.5).startswith("within 0.5 (+0.07, one-sided 95% lower bound -0.32")
    assert "not shown within 0.25" in claim(d, 0.25)
    with pytest.raises(ValueError):
        difference([1.0, 2.0], [1.0, 2.0], method="bayes")
