"""The retention policies of a defs folder: its component tree, and the policies it declares,
validated, each file on its own.

Every policy file is loaded on a component tree of its own folder (:func:`policy_files`), so a
broken file is reported as one line naming the file, the line, the policy and the field, and
never hides the policies beside it:

    favorites_maintenance/defs/guest_carts/defs.yaml:8: policy guest_carts, retention_dayz:
    not a field of a retention policy (did you mean retention_days?)

(on one line). A policy that fails its own checks when Dagster builds it stops the code
location, in any project, with that one line and no stack
(:class:`~favorites_maintenance.components.load_errors.PolicyLocationError`);
:func:`code_location` builds a defs folder the way Dagster's loader does, for the command line
and the tests, and the command line's commands for one policy load that policy alone and name
the broken ones beside it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from favorites_maintenance.components.load_errors import (
    COMPONENT_FILES,
    FileLayout,
    PolicyLoadError,
    PolicyLocationError,
    describe,
    field_of,
    quiet_previews,
    root_cause,
    shown_path,
)
from favorites_maintenance.components.retention_policy import RetentionPolicy
from favorites_maintenance.config.deployment import load_deployment_settings
from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.config.policy import Policy, PolicyError

#: The checkout holding ``pyproject.toml`` (the project root ``dg`` and Dagster load from).
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent

def code_location(*trees: dg.ComponentTree | None, only: str | None = None) -> dg.Definitions:
    """The definitions of ``trees`` (default: ``defs/``), each built as Dagster's
    ``load_from_defs_folder`` builds a project's: every component's definitions, the resources
    they use included, merged. For the command line and the tests; the code location Dagster
    loads is :mod:`favorites_maintenance.definitions`, the stock loader.

    Args:
        trees: component trees; ``None`` stands for ``defs/``.
        only: the name of one policy of ``trees``: build that policy alone, whatever the other
            policy files hold (the command line's commands for one policy).

    Raises:
        favorites_maintenance.config.parsers.SettingsError: a deployment variable that is
            malformed, named (checked first, before any policy); then a policy's setting or
            database variable, named.
        PolicyLoadError: a malformed policy, one line per broken file; with ``only``, that
            policy broken or not found.
    """
    load_deployment_settings()  # a bad variable is named here, not inside Dagster's tree error
    trees = tuple(tree or component_tree() for tree in trees or (None,))
    if only is not None:
        trees = (_tree_of_policy(trees, only),)
    try:
        return merge_trees(*trees)
    except PolicyLocationError as exc:
        raise exc.error  # noqa: B904 - its own cause, the policy's error, is kept
    except Exception:  # Dagster's tree error, around a schema or YAML error
        for tree in trees:
            load_policies(tree)  # one line per broken file, each loaded on its own
        raise


def merge_trees(*trees: dg.ComponentTree) -> dg.Definitions:
    """The definitions of each of ``trees``, built as Dagster's loader builds a defs folder,
    merged into one code location (its component tree the first's): the sensors every policy
    shares, which one policy of each tree carries, are kept once.

    Raises:
        PolicyLocationError: see
            :class:`~favorites_maintenance.components.load_errors.PolicyLocationError`.
    """
    with quiet_previews():
        first, *others = (tree.build_defs() for tree in trees)
    # Dagster merges one component tree at most, and a sensor name once.
    seen = {s.name for s in first.sensors or []}
    return dg.Definitions.merge(first, *(dg.Definitions(
        assets=defs.assets, asset_checks=defs.asset_checks, schedules=defs.schedules,
        sensors=[s for s in defs.sensors or [] if s.name not in seen], jobs=defs.jobs,
        resources=defs.resources, executor=defs.executor, loggers=defs.loggers,
        metadata=defs.metadata) for defs in others))


def _tree_of_policy(trees: tuple[dg.ComponentTree, ...], name: str) -> dg.ComponentTree:
    """The component tree of the file of ``trees`` that declares policy ``name``."""
    files = [f for tree in trees for f in policy_files(tree)]
    found = [f for f in files for p in f.policies if p.name == name]
    if not found:
        broken = [f.error for f in files if f.error]
        valid = sorted(p.name for f in files for p in f.policies)
        raise PolicyLoadError(f"no valid policy named {name!r}; the valid ones are "
                              f"{', '.join(valid) or 'none'}"
                              + "".join(f"\n{e}" for e in broken))
    return found[0].tree


@dataclass(frozen=True)
class PolicyFile:
    """One policy file of a defs folder, loaded on its own.

    Attributes:
        path: the ``defs.yaml`` file.
        tree: the component tree of its folder alone (its definitions:
            ``tree.build_defs()``).
        policies: what it declares, validated (one policy, usually); empty when broken.
        error: ``None``, or one line naming the file, the line, the policy and the field.
        cause: the exception behind :attr:`error`.
    """

    path: Path
    tree: dg.ComponentTree
    policies: tuple[Policy, ...] = ()
    error: str | None = None
    cause: BaseException | None = field(default=None, repr=False, compare=False)


def component_tree() -> dg.ComponentTree:
    """The component tree of ``favorites_maintenance/defs/``."""
    from favorites_maintenance import defs as defs_folder

    return dg.ComponentTree.from_module(defs_module=defs_folder, project_root=PROJECT_ROOT)


def project_tree(module_name: str | None = None, cwd: Path | None = None) -> dg.ComponentTree:
    """The component tree of the code location the command line works on, found the way
    Dagster's command line finds a code location: ``module_name`` (``-m
    my_platform.definitions``: the ``[tool.dg]`` project holding it, else its package's
    ``defs`` module), else the ``[tool.dg]`` project holding ``cwd`` (default: the working
    folder), else, in the package's own checkout, ``favorites_maintenance/defs/``.

    Raises:
        PolicyLoadError: ``module_name`` does not import, or no project is found (an installed
            package has no policies of its own), naming what to give.
    """
    if module_name:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise PolicyLoadError(f"-m {module_name}: could not be imported ({exc}); name the "
                                  "code location's module, importable from the working folder "
                                  "or the environment") from None
        path = Path(module.__file__ or ".").resolve()
        try:
            return dg.ComponentTree.for_project(path)
        except dg.DagsterError:
            package = module_name if hasattr(module, "__path__") else module_name.rpartition(
                ".")[0]
            defs_name = module_name if module_name.endswith(".defs") else f"{package}.defs"
            defs_module = importlib.import_module(defs_name)
            root = Path(defs_module.__file__).resolve().parents[len(defs_name.split("."))]
            return dg.ComponentTree.from_module(defs_module=defs_module, project_root=root)
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "[tool.dg" in pyproject.read_text():
            if folder == PROJECT_ROOT:
                break  # this package's own checkout
            return dg.ComponentTree.for_project(folder)
    if any(part in ("site-packages", "dist-packages") for part in Path(__file__).parts):
        raise PolicyLoadError(
            f"{here} is in no Dagster project ([tool.dg] in pyproject.toml): run the command "
            "from your project's folder, or name its code location with -m "
            "my_platform.definitions")
    return component_tree()


def policy_files(tree: dg.ComponentTree | None = None) -> list[PolicyFile]:
    """Every folder of ``tree``'s defs folder (default: ``defs/``) that holds a component file,
    loaded on a tree of its own, in path order; a broken one carries its one-line error.

    A file of another component type than ``RetentionPolicy`` is listed with no policy.
    """
    tree = tree or component_tree()
    root = tree.defs_module_path
    found = []
    for path in _component_files(root):
        relative = path.parent.relative_to(root)
        module = importlib.import_module(".".join((tree.defs_module_name, *relative.parts)))
        folder_tree = dg.ComponentTree(defs_module=module, project_root=tree.project_root)
        found.append(_load_file(path, folder_tree, tree.project_root))
    return found


def load_policies(tree: dg.ComponentTree | None = None) -> list[Policy]:
    """Every policy of ``tree`` (default: ``defs/``), validated, names unique.

    Raises:
        PolicyLoadError: one line per broken file (see :class:`PolicyFile`), or two policies
            of one name; the first file's :class:`~favorites_maintenance.config.policy.
            PolicyError`, :class:`~favorites_maintenance.config.parsers.SettingsError` or
            YAML or schema error is its ``__cause__``.
    """
    files = policy_files(tree)
    broken = [f for f in files if f.error]
    if broken:
        raise PolicyLoadError("\n".join(f.error for f in broken)) from broken[0].cause
    policies = [p for f in files for p in f.policies]
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise PolicyLoadError(f"policy names must be unique, got {sorted(names)!r}")
    return policies


def declared_name(path: Path) -> str:
    """The ``name`` policy file ``path`` gives its policy, read as text (its folder's name when
    it gives none or cannot be read): what messages call a broken policy."""
    return FileLayout.read(path).name


# --- one file ---------------------------------------------------------------------------------

def _component_files(folder: Path) -> Iterator[Path]:
    """Component files under ``folder``, depth first; a folder holding one is a leaf, as
    Dagster's loader sees it."""
    for child in sorted(folder.iterdir()):
        if not child.is_dir() or child.name.startswith((".", "_")):
            continue
        own = [child / name for name in COMPONENT_FILES if (child / name).is_file()]
        if own:
            yield own[0]
        else:
            yield from _component_files(child)


def _load_file(path: Path, tree: dg.ComponentTree, project_root: Path) -> PolicyFile:
    layout = FileLayout.read(path)
    where = shown_path(path, project_root)
    try:
        with quiet_previews():
            components = tree.get_all_components(RetentionPolicy)
        policies = []
        for component in components:
            try:
                policies.append(component.policy)
            except (PolicyError, SettingsError) as exc:
                line = layout.line(field_of(exc, component))
                raise _Located(f"{where}:{line}: {exc}") from exc
    except _Located as exc:
        return PolicyFile(path, tree, error=str(exc), cause=exc.__cause__)
    except PolicyLocationError as exc:  # refused by the component's schema
        return PolicyFile(path, tree, error=str(exc.error), cause=exc.error.__cause__)
    except Exception as exc:  # noqa: BLE001 - YAML, schema, Dagster's tree, a component's own
        cause = root_cause(exc)
        return PolicyFile(path, tree, error=describe(cause, where, layout, RetentionPolicy.model_fields), cause=cause)
    return PolicyFile(path, tree, tuple(policies))


class _Located(Exception):
    """A policy's error, already worded with its file and line."""
