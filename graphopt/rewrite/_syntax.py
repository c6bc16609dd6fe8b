"""The small expression language of rule files: patterns, constraint calls and replacements.

One tokenizer and one recursive-descent parser read all three, and then a converter checks the
shape each one allows:

* pattern:      ``Relu(Add(Conv(x, w, b?) as conv, c)) as act``
* constraint:   ``per_channel(c, conv)``   ``const_near(s, 1.4142)``
* replacement:  ``graphopt.CBR(x, w, add_bias(b?, c, conv), attrs=conv, activation='Relu')``
  (lower-case calls are value builders; other calls are ops, and may nest)

Why hand-written and not Python's ``ast``: ``ast`` cannot express ``x as name`` inside a call or the
``b?`` optional marker, and anything shaped like Python invites someone to ``eval`` it. Rule files
must never execute code, so the grammar is kept tiny, parsed here, and every error carries the
1-based column where it went wrong.

Grammar::

    expr    := NUMBER | STRING | qualname [ '(' [arg (',' arg)*] ')' ] [ '?' ] [ 'as' IDENT ]
    arg     := IDENT '=' expr | expr
    qualname:= IDENT ('.' IDENT)*          # the last part is the op, the rest its domain
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from graphopt.errors import RuleError

# ----------------------------------------------------------------------------------------------
# Tokens


class RuleSyntaxError(RuleError):
    """A pattern, constraint or replacement string that does not parse; ``column`` is 1-based."""

    def __init__(self, text: str, column: int, message: str):
        self.text = text
        self.column = column
        self.detail = message
        super().__init__(f"column {column}: {message} in {excerpt(text, column)}")


def excerpt(text: str, column: int, width: int = 60) -> str:
    """The quoted text, or for a long one the part around ``column`` (an error line stays readable)."""
    if len(text) <= 2 * width:
        return repr(text)
    start = max(0, column - 1 - width)
    end = min(len(text), column - 1 + width)
    return (("..." if start else "") + repr(text[start:end]) + ("..." if end < len(text) else "")
            + f" ({len(text)} characters)")


# Whitespace is skipped inside the one match of each token, and ``bad`` takes any other character,
# so ``finditer`` walks the text token by token without a Python loop around it.
_TOKEN = re.compile(
    r"""
    \s*(?:
    (?P<number>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'[^']*'|"[^"]*")
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[(),?=.])
  | (?P<bad>\S)
    )
    """,
    re.VERBOSE,
)

#: One token: (kind, text, 1-based column); kind is number | string | ident | punct | end. A plain
#: tuple, not a NamedTuple or dataclass: 14,000 are built by every process's ``load_rules``, and
#: their constructors cost ten times a tuple's.
_Tok = tuple[str, str, int]


def _tokenize(text: str) -> list[_Tok]:
    toks = [(m.lastgroup, m[m.lastgroup], m.start(m.lastgroup) + 1) for m in _TOKEN.finditer(text)]
    for kind, tok, col in toks:
        if kind == "bad":
            raise RuleSyntaxError(text, col, f"unexpected character {tok!r}")
    toks.append(("end", "", len(text) + 1))
    return toks


# ----------------------------------------------------------------------------------------------
# Generic syntax tree (what the parser returns before the per-use checks)


@dataclass(frozen=True)
class Lit:
    """A number or string literal."""

    value: object
    col: int


@dataclass(frozen=True)
class Name:
    """A bare name: a capture (``x``), an optional capture (``b?``) or the wildcard ``_``."""

    name: str
    optional: bool
    col: int
    bind: str | None = None  # only to report "as" where it is not allowed


@dataclass(frozen=True)
class Call:
    """``domain.op(args, key=value) as bind``; ``domain`` is "" for the default ONNX domain."""

    op: str
    domain: str
    args: tuple
    kwargs: tuple  # tuple of (key, expr), in source order
    bind: str | None
    col: int

    @property
    def qualname(self) -> str:
        return f"{self.domain}.{self.op}" if self.domain else self.op


class _Parser:
    """Recursive descent over the token list. A punctuation token is recognized by its text alone:
    no other kind of token can be "(", ")", ",", "?", "=" or "." (strings keep their quotes)."""

    def __init__(self, text: str):
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    # helpers
    def next(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def take(self, punct: str) -> bool:
        """Consume the next token when it is ``punct``; say whether it was."""
        if self.toks[self.i][1] == punct:
            self.i += 1
            return True
        return False

    def error(self, tok: _Tok, expected: str):
        kind, text, col = tok
        found = "end of text" if kind == "end" else repr(text)
        raise RuleSyntaxError(self.text, col, f"expected {expected} but found {found}")

    # grammar
    def parse_all(self):
        expr = self.expr()
        if self.toks[self.i][0] != "end":
            self.error(self.toks[self.i], "end of text")
        return expr

    def expr(self):
        tok = self.next()
        kind, text, col = tok
        if kind == "number":
            return Lit(float(text) if "." in text or "e" in text or "E" in text else int(text), col)
        if kind == "string":
            return Lit(text[1:-1], col)
        if kind != "ident" or text == "as":
            self.error(tok, "a name, number or string")
        parts = [text]
        while self.take("."):
            part = self.next()
            if part[0] != "ident":
                self.error(part, "a name after '.'")
            parts.append(part[1])
        if self.take("("):
            args, kwargs = self.arguments()
            return Call(parts[-1], ".".join(parts[:-1]), args, kwargs, self.binding(), col)
        if len(parts) > 1:
            self.error(self.toks[self.i], f"'(' after the op name {'.'.join(parts)!r}")
        optional = self.take("?")
        return Name(text, optional, col, self.binding())

    def binding(self) -> str | None:
        kind, text, _ = self.toks[self.i]
        if kind == "ident" and text == "as":
            self.i += 1
            name = self.next()
            if name[0] != "ident" or name[1] in ("as", "_"):
                self.error(name, "a capture name after 'as'")
            return name[1]
        return None

    def arguments(self) -> tuple[tuple, tuple]:
        args, kwargs = [], []
        if self.take(")"):
            return (), ()
        toks = self.toks
        while True:
            kind, text, col = toks[self.i]
            if kind == "ident" and toks[self.i + 1][1] == "=":
                self.i += 2
                if any(k == text for k, _ in kwargs):
                    raise RuleSyntaxError(self.text, col, f"keyword {text!r} given twice")
                kwargs.append((text, self.expr()))
            else:
                if kwargs:
                    raise RuleSyntaxError(self.text, col, "positional argument after a keyword argument")
                args.append(self.expr())
            if len(args) + len(kwargs) > MAX_ARGS:
                raise RuleSyntaxError(self.text, col, f"more than {MAX_ARGS} arguments in one call")
            tok = self.next()
            if tok[1] == ")":
                return tuple(args), tuple(kwargs)
            if tok[1] != ",":
                self.error(tok, "',' or ')'")


#: Deepest call nesting a pattern, constraint or replacement may have (real ones stay below 15).
MAX_NESTING = 64
#: Most arguments one call may have (a Concat of many inputs stays far below).
MAX_ARGS = 256


def _memo_by_text(parse):
    """Memoize a parse of rule text. Its result is frozen, so one parse serves every rule that
    repeats the text: the shipped rules parse 1,800 expression texts (488 distinct), 1,169
    constraints (63 distinct) and 315 replacements (111 distinct). Anything but a string goes
    to ``parse`` unmemoized (to its error)."""
    memo = functools.lru_cache(maxsize=4096)(parse)

    @functools.wraps(parse)
    def parse_text(text):
        return memo(text) if isinstance(text, str) else parse(text)

    parse_text.cache_clear = memo.cache_clear
    return parse_text


@_memo_by_text
def parse_expr(text: str):
    """Parse ``text`` into the generic tree (``Call`` / ``Name`` / ``Lit``); raises RuleSyntaxError."""
    if not isinstance(text, str):
        raise RuleSyntaxError(str(text), 1, "expected a string")
    if text.count("(") > MAX_NESTING:  # only then can the nesting be too deep: find where
        depth = 0
        for col, ch in enumerate(text, 1):  # the parser and the matcher recurse once per level
            depth += (ch == "(") - (ch == ")")
            if depth > MAX_NESTING:
                raise RuleSyntaxError(text, col, f"calls nested more than {MAX_NESTING} levels deep")
    return _Parser(text).parse_all()


# ----------------------------------------------------------------------------------------------
# Patterns

#: Ops whose inputs may be matched in any order. Max/Min/Sum are variadic; their permutations are
#: tried only up to this many inputs (24 orders), which every real pattern stays well within.
COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum"})
MAX_PERMUTED_INPUTS = 4


@dataclass(frozen=True)
class OpPat:
    """An op node in a pattern. ``bind`` names the matched node (and, as a tensor, its output)."""

    op: str
    domain: str
    args: tuple  # of OpPat | VarPat
    bind: str | None
    col: int

    @property
    def qualname(self) -> str:
        return f"{self.domain}.{self.op}" if self.domain else self.op

    @property
    def commutative(self) -> bool:
        return self.domain == "" and self.op in COMMUTATIVE

    # The matcher reads these for every candidate: computed once per pattern node (a frozen
    # dataclass still has an instance __dict__, where cached_property keeps them).
    @functools.cached_property
    def any_order(self) -> bool:
        """Whether the matcher tries the operands in every order (see MAX_PERMUTED_INPUTS)."""
        return self.commutative and 1 < len(self.args) <= MAX_PERMUTED_INPUTS

    @functools.cached_property
    def domains(self) -> tuple[str, ...]:
        """The node domains this op matches ("ai.onnx" is the default domain spelled out)."""
        return (self.domain,) if self.domain else ("", "ai.onnx")

    @functools.cached_property
    def op_args(self) -> tuple[tuple[int, "OpPat"], ...]:
        """(position, sub-pattern) of the arguments that are ops."""
        return tuple((i, a) for i, a in enumerate(self.args) if isinstance(a, OpPat))


@dataclass(frozen=True)
class VarPat:
    """A tensor variable; ``name == "_"`` is the wildcard; ``optional`` matches an absent input too."""

    name: str
    optional: bool
    col: int


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def parse_pattern(text: str) -> OpPat:
    """Parse a pattern string; the root must be an op call."""
    tree = parse_expr(text)
    if not isinstance(tree, Call):
        raise RuleSyntaxError(text, getattr(tree, "col", 1), "a pattern must start with an op, e.g. Relu(x)")
    return _to_pattern(text, tree)


def _to_pattern(text: str, node):
    if isinstance(node, Lit):
        raise RuleSyntaxError(
            text, node.col, "literals are not allowed in patterns; bind a name and constrain it, e.g. const_near(s, 0.5)"
        )
    if isinstance(node, Name):
        if node.bind is not None:
            raise RuleSyntaxError(text, node.col, f"'as' can only follow an op call, not the name {node.name!r}")
        return VarPat(node.name, node.optional, node.col)
    if node.kwargs:
        raise RuleSyntaxError(text, node.col, f"keyword arguments are not allowed in patterns ({node.kwargs[0][0]!r})")
    args = tuple(_to_pattern(text, a) for a in node.args)
    return OpPat(node.op, _norm_domain(node.domain), args, node.bind, node.col)


def pattern_ops(pat: OpPat) -> list[OpPat]:
    """All op nodes of a pattern, children before parents (post-order), left to right."""
    out: list[OpPat] = []

    def visit(p):
        for a in p.args:
            if isinstance(a, OpPat):
                visit(a)
        out.append(p)

    visit(pat)
    return out


def pattern_captures(pat: OpPat) -> tuple[dict[str, bool], set[str]]:
    """Return (tensor captures -> optional?, node captures). Node captures are also tensor captures."""
    tensors: dict[str, bool] = {}
    nodes: set[str] = set()

    def visit(p):
        if isinstance(p, VarPat):
            if p.name != "_":
                # A name used both optional and required is required where it is required.
                tensors[p.name] = tensors.get(p.name, True) and p.optional
            return
        for a in p.args:
            visit(a)
        if p.bind:
            nodes.add(p.bind)
            tensors[p.bind] = False

    visit(pat)
    return tensors, nodes


# ----------------------------------------------------------------------------------------------
# Constraint calls and replacements


@dataclass(frozen=True)
class ConstraintCall:
    """``name(args)`` from a rule's ``where`` list; args are ``Name`` (captures) or ``Lit``."""

    name: str
    args: tuple
    text: str


