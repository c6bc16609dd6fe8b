"""Rule files: loading, ``for`` expansion, and errors that name the file, line and rule."""

from __future__ import annotations

import textwrap

import pytest

from graphopt.errors import RuleError, UsageError
from graphopt.rewrite import check_rule_file, load_rules, shipped_rules_dir

GOOD = """
[[rule]]
name = "neg_relu"
doc = "Relu(Neg(x)) => Neg(Relu... no: a test rule"
pattern = "Relu(Neg(x) as n)"
replace = "Neg(x)"
"""


def _write(tmp_path, text, name="r.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def test_shipped_files_are_clean():
    files = sorted(shipped_rules_dir().glob("*.toml"))
    assert [f.name for f in files] == ["attention.toml", "conv.toml", "gelu.toml", "gemm.toml", "mlp.toml", "norm.toml", "rope.toml"]
    for f in files:
        assert check_rule_file(f) == []


def test_for_expansion_params_let_and_splice(tmp_path):
    p = _write(tmp_path, """
        [params]
        gates = [ { op = "Sigmoid", extra = ["rank(x, 4)"] }, { op = "HardSigmoid", extra = [] } ]

        [[rule]]
        name = "gate_{g.op}_{k}"
        doc = "x * {g.op}(x)"
        for.g = "gates"
        for.k = [1, 2]
        let.inner = "{g.op}(x)"
        pattern = "Mul(x, {inner})"
        where = ["{g.extra}", "constant_or_absent(x)"]
        replace = "Relu(x)"
        priority = 7
    """)
    rules = load_rules(shipped=False, paths=[p])
    assert rules.names() == ["gate_HardSigmoid_1", "gate_HardSigmoid_2", "gate_Sigmoid_1", "gate_Sigmoid_2"]
    r = rules.get("gate_Sigmoid_2")
    assert r.pattern_text == "Mul(x, Sigmoid(x))"
    assert [c.text for c in r.where] == ["rank(x, 4)", "constant_or_absent(x)"]
    assert [c.text for c in rules.get("gate_HardSigmoid_1").where] == ["constant_or_absent(x)"]
    assert r.priority == 7 and r.line == 4 and r.file == str(p) and r.family == "gate_{g.op}_{k}"


def test_default_priority_is_pattern_size_and_order_is_priority_then_name(tmp_path):
    p = _write(tmp_path, GOOD + """
[[rule]]
name = "a_small"
doc = "d"
pattern = "Relu(x)"
replace = "Sigmoid(x)"

[[rule]]
name = "b_big"
doc = "d"
pattern = "Relu(Neg(Abs(x)))"
replace = "Sigmoid(x)"
""")
    rules = load_rules(shipped=False, paths=[tmp_path])
    assert [(r.name, r.priority) for r in rules] == [("b_big", 3), ("neg_relu", 2), ("a_small", 1)]
    assert load_rules(shipped=False, paths=[p]).names() == rules.names()


@pytest.mark.parametrize(
    "body,line,rule,fragment",
    [
        ('name = "r1"\ndoc = "d"\npattern = "Reluu(x)"\nreplace = "Relu(x)"', 3, "r1", "unknown op 'Reluu'"),
        ('name = "r1"\ndoc = "d"\npattern = "graphopt.Nope(x)"\nreplace = "Relu(x)"', 3, "r1", "unknown op 'graphopt.Nope'"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nwhere = ["bogus(x)"]\nreplace = "Relu(x)"', 4, "r1", "unknown constraint bogus()"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nwhere = ["constant(y)"]\nreplace = "Relu(x)"', 4, "r1", "uses 'y', which the pattern does not bind"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nwhere = ["single_use(x)"]\nreplace = "Relu(x)"', 4, "r1", "must be a node capture"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nwhere = ["rank(x)"]\nreplace = "Relu(x)"', 4, "r1", "takes 2 arguments, got 1"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nreplace = "Relu(z)"', 4, "r1", "uses 'z', which the pattern does not bind"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nreplace = "graphopt.Fused(x)"', 4, "r1", "unknown replacement op 'graphopt.Fused'"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nreplace = "Relux(x)"', 4, "r1", "unknown replacement op 'Relux'"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nreplace = "graphopt.CBR(x, x, bogus=1)"', 4, "r1", "unknown attribute 'bogus' for graphopt.CBR"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nreplace = "graphopt.CBR(x, x, nope(x))"', 4, "r1", "unknown builder nope()"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nreplace = "Neg(graphopt.Nope(x))"', 4, "r1", "unknown replacement op 'graphopt.Nope'"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nreplace = "Neg(graphopt.CBR(x, x, bogus=1))"', 4, "r1", "unknown attribute 'bogus' for graphopt.CBR"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x) as r"\nreplace = "Neg(activation_of(r, k=1))"', 4, "r1", "builder calls take positional arguments only"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(Conv(x, w, b?))"\nreplace = "graphopt.CBR(x, w, b)"', 4, "r1", "write 'b?'"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(Conv(x, w) as c)"\nreplace = "Relu(x)"\nkeep = ["x"]', 5, "r1", "keep entry 'x' is not a node capture"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x"\nreplace = "Relu(x)"', 3, "r1", "column 7"),
        ('name = "r1"\ndoc = "d"\npattern = "Relu(x)"\nreplace = "Relu(x)"\nfrobnicate = 1', 5, "r1", "unknown key 'frobnicate'"),
        ('name = "r1"\npattern = "Relu(x)"\nreplace = "Relu(x)"', 0, "r1", "missing required key 'doc'"),
        ('name = "r_{a}"\ndoc = "d"\nfor.b = [1]\npattern = "Relu(x)"\nreplace = "Relu(x)"', 1, "r_{a}", "unknown placeholder {a}"),
        ('name = "r1"\ndoc = "d"\nfor.a = "nolist"\npattern = "Relu(x)"\nreplace = "Relu(x)"', 3, "r1", "names no [params] list"),
        ('name = "r1"\ndoc = "d"\nfor.a = [1, 2]\npattern = "Relu(x)"\nreplace = "Relu(x)"', 0, "r1", "duplicate rule name"),
    ],
)
def test_issues_name_file_line_and_rule(tmp_path, body, line, rule, fragment):
    # Two lines of preamble and a good rule first, so line numbers are not trivially 1.
    text = "# test\n\n" + GOOD.strip() + "\n\n[[rule]]\n" + body + "\n"
    p = tmp_path / "bad.toml"
    p.write_text(text)
    issues = check_rule_file(p)
    assert issues, "expected an issue"
    issue = issues[0]
    header = 9  # the line of the second [[rule]]
    assert (issue.file, issue.rule) == (str(p), rule)
    expected_line = header + line  # ``line`` counts the rule's body lines; 0 is the [[rule]] header
    assert issue.line == expected_line, (issue, text.splitlines()[issue.line - 1])
    assert fragment in issue.message, issue
    assert str(issue).startswith(f"{p}:{expected_line}: rule {rule!r}: ")
    with pytest.raises(RuleError) as info:
        load_rules(shipped=False, paths=[p])
    assert f"{p}:{expected_line}" in str(info.value) and "\n" not in str(info.value)


def test_toml_syntax_error_reports_tomllib_line(tmp_path):
    p = _write(tmp_path, GOOD + '\n[[rule]]\nname = "x"\ndoc = = "d"\n')
    (issue,) = check_rule_file(p)
    assert issue.line == 9 and "TOML syntax error" in issue.message and issue.rule == ""


def test_unknown_top_level_key(tmp_path):
    p = _write(tmp_path, GOOD + "\n[ruless]\nx = 1\n")
    (issue,) = check_rule_file(p)
    assert issue.line == 7 and "unknown top-level key 'ruless'" in issue.message


def test_duplicate_names_across_files(tmp_path):
    _write(tmp_path, GOOD, "a.toml")
    _write(tmp_path, GOOD, "b.toml")
    with pytest.raises(RuleError, match=r"'neg_relu' is defined twice \(.*a.toml:1 and .*b.toml:1\)"):
        load_rules(shipped=False, paths=[tmp_path])


def test_disable(tmp_path):
    shipped = load_rules()
    assert "conv_relu" in shipped
    fewer = load_rules(disable=["conv_relu"])
    assert "conv_relu" not in fewer and len(fewer) == len(shipped) - 1
    globbed = load_rules(disable=["gemm*"])
    assert not any(n.startswith("gemm") for n in globbed.names()) and "matmul_bias" in globbed
    with pytest.raises(UsageError) as info:
        load_rules(disable=["conv_reluu"])
    msg = str(info.value)
    assert "--disable conv_reluu: no rule of that name; did you mean conv_relu" in msg and "matmul_bias" not in msg


def test_missing_path(tmp_path):
    with pytest.raises(RuleError, match="does not exist"):
        load_rules(paths=[tmp_path / "nope.toml"])


def test_rule_files_never_execute_code(tmp_path):
    # Anything shaped like Python is just text to the parser: it fails to parse, it never runs.
    p = _write(tmp_path, """
        [[rule]]
        name = "evil"
        doc = "d"
        pattern = "Relu(__import__('os').system('touch pwned'))"
        replace = "Relu(x)"
    """)
    (issue,) = check_rule_file(p)
    assert "literals are not allowed" in issue.message or "expected" in issue.message
    assert not (tmp_path / "pwned").exists()
