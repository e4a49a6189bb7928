"""The retention policies of a defs folder: its component tree, and the policies it declares,
validated, each file on its own.

Every policy file is loaded on a component tree of its own folder (:func:`policy_files`), so a
broken file is reported as one line naming the file, the line, the policy and the field, and
never hides the policies beside it:

    favorites_maintenance/defs/guest_carts/defs.yaml:8: policy guest_carts, retention_dayz:
    not a field of a retention policy (did you mean retention_days?)

(on one line). A policy that fails its own checks when Dagster builds it stops the code
location, in any project, with that one line and no stack (:class:`PolicyLocationError`);
:func:`code_location` builds a defs folder the way Dagster's loader does, for the command line
and the tests, and the command line's commands for one policy load that policy alone and name
the broken ones beside it.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pydantic
import yaml
from dagster.components.core.component_tree import ComponentTreeException
from dagster_shared.error import DagsterUnresolvableSymbolError

from favorites_maintenance.components.retention_policy import RetentionPolicy
from favorites_maintenance.config.deployment import load_deployment_settings
from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.config.policy import Policy, PolicyError
from favorites_maintenance.pipeline.dagster_internals import (
    DagsterUserCodeProcessError,
    SerializableErrorInfo,
)

#: The checkout holding ``pyproject.toml`` (the project root ``dg`` and Dagster load from).
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent

#: What a policy file's ``type`` says.
RETENTION_POLICY_TYPE = "favorites_maintenance.RetentionPolicy"
#: The names a component file may hold, after Dagster's component file model.
_COMPONENT_FILE_KEYS = ("type", "attributes", "requirements", "template_vars_module",
                        "post_processing")
#: Files a folder of the defs folder declares a component with.
_COMPONENT_FILES = ("defs.yaml", "defs.yml")
#: Characters of a value quoted in a message at most.
_QUOTED = 40


class PolicyLoadError(Exception):
    """The policies of ``defs/`` could not be loaded: a YAML file that does not fit the
    component's schema (a misspelled or missing field), a malformed policy, a setting out of
    bounds, or two policies of one name. The message is one line per broken file, each naming
    the file, the line, the policy and the field (see the module docstring)."""


class PolicyLocationError(ComponentTreeException, DagsterUserCodeProcessError):
    """A policy's or a setting's error (:attr:`error`) as the load error of the code location
    holding the policy, shown as its message alone: ``PolicyLoadError: <file>:<line>: ...``.

    The error is the configuration's, not the code's, so the stack of the code that found it
    is left out. Dagster's component tree passes an error of its own kind through unwrapped,
    and Dagster reports an error received from a code process as that process serialized it:
    the UI's code location page, ``dg check defs`` and ``dagster definitions validate`` show
    the one line, in this package's code location and in any project's.

    Attributes:
        error: the :class:`PolicyLoadError` or
            :class:`~favorites_maintenance.config.parsers.SettingsError` behind it.
    """

    def __init__(self, error: PolicyLoadError | SettingsError):
        info = SerializableErrorInfo(message=f"{type(error).__name__}: {error}\n", stack=[],
                                     cls_name=type(error).__name__)
        super().__init__(str(error), user_code_process_error_infos=[info])
        self.error = error


def location_error(exc: PolicyError | SettingsError, component: RetentionPolicy,
                   folder: Path, project_root: Path) -> PolicyLocationError:
    """``exc``, raised validating ``component`` (declared in ``folder``), as its code
    location's load error: a :class:`PolicyLoadError` of ``exc``'s message after the file and
    the line of the field it is about, ``exc`` its cause."""
    files = [folder / name for name in _COMPONENT_FILES if (folder / name).is_file()]
    path = files[0] if files else folder
    line = _Layout.read(path).line(_field_of(exc, component)) if files else 1
    error = PolicyLoadError(f"{_shown(path, project_root)}:{line}: {exc}")
    error.__cause__ = exc
    return PolicyLocationError(error)


def schema_error(cause: pydantic.ValidationError, folder: Path,
                 project_root: Path) -> PolicyLocationError:
    """``cause``, the schema errors of the ``attributes`` of the policy declared in ``folder``,
    as its code location's load error: one line naming the file, the line and each field
    (an unknown one with the closest known one)."""
    files = [folder / name for name in _COMPONENT_FILES if (folder / name).is_file()]
    path = files[0] if files else folder
    layout = _Layout.read(path) if files else _Layout(folder.name)
    error = PolicyLoadError(_describe_schema(cause, _shown(path, project_root), layout,
                                             attributes=True))
    error.__cause__ = cause
    return PolicyLocationError(error)


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
        PolicyLocationError: see :class:`PolicyLocationError`.
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
    return _Layout.read(path).name


@contextlib.contextmanager
def quiet_previews() -> Iterator[None]:
    """Components and code references are preview and beta in Dagster 1.13: said once in the
    README, not at every load of the code location."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        warnings.simplefilter("ignore", dg.BetaWarning)
        yield


