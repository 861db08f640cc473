"""store.py - kubesim's object store: one global resourceVersion counter,
optimistic concurrency (409 on a stale resourceVersion), metadata.generation
bumped on spec changes only, uid/creationTimestamp/generateName, and an
event log that watches resume from (410 Gone when a resourceVersion is
older than the retained window)."""
import copy
import datetime
import threading
import uuid



class ApiError(Exception):
    """An API failure with its HTTP status and Kubernetes reason."""

    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self):
        s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
             "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            s["details"] = self.details
        return s


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def path_segment_problem(name):
    """Why name cannot be an object's name (it is a path segment of its URL,
    and kubesim makes folders of some), or None."""
    if not isinstance(name, str):
        return "must be a string"
    if name in (".", ".."):
        return f"may not be '{name}'"
    for c in ("/", "%"):
        if c in name:
            return f"may not contain '{c}'"
    if len(name) > 253 or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        return "must be at most 253 printable characters"
    return None


def immutable_kept(rkey, name, old, obj, subresource):
    """A ConfigMap or Secret made immutable keeps its data and stays so:
    kube-apiserver refuses the update (422, its validation's words)."""
    kind = rkey[2]
    if rkey[:2] not in (("", "configmaps"), ("", "secrets")) or subresource or old.get("immutable") is not True:
        return
    for field in ("data", "binaryData", "stringData", "immutable"):
        if obj.get(field) != old.get(field) and not (field == "stringData" and not obj.get(field)):
            why = "Forbidden: field is immutable when `immutable` is set"
            raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {field}: {why}',
                           {"name": name, "kind": kind,
                            "causes": [{"reason": "FieldValueForbidden", "message": why, "field": field}]})


class Store:
    def __init__(self, window=10000):
        self.window = window  # events kept for watch resume
        self.lock = threading.Condition()
        self.rv = 0
        self.objects = {}  # (resource key, namespace, name) -> object
        self.events = []   # (rv, type, resource key, object)
        self.floor = 0     # resourceVersions before this were compacted away (restart)

    def _bump(self):
        self.rv += 1
        return str(self.rv)

    def _record(self, etype, rkey, obj):
        self.events.append((int(obj["metadata"]["resourceVersion"]), etype, rkey, copy.deepcopy(obj)))
        if len(self.events) > self.window:
            del self.events[: len(self.events) - self.window]
        self.lock.notify_all()

    def get(self, rkey, ns, name):
        with self.lock:
            obj = self.objects.get((rkey, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{rkey[1]} "{name}" not found',
                               {"name": name, "kind": rkey[1]})
            return copy.deepcopy(obj)

    def list(self, rkey, ns=None):
        with self.lock:
            items = [copy.deepcopy(o) for (k, n, _), o in self.objects.items()
                     if k == rkey and (ns is None or n == ns)]
            items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            return items, str(self.rv)

    def create(self, rkey, ns, obj):
        with self.lock:
            md = obj.setdefault("metadata", {})
            if not md.get("name") and md.get("generateName"):
                md["name"] = md["generateName"] + uuid.uuid4().hex[:5]
            name = md.get("name")
            if not name:
                raise ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
            bad = path_segment_problem(name)
            if bad:  # what kube-apiserver checks of every object's name (kinds add their own rules)
                raise ApiError(422, "Invalid", f'metadata.name: Invalid value: "{name}": {bad}')
            if (rkey, ns, name) in self.objects:
                raise ApiError(409, "AlreadyExists", f'{rkey[1]} "{name}" already exists',
                               {"name": name, "kind": rkey[1]})
            if ns is not None:
                md["namespace"] = ns
            md["uid"] = str(uuid.uuid4())
            md["creationTimestamp"] = now()
            md["generation"] = 1
            md["resourceVersion"] = self._bump()
            self.objects[(rkey, ns, name)] = obj
            self._record("ADDED", rkey, obj)
            return copy.deepcopy(obj)

    def update(self, rkey, ns, name, obj, subresource=None, status_sub=False, internal=False):
        """Replace an object, or only its status through the status
        subresource; with status_sub, a main-resource write keeps the old
        status (as the API server does for kinds with that subresource)."""
        with self.lock:
            old = self.objects.get((rkey, ns, name))
            if old is None:
                raise ApiError(404, "NotFound", f'{rkey[1]} "{name}" not found', {"name": name, "kind": rkey[1]})
            rv = obj.get("metadata", {}).get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {rkey[1]} "{name}": the object has been '
                               "modified; please apply your changes to the latest version and try again",
                               {"name": name, "kind": rkey[1]})
            immutable_kept(rkey, name, old, obj, subresource)
            new = copy.deepcopy(old)
            if subresource == "status":
                new["status"] = obj.get("status")
            else:
                new = copy.deepcopy(obj)
                if status_sub:
                    if "status" in old:
                        new["status"] = copy.deepcopy(old["status"])
                    else:
                        new.pop("status", None)
                md = new.setdefault("metadata", {})
                for k in ("uid", "creationTimestamp", "namespace", "name"):
                    if k in old["metadata"]:
                        md[k] = old["metadata"][k]
                md["generation"] = old["metadata"].get("generation", 1) + \
                    (1 if new.get("spec") != old.get("spec") else 0)
            md, omd = new["metadata"], old["metadata"]
            if not internal:  # clients cannot set or clear these; deletion does
                for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                    if k in omd:
                        md[k] = omd[k]
                    else:
                        md.pop(k, None)
                if omd.get("deletionTimestamp") and set(md.get("finalizers") or []) - set(omd.get("finalizers") or []):
                    raise ApiError(422, "Invalid", "metadata.finalizers: Forbidden: no new finalizers can be added "
                                                   "if the object is being deleted")
            md["resourceVersion"] = self._bump()
            if md.get("deletionTimestamp") and not md.get("finalizers"):
                del self.objects[(rkey, ns, name)]  # the last finalizer is gone: the deletion completes
                self._record("DELETED", rkey, new)
                return copy.deepcopy(new)
            self.objects[(rkey, ns, name)] = new
            self._record("MODIFIED", rkey, new)
            return copy.deepcopy(new)

    def delete(self, rkey, ns, name):
        with self.lock:
            old = self.objects.pop((rkey, ns, name), None)
            if old is None:
                raise ApiError(404, "NotFound", f'{rkey[1]} "{name}" not found', {"name": name, "kind": rkey[1]})
            old["metadata"]["resourceVersion"] = self._bump()
            self._record("DELETED", rkey, old)
            return copy.deepcopy(old)

    def compact(self):
        """What a restarted API server's fresh watch cache means for clients:
        every resourceVersion they hold is too old to resume from."""
        with self.lock:
            self.events = []
            self.floor = self.rv + 1
            self.lock.notify_all()

    def events_since(self, rkey, ns, rv):
        """Events for rkey after resourceVersion rv; ApiError 410 if rv left the window."""
        with self.lock:
            if rv < self.floor:
                raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.floor})")
            if self.events and rv < self.events[0][0] - 1:
                raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.events[0][0]})")
            return [(r, t, o) for (r, t, k, o) in self.events
                    if r > rv and k == rkey and (ns is None or o["metadata"].get("namespace") == ns)]
