"""Plain row-at-a-time reference implementations of the spec, used as test oracles.

Each module restates one rule of ``docs/semantics.md`` in the most
literal Python possible (lists, loops, one row at a time).  They are the only
second copy of a rule, kept in the tests on purpose: the vectorized operators
must agree with them on every generated input.
"""
