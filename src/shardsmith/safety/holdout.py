"""A holdout must leave training data: refuse a plan whose train split would be empty.

Contract
- :func:`refuse_empty_train` raises :class:`HoldoutError` (a :class:`UserError`) for the first
  output whose planned items all fell in the holdout split (a count at least the data, or a
  fraction that rounds to all of it), naming the counts and the fix. An output without any
  planned item is not refused here (there is nothing to hold out).
- :func:`refuse_recipe_empty_train` does so for a recipe's outputs from a planned ledger (``build`` before
  writing; ``scan`` as a warning); nothing without a holdout or with ``one_sample``.
- :func:`achieved` is the summary line of one output's written holdout count and fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsmith.errors import UserError


class HoldoutError(UserError):
    """``split.holdout`` takes every planned item: the train split would be empty."""


@dataclass(frozen=True)
class SplitCounts:
    output: str
    train: int  # planned items of the output's sources in the train split
    holdout: int


def refuse_recipe_empty_train(recipe, ledger) -> None:
    """:func:`refuse_empty_train` on every output of ``recipe``, counting its planned items in ``ledger``."""
    from shardsmith.split.assign import HOLDOUT, TRAIN

    if not recipe.split.holdout > 0 or recipe.one_sample:
        return
    refuse_empty_train(recipe.split.holdout, [
        SplitCounts(o.name, ledger.eligible(TRAIN, recipe.source_ids(o)), ledger.eligible(HOLDOUT, recipe.source_ids(o)))
        for o in recipe.outputs])


def refuse_empty_train(holdout: float, counts: list[SplitCounts]) -> None:
    for c in counts:
        if c.train == 0 and c.holdout > 0:
            total = c.holdout
            if holdout >= 1:
                fix = f"Give a count below {total}, e.g. split.holdout: {max(1, total // 10)}"
                what = f"a count of {holdout:g}"
            else:
                fix = "Give a smaller fraction, e.g. split.holdout: 0.1"
                what = f"a fraction of {holdout:g}"
            raise HoldoutError(
                f"split.holdout ({what}) holds out all {total} planned item(s) of output {c.output!r}: "
                f"train 0, holdout {c.holdout} of {total}; the train split would be empty. {fix}")


def achieved(train_written: int, holdout_written: int) -> str:
    total = train_written + holdout_written
    frac = 100 * holdout_written / total if total else 0.0
    return f"holdout {holdout_written} of {total} written ({frac:.1f} %)"
