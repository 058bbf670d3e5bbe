"""A small Python renderer of this repository's kustomizations, for machines without kubectl.

It implements exactly the kustomize features ``deploy/kubernetes`` uses --
``resources`` (files and directories), ``configMapGenerator`` (``files``,
``options.labels``, ``options.disableNameSuffixHash``) with kustomize's
content-hash name suffix and the rewrite of pod references to the generated
name, JSON 6902 ``patches`` with a ``target``, ``images`` and ``namespace`` --
and refuses any other key, so it cannot silently render something kustomize
would not. ``tests/integration/test_deploy_manifests.py`` holds its output
equal to ``kubectl kustomize`` wherever kubectl is installed.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

KNOWN_KEYS = {"apiVersion", "kind", "resources", "configMapGenerator", "patches", "images",
              "namespace"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "CustomResourceDefinition", "PriorityClass"}
HASH_LETTERS = str.maketrans({"0": "g", "1": "h", "3": "k", "a": "m", "e": "t"})

Resource = dict[str, Any]


class KustomizeError(ValueError):
    pass


def render(folder: str | Path) -> list[Resource]:
    """The resources ``kubectl kustomize FOLDER`` prints (in no particular order)."""
    resources, renames = _build(Path(folder))
    for resource in resources:
        _rename_config_refs(resource, renames)
    return resources


def _build(folder: Path) -> tuple[list[Resource], dict[str, str]]:
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise KustomizeError(f"{folder}: kustomization keys this renderer lacks: {unknown}")
    resources: list[Resource] = []
    renames: dict[str, str] = {}
    for entry in spec.get("resources", []):
        path = folder / entry
        if path.is_dir():
            found, more = _build(path)
            resources += found
            renames.update(more)
        else:
            resources += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    for generator in spec.get("configMapGenerator", []):
        config_map, name = _config_map(folder, generator)
        resources.append(config_map)
        renames[generator["name"]] = name
    for patch in spec.get("patches", []):
        _patch(folder, patch, resources)
    for image in spec.get("images", []):
        _set_image(resources, image)
    if "namespace" in spec:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource.setdefault("metadata", {})["namespace"] = spec["namespace"]
    return resources, renames


def _config_map(folder: Path, generator: dict[str, Any]) -> tuple[Resource, str]:
    data: dict[str, str] = {}
    for item in generator.get("files", []):
        key, _, path = item.rpartition("=") if "=" in item else ("", "", item)
        data[key or Path(path).name] = (folder / path).read_text(encoding="utf-8")
    unknown = set(generator) - {"name", "files", "options"}
    if unknown:
        raise KustomizeError(f"configMapGenerator keys this renderer lacks: {unknown}")
    options = generator.get("options", {})
    name = generator["name"]
    if not options.get("disableNameSuffixHash"):
        name = f"{name}-{config_map_hash(data)}"
    metadata: dict[str, Any] = {"name": name}
    if options.get("labels"):
        metadata["labels"] = dict(options["labels"])
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}, name


def config_map_hash(data: dict[str, str]) -> str:
    """kustomize's suffix: sha256 of Go's JSON of {data, kind, name}, 10 hex digits recoded.

    The name is always empty there (kustomize 5.5 looks ``metadata/name`` up as one
    field name, which no ConfigMap has), so the suffix depends on the data alone."""
    encoded = json.dumps({"data": data, "kind": "ConfigMap", "name": ""}, sort_keys=True,
                         separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        encoded = encoded.replace(char, escape)
    return hashlib.sha256(encoded.encode()).hexdigest()[:10].translate(HASH_LETTERS)


def _patch(folder: Path, patch: dict[str, Any], resources: list[Resource]) -> None:
    target = patch.get("target", {})
    ops = yaml.safe_load((folder / patch["path"]).read_text(encoding="utf-8"))
    if not isinstance(ops, list):
        raise KustomizeError(f"{patch['path']}: only JSON 6902 patches (a list of ops)")
    matched = [r for r in resources
               if all(r.get("kind") == v if k == "kind" else r["metadata"].get(k) == v
                      for k, v in target.items())]
    if not matched:
        raise KustomizeError(f"patch {patch['path']}: no resource matches {target}")
    for resource in matched:
        for op in ops:
            _apply_op(resource, op)


def _apply_op(resource: Resource, op: dict[str, Any]) -> None:
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = resource
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) and last != "-" else last
    if op["op"] == "replace":
        if isinstance(node, dict) and key not in node:
            raise KustomizeError(f"replace {op['path']}: no such member")
        node[key] = copy.deepcopy(op["value"])
    elif op["op"] == "add":
        if isinstance(node, list):
            node.insert(len(node) if key == "-" else key, copy.deepcopy(op["value"]))
        else:
            node[key] = copy.deepcopy(op["value"])
    elif op["op"] == "remove":
        del node[key]
    else:
        raise KustomizeError(f"patch op {op['op']!r} not supported")


def _containers(resource: Resource) -> Iterator[dict[str, Any]]:
    pod = resource.get("spec", {}).get("template", {}).get("spec", {})
    yield from pod.get("initContainers", [])
    yield from pod.get("containers", [])


def _set_image(resources: list[Resource], image: dict[str, str]) -> None:
    for resource in resources:
        for container in _containers(resource):
            name, _, _tag = container["image"].partition(":")
            if name == image["name"]:
                container["image"] = (f"{image.get('newName', name)}:"
                                      f"{image.get('newTag', _tag or 'latest')}")


def _rename_config_refs(resource: Resource, renames: dict[str, str]) -> None:
    pod = resource.get("spec", {}).get("template", {}).get("spec", {})
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            ref = volume["configMap"]
            ref["name"] = renames.get(ref["name"], ref["name"])
    for container in _containers(resource):
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                ref["name"] = renames.get(ref["name"], ref["name"])
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref:
                ref["name"] = renames.get(ref["name"], ref["name"])
