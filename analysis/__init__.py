"""Bottleneck analyses over warehouse tables: pure functions, no I/O."""

from .classify import CATEGORIES, RULES, Category, category_sql, classify, op_kind

__all__ = ["CATEGORIES", "RULES", "Category", "category_sql", "classify", "op_kind"]
