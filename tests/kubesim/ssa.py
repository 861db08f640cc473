"""ssa.py - server-side apply (application/apply-patch+yaml) with field
managers, simplified: every leaf field (lists count as one leaf) is owned
by the managers that applied or wrote it, recorded in metadata.managedFields
as a list of dotted paths. Applying a value another manager owns with a
different value is a conflict (409) unless force=true, which takes the
field over; fields a manager applied before and now omits are removed when
no other manager owns them."""
import copy

import yaml

from store import ApiError, now

SKIP_META = {"managedFields", "resourceVersion", "uid", "creationTimestamp", "generation", "deletionTimestamp",
             "deletionGracePeriodSeconds", "namespace", "name", "selfLink"}


def leaves(obj, prefix=""):
    """{dotted path: value} of the leaves of obj (dicts recursed, lists whole)."""
    out = {}
    for k, v in (obj or {}).items():
        if prefix == ".metadata" and k in SKIP_META:
            continue
        p = f"{prefix}.{k}"
        if isinstance(v, dict) and v:
            out.update(leaves(v, p))
        else:
            out[p] = v
    return out


def get_path(obj, path):
    cur = obj
    for part in path.lstrip(".").split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def set_path(obj, path, value):
    parts = path.lstrip(".").split(".")
    for p in parts[:-1]:
        obj = obj.setdefault(p, {})
    obj[parts[-1]] = copy.deepcopy(value)


def del_path(obj, path):
    parts = path.lstrip(".").split(".")
    chain = [obj]
    for p in parts[:-1]:
        if not isinstance(chain[-1], dict) or p not in chain[-1]:
            return
        chain.append(chain[-1][p])
    chain[-1].pop(parts[-1], None)
    for i in range(len(parts) - 2, -1, -1):  # drop emptied parents
        if chain[i + 1] == {}:
            chain[i].pop(parts[i], None)


def owners(obj):
    """{manager: (operation, set of paths)} from metadata.managedFields."""
    out = {}
    for mf in obj.get("metadata", {}).get("managedFields") or []:
        out[mf["manager"]] = (mf.get("operation", "Update"), set(mf.get("fieldsV1", {}).get("f:paths", [])))
    return out


def store_owners(obj, own):
    obj.setdefault("metadata", {})["managedFields"] = [
        {"manager": m, "operation": op, "apiVersion": obj.get("apiVersion"), "time": now(),
         "fieldsType": "FieldsV1", "fieldsV1": {"f:paths": sorted(paths)}}
        for m, (op, paths) in sorted(own.items()) if paths]


class Yaml12Loader(yaml.SafeLoader):
    """YAML 1.2 booleans (true/false only): "y", "on", "yes" stay strings,
    as the API server's decoder reads them."""


Yaml12Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _first in "tTfF":
    Yaml12Loader.add_implicit_resolver("tag:yaml.org,2002:bool",
                                       __import__("re").compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), [_first])


def parse_body(raw):
    try:
        obj = yaml.load(raw.decode() if isinstance(raw, bytes) else raw, Loader=Yaml12Loader)
    except yaml.YAMLError as e:
        raise ApiError(400, "BadRequest", f"invalid apply body: {e}")
    if not isinstance(obj, dict):
        raise ApiError(400, "BadRequest", "the apply body must be an object")
    return obj


def apply(current, applied, manager, force):
    """Returns the new object after manager applies `applied` onto current (None: create)."""
    if not manager:
        raise ApiError(422, "Invalid", "metadata.managedFields: Required value: fieldManager is required for apply")
    new = copy.deepcopy(current) if current else {"metadata": {}}
    own = owners(current or {})
    mine = leaves(applied)
    conflicts = []
    for path, val in mine.items():
        for m, (op, paths) in own.items():
            if m != manager and path in paths and get_path(new, path) != val:
                conflicts.append((m, path))
    if conflicts and not force:
        detail = "\n".join(f'- conflict with "{m}": {p}' for m, p in conflicts)
        raise ApiError(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s): {detail}",
                       {"causes": [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"',
                                    "field": p} for m, p in conflicts]})
    before = own.get(manager, ("Apply", set()))[1]
    for path in before - set(mine):  # given up by this manager
        if not any(path in paths for m, (_, paths) in own.items() if m != manager):
            del_path(new, path)
    for path, val in mine.items():
        set_path(new, path, val)
    taken = {p for _, p in conflicts}  # forced: those fields change owner; equal values stay shared
    for m in list(own):
        if m != manager:
            op, paths = own[m]
            own[m] = (op, paths - taken)
    own[manager] = ("Apply", set(mine))
    for k in ("apiVersion", "kind"):
        if k in applied:
            new[k] = applied[k]
    store_owners(new, own)
    return new


def record_update(old, new, manager):
    """Ownership after a PUT/PATCH by manager: it owns the leaves it changed."""
    own = owners(old or {})
    changed = {p for p, v in leaves(new).items() if get_path(old or {}, p) != v}
    for m in list(own):
        op, paths = own[m]
        own[m] = (op, paths - changed)
    op, paths = own.get(manager, ("Update", set()))
    own[manager] = (op if op == "Apply" else "Update", paths | changed)
    store_owners(new, own)
