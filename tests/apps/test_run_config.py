"""Run config: ``--run-config`` text to raw values, then defaults + typed overrides."""

from __future__ import annotations

from typing import Any

import pytest

from fedcore.apps.run_config import flatten, parse_run_config, resolve_run_config, unflatten
from fedcore.errors import RunConfigError, UsageError

DECLARED: dict[str, Any] = {
    "num-server-rounds": 3,
    "learning-rate": 0.1,
    "use-gpu": False,
    "optimizer": "sgd",
}


def cli_text(overrides: dict[str, str]) -> str:
    """Overrides as they come from the command line: ``k=v k2=v2``."""
    return " ".join(f"{key}={value}" for key, value in overrides.items())


def resolve(overrides: dict[str, Any] | str) -> dict[str, Any]:
    return resolve_run_config(DECLARED, overrides)


def resolve_error(defaults: dict[str, Any] | None, overrides: dict[str, Any] | str) -> str:
    with pytest.raises(RunConfigError) as caught:
        resolve_run_config(defaults, overrides)
    return str(caught.value)


# ------------------------------------------------------------------ parse_run_config


def test_parse_splits_items_into_raw_text_values() -> None:
    assert parse_run_config('a=1 b="two words" c=0.5 d=true') == {
        "a": "1",
        "b": '"two words"',
        "c": "0.5",
        "d": "true",
    }


def test_parse_keeps_single_quoted_values_whole() -> None:
    assert parse_run_config("name='x y z' n=2") == {"name": "'x y z'", "n": "2"}


def test_parse_keeps_escaped_quotes_inside_double_quotes() -> None:
    assert parse_run_config(r'msg="say \"hi there\"" n=1') == {
        "msg": r'"say \"hi there\""',
        "n": "1",
    }


def test_parse_accepts_any_whitespace_between_items() -> None:
    assert parse_run_config("  a=1\tb=2\n c=3 ") == {"a": "1", "b": "2", "c": "3"}


def test_parse_keeps_everything_after_the_first_equals_sign() -> None:
    assert parse_run_config("expr=a=b empty=") == {"expr": "a=b", "empty": ""}


def test_parse_of_nothing_is_empty() -> None:
    assert parse_run_config("   ") == {}


def test_parse_lets_a_later_item_win() -> None:
    assert parse_run_config("a=1 a=2") == {"a": "2"}


@pytest.mark.parametrize("text", ["a", "a=1 b", "=3", "a=1 =2"])
def test_parse_refuses_items_without_key_and_value(text: str) -> None:
    with pytest.raises(RunConfigError, match="run-config items look like key=value; got"):
        parse_run_config(text)


@pytest.mark.parametrize("text", ['a="open', "a='open b=2"])
def test_parse_refuses_an_unclosed_quote(text: str) -> None:
    with pytest.raises(RunConfigError, match=r"cannot parse run-config .*: no closing"):
        parse_run_config(text)


def test_run_config_errors_are_usage_errors() -> None:
    with pytest.raises(UsageError):
        parse_run_config("nonsense")


# ------------------------------------------------------------------ declared defaults


def test_without_overrides_the_defaults_are_the_config() -> None:
    assert resolve_run_config(DECLARED, None) == DECLARED
    assert resolve_run_config(DECLARED, {}) == DECLARED


def test_overrides_replace_declared_values_and_keep_the_rest() -> None:
    assert resolve(cli_text({"num-server-rounds": "10"})) == {**DECLARED, "num-server-rounds": 10}


def test_resolving_does_not_change_the_defaults() -> None:
    defaults = dict(DECLARED)

    resolve_run_config(defaults, "num-server-rounds=10")

    assert defaults == DECLARED


def test_an_int_default_takes_an_int() -> None:
    config = resolve(cli_text({"num-server-rounds": "5"}))

    assert config["num-server-rounds"] == 5
    assert type(config["num-server-rounds"]) is int


@pytest.mark.parametrize("text", ["0.5", "true", '"5"', "five"])
def test_an_int_default_refuses_other_types(text: str) -> None:
    message = resolve_error(DECLARED, cli_text({"num-server-rounds": text}))

    assert message.startswith("run-config num-server-rounds expects int (default 3), got ")


def test_a_float_default_accepts_an_int_as_float() -> None:
    config = resolve(cli_text({"learning-rate": "3"}))

    assert config["learning-rate"] == 3.0
    assert type(config["learning-rate"]) is float


def test_a_float_default_takes_toml_floats() -> None:
    assert resolve(cli_text({"learning-rate": "1e-3"}))["learning-rate"] == 0.001


def test_a_float_default_refuses_a_bool() -> None:
    message = resolve_error(DECLARED, "learning-rate=true")

    assert message == "run-config learning-rate expects float (default 0.1), got True"


@pytest.mark.parametrize(("text", "value"), [("true", True), ("false", False)])
def test_a_bool_default_parses_true_and_false(text: str, value: bool) -> None:
    assert resolve(cli_text({"use-gpu": text}))["use-gpu"] is value


