"""A policy's ``defs.yaml`` as the code location reads it: each setting means what its text
says, whatever the YAML shape, and a file that is malformed, incomplete, written twice or not a
policy stops the load in one line naming the file, the line, the policy and the field.

The policies are loaded the way the code location loads them (a defs folder of
``favorites_maintenance.RetentionPolicy`` components), from a sandbox folder holding the real
``guest_favorites/defs.yaml`` and a ``guest_carts/defs.yaml`` written here.
"""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from favorites_maintenance.components.policy_tree import PolicyLoadError, load_policies
from favorites_maintenance_tests.helpers.carts_policy import CARTS, write_policy


@pytest.mark.parametrize("change, field, message", [
    # An empty guard is a rule of its own (test_rules_of_every_shape.py); a null one is no
    # guard written on purpose.
    ({"null_columns": None}, "null_columns", "policy 'guest_carts': null_columns is missing"),
    ({"table": 'carts."guest_carts"; DROP TABLE x'}, "table",
     "is not a lower-case SQL identifier"),
    ({"key_column": "Cart_UUID"}, "key_column",
     "key_column 'Cart_UUID' is not a lower-case SQL identifier"),
    ({"table": "guest_carts"}, "table", "table 'guest_carts' must be written schema.table"),
    ({"table": "db.carts.guest_carts"}, "table",
     "table 'db.carts.guest_carts' must be written schema.table"),
    ({"retention_days": 0}, "retention_days",
     "policy guest_carts, retention_days: '0' must be greater than 0"),
    ({"max_run_duration": "ten minutes"}, "max_run_duration",
     "policy guest_carts, max_run_duration: 'ten minutes' is not a duration"),
    ({"name": "Guest-Carts"}, "name", "policy 'Guest-Carts': name must be snake_case"),
    # Dagster's schema, through the component: the field, and the one it may have meant.
    ({"retention_dayz": 30}, "retention_dayz",
     ("policy guest_carts, retention_dayz: not a field of a retention policy (did you mean "
      "retention_days?)")),
    ({"batch_size": [100]}, "batch_size",
     "policy guest_carts, batch_size: [100] is not accepted (input should be a valid integer)"),
    ({"row_noun": "Guest-Cart"}, "row_noun",
     "policy guest_carts, row_noun: 'Guest-Cart' is not a row noun: lower-case words"),
    ({"name": "guest_favorites"}, None,
     "policy names must be unique, got ['guest_favorites', 'guest_favorites']"),
])
def test_a_malformed_policy_stops_the_load_in_one_line_naming_the_file_line_policy_and_field(
        sandbox, change, field, message):
    write_policy(sandbox.defs_folder_path, {**CARTS, **change})
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError) as refused:
        load_policies(tree)
    text = str(refused.value)
    assert message in text and "\n" not in text
    if field is not None:
        path = sandbox.defs_folder_path / "guest_carts" / "defs.yaml"
        [line] = [n for n, written in enumerate(path.read_text().splitlines(), 1)
                  if written.lstrip().startswith(f"{field}:")]
        where = path.relative_to(sandbox.project_root)
        assert text.startswith(f"{where}:{line}: "), text


def test_a_policy_file_missing_its_rule_says_which_fields_in_one_line(sandbox):
    folder = sandbox.defs_folder_path / "guest_orders"
    folder.mkdir()
    (folder / "defs.yaml").write_text("type: favorites_maintenance.RetentionPolicy\n"
                                      "attributes: {}\n")
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError) as refused:
        load_policies(tree)
    assert str(refused.value) == (
        f"{(folder / 'defs.yaml').relative_to(sandbox.project_root)}:2: policy guest_orders, "
        "required fields missing: name, table, key_column, age_column")


@pytest.mark.parametrize("written, days", [
    # As written, by the rules a variable's text is read with, not by YAML 1.1's (which reads
    # 030 as 24, 1:30 as 90, yes as 1 and 0x1e as 30).
    ("030", 30), ("30", 30), ("yes", None), ("1:30", None), ("0x1e", None), ("30.0", None),
])
def test_a_setting_means_what_its_yaml_text_says(sandbox, written, days):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    text = yaml.safe_dump({"type": "favorites_maintenance.RetentionPolicy",
                           "attributes": {**CARTS, "retention_days": 1}})
    (folder / "defs.yaml").write_text(text.replace("retention_days: 1",
                                                   f"retention_days: {written}"))
    with sandbox.build_component_tree() as tree:
        if days is None:
            with pytest.raises(PolicyLoadError, match=f"policy guest_carts, retention_days: "
                                                      f"'{written}' is not a whole number"):
                load_policies(tree)
        else:
            carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
            assert carts.settings.retention_days == days


def carts_yaml(attributes_text: str) -> str:
    """A guest-carts policy file whose ``attributes`` are written as ``attributes_text``."""
    return f"type: favorites_maintenance.RetentionPolicy\nattributes:{attributes_text}\n"


_RULE = ("\n  name: guest_carts\n  table: carts.guest_carts\n  key_column: cart_uuid"
         "\n  age_column: touched_at\n  null_columns: [customer_ref]")


_FLOW = ("{name: guest_carts, table: carts.guest_carts, key_column: cart_uuid, "
         "age_column: touched_at, null_columns: [customer_ref]")


