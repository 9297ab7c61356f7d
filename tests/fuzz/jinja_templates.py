"""A hypothesis strategy for Jinja chat templates: statements (output, for, if, set, namespace attributes, values
doubling in a loop, macros, filter blocks, loop controls, raise_exception, generation blocks) around expressions
built from the variables a chat template sees, literals of every size, operators, filters and string methods; with
stray text, unclosed tags and random characters mixed in, so that parse errors are fuzzed too."""

from __future__ import annotations

from hypothesis import strategies as st

VARIABLES = ["messages", "message", "message['role']", "message.content", "messages[0]", "messages[-1]['content']",
             "loop.index", "loop.last", "ns.v", "bos_token", "eos_token", "add_generation_prompt", "tools", "x",
             "undefined_name", "range", "namespace", "raise_exception", "strftime_now", "self", "cycler", "joiner",
             "lipsum", "dict", "''.__class__", "messages.__class__.__mro__", "loop.cycle"]
FILTERS = ["string", "list", "join", "length", "tojson", "upper", "trim", "first", "last", "reverse", "sort",
           "unique", "sum", "int", "float", "abs", "title", "default", "dictsort", "items", "max", "min", "round",
           "pprint", "urlize", "wordcount", "safe", "escape", "center", "indent", "wordwrap", "truncate", "replace",
           "batch", "slice", "format", "map", "select", "reject", "selectattr", "groupby", "attr", "random",
           "filesizeformat", "xmlattr", "striptags", "capitalize", "count"]
METHODS = ["upper", "split", "join", "replace", "format", "center", "ljust", "zfill", "strip", "startswith",
           "items", "keys", "values", "get", "append", "pop", "update", "count", "index", "expandtabs", "encode",
           "__len__", "mro", "__subclasses__"]
OPERATORS = ["+", "-", "*", "**", "/", "//", "%", "~", "==", "!=", "<", "in", "not in", "and", "or", "is", "is not"]

numbers = st.sampled_from(["0", "1", "2", "3", "-1", "60", "1000", "100000", "10**6", "2**64", "1e308", "0.5"]) | \
    st.integers(-10**12, 10**12).map(str)
strings = st.sampled_from(["''", "'x'", "'a'*100", "'<|im_start|>'", "'\\n'", "'%s'", "'{0:>99}'", "'%999d'",
                           "'\\t'*8"]) | st.text(max_size=6).map(repr)
atoms = st.sampled_from(VARIABLES) | numbers | strings | st.sampled_from(["none", "true", "false", "[]", "{}"])


def _compound(inner: st.SearchStrategy) -> st.SearchStrategy:
    pair = st.tuples(inner, inner)
    return st.one_of(
        st.tuples(inner, st.sampled_from(OPERATORS), inner).map(lambda e: f"({e[0]} {e[1]} {e[2]})"),
        st.tuples(inner, st.sampled_from(FILTERS)).map(lambda e: f"{e[0]}|{e[1]}"),
        st.tuples(inner, st.sampled_from(FILTERS), inner).map(lambda e: f"{e[0]}|{e[1]}({e[2]})"),
        st.tuples(inner, st.sampled_from(METHODS), st.lists(inner, max_size=2)).map(
            lambda e: f"{e[0]}.{e[1]}({', '.join(e[2])})"),
        pair.map(lambda e: f"{e[0]}[{e[1]}]"),
        pair.map(lambda e: f"[{e[0]}, {e[1]}]"),
        pair.map(lambda e: f"{{{e[0]}: {e[1]}}}"),
        st.tuples(inner, inner, inner).map(lambda e: f"({e[0]} if {e[1]} else {e[2]})"),
        inner.map(lambda e: f"range({e})"),
        inner.map(lambda e: f"namespace(v={e})"),
        inner.map(lambda e: f"not {e}"),
    )


expressions = st.recursive(atoms, _compound, max_leaves=6)
names = st.sampled_from(["x", "ns.v", "message", "loop", "messages", "y"])


def _blocks(inner: st.SearchStrategy) -> st.SearchStrategy:
    body = st.lists(inner, max_size=3).map("".join)
    return st.one_of(
        st.tuples(names, expressions, body).map(lambda e: f"{{% for {e[0]} in {e[1]} %}}{e[2]}{{% endfor %}}"),
        st.tuples(expressions, body, body).map(lambda e: f"{{% if {e[0]} %}}{e[1]}{{% else %}}{e[2]}{{% endif %}}"),
        st.tuples(expressions, body).map(lambda e: f"{{% macro m(a) %}}{e[1]}{{% endmacro %}}{{{{ m({e[0]}) }}}}"),
        st.tuples(st.sampled_from(["upper", "trim", "string"]), body).map(
            lambda e: f"{{% filter {e[0]} %}}{e[1]}{{% endfilter %}}"),
        body.map(lambda e: f"{{% generation %}}{e}{{% endgeneration %}}"),
    )


# a value that doubles on each turn of a loop: the growth a render's limits (time, size, memory) must stop
GROWTHS = ["[ns.v, ns.v]", "ns.v + ns.v", "ns.v ~ ns.v", "ns.v * 2", "(ns.v|string) * 2", "ns.v|tojson ~ ns.v",
           "{'a': ns.v, 'b': ns.v}", "ns.v|list + ns.v|list"]
growth = st.tuples(st.sampled_from([1, 10, 30, 60, 1000]), st.sampled_from(GROWTHS)).map(
    lambda e: f"{{% for i in range({e[0]}) %}}{{% set ns.v = {e[1]} %}}{{% endfor %}}")
statements = st.one_of(
    growth,
    expressions.map(lambda e: f"{{{{ {e} }}}}"),
    st.tuples(names, expressions).map(lambda e: f"{{% set {e[0]} = {e[1]} %}}"),
    st.sampled_from(["{% break %}", "{% continue %}", "{{ raise_exception('no') }}", "{%- if true -%}",
                     "{% endfor %}", "{{", "{%", "}}", "{# note #}", "{% raw %}{{ x }}{% endraw %}", "\n", " "]),
    st.text(max_size=8),
)
templates = st.tuples(st.booleans(), st.lists(st.recursive(statements, _blocks, max_leaves=8), min_size=1,
                                              max_size=5)).map(
    lambda e: ("{% set ns = namespace(v=['x']) %}" if e[0] else "") + "".join(e[1]))
