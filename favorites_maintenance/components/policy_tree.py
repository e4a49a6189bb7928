"""The retention policies of a defs folder: its component tree, and the policies it declares,
validated.

The code location (:mod:`favorites_maintenance.definitions`) and the command line both read the
policies through :func:`load_policies`, so an error reads the same in either.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pydantic
import yaml
from dagster.components.core.component_tree import ComponentTreeException

from favorites_maintenance.components.retention_policy import RetentionPolicy
from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.config.policy import Policy, PolicyError

#: The checkout holding ``pyproject.toml`` (the project root ``dg`` and Dagster load from).
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent


class PolicyLoadError(Exception):
    """The policies of ``defs/`` could not be loaded: a YAML file that does not fit the
    component's schema (a misspelled or missing field), a malformed policy, a setting out of
    bounds, or two policies of one name. The message is the cause's, without Dagster's tree."""


def component_tree() -> dg.ComponentTree:
    """The component tree of ``favorites_maintenance/defs/``."""
    from favorites_maintenance import defs as defs_folder

    return dg.ComponentTree.from_module(defs_module=defs_folder, project_root=PROJECT_ROOT)


def load_policies(tree: dg.ComponentTree | None = None) -> list[Policy]:
    """Every policy of ``tree`` (default: ``defs/``), validated, names unique.

    Raises:
        PolicyLoadError: see the class; a :class:`~favorites_maintenance.config.policy.
            PolicyError` or :class:`~favorites_maintenance.config.parsers.SettingsError` is its
            ``__cause__``.
    """
    try:
        with quiet_previews():
            components = (tree or component_tree()).get_all_components(RetentionPolicy)
        policies = [component.policy for component in components]
    except (PolicyError, SettingsError) as exc:
        raise PolicyLoadError(str(exc)) from exc
    except ComponentTreeException as exc:
        raise PolicyLoadError(_root_cause(exc)) from exc
    except (yaml.YAMLError, pydantic.ValidationError) as exc:
        # A file that is not YAML, or not a component file: raised before Dagster wraps it.
        raise PolicyLoadError(_root_cause(exc)) from exc
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyLoadError(f"policy names must be unique, got {sorted(names)!r}")
    return policies


@contextlib.contextmanager
def quiet_previews() -> Iterator[None]:
    """Components and code references are preview and beta in Dagster 1.13: said once in the
    README, not at every load of the code location."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        warnings.simplefilter("ignore", dg.BetaWarning)
        yield


def _root_cause(exc: BaseException) -> str:
    """The innermost cause's message: pydantic's, naming the file, line and field."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc)
    return "\n".join(line for line in text.splitlines() if "errors.pydantic.dev" not in line)