def root_cause(exc: BaseException) -> BaseException:
    """The innermost ``__cause__`` of ``exc`` (Dagster wraps a component's error in its tree's)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


# --- one file ---------------------------------------------------------------------------------

def _component_files(folder: Path) -> Iterator[Path]:
    """Component files under ``folder``, depth first; a folder holding one is a leaf, as
    Dagster's loader sees it."""
    for child in sorted(folder.iterdir()):
        if not child.is_dir() or child.name.startswith((".", "_")):
            continue
        own = [child / name for name in _COMPONENT_FILES if (child / name).is_file()]
        if own:
            yield own[0]
        else:
            yield from _component_files(child)


def _load_file(path: Path, tree: dg.ComponentTree, project_root: Path) -> PolicyFile:
    layout = _Layout.read(path)
    where = _shown(path, project_root)
    try:
        with quiet_previews():
            components = tree.get_all_components(RetentionPolicy)
        policies = []
        for component in components:
            try:
                policies.append(component.policy)
            except (PolicyError, SettingsError) as exc:
                line = layout.line(_field_of(exc, component))
                raise _Located(f"{where}:{line}: {exc}") from exc
    except _Located as exc:
        return PolicyFile(path, tree, error=str(exc), cause=exc.__cause__)
    except PolicyLocationError as exc:  # refused by the component's schema
        return PolicyFile(path, tree, error=str(exc.error), cause=exc.error.__cause__)
    except Exception as exc:  # noqa: BLE001 - YAML, schema, Dagster's tree, a component's own
        cause = root_cause(exc)
        return PolicyFile(path, tree, error=_describe(cause, where, layout), cause=cause)
    return PolicyFile(path, tree, tuple(policies))


class _Located(Exception):
    """A policy's error, already worded with its file and line."""


@dataclass(frozen=True)
class _Layout:
    """Where things are in one policy file, read as text (every scalar a string).

    Attributes:
        name: the policy's ``name``, or its folder's name when the file gives none.
        attributes_line: the 1-based line of ``attributes:`` (1 when there is none).
        lines: field of ``attributes`` -> the 1-based line of its key.
        type_line: the 1-based line of ``type:``.
    """

    name: str
    attributes_line: int = 1
    lines: tuple[tuple[str, int], ...] = ()
    type_line: int = 1

    @classmethod
    def read(cls, path: Path) -> _Layout:
        folder = path.parent.name
        try:
            node = next(iter(yaml.compose_all(path.read_text(), Loader=yaml.BaseLoader)), None)
        except (OSError, yaml.YAMLError):
            return cls(folder)
        if not isinstance(node, yaml.MappingNode):
            return cls(folder)
        keys = {k.value: (k.start_mark.line + 1, v) for k, v in node.value
                if isinstance(k, yaml.ScalarNode)}
        line, attributes = keys.get("attributes", (1, None))
        type_line = keys.get("type", (1, None))[0]
        if not isinstance(attributes, yaml.MappingNode):
            return cls(folder, line, type_line=type_line)
        lines = tuple((k.value, k.start_mark.line + 1) for k, _ in attributes.value
                      if isinstance(k, yaml.ScalarNode))
        name = next((v.value for k, v in attributes.value
                     if k.value == "name" and isinstance(v, yaml.ScalarNode) and v.value), folder)
        return cls(name, line, lines, type_line)

    def line(self, field: str | None) -> int:
        """The line of ``field``'s key (its last, if written twice), else of ``attributes``."""
        found = [line for name, line in self.lines if name == field]
        return found[-1] if found else self.attributes_line


