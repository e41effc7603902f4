#!/usr/bin/env python3
"""Validate Kubernetes manifests (a multi-document YAML stream on stdin, e.g. the output
of `kubectl kustomize`) and print them back as JSON, for tests/tests/e2e/deploy/.

- Built-in kinds: kubernetes-validate in strict mode (unknown fields fail), against every
  --kubernetes-version given.
- Custom resources: the JSON schemas in --crd-schemas (named
  `<group>_<version>_<Kind>.json`, additionalProperties false), because
  kubernetes-validate has no schemas for CRDs. A kind with neither schema fails.

Prints one JSON object {"objects": [...], "errors": ["Kind/name: ...", ...]} and exits 1
when there are errors (the objects are printed either way).
"""

import argparse
import json
import os
import sys

import jsonschema
import yaml

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - reported to the test
    print("kubernetes-validate is not installed: run tests/setup.sh", file=sys.stderr)
    sys.exit(2)


def crd_schema(schemas_dir, obj):
    api_version = obj.get("apiVersion", "")
    if "/" not in api_version:
        return None
    group, version = api_version.split("/", 1)
    path = os.path.join(schemas_dir, f"{group}_{version}_{obj.get('kind')}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def builtin_group(api_version):
    """Groups served by Kubernetes itself (no dot, or *.k8s.io)."""
    if "/" not in api_version:
        return True
    group = api_version.split("/", 1)[0]
    return "." not in group or group.endswith(".k8s.io")


def location(error):
    return "/".join(str(p) for p in error.absolute_path) or "(root)"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubernetes-version", action="append", required=True)
    parser.add_argument("--crd-schemas", required=True)
    args = parser.parse_args()

    objects, errors = [], []
    for obj in yaml.safe_load_all(sys.stdin):
        if obj is None:
            continue
        objects.append(obj)
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        schema = crd_schema(args.crd_schemas, obj)
        if schema is not None:
            validator = jsonschema.Draft202012Validator(schema)
            for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
                errors.append(f"{name}: {location(e)}: {e.message}")
            continue
        if not builtin_group(obj.get("apiVersion", "")):
            errors.append(
                f"{name}: no schema for {obj.get('apiVersion')} {obj.get('kind')}: add one to "
                f"{args.crd_schemas}"
            )
            continue
        for version in args.kubernetes_version:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{name}: Kubernetes {version}: {location(e)}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append(f"{name}: Kubernetes {version}: {e.message}")

    json.dump({"objects": objects, "errors": errors}, sys.stdout)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
