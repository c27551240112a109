"""The statistics every comparison of the studies states: n, mean, sample SD, and for a
difference of two means its 95% interval and one-sided 95% lower bound.

Two samples (seeds of a large-batch recipe, seeds of the baseline) are compared with
Student's two-sample t (pooled variance, ``n_a + n_b - 2`` degrees of freedom), the
interval the docs print; Welch's unequal-variance version (Welch-Satterthwaite degrees of
freedom) is there for the reader who distrusts the pooling. A claim follows the bound:
"within X" (or "level with", X = the stated margin) only where the one-sided 95% lower
bound of (large batch - baseline) is at least -X (:func:`claim`); otherwise the interval is
what is said.

The t quantiles are computed here (regularised incomplete beta by its continued fraction,
then bisection), so the module needs nothing beyond the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Optional, Sequence

__all__ = ["Difference", "Summary", "claim", "difference", "fmt", "summarize", "t_cdf", "t_quantile"]


def fmt(x: float, digits: int = 2, sign: bool = False) -> str:
    """``x`` to ``digits`` decimals, halves rounded away from zero as written in decimal
    (74.915 -> "74.92", where ``f"{74.915:.2f}"`` gives "74.91": the nearest double is below).
    ``sign``: a leading "+" for positive numbers (and zero)."""
    exact = Decimal(f"{x:.10f}").quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    if exact == 0:
        exact = abs(exact)
    return f"{'+' if sign and exact >= 0 else ''}{exact}"


@dataclass(frozen=True)
class Summary:
    """n values: their mean and sample standard deviation (None for n = 1)."""

    n: int
    mean: float
    sd: Optional[float]

    def text(self, digits: int = 2) -> str:
        """``"83.04 ± 0.17 (n=3)"``; ``"83.04 (n=1)"`` for one value."""
        spread = "" if self.sd is None else f" ± {fmt(self.sd, digits)}"
        return f"{fmt(self.mean, digits)}{spread} (n={self.n})"


@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b), its two-sided 95% interval and one-sided 95% lower bound (None
    where the samples carry no variance estimate: n_a = n_b = 1)."""

    a: Summary
    b: Summary
    diff: float
    low: Optional[float]
    high: Optional[float]
    lower_bound: Optional[float]
    df: Optional[float]
    method: str  # "pooled" or "welch"

    def interval(self, digits: int = 2) -> str:
        """``"+0.07 [-0.46, +0.59]"``, or ``"+0.07 (no interval: n=1 each)"``."""
        if self.low is None:
            why = "n=1 each" if self.method == "pooled" else "one seed on a side"
            return f"{fmt(self.diff, digits, sign=True)} (no interval: {why})"
        return f"{fmt(self.diff, digits, sign=True)} [{fmt(self.low, digits, sign=True)}, {fmt(self.high, digits, sign=True)}]"


def summarize(values: Sequence[float]) -> Summary:
    """n, mean and sample SD (``n - 1`` in the denominator) of ``values``."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("summarize: no values")
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return Summary(n, mean, sd)


def difference(a: Sequence[float], b: Sequence[float], method: str = "pooled",
               confidence: float = 0.95) -> Difference:  # fmt: skip
    """mean(a) - mean(b) with Student's pooled two-sample interval (``method="pooled"``) or
    Welch's (``"welch"``); the interval is two-sided at ``confidence``, the lower bound
    one-sided at the same level."""
    if method not in ("pooled", "welch"):
        raise ValueError(f"method must be 'pooled' or 'welch', got {method!r}")
    sa, sb = summarize(a), summarize(b)
    diff = sa.mean - sb.mean
    var_a = sa.sd**2 if sa.sd is not None else None
    var_b = sb.sd**2 if sb.sd is not None else None
    if method == "pooled":
        df = sa.n + sb.n - 2
        if df < 1:
            return Difference(sa, sb, diff, None, None, None, None, method)
        pooled = ((sa.n - 1) * (var_a or 0.0) + (sb.n - 1) * (var_b or 0.0)) / df
        se = math.sqrt(pooled * (1.0 / sa.n + 1.0 / sb.n))
    else:
        if var_a is None or var_b is None:
            return Difference(sa, sb, diff, None, None, None, None, method)
        qa, qb = var_a / sa.n, var_b / sb.n
        se = math.sqrt(qa + qb)
        if se == 0.0:
            df = float(sa.n + sb.n - 2)
        else:
            df = (qa + qb) ** 2 / (qa**2 / (sa.n - 1) + qb**2 / (sb.n - 1))
    two_sided = t_quantile(1.0 - (1.0 - confidence) / 2.0, df)
    one_sided = t_quantile(confidence, df)
    return Difference(sa, sb, diff, diff - two_sided * se, diff + two_sided * se,
                      diff - one_sided * se, df, method)  # fmt: skip


def claim(d: Difference, margin: float, digits: int = 2) -> str:
    """What may be said of ``d`` (large batch - baseline) against ``margin`` (AP or top-1):
    "within X" where the one-sided 95% lower bound is at least ``-margin``, otherwise the
    difference and its 95% interval, with n on each side."""
    n = f"n={d.a.n} against n={d.b.n}"
    if d.lower_bound is not None and d.lower_bound >= -margin:
        return (f"within {margin:g} ({fmt(d.diff, digits, sign=True)}, one-sided 95% lower bound "
                f"{fmt(d.lower_bound, digits, sign=True)}; {n})")  # fmt: skip
    return f"{d.interval(digits)} ({n}; not shown within {margin:g})"


# --- Student's t distribution -------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0))):  # fmt: skip
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))  # fmt: skip
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on
    :func:`t_cdf` to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    while high - low > 1e-12 * max(1.0, high):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)
