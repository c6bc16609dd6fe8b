"""The pattern / constraint / replacement parser: valid forms and errors with their column."""

from __future__ import annotations

import pytest

from graphopt.errors import RuleError
from graphopt.rewrite._syntax import (
    Call,
    Lit,
    Name,
    OpPat,
    RuleSyntaxError,
    VarPat,
    parse_constraint,
    parse_pattern,
    parse_replacement,
    pattern_captures,
    pattern_ops,
)


def test_nested_pattern_with_bindings_optional_and_wildcard():
    p = parse_pattern("Relu(Add(Conv(x, w, b?) as conv, _)) as act")
    assert p == OpPat("Relu", "", (
        OpPat("Add", "", (
            OpPat("Conv", "", (VarPat("x", False, 15), VarPat("w", False, 18), VarPat("b", True, 21)), "conv", 10),
            VarPat("_", False, 34),
        ), None, 6),
    ), "act", 1)
    assert [o.op for o in pattern_ops(p)] == ["Conv", "Add", "Relu"]
    tensors, nodes = pattern_captures(p)
    assert tensors == {"x": False, "w": False, "b": True, "conv": False, "act": False}
    assert nodes == {"conv", "act"}


def test_domain_qualified_ops_and_ai_onnx():
    p = parse_pattern("graphopt.CBR(x, w) as y")
    assert (p.domain, p.op, p.bind) == ("graphopt", "CBR", "y")
    q = parse_pattern("com.microsoft.FusedConv(x)")
    assert (q.domain, q.op) == ("com.microsoft", "FusedConv")
    assert parse_pattern("ai.onnx.Relu(x)").domain == ""


def test_repeated_variable_is_one_capture():
    p = parse_pattern("Mul(x, Sigmoid(x))")
    assert pattern_captures(p) == ({"x": False}, set())
    assert p.commutative and not p.args[1].commutative


def test_empty_argument_list():
    assert parse_pattern("Foo()").args == ()


def test_whitespace_anywhere_between_tokens():
    p = parse_pattern("\t Relu( Add (x ,\n y ) )  as  act \n")
    assert (p.op, p.bind, p.col) == ("Relu", "act", 3)
    assert [(a.name, a.col) for a in p.args[0].args] == [("x", 14), ("y", 19)]


@pytest.mark.parametrize(
    "text,column,fragment",
    [
        ("Relu(Conv(x, w)", 16, "expected ',' or ')' but found end of text"),
        ("Relu(x,, y)", 8, "expected a name, number or string but found ','"),
        ("Relu(x) as", 11, "capture name after 'as'"),
        ("Relu(x as y)", 6, "'as' can only follow an op call"),
        ("Relu(0.5)", 6, "literals are not allowed in patterns"),
        ("Relu(x, alpha=1)", 1, "keyword arguments are not allowed"),
        ("x", 1, "must start with an op"),
        ("Relu(x) Sigmoid(y)", 9, "expected end of text"),
        ("Relu(x$)", 7, "unexpected character '$'"),
        ("Relu(x, \n  $)", 12, "unexpected character '$'"),  # the column of the character, after whitespace
        ("   ", 4, "expected a name, number or string but found end of text"),
        ("graphopt.CBR x", 14, "'(' after the op name"),
    ],
)
def test_pattern_errors_give_the_column(text, column, fragment):
    with pytest.raises(RuleSyntaxError) as info:
        parse_pattern(text)
    assert info.value.column == column, str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, RuleError)
    assert f"column {column}" in str(info.value)


def test_constraint_calls():
    c = parse_constraint("const_near(s, 1.4142, 1e-3)")
    assert c.name == "const_near"
    assert c.args == (Name("s", False, 12), Lit(1.4142, 15), Lit(0.001, 23))
    assert parse_constraint("attr_equals(y, 'activation', \"none\")").args[1:] == (Lit("activation", 16), Lit("none", 30))
    assert parse_constraint("rank(t, -1)").args[1] == Lit(-1, 9)
    for bad, col in (("constant", 1), ("constant(f(x))", 10), ("constant(b) as k", 1), ("constant(x=1)", 1)):
        with pytest.raises(RuleSyntaxError) as info:
            parse_constraint(bad)
        assert info.value.column == col, (bad, str(info.value))


def test_replacement():
    r = parse_replacement("graphopt.CBR(x, w, add_bias(b?, c, conv), r?, attrs=conv, activation='Relu')")
    assert (r.domain, r.op) == ("graphopt", "CBR")
    assert r.args[2] == Call("add_bias", "", (Name("b", True, 29), Name("c", False, 33), Name("conv", False, 36)), (), None, 20)
    assert r.args[3] == Name("r", True, 43)
    assert r.kwargs == (("attrs", Name("conv", False, 53)), ("activation", Lit("Relu", 70)))
    for bad, col in (("graphopt.CBR(x, 1)", 17), ("graphopt.CBR(x, attrs=y, w)", 26), ("graphopt.CBR(x) as z", 1),
                     ("graphopt.CBR(k=1, k=2)", 19), ("graphopt.CBR(Relu(x) as y)", 14)):
        with pytest.raises(RuleSyntaxError) as info:
            parse_replacement(bad)
        assert info.value.column == col, (bad, str(info.value))


def test_nesting_limit_and_its_column():
    deepest = "Relu(" * 64 + "x" + ")" * 64
    assert len(pattern_ops(parse_pattern(deepest))) == 64
    with pytest.raises(RuleSyntaxError, match="nested more than 64 levels deep") as info:
        parse_pattern("Neg(Relu(" * 32 + "Abs(x, y)" + "))" * 32)  # 65 open calls: the 65th "(" is too deep
    assert info.value.column == 32 * len("Neg(Relu(") + len("Abs(")


def test_parses_are_memoized_per_text_and_non_strings_still_fail_cleanly():
    assert parse_constraint("constant(b)") is parse_constraint("constant(b)")
    assert parse_replacement("graphopt.CBR(x, w)") is parse_replacement("graphopt.CBR(x, w)")
    for parse in (parse_pattern, parse_constraint, parse_replacement):
        with pytest.raises(RuleSyntaxError, match="expected a string"):
            parse(["Relu(x)"])
