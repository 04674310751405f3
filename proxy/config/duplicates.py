"""Keys written twice in one YAML mapping: PyYAML keeps the last silently; we refuse them."""

from __future__ import annotations

import yaml

from proxy.errors import ConfigError


def duplicate_keys(text: str) -> list[ConfigError]:
    """Every key that repeats in its mapping, named by its path, with both lines."""
    found: list[ConfigError] = []
    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if document is not None:
            _walk(document, "", found)
    return found


def _walk(node: yaml.Node, path: str, found: list[ConfigError]) -> None:
    if isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            where = f"{path}.{key}" if path else key
            line = key_node.start_mark.line + 1
            if key == "<<":  # a merge key, not a key of its own
                continue
            if key in first_line:
                found.append(
                    ConfigError(
                        where,
                        f"duplicate key (line {line}; first written on line {first_line[key]})",
                    )
                )
            else:
                first_line[key] = line
            _walk(value_node, where, found)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, f"{path}[{i}]", found)
