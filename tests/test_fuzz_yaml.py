"""Fuzzing of untrusted.parse_yaml: arbitrary text and hostile YAML fragments are parsed or refused with one
ConfigError line."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from reprocube.errors import ConfigError
from reprocube.untrusted import parse_yaml

from fuzz_helpers import expect_value_or_error, fuzz_settings

yaml_fragments = st.sampled_from(
    [
        "a: ",
        "b:",
        "- ",
        "? ",
        ": ",
        "\n",
        "\n  ",
        "  ",
        "[",
        "]",
        "{",
        "}",
        ",",
        "&x ",
        "*x",
        "!!int ",
        "!!float ",
        "!!bool ",
        "!!str ",
        "!!binary ",
        "!!timestamp ",
        "!!set ",
        "!!omap ",
        "!!python/object:os.system ",
        "!local ",
        "%YAML 1.1\n---\n",
        "---\n",
        "...\n",
        "2001-02-30",
        "2001-13-01",
        "2001-12-14t21:59:43.10-05:00",
        "0x",
        "0o8",
        "0b102",
        "1_000",
        "190:20:30",
        "1:2" + "0" * 4400,
        ".nan",
        "-.inf",
        "1e999",
        "yes",
        "maybe",
        "~",
        "null",
        "'",
        '"',
        '"\\x',
        "|",
        ">-",
        "#",
        "\t",
        "\ufeff",
        "\x85",
        "9" * 4400,
        "1",
        "abc",
    ]
)
yaml_texts = st.one_of(st.text(max_size=80), st.lists(yaml_fragments | st.text(max_size=3), max_size=10).map("".join))


@fuzz_settings(500)
@given(yaml_texts)
@example("a: 2001-02-30")  # a date the resolver matches but datetime refuses (ValueError)
@example("a: !!int abc")
@example("a: !!bool maybe")  # KeyError inside PyYAML's bool constructor
@example("a: " + "1" * 5000)  # more digits than int() converts (ValueError)
@example("a: &x 1\nb: *x")  # an alias: refused, not expanded
@example("a: !!timestamp x")  # AttributeError inside PyYAML's timestamp constructor
@example("!!int")  # IndexError inside PyYAML's int constructor
def test_parse_yaml_on_arbitrary_text(text):
    blob = text.encode("utf-8", "surrogatepass")
    ok, result = expect_value_or_error(lambda: parse_yaml(blob, "fuzz.yaml", ConfigError), ConfigError)
    if not ok:
        assert result.startswith("fuzz.yaml")
