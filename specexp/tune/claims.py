"""Which trial measures a candidate, decided atomically in the study's own database.

Several ``tune`` processes share a study through Optuna's RDB storage, and two of them can
draw the same candidate at the same moment. Trial attributes cannot settle that (two
processes can each write theirs and read before the other's arrives), so each candidate's
claim is a row in a small table of the same database with the candidate as primary key:
one INSERT wins, on sqlite as on PostgreSQL. A claim passes on only when the trial holding
it will not measure the candidate (pruned, interrupted, or its process died), and then by
a conditional UPDATE, so again only one process gets it.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

_META = sa.MetaData()
CLAIMS = sa.Table(
    "specexp_claims",
    _META,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("candidate", sa.String(64), primary_key=True),
    sa.Column("trial", sa.Integer, nullable=False),
)


class Claims:
    def __init__(self, engine: sa.Engine, study: str) -> None:
        self.engine, self.study = engine, study
        try:
            _META.create_all(engine, checkfirst=True)
        except (IntegrityError, OperationalError, ProgrammingError):
            # another process created it between the check and the CREATE
            _META.create_all(engine, checkfirst=True)

    def holder(self, candidate: str) -> int | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(CLAIMS.c.trial).where(CLAIMS.c.study == self.study, CLAIMS.c.candidate == candidate)
            ).first()
        return None if row is None else int(row[0])

    def claim(self, candidate: str, trial: int, released: Callable[[int], bool]) -> int | None:
        """Claim ``candidate`` for ``trial``. Returns None when the trial holds it now, else
        the number of the trial that does. ``released(n)``: trial n gave the claim up."""
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(CLAIMS).values(study=self.study, candidate=candidate, trial=trial))
            return None
        except IntegrityError:
            pass
        held = self.holder(candidate)
        if held is None or held == trial:
            return None if held == trial else self.claim(candidate, trial, released)
        if not released(held):
            return held
        with self.engine.begin() as conn:
            moved = conn.execute(
                sa.update(CLAIMS)
                .where(CLAIMS.c.study == self.study, CLAIMS.c.candidate == candidate, CLAIMS.c.trial == held)
                .values(trial=trial)
            ).rowcount
        return None if moved == 1 else self.holder(candidate)
