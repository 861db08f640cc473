"""schema.py - structural OpenAPI v3 schema handling for custom resources,
as the API server does it: defaults applied, unknown fields pruned (unless
x-kubernetes-preserve-unknown-fields), then validation of types, required,
enum, bounds, lengths and patterns, and the CEL rules of
x-kubernetes-validations (evaluated by cel-python, the Common Expression
Language's Python implementation; the root's rules see metadata.name).
Errors carry field paths."""
import re

try:
    import celpy
except ImportError:  # make deps installs it; without it the rules are not enforced
    celpy = None

_CEL = {}

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _type_ok(t, v):
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return t not in TYPES or isinstance(v, TYPES[t])


def default_and_prune(schema, v, path="", pruned=None):
    """Applies defaults and drops unknown fields in place; returns v. The
    paths of the fields dropped go to pruned (when a list): under
    fieldValidation=Strict the API server refuses them instead."""
    if not isinstance(schema, dict):
        return v
    if isinstance(v, dict) and schema.get("type") == "object":
        props = schema.get("properties", {})
        for k, sub in props.items():
            if k not in v and isinstance(sub, dict) and "default" in sub:
                v[k] = sub["default"]
        extra = schema.get("additionalProperties")
        for k in list(v):
            if k in props:
                default_and_prune(props[k], v[k], f"{path}.{k}", pruned)
            elif isinstance(extra, dict):
                default_and_prune(extra, v[k], f"{path}.{k}", pruned)
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and extra is not True:
                del v[k]
                if pruned is not None:
                    pruned.append(f"{path}.{k}")
    elif isinstance(v, list) and isinstance(schema.get("items"), dict):
        for i, x in enumerate(v):
            default_and_prune(schema["items"], x, f"{path}[{i}]", pruned)
    return v


def validate(schema, v, path, errs):
    """Appends (path, message) for every violation of schema by v."""
    if not isinstance(schema, dict):
        return
    t = schema.get("type")
    if v is None:
        if not schema.get("nullable"):
            errs.append((path, f"Invalid value: \"null\": {path} in body must be of type {t or 'object'}"))
        return
    if t and not _type_ok(t, v) and not schema.get("x-kubernetes-int-or-string"):
        errs.append((path, f"Invalid value: \"{_kind(v)}\": {path} in body must be of type {t}: \"{_kind(v)}\""))
        return
    if "enum" in schema and v not in schema["enum"]:
        allowed = ", ".join(f'"{e}"' for e in schema["enum"])
        errs.append((path, f"Unsupported value: {_show(v)}: supported values: {allowed}"))
    _bounds(schema, v, path, errs)
    cel_rules(schema, v, path, errs)
    if isinstance(v, dict):
        for k in schema.get("required", []):
            if k not in v:
                errs.append((f"{path}.{k}", "Required value"))
        props = schema.get("properties", {})
        for k, x in v.items():
            sub = props.get(k, schema.get("additionalProperties"))
            validate(sub, x, f"{path}.{k}", errs)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            validate(schema.get("items"), x, f"{path}[{i}]", errs)


def _bounds(schema, v, path, errs):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if "minimum" in schema and v < schema["minimum"]:
            errs.append((path, f"Invalid value: {v}: {path} in body should be greater than or equal to "
                               f"{schema['minimum']}"))
        if "maximum" in schema and v > schema["maximum"]:
            errs.append((path, f"Invalid value: {v}: {path} in body should be less than or equal to "
                               f"{schema['maximum']}"))
    if isinstance(v, str):
        if "minLength" in schema and len(v) < schema["minLength"]:
            errs.append((path, f"Invalid value: \"{v}\": {path} in body should be at least "
                               f"{schema['minLength']} chars long"))
        if "maxLength" in schema and len(v) > schema["maxLength"]:
            errs.append((path, f"Too long: may not be more than {schema['maxLength']} bytes"))
        if "pattern" in schema and not re.search(schema["pattern"], v):
            errs.append((path, f"Invalid value: \"{v}\": {path} in body should match '{schema['pattern']}'"))
    if isinstance(v, list):
        if "minItems" in schema and len(v) < schema["minItems"]:
            errs.append((path, f"Invalid value: {len(v)}: {path} in body should have at least "
                               f"{schema['minItems']} items"))
        if "maxItems" in schema and len(v) > schema["maxItems"]:
            errs.append((path, f"Too many: {len(v)}: must have at most {schema['maxItems']} items"))


def _kind(v):
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number"}.get(type(v), "null")


def _show(v):
    return f'"{v}"' if isinstance(v, str) else str(v)


def cel_rules(schema, v, path, errs):
    """x-kubernetes-validations: each rule, with self = v, must hold."""
    for rule in schema.get("x-kubernetes-validations") or []:
        if celpy is None:
            return
        prog = _CEL.get(rule["rule"])
        if prog is None:
            env = celpy.Environment()
            prog = _CEL[rule["rule"]] = env.program(env.compile(rule["rule"]))
        try:
            ok = prog.evaluate({"self": celpy.json_to_cel(v)})
        except Exception as e:  # a rule that cannot be evaluated is an error, as on the API server
            ok = False
            rule = {**rule, "message": f"{rule.get('message') or rule['rule']} (evaluation error: {e})"}
        if ok is not True and not (isinstance(ok, celpy.celtypes.BoolType) and bool(ok)):
            msg = rule.get("message") or f"failed rule: {rule['rule']}"
            errs.append((path + (rule.get("fieldPath") or ""), f'Invalid value: "{_kind(v)}": {msg}'))