@_memo_by_text
def parse_constraint(text: str) -> ConstraintCall:
    tree = parse_expr(text)
    if not isinstance(tree, Call) or tree.domain:
        raise RuleSyntaxError(text, getattr(tree, "col", 1), "a constraint is a call such as constant(b)")
    if tree.bind:
        raise RuleSyntaxError(text, tree.col, "'as' is not allowed in a constraint")
    if tree.kwargs:
        raise RuleSyntaxError(text, tree.col, "constraints take positional arguments only")
    for a in tree.args:
        if isinstance(a, Call):
            raise RuleSyntaxError(text, a.col, "constraint arguments are captures or literals, not calls")
        if isinstance(a, Name) and (a.bind or a.name == "_"):
            raise RuleSyntaxError(text, a.col, "constraint arguments are captures or literals")
    return ConstraintCall(tree.op, tree.args, " ".join(text.split()))


@dataclass(frozen=True)
class Replacement:
    """The op a rule builds: ``op``/``domain``, positional input exprs and keyword exprs."""

    op: str
    domain: str
    args: tuple  # Name | Call(builder)
    kwargs: tuple  # (key, Name | Call(builder) | Lit)
    text: str

    @property
    def qualname(self) -> str:
        return f"{self.domain}.{self.op}" if self.domain else self.op


