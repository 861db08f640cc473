"""paths.py - the simple JSON paths that printer columns and scale
subresources use (".spec.replicas", ".status.conditions[0].type")."""


def jsonpath(obj, path):
    """Value at a simple dotted path (".spec.replicas", ".status.conditions[0].type"); None if absent."""
    parts = [p for p in (path or "").strip().lstrip(".").split(".") if p]
    if not parts:
        return None
    cur = obj
    for part in parts:
        idx = None
        if part.endswith("]") and "[" in part:
            part, idx = part[:-1].split("[")
        cur = cur.get(part) if isinstance(cur, dict) else None
        if idx is not None:
            cur = cur[int(idx)] if isinstance(cur, list) and -len(cur) <= int(idx) < len(cur) else None
    return cur


def set_path(obj, path, value):
    parts = [p for p in path.strip().lstrip(".").split(".") if p]
    for p in parts[:-1]:
        obj = obj.setdefault(p, {})
    obj[parts[-1]] = value