@pytest.mark.parametrize("shape, attributes, days", [
    # Every way YAML can write a value is read as written, never by YAML 1.1's number rules.
    ("flow style", f" {_FLOW}, retention_days: 030}}", 30),
    ("value on the next line", _RULE + "\n  retention_days:\n    030", 30),
    ("an alias", _RULE + "\n  batch_size: &days 030\n  retention_days: *days", 30),
    ("a quoted key", _RULE + '\n  "retention_days": 030', 30),
    ("a comment", _RULE + "\n  retention_days: 030  # thirty", 30),
    ("a plain value folded over two lines", _RULE + "\n  retention_days: 3\n    65", None),
    ("flow style, hexadecimal", f" {_FLOW}, retention_days: 0x1e}}", None),
])
def test_a_setting_is_read_as_written_whatever_the_yaml_shape(sandbox, shape, attributes, days):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(attributes))
    with sandbox.build_component_tree() as tree:
        if days is None:
            with pytest.raises(PolicyLoadError, match="policy guest_carts, retention_days: "
                                                      "'.*' is not a whole number"):
                load_policies(tree)
        else:
            carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
            assert carts.settings.retention_days == days, shape


def test_a_setting_written_twice_is_refused_not_the_last_one_taken(sandbox):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(
        _RULE + "\n  retention_days: 30\n  retention_days: 3"))
    with sandbox.build_component_tree() as tree:
        with pytest.raises(PolicyLoadError, match="policy guest_carts, retention_days: is "
                                                  "written 2 times in the policy's defs.yaml"):
            load_policies(tree)


def test_an_unquoted_hh_mm_ss_duration_is_the_duration_it_says(sandbox):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(
        _RULE + "\n  stale_after: 48:00:00\n  max_run_duration: 00:10:00"))
    with sandbox.build_component_tree() as tree:
        carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
    assert carts.settings.stale_after == dt.timedelta(hours=48)
    assert carts.settings.max_run_duration == dt.timedelta(minutes=10)


@pytest.mark.parametrize("text, line, message", [
    (carts_yaml(_RULE + "\n  retention_days:\t030"), 8,
     "policy guest_carts: not valid YAML: found character '\\t' that cannot start any token"),
    (carts_yaml(_RULE + "\n  retention_days: *nowhere"), 8,
     "policy guest_carts: not valid YAML: found undefined alias 'nowhere'"),
    ("type: favorites_maintenance.RetentionPolicy\nowner: me\nattributes:" + _RULE, 2,
     "policy guest_carts, owner: not a key of a component file"),
    ("type: favorites_maintenance.RetentionPolicies\nattributes:" + _RULE, 1,
     ("policy guest_carts, type: Module `favorites_maintenance` has no attribute "
      "`RetentionPolicies`. (a retention policy is type: favorites_maintenance.RetentionPolicy)")),
])
def test_a_file_that_is_not_a_policy_is_one_load_error_naming_the_file(sandbox, text, line,
                                                                        message):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(text)
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError) as refused:
        load_policies(tree)
    where = (folder / "defs.yaml").relative_to(sandbox.project_root)
    assert str(refused.value) == f"{where}:{line}: {message}"


def test_a_policy_setting_read_from_the_environment_is_reported_under_its_variable(
        sandbox, monkeypatch):
    write_policy(sandbox.defs_folder_path,
                 {**CARTS, "retention_days": "{{ env.CARTS_RETENTION_DAYS }}"})
    monkeypatch.setenv("CARTS_RETENTION_DAYS", "0")
    with sandbox.build_component_tree() as tree:
        with pytest.raises(PolicyLoadError, match="CARTS_RETENTION_DAYS: '0' must be greater"):
            load_policies(tree)
    monkeypatch.delenv("CARTS_RETENTION_DAYS")
    with sandbox.build_component_tree() as tree:
        carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
    assert carts.settings.retention_days == 365  # unset: the default


@pytest.mark.parametrize("written, drop, kept_for", [
    ("", False, dt.timedelta(days=7)),
    ("\n  drop_expired_partitions: true", True, dt.timedelta(days=7)),
    ("\n  drop_expired_partitions: true\n  detached_retention: P30D", True,
     dt.timedelta(days=30)),
    # null is a value of its own here: kept for good, never dropped.
    ("\n  drop_expired_partitions: true\n  detached_retention: null", True, None),
    ("\n  drop_expired_partitions: true\n  detached_retention: ~", True, None),
    ("\n  drop_expired_partitions: true\n  detached_retention: PT0S", True, dt.timedelta(0)),
])
def test_drop_expired_partitions_and_detached_retention_load_without_the_database(
        sandbox, written, drop, kept_for):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(_RULE + written))
    with sandbox.build_component_tree() as tree:
        carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
    assert carts.settings.drop_expired_partitions is drop
    assert carts.settings.detached_retention == kept_for


@pytest.mark.parametrize("written, said", [
    ("\n  drop_expired_partitions: yes", "drop_expired_partitions: 'yes' is not true or false"),
    ("\n  detached_retention: -P1D", "detached_retention: '-P1D' must not be negative"),
    ("\n  drop_expired_partitions: true\n  detached_retention: -P1D",
     (r"detached_retention: '-P1D' must not be negative \(PT0S drops a detached table on the "
      r"next run, null keeps it for good\)")),
    ("\n  drop_expired_partitions: true\n  detached_retention: P3651D",
     "detached_retention: 'P3651D' must be at most P3650D"),
    ("\n  detached_retention: P30D",
     ("policy guest_carts, detached_retention is set, but policy guest_carts, "
      "drop_expired_partitions is not true")),
    ("\n  drop_expired_partitions: false\n  detached_retention: null",
     "detached_retention is set, but .*drop_expired_partitions is not true"),
    ("\n  drop_expired_partitions: true\n  archive_table: carts.archive",
     "archive_table and policy guest_carts, drop_expired_partitions cannot be set together"),
])
def test_a_bad_partition_setting_is_refused_at_load_naming_it(sandbox, written, said):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(_RULE + written))
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError, match=said):
        load_policies(tree)