def is_builder(call: Call) -> bool:
    """A lower-case, undotted call in a replacement is a value builder; anything else is an op."""
    return not call.domain and call.op[:1].islower()


def _check_value(text: str, node, where: str):
    """Replacement values: captures, literals, and calls. A call is a builder (a registered lower-case
    name, positional arguments only; the loader checks which) or a nested op that builds another
    new node, e.g. ``Reshape(graphopt.GemmAct(a, b), shape)``."""
    if isinstance(node, Name) and (node.bind or node.name == "_"):
        raise RuleSyntaxError(text, node.col, f"{where} must be a capture, a literal or a call")
    if isinstance(node, Call):
        if node.bind:
            raise RuleSyntaxError(text, node.col, f"'as' is not allowed in a replacement ({node.qualname})")
        for a in node.args:
            _check_value(text, a, "an argument")
        for _, v in node.kwargs:
            _check_value(text, v, "a keyword value")
        object.__setattr__(node, "domain", _norm_domain(node.domain))


@_memo_by_text
def parse_replacement(text: str) -> Replacement:
    tree = parse_expr(text)
    if not isinstance(tree, Call):
        raise RuleSyntaxError(text, getattr(tree, "col", 1), "a replacement is an op call such as graphopt.CBR(x, w)")
    if tree.bind:
        raise RuleSyntaxError(text, tree.col, "'as' is not allowed in a replacement")
    for a in tree.args:
        if isinstance(a, Lit):
            raise RuleSyntaxError(text, a.col, "positional arguments are inputs: captures or builder calls")
        _check_value(text, a, "an input")
    for _, v in tree.kwargs:
        _check_value(text, v, "a keyword value")
    return Replacement(tree.op, _norm_domain(tree.domain), tree.args, tree.kwargs, " ".join(text.split()))
