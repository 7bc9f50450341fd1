"""YAML text → data (``yaml.safe_load``, duplicate keys rejected) and the one function that reads
a config file. Everything else in ``nereus.config`` works on already-parsed data.

A document is bounded before it is built (:mod:`nereus.config.limits`): at most
``MAX_CONFIG_BYTES`` of text, ``MAX_YAML_DEPTH`` levels of nesting and ``MAX_YAML_VALUES``
values with every alias expanded — so an alias bomb ("billion laughs") or a 20,000-deep list
is refused after one pass over the parser's events, before the composer recurses or the
constructor multiplies anything — and an alias may not point into the node that contains it.

PyYAML is imported inside the functions that parse text, so the rest of the package (and the
pure core importing it) stays standard-library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nereus.config import files, limits
from nereus.config.checkpoint_files import read_checkpoint
from nereus.config.cluster import uses_auto_gpu
from nereus.config.schema import EXTENSION_SECTIONS, Config, describe, parse_config
from nereus.errors import ConfigError

if TYPE_CHECKING:
    import yaml

    from nereus.spec.hardware import GpuSpec


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


def _check_shape(text: str, source: str) -> None:
    """One pass over the parser's events: depth, expanded size and alias cycles within limits.

    libyaml's parser (when PyYAML has it: fast) reads first. Some of its versions stop at a
    nesting limit of their own (PyYAML 6.0.4's: 1,000 levels) with a syntax error before they
    yield the events past depth ``MAX_YAML_DEPTH``; any error of libyaml's is therefore read
    again by PyYAML's own parser (iterative: no nesting limit), whose events decide. A syntax
    error there ends the pass quietly: the composer, run next, reports it with its message.
    """
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            _shape_pass(text, source, fast)
            return
        except yaml.YAMLError:
            pass
    try:
        _shape_pass(text, source, yaml.SafeLoader)
    except yaml.YAMLError:
        return


def _shape_pass(text: str, source: str, loader: Any) -> None:
    """:func:`_check_shape` over the events of ``loader``'s parser; its syntax errors raise."""
    import yaml

    sizes: dict[str, int] = {}  # anchor → values of its node, aliases inside expanded
    open_nodes: list[list[Any]] = []  # [anchor, values so far] of each collection being read
    total = 0

    def add(n: int, mark: Any) -> None:
        nonlocal total
        total += n
        if open_nodes:
            open_nodes[-1][1] += n
        if total > limits.MAX_YAML_VALUES:
            raise ConfigError(
                "config", source, f"has more than {limits.MAX_YAML_VALUES:,} values with its "
                f"aliases expanded (MAX_YAML_VALUES; at {_where(mark)})",
            )

    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_nodes) >= limits.MAX_YAML_DEPTH:
                raise ConfigError(
                    "config", source, f"nests deeper than {limits.MAX_YAML_DEPTH} levels "
                    f"(MAX_YAML_DEPTH) at {_where(event.start_mark)}",
                )
            add(1, event.start_mark)
            open_nodes.append([event.anchor, 1])
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, n = open_nodes.pop()
            if anchor is not None:
                sizes[anchor] = n
            if open_nodes:
                open_nodes[-1][1] += n
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_nodes):
                raise ConfigError(
                    "config", source, f"alias *{event.anchor} at {_where(event.start_mark)} "
                    f"refers to a node that contains it (a cycle)",
                )
            add(sizes.get(event.anchor or "", 1), event.start_mark)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                sizes[event.anchor] = 1
            add(1, event.start_mark)


def _check_unique_keys(node: yaml.Node, path: str, seen: set[int]) -> None:
    """Reject a mapping that names one key twice (``safe_load`` would keep the last silently).

    ``seen``: the nodes already checked — an aliased node is checked once, not once per alias.
    """
    import yaml

    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            at = f"{path}.{key}" if path else key
            if key in first_line:
                shown = value_node.value if isinstance(value_node, yaml.ScalarNode) else "..."
                raise ConfigError(
                    at, shown, f"duplicate key at {_where(key_node.start_mark)} "
                    f"(first at line {first_line[key]})",
                )
            first_line[key] = key_node.start_mark.line + 1
            _check_unique_keys(value_node, at, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, f"{path}[{i}]", seen)


def _bounded_loader(text: str, source: str) -> Any:
    """PyYAML's safe loader whose composer refuses a node nested deeper than
    ``MAX_YAML_DEPTH`` before it recurses into it (the composer recurses once per level: without
    this, a document the event pass did not bound would end in a RecursionError)."""
    import yaml

    class Bounded(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.depth >= limits.MAX_YAML_DEPTH and not self.check_event(
                    yaml.ScalarEvent, yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise ConfigError("config", source, f"nests deeper than {limits.MAX_YAML_DEPTH} "
                                  f"levels (MAX_YAML_DEPTH) at {_where(mark)}")
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return Bounded(text)


def parse_yaml(text: str, source: str = "config") -> Any:
    """One YAML document as plain data; syntax errors become one-line ``ConfigError``s."""
    import yaml

    if len(text) > limits.MAX_CONFIG_BYTES:
        raise ConfigError("config", source, f"has {len(text):,} characters; at most "
                          f"{limits.MAX_CONFIG_BYTES:,} (MAX_CONFIG_BYTES)")
    _check_shape(text, source)
    loader = None
    try:
        loader = _bounded_loader(text, source)
        root = loader.get_single_node()
        if root is None:
            return None
        _check_unique_keys(root, "", set())
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        parts = [str(p) for p in (exc.context, exc.problem) if p] or ["syntax error"]
        problem = " ".join(" ".join(parts).split())
        where = _where(exc.problem_mark)
        raise ConfigError("config", source, f"not valid YAML: {problem} at {where}") from None
    except yaml.YAMLError as exc:
        problem = " ".join(str(exc).split())
        raise ConfigError("config", source, f"not valid YAML: {problem}") from None
    except (ValueError, OverflowError) as exc:  # a value's constructor: 2001-13-45, 10**5000
        problem = " ".join(str(exc).split())[:200]
        raise ConfigError("config", source, f"not valid YAML: a value cannot be read "
                          f"({problem})") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_text(path: str) -> str:
    """The file's text; a missing, unreadable, irregular, too large or binary file is a
    ``ConfigError`` (:func:`nereus.config.files.read_text`)."""
    return files.read_text(path, "config", "YAML file", "MAX_CONFIG_BYTES")


def load_raw(path: str) -> dict[str, Any]:
    """The file's top-level mapping, not yet checked (callers may overlay CLI flags first)."""
    data = parse_yaml(read_text(path), path)
    if not isinstance(data, dict):
        raise ConfigError(
            "config", path, f"is {describe(data)}; must be a YAML mapping with sections "
            "job, models, cluster, controller",
        )
    return data


def load_config(path: str, *, extensions: tuple[str, ...] = EXTENSION_SECTIONS,
                detect_gpu: Callable[[], GpuSpec] | None = None) -> Config:
    """Read, parse and check the YAML config at ``path``; ``detect_gpu`` (the shell's inventory
    reader) is called only when the config says ``cluster.gpu: auto``; a Hugging Face
    checkpoint a model names is read here (its metadata: :mod:`nereus.config.checkpoint_files`)."""
    raw = load_raw(path)
    detected = detect_gpu() if detect_gpu is not None and uses_auto_gpu(raw) else None
    return parse_config(raw, extensions=extensions, detected_gpu=detected,
                        read_checkpoint=read_checkpoint)
