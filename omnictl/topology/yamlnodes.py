"""A YAML loader that keeps the line and column of every node and rejects duplicate keys.

PyYAML's constructors forget where values came from and silently keep the last of two
equal keys. We compose the node graph (every node carries ``start_mark``) and build the
plain Python values ourselves, recording a position for every path on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from omnictl.exceptions import YamlTooLarge
from omnictl.topology.issues import Issue

# A path into the document: mapping keys and sequence indices, as jsonschema reports them.
# YAML keys may be any scalar, so a key can also be a float, a bool or None.
Path = tuple[Union[str, int, float, bool, None], ...]
Position = tuple[int, int]  # 1-based line, column

_MERGE_TAG = "tag:yaml.org,2002:merge"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MAP_TAG = "tag:yaml.org,2002:map"
# Values built, aliases expanded. A 633-byte "billion laughs" of nested aliases once made
# `validate` use gigabytes; a real topology builds a few hundred values.
MAX_VALUES = 100_000


@dataclass
class Document:
    """The parsed document, where each of its parts sits, and what went wrong reading it."""

    data: Any
    file: str
    values: dict[Path, Position] = field(default_factory=dict)
    keys: dict[Path, Position] = field(default_factory=dict)  # position of a mapping key
    issues: list[Issue] = field(default_factory=list)

    def position(self, path: Path) -> Position:
        """Where ``path``'s value starts, or its nearest recorded ancestor's."""
        for end in range(len(path), -1, -1):
            found = self.values.get(path[:end])
            if found is not None:
                return found
        return (1, 1)

    def key_position(self, path: Path) -> Position:
        """Where the key of ``path`` is written (falls back to its value)."""
        return self.keys.get(path) or self.position(path)


def _position(node: Node) -> Position:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


class _Builder:
    """Turns a composed node graph into Python values, recording positions and issues."""

    def __init__(self, loader: yaml.SafeLoader, document: Document) -> None:
        self.loader = loader
        self.doc = document
        self.in_progress: set[int] = set()  # node ids on the current path: catches `&a [*a]`
        self.built = 0

    def issue(self, rule: str, node: Node, message: str, hint: str | None = None) -> None:
        line, column = _position(node)
        self.doc.issues.append(Issue(rule, message, self.doc.file, line, column, hint=hint))

    def build(self, node: Node, path: Path) -> Any:
        self.built += 1
        if self.built > MAX_VALUES:
            raise YamlTooLarge(f"more than {MAX_VALUES} values")  # stops the build at once
        self.doc.values.setdefault(path, _position(node))
        if id(node) in self.in_progress:
            self.issue("yaml-syntax", node, "an alias refers to a node that contains it")
            return None
        self.in_progress.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self.mapping(node, path)
            if isinstance(node, SequenceNode):
                if node.tag != _SEQ_TAG:
                    self.issue("yaml-syntax", node, f"unsupported YAML tag {node.tag!r}")
                return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
            return self.scalar(node)
        finally:
            self.in_progress.discard(id(node))

    def scalar(self, node: Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except (yaml.constructor.ConstructorError, ValueError, TypeError) as error:
            self.issue("yaml-syntax", node, f"cannot read value {node.value!r}: {error}")
            return None

    def mapping(self, node: MappingNode, path: Path) -> dict[Any, Any]:
        if node.tag != _MAP_TAG:
            self.issue("yaml-syntax", node, f"unsupported YAML tag {node.tag!r}")
        result: dict[Any, Any] = {}
        merged: list[MappingNode] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.extend(self.merge_sources(value_node))
                continue
            if not isinstance(key_node, ScalarNode):
                self.issue("yaml-syntax", key_node, "a mapping key must be a plain value")
                continue
            key = self.scalar(key_node)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                key = str(key)  # dates and the like: keep them hashable and printable
            if key in result:
                first_line = self.doc.keys[path + (key,)][0]
                line, column = _position(key_node)
                # Inside a stage mapping, name the stage when its `name` came first.
                stage = result.get("name") if len(path) == 2 and path[0] == "stages" else None
                self.doc.issues.append(
                    Issue(
                        "duplicate-key",
                        f"key {key!r} appears twice (first at line {first_line})",
                        self.doc.file,
                        line,
                        column,
                        stage=stage if isinstance(stage, str) else None,
                        field=str(key),
                        hint="YAML would silently keep only the last one; remove or rename one",
                    )
                )
                continue
            self.doc.keys[path + (key,)] = _position(key_node)
            result[key] = self.build(value_node, path + (key,))
        # `<<: *base` fills in keys the mapping does not set itself, as YAML 1.1 defines.
        for source in merged:
            for key_node, value_node in self.merged_pairs(source, set()):
                if isinstance(key_node, ScalarNode):
                    key = self.scalar(key_node)
                    if isinstance(key, (str, int, float, bool)) and key not in result:
                        self.doc.keys[path + (key,)] = _position(key_node)
                        result[key] = self.build(value_node, path + (key,))
        return result

    def merged_pairs(self, source: MappingNode, seen: set[int]) -> list[tuple[Node, Node]]:
        """A merged mapping's own pairs first, then those of the mappings it merges itself
        (``<<`` inside a merged mapping), as PyYAML's own loader flattens them."""
        if id(source) in seen:
            self.issue("yaml-syntax", source, "a merge key `<<` refers to a mapping that merges it")
            return []
        seen.add(id(source))
        own: list[tuple[Node, Node]] = []
        inherited: list[tuple[Node, Node]] = []
        for key_node, value_node in source.value:
            if key_node.tag == _MERGE_TAG:
                for nested in self.merge_sources(value_node):
                    inherited.extend(self.merged_pairs(nested, seen))
            else:
                own.append((key_node, value_node))
        return own + inherited

    def merge_sources(self, node: Node) -> list[MappingNode]:
        nodes = node.value if isinstance(node, SequenceNode) else [node]
        sources = [n for n in nodes if isinstance(n, MappingNode)]
        if len(sources) != len(nodes):
            self.issue("yaml-syntax", node, "a merge key `<<` takes a mapping or a list of them")
        return sources


def _syntax_issue(error: yaml.YAMLError, text: str, file: str) -> Issue:
    line, column = 1, 1
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        line, column = error.problem_mark.line + 1, error.problem_mark.column + 1
    elif isinstance(error, yaml.reader.ReaderError):
        before = text[: error.position]
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
    problem = error.problem if isinstance(error, yaml.MarkedYAMLError) else None
    message = problem or str(error).splitlines()[0]
    return Issue(
        "yaml-syntax",
        f"invalid YAML: {message}",
        file,
        line,
        column,
        hint="check indentation, quoting and the `key: value` form near this point",
    )


def parse(text: str, file: str) -> Document:
    """Parse one YAML document. Problems are returned as issues, never raised."""
    document = Document(data=None, file=file)
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # reading starts here: it rejects control characters
        root = loader.get_single_node()
        if root is not None:
            document.data = _Builder(loader, document).build(root, ())
    except yaml.YAMLError as error:
        document.data = None
        document.issues.append(_syntax_issue(error, text, file))
    except RecursionError:
        document.data = None
        document.issues.append(Issue("yaml-syntax", "the document is nested too deeply", file, 1, 1))
    except YamlTooLarge:
        document.data = None
        document.issues.append(
            Issue(
                "yaml-syntax",
                f"the document expands to more than {MAX_VALUES} values",
                file,
                1,
                1,
                hint="aliases (`*name`) repeat what they point to; a topology is far smaller than this",
            )
        )
    finally:
        if loader is not None:
            loader.dispose()
    return document
