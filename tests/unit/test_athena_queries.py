"""The analysts' saved Athena queries (spark_emr/athena.py) are valid in Athena's dialect
(engine version 3: Trino's), as parsed by sqlglot: every function is one the dialect
knows, every table is an archive table of the stack's Glue database, and every read of
one is bounded by the ``date`` partition column. tests/analytics/test_archive_and_report.py
runs the same SQL through Spark over an archive and checks it against the report."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel

from spark_emr.athena import QUERIES
from spark_emr.jobs.archive import TABLES

DATABASE = "cormorant_test_archive"


def _parsed(sql: str) -> exp.Expr:
    tree = sqlglot.parse_one(sql, read="trino", error_level=ErrorLevel.RAISE)
    assert tree is not None
    return tree


@pytest.mark.parametrize("query", QUERIES, ids=[q.name for q in QUERIES])
def test_each_saved_query_is_trino_sql_over_the_archive_s_partitions(query: object) -> None:
    from spark_emr.athena import Query

    assert isinstance(query, Query)
    tree = _parsed(query.for_database(DATABASE))
    assert isinstance(tree, exp.Query)
    # A misspelt or foreign function parses as Anonymous: Athena would refuse it.
    unknown = [f.name for f in tree.find_all(exp.Anonymous)]
    assert not unknown, unknown
    ctes = {cte.alias for cte in tree.find_all(exp.CTE)}
    tables = [t for t in tree.find_all(exp.Table) if t.name not in ctes]
    assert tables
    for table in tables:
        assert (table.db, table.name in TABLES) == (DATABASE, True), table.sql("trino")
        select = table.find_ancestor(exp.Select)
        assert select is not None
        where = select.args.get("where")
        assert where is not None, f"{query.name}: {table.name} read without a WHERE"
        bounds = [c for c in where.find_all(exp.GTE, exp.GT) if isinstance(c.this, exp.Column)]
        assert any(c.this.name == "date" for c in bounds), f"{query.name}: no date bound"


def test_the_queries_have_unique_names_within_athena_s_limits() -> None:
    names = [q.name for q in QUERIES]
    assert len(set(names)) == len(names)
    # CreateNamedQuery: Name 1-128 characters, Description up to 1024, QueryString up to 262144.
    assert all(0 < len(q.name) <= 128 and len(q.description) <= 1024 for q in QUERIES)
    assert all(len(q.for_database(DATABASE)) <= 262_144 for q in QUERIES)
