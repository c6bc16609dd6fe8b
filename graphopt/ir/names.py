"""Names in a model: the model-wide registry that hands out fresh node and tensor names, the ordered
list of a graph's input or output names, and the one spelling of the default op domain."""

from __future__ import annotations

import re

_NAME_TAIL = re.compile(r"[^A-Za-z0-9_./:-]+")


class _Names:
    """Model-wide registry of node and tensor names, shared by the root graph and its subgraphs."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.counters: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        hint = _NAME_TAIL.sub("_", hint or "t") or "t"
        if hint not in self.used:
            self.used.add(hint)
            return hint
        n = self.counters.get(hint, 0)
        while True:
            n += 1
            candidate = f"{hint}_{n}"
            if candidate not in self.used:
                self.counters[hint] = n
                self.used.add(candidate)
                return candidate


class _NameList(list):
    """A graph's input or output names: a list (order matters) with O(1) ``in``, kept in step through
    the few mutations the IR uses (append, remove); any other change rebuilds the index."""

    def __init__(self, items=()):
        super().__init__(items)
        self._count: dict[str, int] = {}
        for t in self:
            self._count[t] = self._count.get(t, 0) + 1

    def __contains__(self, item) -> bool:
        return item in self._count

    def __reduce__(self):
        return (_NameList, (list(self),))

    def append(self, item) -> None:
        super().append(item)
        self._count[item] = self._count.get(item, 0) + 1

    def remove(self, item) -> None:
        super().remove(item)
        left = self._count[item] - 1
        if left:
            self._count[item] = left
        else:
            del self._count[item]

    def _rebuilt(name):
        def method(self, *args, **kwargs):
            result = getattr(list, name)(self, *args, **kwargs)
            self._count = {}
            for t in self:
                self._count[t] = self._count.get(t, 0) + 1
            return result
        return method

    for _name in ("extend", "insert", "pop", "clear", "__setitem__", "__delitem__", "__iadd__", "sort", "reverse"):
        locals()[_name] = _rebuilt(_name)
    del _name, _rebuilt


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain
