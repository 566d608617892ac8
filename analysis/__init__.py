"""Bottleneck analyses over warehouse tables: pure functions, no I/O."""

from .classify import CATEGORIES, RULES, category_sql, classify

__all__ = ["CATEGORIES", "RULES", "category_sql", "classify"]
