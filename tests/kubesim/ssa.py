"""ssa.py - server-side apply (application/apply-patch+yaml) and field
ownership, after the API server's structured-merge-diff:

- A field set is the set of paths to the fields an object sets, in the
  FieldsV1 notation metadata.managedFields stores as a trie: "f:name" for
  a field, 'k:{"name":"c"}' for an item of a list keyed by merge keys (its
  "." entry: the item itself), 'v:"x"' for an item of a set, and a whole
  atomic list (args, tolerations, rules) as one leaf. Maps and structs are
  granular: each key is a field of its own.
- Every entry of managedFields (a manager and its operation, Apply or
  Update) owns a field set. Apply: the applier owns exactly the fields it
  sent; a field another entry owns with a different value is a conflict
  (409 naming the manager and the field) unless force=true, which takes it
  over; fields the applier owned before and no longer sends are removed
  from the object unless another entry owns them (a keyed item stays while
  another entry owns a field in it). Update (create, PUT, patches): the
  writer owns the fields it changed, taken from whoever owned them.
- Lists merge by their merge keys: containers, env, volumes and
  imagePullSecrets by name, volumeMounts by mountPath, container ports by
  containerPort+protocol, Service ports by port+protocol, conditions by
  type, ownerReferences by uid; finalizers are a set; other lists are
  atomic (custom resources: x-kubernetes-list-type/-map-keys could refine
  this; ours use conditions keyed by type and atomic lists otherwise)."""
import copy
import json

import yaml

from store import ApiError, now

# metadata fields the server sets; never owned
SKIP_META = {"managedFields", "resourceVersion", "uid", "creationTimestamp", "generation", "deletionTimestamp",
             "deletionGracePeriodSeconds", "namespace", "name", "selfLink", "generateName"}
LIST_KEYS = {"containers": ("name",), "initContainers": ("name",), "ephemeralContainers": ("name",),
             "env": ("name",), "volumes": ("name",), "volumeMounts": ("mountPath",), "volumeDevices": ("devicePath",),
             "imagePullSecrets": ("name",), "ownerReferences": ("uid",), "conditions": ("type",),
             "hostAliases": ("ip",), "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
             "resourceClaims": ("name",)}
SET_LISTS = {"finalizers"}
MISSING = object()


def list_keys(field, items):
    """The merge keys of list `field` (None: a set, (): atomic)."""
    if field in SET_LISTS:
        return None
    if field == "ports":  # a container's or a Service's
        dicts = [i for i in items if isinstance(i, dict)]
        return ("containerPort", "protocol") if dicts and all("containerPort" in i for i in dicts) else \
            ("port", "protocol") if dicts and all("port" in i for i in dicts) else ()
    keys = LIST_KEYS.get(field, ())
    return keys if all(isinstance(i, dict) for i in items) else ()


def item_key(keys, item):
    """'k:{...}' for a keyed item (protocol defaults to TCP, as the server defaults it)."""
    kd = {k: item[k] for k in keys if k in item}
    if "protocol" in keys and "protocol" not in kd:
        kd["protocol"] = "TCP"
    return "k:" + json.dumps(kd, sort_keys=True, separators=(",", ":"))


def walk(obj, prefix=(), top=True):
    """{path: value} of the fields obj sets (items of keyed lists also as "." paths)."""
    out = {}
    for k, v in (obj or {}).items():
        if top and k in ("apiVersion", "kind", "status"):
            continue
        if prefix == ("f:metadata",) and k in SKIP_META:
            continue
        p = prefix + ("f:" + k,)
        if isinstance(v, dict) and v:
            out.update(walk(v, p, False))
        elif isinstance(v, list) and v and list_keys(k, v) != ():
            keys = list_keys(k, v)
            for item in v:
                if keys is None:
                    out[p + ("v:" + json.dumps(item, sort_keys=True, separators=(",", ":")),)] = item
                else:
                    kp = p + (item_key(keys, item),)
                    out[kp + (".",)] = None
                    out.update(walk(item, kp, False))
        else:
            out[p] = v
    return out


def _find(lst, el):
    """Index of the item el ('k:...' or 'v:...') names in list lst, or None."""
    want = json.loads(el[2:])
    for i, item in enumerate(lst):
        if el.startswith("v:") and item == want:
            return i
        if el.startswith("k:") and isinstance(item, dict) and all(
                item.get(k, "TCP" if k == "protocol" else MISSING) == v for k, v in want.items()):
            return i
    return None


def value_at(obj, path):
    cur = obj
    for el in path:
        if el == ".":
            return cur
        if el.startswith("f:"):
            if not isinstance(cur, dict) or el[2:] not in cur:
                return MISSING
            cur = cur[el[2:]]
        else:
            i = _find(cur, el) if isinstance(cur, list) else None
            if i is None:
                return MISSING
            cur = cur[i]
    return cur


def delete_at(obj, path):
    """Removes the field (or list item) path names; emptied maps and lists above it go too."""
    if path[-1] == ".":
        path = path[:-1]
    chain, cur = [], obj
    for el in path[:-1]:
        nxt = value_at(cur, (el,))
        if nxt is MISSING or not isinstance(nxt, (dict, list)):
            return
        chain.append((cur, el))
        cur = nxt
    last = path[-1]
    if last.startswith("f:") and isinstance(cur, dict):
        cur.pop(last[2:], None)
    elif isinstance(cur, list):
        i = _find(cur, last)
        if i is not None:
            cur.pop(i)
    for parent, el in reversed(chain):  # prune what this emptied
        child = value_at(parent, (el,))
        if child in ({}, []):
            if el.startswith("f:"):
                parent.pop(el[2:], None)
            else:
                parent.pop(_find(parent, el))
        else:
            break


