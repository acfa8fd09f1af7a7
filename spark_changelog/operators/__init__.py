"""Operators: one module per operator, each a vectorized keyed step (see ``base``)."""
from .base import KeyedOperator, Metrics, OpContext

__all__ = ["KeyedOperator", "Metrics", "OpContext"]
