"""Aggregations over changelogs: retracting accumulators and the group aggregate."""
