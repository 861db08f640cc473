"""proto.py - reads the Kubernetes protobuf encoding of the few built-in
objects clients send that way: client-go's typed clientsets (Helm's
release storage among them) write Secrets and ConfigMaps, and the
DeleteOptions of their deletes, as application/vnd.kubernetes.protobuf. Answers stay JSON, which such
clients accept too.

The envelope is the 4 bytes "k8s\\0" and a runtime.Unknown message
(typeMeta = 1, raw = 2); raw is the object's own message. Field numbers
are those of k8s.io/api/core/v1/generated.proto and
k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto. ObjectMeta is read
for name, generateName, namespace, uid, resourceVersion, labels,
annotations, ownerReferences and finalizers; its other fields (managed
fields, timestamps the server sets itself) are skipped."""
import base64

MAGIC = b"k8s\x00"


class ProtoError(ValueError):
    """A body that is not a well-formed message (400)."""


class ProtoUnsupported(ProtoError):
    """A well-formed body of a kind not read here (415)."""


def _varint(buf, i):
    out, shift = 0, 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ProtoError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def fields(buf):
    """Yields (field number, wire type, value): ints for varints, bytes for
    length-delimited fields; fixed-width fields are skipped."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ProtoError("truncated field")
            v, i = buf[i:i + n], i + n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
            continue
        else:
            raise ProtoError(f"wire type {wire} not handled")
        yield num, wire, v


def _entry(buf):
    kv = {n: v for n, _, v in fields(buf)}
    return kv.get(1, b"").decode(), kv.get(2, b"")


def _meta(buf):
    m, labels, annotations = {}, {}, {}
    names = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    for n, _, v in fields(buf):
        if n in names:
            if v:  # gogo-protobuf writes empty strings that JSON omits
                m[names[n]] = v.decode()
        elif n == 11:
            k, x = _entry(v)
            labels[k] = x.decode()
        elif n == 12:
            k, x = _entry(v)
            annotations[k] = x.decode()
        elif n == 13:
            m.setdefault("ownerReferences", []).append(_owner(v))
        elif n == 14:
            m.setdefault("finalizers", []).append(v.decode())
    if labels:
        m["labels"] = labels
    if annotations:
        m["annotations"] = annotations
    return m


def _owner(buf):
    ref = {}
    for n, _, v in fields(buf):
        if n in (1, 3, 4, 5):
            ref[{1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}[n]] = v.decode()
        elif n in (6, 7):
            ref["controller" if n == 6 else "blockOwnerDeletion"] = bool(v)
    return ref


def _secret(buf):
    obj = {"apiVersion": "v1", "kind": "Secret", "data": {}}
    for n, _, v in fields(buf):
        if n == 1:
            obj["metadata"] = _meta(v)
        elif n == 2:
            k, x = _entry(v)
            obj["data"][k] = base64.b64encode(x).decode()
        elif n == 3 and v:
            obj["type"] = v.decode()
        elif n == 4:
            k, x = _entry(v)
            obj.setdefault("stringData", {})[k] = x.decode()
        elif n == 5:
            obj["immutable"] = bool(v)
    return obj


def _configmap(buf):
    obj = {"apiVersion": "v1", "kind": "ConfigMap"}
    for n, _, v in fields(buf):
        if n == 1:
            obj["metadata"] = _meta(v)
        elif n == 2:
            k, x = _entry(v)
            obj.setdefault("data", {})[k] = x.decode()
        elif n == 3:
            k, x = _entry(v)
            obj.setdefault("binaryData", {})[k] = base64.b64encode(x).decode()
        elif n == 4:
            obj["immutable"] = bool(v)
    return obj


def _delete_options(buf):
    obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
    for n, _, v in fields(buf):
        if n == 1:
            obj["gracePeriodSeconds"] = v
        elif n == 3:
            obj["orphanDependents"] = bool(v)
        elif n == 4 and v:
            obj["propagationPolicy"] = v.decode()
        elif n == 5:
            obj.setdefault("dryRun", []).append(v.decode())
    return obj


# DeleteOptions: the body of client-go's deletes (Helm's uninstall among them)
KINDS = {"Secret": _secret, "ConfigMap": _configmap, "DeleteOptions": _delete_options}


def decode(body):
    """The JSON form of a protobuf-encoded object; ProtoUnsupported for a
    kind not read here, ProtoError for anything malformed (a field of the
    wrong wire type included: an int where bytes belong has no .decode)."""
    if not body.startswith(MAGIC):
        raise ProtoError("no k8s protobuf envelope")
    try:
        unknown = {n: v for n, _, v in fields(body[len(MAGIC):])}
        tm = {n: v.decode() for n, _, v in fields(unknown.get(1, b""))}
        kind = tm.get(2, "")
        if kind not in KINDS:
            raise ProtoUnsupported(f"protobuf bodies of kind {kind!r} are not read here (send JSON)")
        return KINDS[kind](unknown.get(2, b""))
    except ProtoError:
        raise
    except UnicodeDecodeError as e:
        raise ProtoError(f"a string field is not UTF-8: {e}")
    except (TypeError, AttributeError, ValueError) as e:
        raise ProtoError(f"a field has the wrong wire type: {e}")
