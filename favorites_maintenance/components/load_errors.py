"""A policy file's errors, worded for the code location that loads it: one line naming the
file, the line, the policy and the field, without a stack, in this package's code location and in
any project's (:class:`PolicyLocationError`).

Kept apart from the component (:mod:`~favorites_maintenance.components.retention_policy`) and
the tree of policy files (:mod:`~favorites_maintenance.components.policy_tree`), which both word
their errors here: the field names a message may suggest are passed in, so this module imports
neither.
"""

from __future__ import annotations

import contextlib
import difflib
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pydantic
import yaml
from dagster.components.core.component_tree import ComponentTreeException
from dagster_shared.error import DagsterUnresolvableSymbolError

from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.config.policy import PolicyError
from favorites_maintenance.pipeline.dagster_internals import (
    DagsterUserCodeProcessError,
    SerializableErrorInfo,
)

#: What a policy file's ``type`` says.
RETENTION_POLICY_TYPE = "favorites_maintenance.RetentionPolicy"
#: The names a component file may hold, after Dagster's component file model.
_COMPONENT_FILE_KEYS = ("type", "attributes", "requirements", "template_vars_module",
                        "post_processing")
#: Files a folder of the defs folder declares a component with.
COMPONENT_FILES = ("defs.yaml", "defs.yml")
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


def location_error(exc: PolicyError | SettingsError, component: Any,
                   folder: Path, project_root: Path) -> PolicyLocationError:
    """``exc``, raised validating ``component`` (declared in ``folder``), as its code
    location's load error: a :class:`PolicyLoadError` of ``exc``'s message after the file and
    the line of the field it is about, ``exc`` its cause."""
    files = [folder / name for name in COMPONENT_FILES if (folder / name).is_file()]
    path = files[0] if files else folder
    line = FileLayout.read(path).line(field_of(exc, component)) if files else 1
    error = PolicyLoadError(f"{shown_path(path, project_root)}:{line}: {exc}")
    error.__cause__ = exc
    return PolicyLocationError(error)


def schema_error(cause: pydantic.ValidationError, folder: Path, project_root: Path,
                 fields: Iterable[str]) -> PolicyLocationError:
    """``cause``, the schema errors of the ``attributes`` of the policy declared in ``folder``,
    as its code location's load error: one line naming the file, the line and each field
    (an unknown one with the closest of ``fields``, the component's)."""
    files = [folder / name for name in COMPONENT_FILES if (folder / name).is_file()]
    path = files[0] if files else folder
    layout = FileLayout.read(path) if files else FileLayout(folder.name)
    error = PolicyLoadError(_describe_schema(cause, shown_path(path, project_root), layout, fields,
                                             attributes=True))
    error.__cause__ = cause
    return PolicyLocationError(error)


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


@dataclass(frozen=True)
class FileLayout:
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
    def read(cls, path: Path) -> FileLayout:
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


def shown_path(path: Path, project_root: Path) -> str:
    """``path`` as a message shows it: relative to the project when inside it."""
    try:
        return str(path.resolve().relative_to(project_root.resolve()))
    except ValueError:
        return str(path)


def field_of(exc: PolicyError | SettingsError, component: Any) -> str | None:
    """The field of ``component`` (a retention policy component, a pydantic model) that
    ``exc`` is about, or ``None``."""
    if isinstance(exc, SettingsError):
        for name in type(component).model_fields:
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


def describe(cause: BaseException, where: str, layout: FileLayout, fields: Iterable[str]) -> str:
    """One line for a file that is not valid YAML or does not fit the component's schema
    (``fields``: the component's)."""
    if isinstance(cause, yaml.MarkedYAMLError):
        mark = cause.problem_mark or cause.context_mark
        line = mark.line + 1 if mark else 1
        problem = " ".join(str(cause.problem or cause.context or cause).split())
        return f"{where}:{line}: policy {layout.name}: not valid YAML: {problem}"
    if isinstance(cause, pydantic.ValidationError):
        return _describe_schema(cause, where, layout, fields)
    lines = str(cause).strip().splitlines()
    text = lines[0] if lines else ""
    if isinstance(cause, DagsterUnresolvableSymbolError):
        return (f"{where}:{layout.type_line}: policy {layout.name}, type: {text} (a retention "
                f"policy is type: {RETENTION_POLICY_TYPE})")
    return (f"{where}:{layout.attributes_line}: policy {layout.name}: "
            f"{type(cause).__name__}: {text}")


def _describe_schema(cause: pydantic.ValidationError, where: str, layout: FileLayout,
                     fields: Iterable[str], attributes: bool = False) -> str:
    """The schema errors of one file on one line: unknown fields (with the closest known
    one) and values of the wrong type by line, then missing fields; the line given is the
    first one's. ``attributes``: ``cause`` is about the ``attributes`` mapping alone."""
    known = list(fields)
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
