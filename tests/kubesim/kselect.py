"""kselect.py - labelSelector (equality and set-based) and fieldSelector
(metadata.name, metadata.namespace, status.phase; the events' fields
kube-apiserver selects on: involvedObject.*, reason, type, source,
reportingComponent) matching."""
import re

from store import ApiError

SET_RE = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split(sel):
    """Splits on commas that are not inside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in sel:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def label_matcher(sel):
    """Returns a predicate over a labels dict; ApiError 400 on bad syntax."""
    tests = []
    for term in _split(sel or ""):
        term = term.strip()
        m = SET_RE.match(term)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            tests.append(lambda l, k=key, o=op, vs=vals: (l.get(k) in vs) if o == "in" else (l.get(k) not in vs))
        elif "!=" in term:
            k, v = (x.strip() for x in term.split("!=", 1))
            tests.append(lambda l, k=k, v=v: l.get(k) != v)
        elif "=" in term:
            k, v = (x.strip() for x in term.replace("==", "=").split("=", 1))
            tests.append(lambda l, k=k, v=v: l.get(k) == v)
        elif term.startswith("!"):
            tests.append(lambda l, k=term[1:].strip(): k not in l)
        elif re.match(r"^[\w./-]+$", term):
            tests.append(lambda l, k=term: k in l)
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
    return lambda labels: all(t(labels or {}) for t in tests)


FIELDS = {"metadata.name": lambda o: o["metadata"].get("name"),
          "metadata.namespace": lambda o: o["metadata"].get("namespace"),
          "status.phase": lambda o: (o.get("status") or {}).get("phase"),
          "involvedObject.name": lambda o: (o.get("involvedObject") or {}).get("name"),
          "involvedObject.namespace": lambda o: (o.get("involvedObject") or {}).get("namespace"),
          "involvedObject.kind": lambda o: (o.get("involvedObject") or {}).get("kind"),
          "involvedObject.uid": lambda o: (o.get("involvedObject") or {}).get("uid"),
          "involvedObject.apiVersion": lambda o: (o.get("involvedObject") or {}).get("apiVersion"),
          "involvedObject.resourceVersion": lambda o: (o.get("involvedObject") or {}).get("resourceVersion"),
          "involvedObject.fieldPath": lambda o: (o.get("involvedObject") or {}).get("fieldPath"),
          "source": lambda o: (o.get("source") or {}).get("component"),
          "reportingComponent": lambda o: o.get("reportingComponent"),
          "reason": lambda o: o.get("reason"),
          "type": lambda o: o.get("type")}


def field_matcher(sel):
    tests = []
    for term in _split(sel or ""):
        neg = "!=" in term
        k, v = (x.strip() for x in term.replace("==", "=").replace("!=", "=").split("=", 1))
        if k not in FIELDS:
            raise ApiError(400, "BadRequest", f'field label not supported: "{k}"')
        tests.append(lambda o, f=FIELDS[k], v=v, neg=neg: (f(o) != v) if neg else (f(o) == v))
    return lambda obj: all(t(obj) for t in tests)


def matcher(q):
    lm, fm = label_matcher(q.get("labelSelector")), field_matcher(q.get("fieldSelector"))
    return lambda o: lm(o["metadata"].get("labels")) and fm(o)