def merge(cur, app, field=None):
    """app applied over cur: maps by key, keyed lists by item, sets by value, the rest replaced."""
    if isinstance(app, dict) and isinstance(cur, dict):
        out = copy.deepcopy(cur)
        for k, v in app.items():
            out[k] = merge(cur.get(k, MISSING), v, k)
        return out
    if isinstance(app, list) and isinstance(cur, list) and list_keys(field, app + cur) != ():
        keys = list_keys(field, app + cur)
        out = copy.deepcopy(cur)
        for item in app:
            if keys is None:
                if item not in out:
                    out.append(copy.deepcopy(item))
                continue
            i = _find(out, item_key(keys, item))
            if i is None:
                out.append(copy.deepcopy(item))
            else:
                out[i] = merge(out[i], item)
        return out
    return copy.deepcopy(app)


def path_str(path):
    """.spec.template.spec.containers[name="c"].image, as the API server words it."""
    s = ""
    for el in path:
        if el.startswith("f:"):
            s += "." + el[2:]
        elif el.startswith("k:"):
            s += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(el[2:]).items()) + "]"
        elif el.startswith("v:"):
            s += "[" + el[2:] + "]"
    return s


# ---- managedFields -----------------------------------------------------------------

def to_trie(paths):
    root = {}
    for p in sorted(paths):
        node = root
        for el in p:
            node = node.setdefault(el, {})
    return root


def from_trie(node, prefix=()):
    out = set()
    for el, sub in (node or {}).items():
        p = prefix + (el,)
        if sub:
            out |= from_trie(sub, p)
        else:
            out.add(p)
    return out


def owners(obj):
    """{(manager, operation): set of paths} from metadata.managedFields."""
    out = {}
    for mf in (obj or {}).get("metadata", {}).get("managedFields") or []:
        out[(mf["manager"], mf.get("operation", "Update"))] = from_trie(mf.get("fieldsV1"))
    return out


def store_owners(obj, own):
    obj.setdefault("metadata", {})["managedFields"] = [
        {"manager": m, "operation": op, "apiVersion": obj.get("apiVersion"), "time": now(),
         "fieldsType": "FieldsV1", "fieldsV1": to_trie(paths)}
        for (m, op), paths in sorted(own.items()) if paths]


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


def _conflicts(current, mine, own, me):
    out = []
    for path, val in mine.items():
        if path[-1] == ".":
            continue
        have = value_at(current or {}, path)
        for who, paths in own.items():
            if who != me and path in paths and have != val:
                out.append((who[0], path))
    return out


def apply(current, applied, manager, force):
    """The new object after manager applies `applied` onto current (None: create)."""
    if not manager:
        raise ApiError(422, "Invalid", "metadata.managedFields: Required value: fieldManager is required for apply")
    me = (manager, "Apply")
    own = owners(current)
    mine = walk(applied)
    conflicts = _conflicts(current, mine, own, me)
    if conflicts and not force:
        # the API server's wording (apimachinery's conflict message): one conflict on a line, several listed
        gv = (current or {}).get("apiVersion") or applied.get("apiVersion", "v1")
        if len(conflicts) == 1:
            m, p = conflicts[0]
            msg = f'Apply failed with 1 conflict: conflict with "{m}" using {gv}: {path_str(p)}'
        else:
            by = {}
            for m, p in conflicts:
                by.setdefault(m, []).append(path_str(p))
            parts = [f'conflict{"s" if len(ps) > 1 else ""} with "{m}" using {gv}:' +
                     "".join(f"\n- {p}" for p in ps) for m, ps in by.items()]
            msg = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(parts)
        raise ApiError(409, "Conflict", msg,
                       {"causes": [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"',
                                    "field": path_str(p)} for m, p in conflicts]})
    new = merge(copy.deepcopy(current) if current else {"metadata": {}}, applied)
    others = set().union(*(paths for who, paths in own.items() if who != me)) if own else set()
    taken = {p for _, p in conflicts}  # forced: those fields change owner; equal values stay shared
    others -= taken
    # given up by this manager: whole items first (a key field removed first would lose the item)
    for path in sorted(own.get(me, set()) - set(mine), key=lambda p: (p[-1] != ".", -len(p))):
        stem = path[:-1] if path[-1] == "." else path
        if any(p[:len(stem)] == stem for p in mine):  # still applied beneath (a leaf turned into a map)
            continue
        if path[-1] == "." and any(p[:len(stem)] == stem for p in others):
            continue  # another owns a field of this item: the item stays
        if len(path) > 1 and path[-2].startswith("k:") and path[-1][2:] in json.loads(path[-2][2:]):
            continue  # a key field of an item that stays
        if path not in others:
            delete_at(new, path)
    exists = set(walk(new))
    for who in list(own):
        own[who] = (own[who] - taken) & exists if who != me else own[who]
    own[me] = set(mine)
    for k in ("apiVersion", "kind"):
        if k in applied:
            new[k] = applied[k]
    store_owners(new, own)
    return new


def record_update(old, new, manager):
    """Ownership after a create, PUT or patch by manager: it owns the fields
    it changed; fields gone from the object leave every owner."""
    own = owners(old)
    before, after = walk(old or {}), walk(new)
    changed = {p for p, v in after.items() if before.get(p, MISSING) != v}
    me = (manager, "Update")
    for who in list(own):
        own[who] = (own[who] - changed) & set(after)
    own[me] = own.get(me, set()) | changed
    store_owners(new, own)
