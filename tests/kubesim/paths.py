"""paths.py - the simple JSON paths that printer columns and scale
subresources use (".spec.replicas", ".status.conditions[0].type")."""
import re


_TOKEN = re.compile(r"""\.?([A-Za-z0-9_-]+)|\[(-?\d+)\]|\[\?\(@\.([A-Za-z0-9_-]+)\s*==\s*["'](.*?)["']\)\]""")


def jsonpath(obj, path):
    """Value at a simple path (".spec.replicas", ".status.conditions[0].type",
    '.status.conditions[?(@.type=="Ready")].status': the first match); None if absent."""
    path, cur, pos = (path or "").strip(), obj, 0
    if not path.lstrip("."):
        return None
    while pos < len(path) and cur is not None:
        m = _TOKEN.match(path, pos)
        if not m:
            return None
        pos = m.end()
        if m.group(1) is not None:
            cur = cur.get(m.group(1)) if isinstance(cur, dict) else None
        elif m.group(2) is not None:
            i = int(m.group(2))
            cur = cur[i] if isinstance(cur, list) and -len(cur) <= i < len(cur) else None
        else:
            cur = next((x for x in cur if isinstance(x, dict) and str(x.get(m.group(3))) == m.group(4)), None) \
                if isinstance(cur, list) else None
    return cur


def set_path(obj, path, value):
    parts = [p for p in path.strip().lstrip(".").split(".") if p]
    for p in parts[:-1]:
        obj = obj.setdefault(p, {})
    obj[parts[-1]] = value
