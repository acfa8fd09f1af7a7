"""Top-N (docs/operators.md), one row at a time: the oracle for
``RetractableTopN``/``AppendOnlyTopN``.

Each partition keeps its present rows in arrival order; an ADD appends, a
RETRACT removes the oldest equal row (or is ignored).  After a micro-batch,
each touched partition's top N (sort key, then arrival; nulls largest) is
compared with the one before: per rank with the rank number, as a multiset
of rows without it.  Rows are tuples; outputs ``(kind, row)``, with the rank
appended when ranked.
"""
from __future__ import annotations

ADD_KINDS = ("+I", "+U")


class RefTopN:
    def __init__(self, partition, n, order_by, with_rank):
        self.partition = list(partition)
        self.n = n
        self.order_by = list(order_by)        # [(field index, ascending)]
        self.with_rank = with_rank
        self.parts = {}
        self.arrivals = 0
        self.ignored = 0

    def _sort_key(self, entry):
        row, order = entry
        key = []
        for i, asc in self.order_by:
            v = row[i]
            null = v is None
            if asc:
                key.append((null, 0 if null else v))
            else:
                key.append((not null, 0 if null else -v))
        return tuple(key) + (order,)

    def top(self, p):
        return [row for row, _ in sorted(self.parts.get(p, []), key=self._sort_key)[:self.n]]

    def run_batch(self, rows):
        touched, before = [], {}
        for kind, row in rows:
            p = tuple(row[i] for i in self.partition)
            if p not in before:
                before[p] = self.top(p)
                touched.append(p)
            self.arrivals += 1
            entries = self.parts.setdefault(p, [])
            if kind in ADD_KINDS:
                entries.append((row, self.arrivals))
                continue
            for j, (r, _) in enumerate(entries):
                if r == row:
                    del entries[j]
                    break
            else:
                self.ignored += 1
        out = []
        for p in sorted(touched):
            old, new = before[p], self.top(p)
            if self.with_rank:
                for r in range(self.n):
                    o = old[r] if r < len(old) else None
                    w = new[r] if r < len(new) else None
                    if o is not None and w is not None and o != w:
                        out += [("-U", o + (r + 1,)), ("+U", w + (r + 1,))]
                    elif o is not None and w is None:
                        out.append(("-D", o + (r + 1,)))
                    elif o is None and w is not None:
                        out.append(("+I", w + (r + 1,)))
            else:
                left, rest = [], list(new)
                for o in old:
                    if o in rest:
                        rest.remove(o)
                    else:
                        left.append(o)
                entered, rest = [], list(old)
                for w in new:
                    if w in rest:
                        rest.remove(w)
                    else:
                        entered.append(w)
                out += [("-D", o) for o in left] + [("+I", w) for w in entered]
        return out
