"""The ``favorites_maintenance.RetentionPolicy`` component: a retention policy declared as YAML.

One folder per policy, ``favorites_maintenance/defs/<policy>/defs.yaml``::

    type: favorites_maintenance.RetentionPolicy
    attributes:
      name: guest_carts                 # snake_case; every Dagster name derives from it
      table: carts.guest_carts          # schema.table
      key_column: cart_uuid             # unique key (bigint, uuid, text, ...)
      age_column: touched_at            # timestamptz
      null_columns: [customer_ref]      # the guard: rows with all of them NULL are guest rows
                                        # ([] on purpose: no guard, every old row is prunable)
      retention_days: 30                # optional, like every setting below
      cron: "{{ env.GUEST_CARTS_CLEANUP_CRON }}"
      database_url_env: CARTS_DATABASE_URL   # optional: the variable holding its database's URL
      archive_table: carts.guest_carts_archive   # optional: deleted rows kept there a while

The rule's fields (``name``, ``table``, ``key_column``, ``age_column``, ``null_columns``) are
required; ``null_columns: []`` declares a rule with no guard, and a policy that leaves the field
out is refused (a forgotten guard would delete account rows). The optional settings are the fields of
:class:`~favorites_maintenance.config.policy_settings.PolicySettings`, declared there once; this
component takes its fields, their types and their descriptions from that table. A setting may
come from the environment through the component's templating (``"{{ env.X }}"``: an unset
variable is the default, an empty one an error naming the variable). Identifiers reach SQL only
as SQLAlchemy ``Table``/``Column`` objects, never formatted into a statement.

A literal setting is read as its text in the file, not as YAML 1.1 reads it (``030`` would be
24, ``yes`` would be 1): the same text a variable would hold, checked by the same parser
(:func:`_setting_value`, the one place this happens).

Errors, at load (the code location does not load):

- a name that is not an identifier, ``null_columns`` left out, a value out of bounds:
  :class:`~favorites_maintenance.config.policy.PolicyError` or
  :class:`~favorites_maintenance.config.parsers.SettingsError`, naming the policy, the field (or
  the variable it was read from) and the value;

and at the policy's first run, before anything is deleted: a missing table or column, an age
column that is not ``timestamptz``, a key that is not unique
(:class:`~favorites_maintenance.retention.errors.TableShapeError`, naming the table and the
column).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import textwrap
import weakref
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

import dagster as dg
import pydantic
import yaml
from pydantic import ConfigDict, Field

from favorites_maintenance.components.load_errors import (
    PolicyLocationError,
    location_error,
    quiet_previews,
    schema_error,
)
from favorites_maintenance.config.deployment import (
    check_database_urls,
    load_deployment_settings,
)
from favorites_maintenance.config.parsers import SettingsError, iso_duration
from favorites_maintenance.config.policy import NAMED_FIELDS, Policy, PolicyError
from favorites_maintenance.config.policy_settings import (
    SETTINGS,
    default_of,
    parse_policy_settings,
)
from favorites_maintenance.retention.rule import RetentionRule, RuleError

#: A whole field written as ``{{ env.NAME }}``: messages then name the variable.
_ENV_TEMPLATE = re.compile(r"^\s*\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}\s*$")


@dataclass(frozen=True)
class SettingValue:
    """One policy setting as the YAML gave it, before its parser checks it.

    Attributes:
        text: the value's text: a literal as written in the file, or what the variable holds;
            ``None`` when the variable is unset (the setting takes its default).
        variable: the environment variable it is read from (``"{{ env.X }}"``), or ``None``.
        written_times: how many times the field's key is written in its policy (YAML keeps
            the last one silently; more than one is refused).
    """

    text: str | None
    variable: str | None = None
    written_times: int = 1


def _setting_value(context: dg.ResolutionContext, raw: Any) -> SettingValue | None:
    """Resolve one setting field: ``None`` (unset) or its text and variable. A YAML ``null``
    is unset, except for a setting whose ``null`` is a value (``detached_retention``), which
    is then given the text ``null``."""
    if raw is None:
        name = str(context.path[-1]) if context.path else ""
        declared = SETTINGS.get(name)
        if declared is not None and declared.null_is_value and _is_written(context):
            return SettingValue("null")
        return None
    if isinstance(raw, str) and (match := _ENV_TEMPLATE.match(raw)):
        # The variable's own text: Dagster's rendering would read "1e3" as 1000.0.
        return SettingValue(os.environ.get(match.group(1)), match.group(1))
    if isinstance(raw, (list, dict)):
        # A list or a mapping (owners, tags) reaches its parser as JSON, which YAML reads.
        return SettingValue(json.dumps(context.resolve_value(raw)),
                            written_times=_as_written(context)[1])
    written, times = _as_written(context)
    return SettingValue(written or str(context.resolve_value(raw)), written_times=times)


def _as_written(context: dg.ResolutionContext) -> tuple[str | None, int]:
    """The setting at ``context``'s path as its text in the YAML file, read without YAML 1.1's
    type rules (flow style, aliases and values on the next line included), and how many times
    its key is written in its mapping; ``(None, 1)`` when its position is unknown (Dagster's
    parsed value is used then)."""
    tree = context.source_position_tree
    position = tree.lookup(context.path) if tree is not None and context.path else None
    if position is None:
        return None, 1
    try:
        text = _policy_text(position.filename)
    except OSError:
        return None, 1
    attributes = _attributes_at(text, position.start.line - 1)
    if attributes is None:
        return None, 1
    node, values = attributes
    key = str(context.path[-1])
    times = sum(1 for k, _ in node.value if k.value == key)
    value = values.get(key)
    return (value if isinstance(value, str) and value else None), max(times, 1)


def _is_written(context: dg.ResolutionContext) -> bool:
    """Whether the setting at ``context``'s path is written in its policy's YAML (``null``
    included)."""
    tree = context.source_position_tree
    position = tree.lookup(context.path) if tree is not None and context.path else None
    if position is None:
        return False
    try:
        text = _policy_text(position.filename)
    except OSError:
        return False
    attributes = _attributes_at(text, position.start.line - 1)
    return attributes is not None and str(context.path[-1]) in attributes[1]


def _policy_text(filename: str) -> str:
    """The text of policy file ``filename``, read once for all the settings of its policy (and
    again only once the file changes).

    Raises:
        OSError: the file cannot be read.
    """
    stat = os.stat(filename)
    return _read_policy_text(filename, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _read_policy_text(filename: str, mtime_ns: int, size: int) -> str:
    return Path(filename).read_text()


#: libyaml's parser when PyYAML has it: the same nodes and marks, parsed in C.
_BASE_LOADER = getattr(yaml, "CBaseLoader", yaml.BaseLoader)


@functools.lru_cache(maxsize=8)
def _documents(text: str) -> tuple[yaml.Node, ...] | None:
    """The documents of policy file ``text`` as YAML nodes, parsed once for every setting
    of every policy in it; ``None`` when it is not YAML."""
    try:
        return tuple(yaml.compose_all(text, Loader=_BASE_LOADER))
    except yaml.YAMLError:
        return None


def _attributes_at(text: str, line: int) -> tuple[yaml.MappingNode, dict] | None:
    """The ``attributes`` mapping of the document of ``text`` holding 0-based ``line``: its
    node, and its values as text (every scalar a string as written, as ``yaml.BaseLoader``
    reads it; a key written twice has its last value, as YAML keeps it)."""
    for node in _documents(text) or ():
        if not node.start_mark.line <= line <= node.end_mark.line:
            continue
        if not isinstance(node, yaml.MappingNode):
            return None
        attributes = [v for k, v in node.value
                      if isinstance(k, yaml.ScalarNode) and k.value == "attributes"]
        if not attributes or not isinstance(attributes[-1], yaml.MappingNode):
            return None
        values = {k.value: v.value if isinstance(v, yaml.ScalarNode) else v
                  for k, v in attributes[-1].value if isinstance(k, yaml.ScalarNode)}
        return attributes[-1], values
    return None


def _as_text(context: dg.ResolutionContext, raw: Any) -> str | None:
    """A field taken as written, never rendered: ``database_url_env`` names a variable, and
    rendering ``{{ env.X }}`` would put the URL it holds into the definitions."""
    return None if raw is None else str(raw)


def _setting_field(name: str) -> tuple[Any, Any]:
    declared = SETTINGS[name]
    # inject_before_resolve=False: the resolver sees "{{ env.X }}" itself, to name X.
    resolver = dg.Resolver(_setting_value, model_field_type=declared.yaml_type | None,
                           inject_before_resolve=False,
                           description=f"{declared.description} ({declared.bounds})")
    return Annotated[SettingValue | None, resolver], Field(default=None)


def _rendered(context: dg.ResolutionContext, raw: Any) -> Any:
    """A rule field: rendered by the component's templating when it holds a template
    (``{{ ... }}``), else as written. Dagster's own resolution compiles every string as a
    template, a cost per field and per policy that plain names do not need."""
    if isinstance(raw, list):
        return [_rendered(context, item) for item in raw]
    if isinstance(raw, str) and ("{{" in raw or "{%" in raw):
        return context.resolve_value(raw)
    return raw


def _rule_field(field_type: Any, description: str | None = None) -> dg.Resolver:
    return dg.Resolver(_rendered, model_field_type=field_type, inject_before_resolve=False,
                       description=description)


_NULL_COLUMNS = ("required: the guard, columns that must all be NULL for a row to be prunable; "
                 "[] on purpose for a rule with no guard")


class _RuleFields(dg.Model):
    """The rule and the names: what every policy writes."""

    name: Annotated[str, _rule_field(str)] = Field(
        description="snake_case; every Dagster name of the policy derives from it")
    table: Annotated[str, _rule_field(str)] = Field(description="schema.table")
    key_column: Annotated[str, _rule_field(str)] = Field(description="unique, NOT NULL key "
                                                                     "column")
    age_column: Annotated[str, _rule_field(str)] = Field(
        description="timestamptz column compared with the cutoff")
    # Optional in the schema only so that leaving it out gets a message of its own (below).
    null_columns: Annotated[list[str] | None, _rule_field(
        list[str] | None, _NULL_COLUMNS)] = Field(default=None, description=_NULL_COLUMNS)


def _named_field(name: str) -> tuple[Any, Any]:
    """The optional schema field of a :class:`Policy` field that is not a setting."""
    declared = NAMED_FIELDS[name]
    # The resolver's description is the one the schema Dagster builds shows.
    resolver = dg.Resolver(_as_text if declared["as_written"] else _rendered,
                           model_field_type=str | None, inject_before_resolve=False,
                           description=declared["description"])
    return Annotated[str | None, resolver], Field(default=None)


#: After the rule's fields, the policy's other names (:data:`NAMED_FIELDS`), then one optional
#: field per :class:`PolicySettings` field.
_PolicyFields = pydantic.create_model(
    "PolicyFields", __base__=_RuleFields, **{name: _named_field(name) for name in NAMED_FIELDS},
    **{name: _setting_field(name) for name in SETTINGS})


#: The rule's fields, which every policy file writes (the scaffold with placeholders).
_RULE_FIELDS = ("table", "key_column", "age_column", "null_columns")
#: What the scaffold writes for each of them until it is filled in.
_PLACEHOLDERS = {"table": "<schema>.<table>", "key_column": "<key column>",
                 "age_column": "<timestamptz column>", "null_columns": ["<guard column>"]}


def _is_placeholder(value: Any) -> bool:
    """Whether ``value`` (a field's, or one of a list's) is still written ``<...>``."""
    values = value if isinstance(value, list) else [value]
    return any(isinstance(v, str) and v.startswith("<") and v.endswith(">") for v in values)


class RetentionPolicyScaffoldParams(pydantic.BaseModel):
    """What ``dg scaffold defs favorites_maintenance.RetentionPolicy FOLDER`` may fill in
    (``--table shop.guest_orders --key-column id ...``); a field left out is written as a
    placeholder, which the code location refuses until it is replaced."""

    table: str | None = Field(default=None, description="schema.table of the table to prune")
    key_column: str | None = Field(default=None, description="its unique, NOT NULL key")
    age_column: str | None = Field(default=None, description="its timestamptz age column")
    null_columns: str | None = Field(default=None, description="the guard, comma-separated: "
                                     "columns that must all be NULL")


class RetentionPolicyScaffolder(dg.Scaffolder[RetentionPolicyScaffoldParams]):
    """Writes a policy file with every rule field (given, or a placeholder) and every optional
    setting commented out at its default: ``dg scaffold defs favorites_maintenance.
    RetentionPolicy guest_orders`` writes ``defs/guest_orders/defs.yaml``."""

    @classmethod
    def get_scaffold_params(cls) -> type[RetentionPolicyScaffoldParams]:
        return RetentionPolicyScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[RetentionPolicyScaffoldParams]) -> None:
        if request.scaffold_format != "yaml":
            dg.scaffold_component(request)
            return
        path = request.target_path / "defs.yaml"
        text = policy_template(request.target_path.name, request.params, request.type_name)
        if request.append:
            with path.open("a") as f:
                f.write("---\n" + text)
        else:
            path.write_text(text)


def policy_template(name: str, params: RetentionPolicyScaffoldParams | None = None,
                    type_name: str = "favorites_maintenance.RetentionPolicy",
                    today: dt.date | None = None) -> str:
    """The text of a new policy file for policy ``name``: the rule's fields from ``params``
    or as placeholders, each with what it means, then every optional setting commented out
    at its default (``partitions_start`` set to the day before ``today``, default the current
    UTC date: the partition the policy's first run launches exists at once)."""
    given = params.model_dump() if params is not None else {}
    given["null_columns"] = ([c.strip() for c in given["null_columns"].split(",") if c.strip()]
                             if given.get("null_columns") else None)
    fields = {field: given.get(field) or _PLACEHOLDERS[field] for field in _RULE_FIELDS}
    unfilled = [field for field in _RULE_FIELDS if _is_placeholder(fields[field])]
    lines = _comment(
        f"Retention policy {name}: delete the rows of `table` whose `null_columns` are all "
        "NULL and whose `age_column` is older than `retention_days`, once a day (README, "
        "\"Adding a retention policy\"). A setting may also be read from a variable: "
        "\"{{ env.NAME }}\".", "# ")
    if unfilled:
        lines += _comment(f"Replace the <placeholders> ({', '.join(unfilled)}), then check the "
                          "policy: dg check defs", "# ")
    lines += [f"type: {type_name}", "", "attributes:",
              f"  name: {name}  # {_RuleFields.model_fields['name'].description}"]
    lines += [f"  {field}: {_literal(fields[field])}  # "
              f"{_RuleFields.model_fields[field].description}" for field in _RULE_FIELDS]
    lines.append("  # Optional settings, at their defaults (README, \"Configuration\"):")
    today = today or dt.datetime.now(dt.timezone.utc).date()
    for field, declared in SETTINGS.items():
        default = default_of(field)
        if field == "partitions_start":
            # Today's partition exists only tomorrow: the first run launches yesterday's.
            lines.append(f"  {field}: {(today - dt.timedelta(days=1)).isoformat()}")
        else:
            shown = "unset" if default in (None, ()) else _literal(
                iso_duration(default) if isinstance(default, dt.timedelta) else default)
            lines.append(f"  # {field}: {shown}")
        lines += _comment(f"{declared.description}; {declared.bounds}", "  #   ")
    return "\n".join(lines) + "\n"


def _literal(value: Any) -> str:
    """``value`` as YAML that reads back as written: text quoted, lists in flow style."""
    if isinstance(value, (list, tuple)) and not (value and isinstance(value[0], tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, (dict, tuple)):  # a mapping, or its (key, value) pairs
        return "{" + ", ".join(f"{k}: {_literal(v)}" for k, v in dict(value).items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else str(value)


def _comment(text: str, prefix: str, width: int = 96) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=prefix, subsequent_indent=prefix)


#: Where a model of :func:`_keeping_refusals` keeps the schema errors of a file it refused.
_REFUSAL = "_favorites_schema_refusal"


@functools.cache
def _keeping_refusals(model: type[pydantic.BaseModel]) -> type[pydantic.BaseModel]:
    """``model``, the same schema, except that attributes it refuses validate to an empty
    instance holding the :class:`pydantic.ValidationError` (under :data:`_REFUSAL`), for
    :meth:`RetentionPolicy.load` to word it: Dagster validates a file before any code of the
    component runs."""

    def keep_refusal(cls, data: Any, handler: Any) -> Any:
        try:
            return handler(data)
        except pydantic.ValidationError as exc:
            refused = cls.model_construct()
            object.__setattr__(refused, _REFUSAL, exc)
            return refused

    return pydantic.create_model(
        model.__name__, __base__=model, __module__=model.__module__,
        __validators__={"keep_refusal": pydantic.model_validator(mode="wrap")(keep_refusal)})


#: The policy of each component tree (by the tree's state: one per tree object, as long as it
#: lives) that carries the code location's dead-run sensor.
_LOCATION_SENSORS: weakref.WeakKeyDictionary[Any, RetentionPolicy] = weakref.WeakKeyDictionary()


@dg.scaffold_with(RetentionPolicyScaffolder)
class RetentionPolicy(dg.Component, dg.Resolvable, _PolicyFields):
    """A retention policy: delete rows of ``table`` whose ``null_columns`` are all NULL and
    whose ``age_column`` is older than ``retention_days``, in ``SKIP LOCKED`` batches, once a
    day on ``cron``.

    Attributes:
        name: snake_case, at most 40 characters; the asset is ``<schema>/<name>_cleanup``, the
            job ``<name>_cleanup_job``, the schedule ``<name>_cleanup_schedule``, the
            concurrency pool ``<name>_cleanup``; the alerts name it.
        table: ``schema.table``, lower-case identifiers.
        key_column: a unique, NOT NULL key; batches are ordered and matched by it.
        age_column: the ``timestamptz`` column compared with the cutoff.
        null_columns: the guard; a row is deleted only while all of them are NULL. ``[]``,
            written on purpose, is a rule with no guard: every row whose ``age_column`` is
            before the cutoff is deleted, whoever owns it. Left out: refused.
        (names): ``metrics_prefix``, ``database_url_env``, ``archive_table``, see
            :data:`~favorites_maintenance.config.policy.NAMED_FIELDS` (README, "Adding a
            retention policy").
        (settings): one optional field per policy setting, see
            :class:`~favorites_maintenance.config.policy_settings.PolicySettings` (README,
            "Configuration").
    """

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def get_model_cls(cls) -> type[pydantic.BaseModel] | None:
        """The component's schema, Dagster's: a file it refuses reaches :meth:`load`, which
        words the refusal in one line (Dagster's loader would show its own error, with a
        stack, before the component sees the file)."""
        return _keeping_refusals(super().get_model_cls())

    @classmethod
    def load(cls, attributes: pydantic.BaseModel | None,
             context: dg.ComponentLoadContext) -> RetentionPolicy:
        """The component of ``attributes``, validated by :meth:`get_model_cls`.

        Raises:
            favorites_maintenance.components.load_errors.PolicyLocationError: the file does
                not fit the schema (a misspelled or missing field, a value of the wrong
                type): the code location's load error, one line naming the file, the line and
                the field, without a stack.
        """
        refusal = vars(attributes).get(_REFUSAL) if attributes is not None else None
        if refusal is not None:
            raise schema_error(refusal, context.path, context.project_root,
                               cls.model_fields) from refusal
        return super().load(attributes, context)

    @cached_property
    def policy(self) -> Policy:
        """The validated :class:`~favorites_maintenance.config.policy.Policy`.

        Raises:
            PolicyError: a malformed name, table, column or guard, or ``null_columns`` left
                out, naming the policy.
            SettingsError: a setting out of bounds, naming the policy and the field (or its
                variable) and the value.
        """
        unfilled = [name for name in _RULE_FIELDS if _is_placeholder(getattr(self, name))]
        if unfilled:
            raise PolicyError(f"policy {self.name}, {', '.join(unfilled)}: still the "
                              "placeholders the scaffold wrote; name the table to prune and "
                              "its columns", field=unfilled[0])
        if self.null_columns is None:
            raise PolicyError(
                f"policy {self.name!r}: null_columns is missing. Name the guard columns a row "
                "must have NULL to be deleted (null_columns: [user_id]), or write "
                "null_columns: [] on purpose for a rule with no guard, which deletes every row "
                f"whose {self.age_column} is older than the retention, whoever owns it")
        try:
            rule = RetentionRule.define(self.table, key_column=self.key_column,
                                        age_column=self.age_column,
                                        null_columns=self.null_columns)
        except RuleError as exc:
            raise PolicyError(f"policy {self.name!r}: {exc}") from None
        if self.database_url_env and (template := _ENV_TEMPLATE.match(self.database_url_env)):
            raise PolicyError(
                f"policy {self.name!r}: database_url_env is written as a template; write the "
                f"variable's name itself (database_url_env: {template.group(1)}): a template "
                "would put the URL it holds into the definitions, where the UI shows it")
        given: dict[str, SettingValue] = {
            name: value for name in SETTINGS if (value := getattr(self, name)) is not None}
        for name, value in given.items():
            if value.written_times > 1:
                raise SettingsError(f"policy {self.name}, {name}",
                                    f"is written {value.written_times} times in the policy's "
                                    "defs.yaml; keep one (YAML would silently take the last)")
        # A setting read from a variable is named by it in messages, set or not.
        labels = {name: value.variable for name, value in given.items() if value.variable}
        settings = parse_policy_settings(
            {name: value.text for name, value in given.items() if value.text is not None},
            {name: labels.get(name, f"policy {self.name}, {name}") for name in SETTINGS})
        return Policy(self.name, rule, settings, labels=labels, **{
            name: value for name in NAMED_FIELDS if (value := getattr(self, name)) is not None})

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """The policy's asset and checks, job, schedule, and the resources they use, under the
        package's keys, and, from one policy of the component tree (the first built), the
        sensors that serve every policy of the code location (the staleness, run-failure and
        tick-failure sensors, and the dead-run sensor): complete in any project's defs folder
        (:func:`~favorites_maintenance.pipeline.policy_defs.policy_definitions`).

        Every policy's definitions name the same sensors; Dagster refuses a sensor name twice
        in a code location, even for one object (the defs folder copies each component's
        definitions to add its metadata), so the other policies return none.

        Raises:
            favorites_maintenance.components.load_errors.PolicyLocationError: a malformed
                policy or setting (one line naming the file, the line, the policy and the
                field or its variable), or deployment variable, or the policy's database
                variable set to a malformed URL (named): the code location's load error,
                without a stack.
        """
        from favorites_maintenance.pipeline.heartbeat import dead_run_sensor
        from favorites_maintenance.pipeline.policy_defs import policy_definitions
        from favorites_maintenance.pipeline.sensors import with_sensors

        try:
            policy = self.policy
        except (PolicyError, SettingsError) as exc:
            raise location_error(exc, self, context.path, context.project_root) from exc
        try:
            settings = load_deployment_settings()
            check_database_urls([policy.database_url_env])
            with quiet_previews():
                defs = policy_definitions(policy)
        except SettingsError as exc:  # a deployment's variable: it names itself
            raise PolicyLocationError(exc) from exc
        # The policy's asset jobs resolved against its own asset: resolved against the code
        # location's, each job would scan every policy's asset, a load quadratic in policies.
        defs = dg.Definitions(
            assets=defs.assets, asset_checks=defs.asset_checks, schedules=defs.schedules,
            sensors=defs.sensors, jobs=[defs.resolve_job_def(job.name) for job in defs.jobs],
            resources=defs.resources)
        if _LOCATION_SENSORS.setdefault(context.component_tree.state_tracker, self) is not self:
            return with_sensors(defs, [])
        return with_sensors(defs, [*defs.sensors, dead_run_sensor(settings.run_heartbeat_timeout)])
