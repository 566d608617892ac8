"""Second ways of computing the product's analyses, kept as test oracles (docs/architecture.md, "tests/").

Each module holds the SQL of one analysis of :mod:`tracelake.analysis` (DuckDB in, a frame
out): the readable definition that tests compare the product's one implementation against,
on hand-built timelines, random ones and every sample format. Nothing in the product imports them.
"""