@pytest.mark.parametrize("text", ["1", "yes", "True"])
def test_a_bool_default_refuses_other_spellings(text: str) -> None:
    assert "run-config use-gpu expects bool" in resolve_error(DECLARED, cli_text({"use-gpu": text}))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("adam", "adam"),
        ('"adam"', "adam"),
        ("'adam w'", "adam w"),
        ("3", "3"),
        ("true", "true"),
        ("0.5", "0.5"),
        ("2024-01-01", "2024-01-01"),
        ("[1,2]", "[1,2]"),
        ("", ""),
    ],
)
def test_a_str_default_keeps_the_text(text: str, value: str) -> None:
    assert resolve(cli_text({"optimizer": text}))["optimizer"] == value


def test_an_unknown_key_is_refused_listing_the_declared_keys() -> None:
    message = resolve_error(DECLARED, "lr=0.5 num-server-rounds=2")

    assert message == (
        "unknown run-config key 'lr'; the app declares learning-rate, num-server-rounds, "
        "optimizer, use-gpu in [tool.fedcore.app.config]"
    )


def test_all_unknown_keys_are_named() -> None:
    message = resolve_error(DECLARED, "b=1 a=2")

    assert message.startswith("unknown run-config key 'a', 'b'; ")


def test_an_app_declaring_no_keys_refuses_every_override() -> None:
    message = resolve_error({}, "rounds=3")

    assert "the app declares no keys" in message


def test_nested_declared_keys_are_overridden_by_their_dotted_name() -> None:
    defaults = flatten({"model": {"depth": 2}, "rounds": 1})

    assert resolve_run_config(defaults, "model.depth=4") == {"model.depth": 4, "rounds": 1}


def test_unflatten_gives_back_the_nested_tables() -> None:
    """Flower's ``unflatten_dict``: the xgboost examples read ``context.run_config`` so."""
    table = {"model": {"depth": 2, "head": {"units": 8}}, "rounds": 1, "name": "x"}

    assert unflatten(flatten(table)) == table
    assert unflatten({"train.lr": 0.1, "train.epochs": 2}) == {"train": {"lr": 0.1, "epochs": 2}}


@pytest.mark.parametrize(
    "flat",
    [{"model": 1, "model.depth": 2}, {"model.depth": 2, "model": 1}, {"a.b": 1, "a.b.c": 2}],
)
def test_unflatten_refuses_a_key_that_is_both_a_value_and_a_table(flat: dict[str, int]) -> None:
    with pytest.raises(RunConfigError, match=r"is both a value and a table of keys under it"):
        unflatten(flat)


# ------------------------------------------------------------------ Python-typed overrides


def test_python_values_of_the_default_type_are_taken() -> None:
    assert resolve({"num-server-rounds": 7, "use-gpu": True, "optimizer": "adam"}) == {
        **DECLARED,
        "num-server-rounds": 7,
        "use-gpu": True,
        "optimizer": "adam",
    }


def test_a_python_int_for_a_float_default_becomes_float() -> None:
    config = resolve({"learning-rate": 1})

    assert type(config["learning-rate"]) is float


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num-server-rounds", 0.5),
        ("num-server-rounds", True),
        ("learning-rate", False),
        ("use-gpu", 1),
        ("optimizer", 3),
    ],
)
def test_python_values_are_type_checked_too(key: str, value: object) -> None:
    assert f"run-config {key} expects" in resolve_error(DECLARED, {key: value})


def test_python_lists_are_refused() -> None:
    message = resolve_error(DECLARED, {"num-server-rounds": [1, 2]})
    assert message.endswith("values must be bool, int, float or str")


# ------------------------------------------------------------------ no declared defaults


def test_without_declared_defaults_text_is_read_as_toml() -> None:
    raw = 'a=1 b="two words" c=0.5 d=true e=\'x\' f="3"'

    assert resolve_run_config(None, raw) == {
        "a": 1,
        "b": "two words",
        "c": 0.5,
        "d": True,
        "e": "x",
        "f": "3",
    }


def test_without_declared_defaults_non_toml_text_stays_a_string() -> None:
    assert resolve_run_config(None, "path=data/train.csv name=mlp") == {
        "path": "data/train.csv",
        "name": "mlp",
    }


def test_python_strings_are_never_read_as_toml() -> None:
    assert resolve_run_config(None, {"prompt": "1\nother = 2", "n": "3"}) == {
        "prompt": "1\nother = 2",
        "n": "3",
    }
    assert resolve({"optimizer": "true"})["optimizer"] == "true"
    assert "expects int" in resolve_error(DECLARED, {"num-server-rounds": "3"})


def test_without_declared_defaults_any_key_is_accepted() -> None:
    assert resolve_run_config(None, "anything-at-all=1") == {"anything-at-all": 1}


def test_without_declared_defaults_python_values_are_kept() -> None:
    assert resolve_run_config(None, {"n": 2, "lr": 0.5, "on": True, "s": "x"}) == {
        "n": 2,
        "lr": 0.5,
        "on": True,
        "s": "x",
    }


def test_without_declared_defaults_nested_dicts_become_dotted_keys() -> None:
    assert resolve_run_config(None, {"model": {"depth": 2}}) == {"model.depth": 2}


@pytest.mark.parametrize("value", ["[1,2]", [1, 2], None, b"raw"])
def test_without_declared_defaults_unsupported_values_are_refused(value: object) -> None:
    overrides = f"x={value}" if isinstance(value, str) else {"x": value}
    assert "bool, int, float or str" in resolve_error(None, overrides)


def test_without_declared_defaults_nothing_resolves_to_nothing() -> None:
    assert resolve_run_config(None, None) == {}
