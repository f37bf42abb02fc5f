"""Reading YAML that a user (or an attacker) wrote, with bounds: file size, duplicate keys, aliases.

PyYAML's SafeLoader never runs code, but it still reads a file of any size (``/dev/zero`` never
ends), lets a later duplicate key silently win, and builds alias graphs whose expansion is
exponential in the file size (the "billion laughs"). ``BoundedSafeLoader`` refuses the last two
and ``read_yaml_text`` bounds the first; ``common.config`` (the one YAML reader) uses both."""

import os

import yaml

MAX_YAML_BYTES = 1 << 20  # a config is a few KB; a megabyte is already absurd
MAX_EXPANDED_NODES = 100_000  # nodes after expanding every alias


class YamlLimitError(ValueError):
    """The YAML is well-formed but refused: too large, a duplicate key, or an alias bomb."""


def read_yaml_text(path: str | os.PathLike, max_bytes: int = MAX_YAML_BYTES) -> str:
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise YamlLimitError(f"{os.fspath(path)} is larger than {max_bytes:,} bytes; pass a YAML config file")
    return data.decode("utf-8")


class BoundedSafeLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate mapping keys and aliases that expand too far."""

    def get_single_node(self):  # noqa: ANN202 - PyYAML's own signature
        node = super().get_single_node()
        if node is not None:
            _check_expanded_size(node)
        return node

    def construct_mapping(self, node, deep=False):  # noqa: ANN001, ANN202
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value!r} (first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _check_expanded_size(root: yaml.Node) -> None:
    """Count the nodes the document would have with every alias copied out; refuse too many. Aliased
    nodes are shared objects, so their sizes are memoised: the count is linear in the file."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in in_progress:
            raise YamlLimitError("an alias refers to a node that contains it (a recursive structure)")
        in_progress.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        in_progress.discard(key)
        sizes[key] = total
        if total > MAX_EXPANDED_NODES:
            raise YamlLimitError(
                f"expanding its aliases gives more than {MAX_EXPANDED_NODES:,} values; write the values out"
            )
        return total

    size(root)
