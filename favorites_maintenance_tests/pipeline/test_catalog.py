"""The catalog: each policy's cleanup asset carries the owners, kinds, tags and group its YAML
sets (defaults: kind ``postgres``, its database's group), for the Catalog's filters; a value
Dagster would refuse stops the load naming the policy, the field and the value."""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg
import pytest
from click.testing import CliRunner

from favorites_maintenance.cli import main
from favorites_maintenance.components.load_errors import PolicyLoadError
from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.policies import (
    favorites_policy,
    location,
    policy_sandbox,
)

BILLING = favorites_policy(
    "billing_sessions", owners=["team:data-platform", "someone@example.com"],
    tags={"team": "billing", "tier": "2"}, group="billing", kinds=["postgres", "billing"],
    database_url_env="BILLING_DATABASE_URL")


def _spec(defs: dg.Definitions, *path: str) -> dg.AssetSpec:
    return defs.resolve_assets_def(dg.AssetKey(list(path))).specs_by_key[
        dg.AssetKey(list(path))]


def test_a_policy_s_asset_carries_the_owners_kinds_tags_and_group_of_its_yaml(monkeypatch):
    carts = favorites_policy("guest_carts", database_url_env="CARTS_DATABASE_URL")
    defs = location(BILLING, carts, monkeypatch=monkeypatch, env={
        "BILLING_DATABASE_URL": "postgresql+psycopg://u@localhost:1/billing"})
    billing = _spec(defs, "favorites", "billing_sessions_cleanup")
    assert billing.owners == ["team:data-platform", "someone@example.com"]
    assert billing.kinds == {"postgres", "billing"}
    assert {k: v for k, v in billing.tags.items() if not k.startswith("dagster/")} == {
        "team": "billing", "tier": "2"}
    assert billing.group_name == "billing"
    # Unset: kind postgres, no owner or tag, the group of the policy's database.
    plain = _spec(defs, "favorites", "guest_carts_cleanup")
    assert (plain.owners, plain.kinds, plain.group_name) == ([], {"postgres"}, "carts")
    assert not {k for k in plain.tags if not k.startswith("dagster/")}
    # The shipped policy keeps its key and the group its asset has always had.
    guest = _spec(defs, "favorites", "guest_favorites_cleanup")
    assert (guest.group_name, guest.kinds) == ("maintenance", {"postgres"})


@pytest.mark.parametrize("field, value, said", [
    ("owners", ["team:data-platform", "data platform"],
     'policy bad_owner, owners: owner "data platform" is neither an email address nor a team'),
    ("owners", ["team:"], 'policy bad_owner, owners: owner "team:" is neither'),
    ("tags", {"team": "billing team"},
     'policy bad_owner, tags: the value of tag team ("billing team") must be text'),
    ("tags", {"dagster/kind/x": ""}, 'policy bad_owner, tags: tag key "dagster/kind/x" is '
     "under dagster/"),
    ("kinds", ["post gres"], 'policy bad_owner, kinds: kind "post gres" must be'),
    ("group", "billing-team", "policy bad_owner, group: 'billing-team' is not a group name"),
])
def test_a_catalog_value_dagster_would_refuse_stops_the_load_naming_the_field(field, value,
                                                                              said):
    with pytest.raises((PolicyLoadError, SettingsError)) as refused:
        location(favorites_policy("bad_owner", **{field: value}))
    assert said in str(refused.value)


def test_owners_read_from_a_variable_are_comma_separated_and_named_by_it(monkeypatch):
    monkeypatch.setenv("CARTS_OWNERS", "team:carts, someone@example.com")
    with policy_sandbox(favorites_policy("guest_carts", owners="{{ env.CARTS_OWNERS }}")) as sb:
        assert _spec(sb.code_location(), "favorites", "guest_carts_cleanup").owners == [
            "team:carts", "someone@example.com"]
        monkeypatch.setenv("CARTS_OWNERS", "carts")
        with pytest.raises((PolicyLoadError, SettingsError), match='CARTS_OWNERS: owner "carts" is neither'):
            sb.code_location()


def test_dry_run_all_json_reads_policies_with_catalog_fields(rows, db_url, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    monkeypatch.setenv("BILLING_DATABASE_URL", db_url.render_as_string(hide_password=False))
    rows.add_many(3, updated_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400))
    with policy_sandbox(BILLING) as sandbox, sandbox.tree():
        module = f"{sandbox.sandbox.project_name}.defs"
        result = CliRunner().invoke(main, ["dry-run", "-m", module, "--all", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    reports = {r["policy"]: r["now"]["prunable"] for r in document["policies"]}
    assert reports == {"billing_sessions": 3, "guest_favorites": 3}
    assert document["deleted"] == 0
    assert rows.count() == 3