def _shown(path: Path, project_root: Path) -> str:
    """``path`` as a message shows it: relative to the project when inside it."""
    try:
        return str(path.resolve().relative_to(project_root.resolve()))
    except ValueError:
        return str(path)


def _field_of(exc: PolicyError | SettingsError, component: RetentionPolicy) -> str | None:
    """The field of ``component`` that ``exc`` is about, or ``None``."""
    if isinstance(exc, SettingsError):
        for name in RetentionPolicy.model_fields:
            value = getattr(component, name, None)
            if exc.variable in (getattr(value, "variable", None),
                                f"policy {component.name}, {name}"):
                return name
        return None
    if exc.field:
        return exc.field
    # A rule's message starts with the field it is about ("table 'x' must be ...").
    text = str(exc).split(": ", 1)[-1]
    first = text.split(" ", 1)[0]
    return {"schema": "table", "columns": "key_column"}.get(first, first)


def _describe(cause: BaseException, where: str, layout: _Layout) -> str:
    """One line for a file that is not valid YAML or does not fit the component's schema."""
    if isinstance(cause, yaml.MarkedYAMLError):
        mark = cause.problem_mark or cause.context_mark
        line = mark.line + 1 if mark else 1
        problem = " ".join(str(cause.problem or cause.context or cause).split())
        return f"{where}:{line}: policy {layout.name}: not valid YAML: {problem}"
    if isinstance(cause, pydantic.ValidationError):
        return _describe_schema(cause, where, layout)
    lines = str(cause).strip().splitlines()
    text = lines[0] if lines else ""
    if isinstance(cause, DagsterUnresolvableSymbolError):
        return (f"{where}:{layout.type_line}: policy {layout.name}, type: {text} (a retention "
                f"policy is type: {RETENTION_POLICY_TYPE})")
    return (f"{where}:{layout.attributes_line}: policy {layout.name}: "
            f"{type(cause).__name__}: {text}")


def _describe_schema(cause: pydantic.ValidationError, where: str, layout: _Layout,
                     attributes: bool = False) -> str:
    """The schema errors of one file on one line: unknown fields (with the closest known
    one) and values of the wrong type by line, then missing fields; the line given is the
    first one's. ``attributes``: ``cause`` is about the ``attributes`` mapping alone."""
    known = list(RetentionPolicy.model_fields)
    problems: dict[str, tuple[int, str]] = {}
    missing: list[str] = []
    for error in cause.errors():
        loc = str(error["loc"][0]) if error["loc"] else ""
        path = loc.split(" at ", 1)[0].split(".")
        # An empty ``attributes`` mapping has no position: its errors name the field alone.
        nested = path[0] == "attributes" and len(path) > 1
        inside = attributes or nested or path[0] in known
        name = path[1] if nested else path[0]
        position = (error.get("ctx") or {}).get("source_position")
        line = position.start.line if position is not None else layout.line(name)
        if error["type"] == "missing" and inside:
            missing.append(name)
        elif error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(name, known if inside else _COMPONENT_FILE_KEYS,
                                              n=1)
            what = "a field of a retention policy" if inside else "a key of a component file"
            hint = f" (did you mean {close[0]}?)" if close else ""
            problems.setdefault(name, (line, f"{name}: not {what}{hint}"))
        elif name not in problems:
            given = repr(error.get("input"))
            given = given if len(given) <= _QUOTED else given[:_QUOTED - 3] + "..."
            reason = error["msg"][0].lower() + error["msg"][1:]
            problems[name] = (line, f"{name}: {given} is not accepted ({reason})")
    parts = sorted(problems.values())
    if missing:
        parts.append((layout.attributes_line, "required field" + "s" * (len(missing) > 1)
                      + " missing: " + ", ".join(sorted(set(missing), key=known.index))))
    first = parts[0][0] if parts else layout.attributes_line
    return f"{where}:{first}: policy {layout.name}, " + "; ".join(text for _, text in parts)
