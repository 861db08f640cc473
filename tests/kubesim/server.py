"""server.py - kubesim's HTTP front: discovery, CRUD, list, watch (chunked
JSON events, resume from resourceVersion, 410 when too old, timeoutSeconds),
JSON merge patch, bearer-token authentication and Table output for kubectl.

Also: CustomResourceDefinitions served at once (schema defaults, pruning
and validation with field paths, status and scale subresources, printer
columns), label and field selectors on list and watch.

Not yet (see the issue notes): RBAC authorization, strategic merge and
server-side apply, OpenAPI documents, limit/continue, finalizers and
garbage collection, and the workload simulation."""
import base64
import copy
import datetime
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import proto
import schema as crschema
import ssa
from collector import Collector
from rbac import Authorizer, User
from hpa import Autoscaler
from paths import jsonpath, set_path
from workload import Workloads, pod_ready
from resources import BUILTIN, crd_resources
from kselect import matcher
from store import ApiError, Store

MAX_BODY = 3 * 1024 * 1024  # the real API server's request limit
BOOKMARK_PERIOD = float(__import__("os").environ.get("KUBESIM_BOOKMARK_SECONDS", "5"))


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# List fields merged element by element in a strategic merge patch, by key
# (the patchMergeKey of the built-in types kubectl patches).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
              "volumes": "name", "volumeMounts": "mountPath", "imagePullSecrets": "name",
              "conditions": "type", "hostAliases": "ip", "topologySpreadConstraints": "topologyKey"}
PORT_KEYS = ("containerPort", "port")


def strategic_merge(target, patch, field=None):
    """Strategic merge patch for built-in kinds: like a JSON merge patch,
    but keyed lists merge element by element ($patch: delete removes one),
    and the $setElementOrder/$retainKeys directives are honoured or ignored
    the way kube-apiserver does for these types."""
    if isinstance(patch, list):
        key = MERGE_KEYS.get(field) or (next((k for k in PORT_KEYS if all(isinstance(e, dict) and k in e
                                                                          for e in patch)), None)
                                        if field == "ports" else None)
        if key is None or not isinstance(target, list):
            return [strategic_merge(None, e) for e in patch]
        out = copy.deepcopy(target)
        for e in patch:
            idx = next((i for i, t in enumerate(out) if isinstance(t, dict) and t.get(key) == e.get(key)), None)
            if isinstance(e, dict) and e.get("$patch") == "delete":
                if idx is not None:
                    out.pop(idx)
            elif idx is None:
                out.append(strategic_merge(None, e))
            else:
                out[idx] = strategic_merge(out[idx], e)
        return out
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: v for k, v in copy.deepcopy(patch).items() if k != "$patch"}
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):  # $setElementOrder/..., $retainKeys, $deleteFromPrimitiveList/...
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = strategic_merge(out.get(k), v, k)
    return out


def json_patch(doc, ops):
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    doc = copy.deepcopy(doc)
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")

    def walk(path):
        if not path.startswith("/"):
            raise ApiError(422, "Invalid", f"JSON patch path {path!r} must start with /")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        return parent, parts[-1]

    def get(path):
        parent, key = walk(path)
        return parent[int(key)] if isinstance(parent, list) else parent[key]

    def remove(path):
        parent, key = walk(path)
        return parent.pop(int(key)) if isinstance(parent, list) else parent.pop(key)

    def add(path, value):
        parent, key = walk(path)
        if isinstance(parent, list):
            parent.insert(len(parent) if key == "-" else int(key), value)
        else:
            parent[key] = value
    try:
        for op in ops:
            kind, path = op.get("op"), op.get("path", "")
            if kind == "add":
                add(path, copy.deepcopy(op["value"]))
            elif kind == "remove":
                remove(path)
            elif kind == "replace":
                remove(path)
                add(path, copy.deepcopy(op["value"]))
            elif kind == "move":
                add(path, remove(op["from"]))
            elif kind == "copy":
                add(path, copy.deepcopy(get(op["from"])))
            elif kind == "test":
                if get(path) != op.get("value"):
                    raise ApiError(422, "Invalid", f"JSON patch test failed at {path}")
            else:
                raise ApiError(422, "Invalid", f"unknown JSON patch operation {kind!r}")
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise ApiError(422, "Invalid", f"JSON patch could not be applied: {e!r}")
    return doc


class Api:
    """Routing state shared by all request threads."""

    def __init__(self, token, window, image_map=None, incluster=None):
        self.token = token
        self.epoch = 0         # bumped by a simulated restart: older connections are dropped
        self.conflicts = {}    # plural -> writes still to answer 409 (fault injection)
        self.requests = {}     # "VERB plural[/name]" -> requests authorized (GET /kubesim/requests)
        self.watch_unavailable = None  # a file: while it exists, watches answer 503 + Retry-After
        self.delays = []       # [(User-Agent substring, seconds, methods)]: such clients' requests wait first
        self.status_writes = []  # [{time, user_agent, path, code}] of status subresource writes
        self.restart = None    # set by serve(): fn(down_seconds)
        self.store = Store(window)
        self.gc = Collector(self.store)
        self.authz = Authorizer(self.store, token)
        if incluster is not None:
            incluster["mint"] = lambda ns, sa: self.authz.mint(ns, sa)
        self.workloads = Workloads(self.store, image_map, incluster, incluster and incluster["dir"])
        self.autoscaler = Autoscaler(self, self.workloads,
                                     float(__import__("os").environ.get("KUBESIM_HPA_SECONDS", "15")))
        self.resources = {}
        for r in BUILTIN:
            self.resources[(r.group, r.version, r.plural)] = r
        for ns in ("default", "kube-system", "kube-public"):
            self.store.create(self.res("", "v1", "namespaces").key, None,
                              {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            self.namespace_created(ns)

    def namespace_created(self, ns):
        """Every namespace gets its "default" service account, as in a cluster."""
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}
        try:
            self.store.create(self.res("", "v1", "serviceaccounts").key, ns, sa)
        except ApiError:
            pass

    def crd_changed(self, crd, deleted=False):
        """Serves (or stops serving) the resources a CRD defines."""
        spec = crd.get("spec", {})
        group, plural = spec.get("group"), spec.get("names", {}).get("plural")
        for k in [k for k in self.resources if k[0] == group and k[2] == plural]:
            del self.resources[k]
        if not deleted:
            for r in crd_resources(crd):
                self.resources[(r.group, r.version, r.plural)] = r

    def count(self, verb, plural, name):
        key = f"{verb} {plural}/{name}" if name else f"{verb} {plural}"
        with self.store.lock:
            self.requests[key] = self.requests.get(key, 0) + 1

    def take_conflict(self, plural):
        with self.store.lock:
            if self.conflicts.get(plural, 0) > 0:
                self.conflicts[plural] -= 1
                return True
            return False

    def res(self, group, version, plural):
        r = self.resources.get((group, version, plural))
        if r is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({plural})")
        return r

    def groups(self):
        out = {}
        for (g, v, _), _r in self.resources.items():
            if g:
                out.setdefault(g, set()).add(v)
        return out


def parse_path(path):
    """-> (group, version, namespace, plural, name, subresource) or None."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    ns = None
    if len(rest) >= 3 and rest[0] == "namespaces":  # /namespaces/NS/PLURAL...; /namespaces/NAME is the object
        ns, rest = rest[1], rest[2:]
    if not rest:
        return (group, version, None, None, None, None)
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return (group, version, ns, plural, name, sub)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall
    api = None  # set by serve()

    def log_message(self, fmt, *args):  # quiet: tests read stdout
        pass

    # ---- plumbing ----------------------------------------------------------
    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        if getattr(self, "retry_after", None):
            self.send_header("Retry-After", str(self.retry_after))
            self.retry_after = None
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def fail(self, e):
        if e.code in (429, 503):
            self.retry_after = e.details.get("retryAfterSeconds") if isinstance(e.details, dict) else None
        self.send_json(e.code, e.status())

    def read_chunked(self):
        """A body sent with Transfer-Encoding: chunked (kubectl create --raw -f)."""
        out = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return out
            out += self.rfile.read(size)
            self.rfile.readline()
            if len(out) > MAX_BODY:
                self.close_connection = True
                raise ApiError(413, "RequestEntityTooLarge", f"request body exceeds {MAX_BODY} bytes")

    def raw_body(self):
        if self._body is None:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                self._body = self.read_chunked()
                return self._body
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                self.close_connection = True
                raise ApiError(413, "RequestEntityTooLarge", f"request body of {n} bytes exceeds {MAX_BODY}")
            self._body = self.rfile.read(n) if n else b""
        return self._body

    def body(self):
        raw = self.raw_body()
        if "protobuf" in self.headers.get("Content-Type", ""):
            try:
                return proto.decode(raw)
            except proto.ProtoUnsupported as e:
                raise ApiError(415, "UnsupportedMediaType", f"protobuf body: {e}")
            except proto.ProtoError as e:
                raise ApiError(400, "BadRequest", f"protobuf body: {e}")
        try:
            obj = json.loads(raw or b"null")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"invalid JSON body: {e}")
        return obj

    def authenticated(self):
        """Sets self.user; answers 401 and returns False when unknown."""
        self.user = self.api.authz.authenticate(self.headers.get("Authorization", ""))
        if self.user is None and self.api.token is None:  # plain HTTP mode: everyone is the admin
            self.user = User("admin", ["system:masters"])
        if self.user is not None:
            return True
        self.send_json(401, ApiError(401, "Unauthorized", "Unauthorized").status())
        return False

    def authorize(self, method, route, q):
        group, version, ns, plural, name, sub = route
        verb = {"GET": "get" if name else ("watch" if q.get("watch") in ("1", "true") else "list"),
                "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
        if method == "POST" and sub:  # e.g. serviceaccounts/NAME/token
            verb = "create"
        resource = f"{plural}/{sub}" if sub else plural
        r = self.api.resources.get((group, version, plural))
        self.api.authz.check(self.user, verb, group, resource, ns if r is None or r.namespaced else None, name)
        return verb

    def setup(self):
        super().setup()
        self.epoch = self.api.epoch

    def dispatch(self, method):
        self._body = None
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        # kubectl (1.27+) asks for Strict: an unknown field of a custom resource is then refused, not pruned
        self.strict = q.get("fieldValidation") == "Strict"
        if self.epoch != self.api.epoch:  # a connection from before a restart: it breaks
            self.close_connection = True
            return
        try:
            if not self.authenticated():
                return
            if url.path == "/kubesim/faults":
                return self.faults(method)
            if url.path == "/kubesim/requests":
                return self.request_counts(method)
            if url.path == "/kubesim/status-writes":
                with self.api.store.lock:
                    return self.send_json(200, {"writes": list(self.api.status_writes)})
            if self.discovery(url.path):
                return
            ua = self.headers.get("User-Agent") or ""
            for needle, seconds, methods in list(self.api.delays):  # a client whose calls the server stalls
                if needle in ua and (not methods or method in methods):
                    time.sleep(seconds)
            route = parse_path(url.path)
            if route is None or route[3] is None:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({url.path})")
            verb = self.authorize(method, route, q)
            self.api.count(verb, route[3], route[4])
            hold = self.api.watch_unavailable
            if verb == "watch" and hold and os.path.exists(hold):
                raise ApiError(503, "ServiceUnavailable", "the watch cache is not ready (injected)",
                               {"retryAfterSeconds": 2})
            if route[3] == "services" and route[5] == "proxy":
                return self.service_proxy(method, route, url)
            if route[5] == "status" and method in ("PUT", "PATCH"):
                return self.logged_status_write(method, route, q, ua)
            if method in ("PUT", "PATCH") and self.api.take_conflict(route[3]):
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {route[3]} "{route[4]}": '
                               "the object has been modified; please apply your changes to the latest version "
                               "and try again (injected)", {"name": route[4], "kind": route[3]})
            getattr(self, "do_" + method.lower() + "_obj")(route, q)
        except ApiError as e:
            if self._body is None and self.headers.get("Content-Length") and e.code != 413:
                try:
                    self.body()  # drain it so the keep-alive connection stays in sync
                except ApiError:
                    pass
            self.fail(e)

    PROXY_MAX_ANSWER = 64 << 20  # an answer larger than this is refused whole (502), not held in memory
    PROXY_SECONDS = 600          # the whole exchange with the pod, not each read

    def service_proxy(self, method, route, url):
        """/api/v1/namespaces/NS/services/NAME[:PORT]/proxy/PATH: the request
        goes to a ready endpoint of the service, as kube-apiserver's service
        proxy sends it (what `kubectl proxy` and `kubectl create --raw` reach).
        Content-Type and Accept go to the pod; its status, Content-Type and
        Retry-After come back. The answer comes back whole, not streamed."""
        ns, ref = route[2], route[4]
        name, _, port = ref.partition(":")
        try:
            svc = self.api.store.get(("", "services", "Service"), ns, name)
        except ApiError:
            raise ApiError(404, "NotFound", f'services "{name}" not found')
        try:
            ep = self.api.store.get(("", "endpoints", "Endpoints"), ns, name)
        except ApiError:
            ep = {}  # not written yet: no endpoints
        ports = (svc.get("spec") or {}).get("ports") or []
        sp = next((pt for pt in ports if not port or pt.get("name") == port or str(pt.get("port")) == port), None)
        subsets = [s for s in ep.get("subsets") or [] if s.get("addresses")]
        target = sp and self.proxy_port(ns, sp, subsets)
        if not target:
            raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{ref}"')
        marker = f"/services/{ref}/proxy"
        rest = url.path[url.path.index(marker) + len(marker):] if marker in url.path else "/"
        body = self.raw_body() if method in ("POST", "PUT", "PATCH") else None
        headers = {k: self.headers[k] for k in ("Content-Type", "Accept") if self.headers.get(k)}
        status, out_headers, data = self.proxy_exchange(subsets[0]["addresses"][0]["ip"], target, method,
                                                        (rest or "/") + (f"?{url.query}" if url.query else ""),
                                                        body, headers)
        self.send_response(status)
        for k, v in out_headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def proxy_port(self, ns, sp, subsets):
        """The pod port a service port leads to: the Endpoints' number, or a
        named targetPort looked up in the first pod's container ports."""
        want = sp.get("targetPort", sp.get("port"))
        got = next((p.get("port") for p in (subsets[0].get("ports") or []) if p.get("name", "") == sp.get("name", "")),
                   want) if subsets else None
        if isinstance(got, int) or (isinstance(got, str) and got.isdigit()):
            return int(got)
        ref = (subsets[0]["addresses"][0].get("targetRef") or {}) if subsets else {}
        try:
            pod = self.api.store.get(("", "pods", "Pod"), ns, ref.get("name", ""))
        except ApiError:
            return None
        return next((p.get("containerPort") for c in pod["spec"].get("containers") or []
                     for p in c.get("ports") or [] if p.get("name") == got), None)

    def proxy_exchange(self, ip, port, method, path, body, headers):
        """(status, headers to pass on, body) of the pod's answer, within
        PROXY_SECONDS in all and PROXY_MAX_ANSWER bytes; ApiError 503/502 else."""
        deadline = time.monotonic() + self.PROXY_SECONDS
        conn = http.client.HTTPConnection(ip, port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            data = b""
            while True:
                if time.monotonic() > deadline:
                    raise ApiError(503, "ServiceUnavailable", "the pod's answer did not end in time")
                part = r.read1(65536)
                if not part:
                    break
                data += part
                if len(data) > self.PROXY_MAX_ANSWER:
                    raise ApiError(502, "BadGateway", f"the pod's answer is over {self.PROXY_MAX_ANSWER} bytes")
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise ApiError(503, "ServiceUnavailable", f"error trying to reach service: {e}")
        finally:
            conn.close()
        keep = {k: r.getheader(k) for k in ("Content-Type", "Retry-After") if r.getheader(k)}
        keep.setdefault("Content-Type", "application/octet-stream")
        return r.status, keep, data

    def faults(self, method):
        """POST /kubesim/faults (admin only), for fault tests:
        {"conflicts": {"deployments": 2}}: the next 2 updates or patches of
        deployments answer 409; {"restart": {"downSeconds": 2}}: the API
        server "restarts" - every connection (watches too) breaks, it
        refuses connections for downSeconds, and every resourceVersion
        clients hold becomes too old (410 on resume); with "holdFile": a
        path, it stays down after that until the file is gone, so a test
        on a loaded machine can see it down without racing a timer;
        {"watchUnavailable": {"holdFile": path}}: while the file exists,
        every watch request answers 503 with Retry-After: 2 (an API server
        in trouble); {"delays": [{"userAgent": s, "seconds": n}]}: every
        request whose User-Agent contains s waits n seconds before it is
        served (a replica cut off behind a stalled link - its requests are
        still carried out, late)."""
        if method != "POST":
            raise ApiError(405, "MethodNotAllowed", "POST a fault")
        if "system:masters" not in self.user.groups:
            raise ApiError(403, "Forbidden", "fault injection is for the admin")
        req = self.body() or {}
        if "watchUnavailable" in req:
            self.api.watch_unavailable = (req["watchUnavailable"] or {}).get("holdFile")
        for d in req.get("delays") or []:
            self.api.delays.append((d["userAgent"], float(d["seconds"]), tuple(d.get("methods") or ())))
        for plural, n in (req.get("conflicts") or {}).items():
            with self.api.store.lock:
                self.api.conflicts[plural] = self.api.conflicts.get(plural, 0) + int(n)
        self.send_json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        if req.get("restart") is not None:
            down = float((req["restart"] or {}).get("downSeconds", 1))
            hold = (req["restart"] or {}).get("holdFile")
            threading.Thread(target=self.api.restart, args=(down, hold), daemon=True).start()
        self.close_connection = True

    def logged_status_write(self, method, route, q, ua):
        """A status write, recorded with its client and outcome in the order
        the server carries them out (GET /kubesim/status-writes)."""
        code = 200
        try:
            getattr(self, "do_" + method.lower() + "_obj")(route, q)
        except ApiError as e:
            code = e.code
            raise
        finally:
            with self.api.store.lock:
                self.api.status_writes.append({"time": time.time(), "userAgent": ua, "code": code,
                                               "path": "/".join(x or "" for x in route[2:5])})

    def request_counts(self, method):
        """GET /kubesim/requests: {"get deployments/story": 12, "list pods":
        3, ...}, every authorized request since the start by verb, resource
        and name - how tests see how many calls a client makes."""
        if method != "GET":
            raise ApiError(405, "MethodNotAllowed", "GET the counts")
        with self.api.store.lock:
            counts = dict(self.api.requests)
        self.send_json(200, counts)

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_PATCH(self):
        self.dispatch("PATCH")

    def do_DELETE(self):
        self.dispatch("DELETE")

    # ---- discovery ---------------------------------------------------------
    def discovery(self, path):
        api = self.api
        if path in ("/healthz", "/readyz", "/livez"):
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(body)
            return True
        if path == "/version":
            self.send_json(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-kubesim",
                                 "platform": "linux/amd64"})
            return True
        if path == "/api":
            self.send_json(200, {"kind": "APIVersions", "versions": ["v1"],
                                 "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                                 "serverAddress": self.headers.get("Host", "")}]})
            return True
        if path == "/apis":
            groups = [{"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(vs)],
                       "preferredVersion": {"groupVersion": f"{g}/{sorted(vs)[-1]}", "version": sorted(vs)[-1]}}
                      for g, vs in sorted(api.groups().items())]
            self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            return True
        if path in ("/openapi/v2", "/swagger-2.0.0.pb-v1"):
            self.openapi_v2()
            return True
        if path == "/openapi/v3" or path.startswith("/openapi/v3/"):
            self.send_json(200, self.openapi_v3(path[len("/openapi/v3"):].strip("/")))
            return True
        route = parse_path(path)
        if route and route[3] is None and route[2] is None:
            group, version = route[0], route[1]
            rs = [r for (g, v, _), r in api.resources.items() if g == group and v == version]
            if not rs:
                raise ApiError(404, "NotFound", f"no API group version {group}/{version}")
            self.send_json(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": rs[0].group_version,
                                 "resources": [d for r in rs for d in r.discovery()]})
            return True
        return False

    def openapi_v2(self):
        """An empty OpenAPI v2 document, for kubectl versions before v3
        support: kubectl validates only kinds it finds a schema for. Older
        clients ask for protobuf: the gnostic Document with swagger = "2.0"
        is the five bytes of field 1."""
        if "protobuf" in self.headers.get("Accept", ""):
            body = b"\x0a\x032.0"
            self.send_response(200)
            self.send_header("Content-Type", "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_json(200, {"swagger": "2.0", "info": {"title": "Kubernetes (kubesim)", "version": "v1.30.0"},
                             "paths": {}, "definitions": {}})

    def openapi_v3(self, gv_path):
        """OpenAPI v3: the index, or one group-version's document. Each
        resource's item path declares its GVK and the fieldValidation query
        parameter (kubectl checks that before relying on server-side
        validation); custom resources carry their schema (kubectl explain)."""
        api = self.api
        gvs = sorted({("api/v1" if not g else f"apis/{g}/{v}") for (g, v, _) in api.resources})
        if not gv_path:
            return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={api.store.rv}"} for gv in gvs}}
        if gv_path not in gvs:
            raise ApiError(404, "NotFound", f"no OpenAPI document for {gv_path}")
        paths, schemas = {}, {}
        for (g, v, plural), r in api.resources.items():
            if ("api/v1" if not g else f"apis/{g}/{v}") != gv_path:
                continue
            gvk = {"group": g, "version": v, "kind": r.kind}
            params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                      {"name": "fieldManager", "in": "query", "schema": {"type": "string"}}]
            op = {"x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {}}
            base = f"/{gv_path}/namespaces/{{namespace}}/{plural}" if r.namespaced else f"/{gv_path}/{plural}"
            paths[base] = {"post": dict(op, operationId=f"create{r.kind}")}
            paths[base + "/{name}"] = {"patch": dict(op, operationId=f"patch{r.kind}"),
                                       "put": dict(op, operationId=f"replace{r.kind}")}
            sch = dict(r.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
            sch["x-kubernetes-group-version-kind"] = [gvk]
            schemas[f"{g or 'core'}.{v}.{r.kind}"] = sch
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes (kubesim)", "version": "v1.30.0"},
                "paths": paths, "components": {"schemas": schemas}}

    # ---- objects -----------------------------------------------------------
    def scope(self, route):
        group, version, ns, plural, name, sub = route
        r = self.api.res(group, version, plural)
        if r.namespaced and name is not None and ns is None:
            raise ApiError(404, "NotFound", f"{plural} is namespaced: use /namespaces/NS/{plural}/{name}")
        if not r.namespaced:
            ns = None
        elif ns is not None:
            self.api.store.get(self.api.res("", "v1", "namespaces").key, None, ns)  # 404 if absent
        return r, ns, name, sub

    def pod_log(self, pod, q):
        """GET pods/NAME/log: the container's output (container=, tailLines=, limitBytes=), as text."""
        names = [c.get("name") for c in pod["spec"].get("containers") or []]
        want = q.get("container") or (names[0] if names else "main")
        if want not in names:
            raise ApiError(400, "BadRequest", f"container {want} is not valid for pod {pod['metadata']['name']}")
        try:
            with open(self.api.workloads.log_path(pod["metadata"]["uid"], want), "rb") as f:
                text = f.read()
        except FileNotFoundError:
            text = b""
        if q.get("tailLines", "").isdigit():
            lines = text.splitlines(keepends=True)
            text = b"".join(lines[len(lines) - min(int(q["tailLines"]), len(lines)):])
        if q.get("limitBytes", "").isdigit():
            text = text[:int(q["limitBytes"])]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def do_get_obj(self, route, q):
        r, ns, name, sub = self.scope(route)
        if name is not None:
            obj = self.api.store.get(r.key, ns, name)
            if r.plural == "pods" and sub == "log":
                return self.pod_log(obj, q)
            if sub == "scale":
                return self.send_json(200, self.to_scale(r, obj))
            return self.send_json(200, self.as_table([obj], r, "") if self.wants_table() else obj)
        if q.get("watch") in ("1", "true"):
            return self.watch(r, ns, q)
        items, rv = self.api.store.list(r.key, ns)
        items = [o for o in items if matcher(q)(o)]
        items, meta = paginate(items, rv, q)
        if self.wants_table():
            table = self.as_table(items, r, meta["resourceVersion"])
            table["metadata"] = meta
            return self.send_json(200, table)
        self.send_json(200, {"kind": r.kind + "List", "apiVersion": r.group_version, "metadata": meta,
                             "items": items})

    def wants_table(self):
        return "as=Table" in self.headers.get("Accept", "")

    def as_table(self, items, r, rv):
        if r.plural in BUILTIN_COLUMNS:
            return builtin_table(items, r.plural, rv)
        extra = [c for c in r.columns if c.get("jsonPath") != ".metadata.creationTimestamp"]
        cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name"}]
        cols += [{"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
                  "description": c.get("description", ""), "priority": c.get("priority", 0)} for c in extra]
        cols.append({"name": "Age", "type": "string", "format": "", "description": "Age"})
        rows = []
        for o in items:
            partial = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
            cells = [o["metadata"]["name"]] + [jsonpath(o, c["jsonPath"]) for c in extra]
            rows.append({"cells": cells + [age(o["metadata"].get("creationTimestamp"))], "object": partial})
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
                "columnDefinitions": cols, "rows": rows}

    def checked_body(self, r, ns, name=None):
        obj = self.body()
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        if obj.get("kind") not in (None, r.kind):
            raise ApiError(400, "BadRequest", f"kind {obj.get('kind')!r} does not match {r.kind}")
        obj.setdefault("kind", r.kind)
        obj.setdefault("apiVersion", r.group_version)
        md = obj.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise ApiError(422, "Invalid", "metadata: must be an object")
        if name is not None and md.get("name", name) != name:
            raise ApiError(400, "BadRequest", f"the name of the object ({md.get('name')}) does not match the URL")
        if ns is not None and md.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the URL")
        self.validate(r, obj)
        return obj

    def validate(self, r, obj):
        """Custom resources: defaults, pruning, then schema validation (422)."""
        if not r.schema:
            return
        keep = {k: obj.pop(k) for k in ("apiVersion", "kind", "metadata") if k in obj}
        pruned = []
        crschema.default_and_prune(r.schema, obj, "", pruned)
        if pruned and getattr(self, "strict", False):  # kube-apiserver's words under fieldValidation=Strict
            obj.update(keep)
            raise ApiError(400, "BadRequest", "strict decoding error: " +
                           ", ".join(f'unknown field "{p.lstrip(".")}"' for p in pruned))
        errs = []
        root = {k: v for k, v in r.schema.items() if k not in ("required", "x-kubernetes-validations")}
        crschema.validate(root | {"type": "object"}, obj, "", errs)
        md = keep.get("metadata") or {}  # the root's CEL rules see metadata.name and generateName, nothing else
        crschema.cel_rules(r.schema, {**obj, "metadata": {k: md[k] for k in ("name", "generateName") if k in md}},
                           "", errs)
        for k in r.schema.get("required", []):
            if k not in obj and k not in keep:
                errs.append((f".{k}", "Required value"))
        obj.update(keep)
        if errs:
            name = obj["metadata"].get("name", "")
            causes = [{"reason": "FieldValueInvalid", "message": m, "field": p.lstrip(".")} for p, m in errs]
            msg = "; ".join(f"{p.lstrip('.')}: {m}" for p, m in errs)
            raise ApiError(422, "Invalid", f'{r.kind}.{r.group} "{name}" is invalid: {msg}',
                           {"name": name, "group": r.group, "kind": r.kind, "causes": causes})

    def to_scale(self, r, obj):
        if "scale" not in r.subresources or not r.scale:
            raise ApiError(404, "NotFound", f"{r.plural} has no scale subresource")
        sp = r.scale
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                             "creationTimestamp") if k in obj["metadata"]},
                "spec": {"replicas": jsonpath(obj, sp["specReplicasPath"]) or 0},
                "status": {"replicas": jsonpath(obj, sp.get("statusReplicasPath", "")) or 0,
                           "selector": jsonpath(obj, sp.get("labelSelectorPath", "")) or ""}}

    def write_scale(self, r, ns, name, scale):
        """PUT/PATCH on scale: sets the spec replicas path of the object."""
        cur = self.api.store.get(r.key, ns, name)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiError(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}: must be a non-negative integer")
        self.to_scale(r, cur)  # 404 unless the kind has a scale subresource
        set_path(cur, r.scale["specReplicasPath"], replicas)
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if rv:
            cur["metadata"]["resourceVersion"] = rv
        self.validate(r, cur)
        return self.to_scale(r, self.api.store.update(r.key, ns, name, cur))

    def do_post_obj(self, route, q):
        r, ns, name, sub = self.scope(route)
        if r.plural == "serviceaccounts" and sub == "token":
            return self.token_request(ns, name)
        if r.plural == "pods" and sub == "eviction":
            return self.evict(ns, name)
        obj = self.checked_body(r, ns)
        if r.plural == "customresourcedefinitions":
            obj["status"] = crd_status(obj)
        ssa.record_update(None, obj, self.field_manager(q))
        out = self.api.store.create(r.key, ns, obj)
        if r.plural == "customresourcedefinitions":
            self.api.crd_changed(out)
        if r.plural == "namespaces":
            self.api.namespace_created(out["metadata"]["name"])
        self.send_json(201, out)

    def evict(self, ns, name):
        """The Eviction subresource (policy/v1), as `kubectl drain` uses it: the pod is deleted (gracefully) unless
        that breaks a PodDisruptionBudget of its namespace whose matchLabels select it. With maxUnavailable M (an
        integer), the pods expected E (the owning Deployments' replicas, as the disruption controller counts: a pod
        evicted a moment ago and not replaced yet still counts) and the Ready ones not being deleted H: the
        eviction of a Ready pod needs H - 1 >= E - M (minAvailable N: H - 1 >= N); else 429 TooManyRequests,
        reason DisruptionBudget, as kube-apiserver answers (the client retries). A pod not Ready may always go."""
        pod = self.api.store.get(self.api.res("", "v1", "pods").key, ns, name)
        self.body()  # the Eviction object: only its name matters here
        labels = pod["metadata"].get("labels") or {}
        pdbs, _ = self.api.store.list(self.api.res("policy", "v1", "poddisruptionbudgets").key, ns)
        pods, _ = self.api.store.list(self.api.res("", "v1", "pods").key, ns)
        for b in pdbs if pod_ready(pod) and not pod["metadata"].get("deletionTimestamp") else []:
            spec = b.get("spec") or {}
            sel = (spec.get("selector") or {}).get("matchLabels") or {}
            if not sel or any(labels.get(k) != v for k, v in sel.items()):
                continue
            chosen = [p for p in pods if not p["metadata"].get("deletionTimestamp") and
                      all((p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())]
            healthy = sum(pod_ready(p) for p in chosen)
            need = self.expected_pods(ns, chosen) - spec["maxUnavailable"] \
                if isinstance(spec.get("maxUnavailable"), int) \
                else spec.get("minAvailable") if isinstance(spec.get("minAvailable"), int) else None
            if need is not None and healthy - 1 < need:
                raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption "
                               f"budget.", {"causes": [{"reason": "DisruptionBudget", "message":
                                            f"The disruption budget {b['metadata']['name']} needs {need} healthy pods "
                                            f"and has {healthy} currently"}]})
        self.api.gc.delete(self.api.res("", "v1", "pods").key, ns, name, "Background", None)
        self.send_json(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})

    def expected_pods(self, ns, pods):
        """How many pods a budget expects, as the disruption controller counts them: the replicas of the
        Deployments that own the pods (a pod evicted a moment ago and not yet replaced still counts), else the
        pods themselves."""
        owners = set()
        for p in pods:  # pod -> its ReplicaSet -> that ReplicaSet's Deployment
            for r in p["metadata"].get("ownerReferences") or []:
                if r.get("kind") != "ReplicaSet" or not r.get("controller"):
                    continue
                try:
                    rs = self.api.store.get(self.api.res("apps", "v1", "replicasets").key, ns, r["name"])
                except ApiError:
                    continue
                owners |= {o["name"] for o in rs["metadata"].get("ownerReferences") or []
                           if o.get("kind") == "Deployment" and o.get("controller")}
        total = 0
        for name in owners:
            try:
                total += int((self.api.store.get(self.api.res("apps", "v1", "deployments").key, ns, name).get("spec")
                              or {}).get("replicas", 1))
            except ApiError:
                pass
        return max(total, len([p for p in pods if not p["metadata"].get("deletionTimestamp")]))

    def token_request(self, ns, name):
        """TokenRequest: a bearer token for the service account (kubectl create token)."""
        self.api.store.get(self.api.res("", "v1", "serviceaccounts").key, ns, name)  # 404 if absent
        req = self.body() or {}
        req.setdefault("apiVersion", "authentication.k8s.io/v1")
        req.setdefault("kind", "TokenRequest")
        req["status"] = {"token": self.api.authz.mint(ns, name), "expirationTimestamp": "2099-01-01T00:00:00Z"}
        self.send_json(201, req)

    def do_put_obj(self, route, q):
        r, ns, name, sub = self.scope(route)
        if sub == "scale":
            return self.send_json(200, self.write_scale(r, ns, name, self.body()))
        obj = self.checked_body(r, ns, name)
        if sub is None:  # (a status write keeps the object's managedFields as they were)
            try:
                ssa.record_update(self.api.store.get(r.key, ns, name), obj, self.field_manager(q))
            except ApiError as e:
                if e.code != 404:
                    raise
        out = self.api.store.update(r.key, ns, name, obj, sub, "status" in r.subresources)
        if r.plural == "customresourcedefinitions":
            self.api.crd_changed(out)
        self.send_json(200, out)

    def field_manager(self, q):
        """The writer's name in managedFields: ?fieldManager, else the
        User-Agent's first word (as the API server derives it)."""
        ua = (self.headers.get("User-Agent") or "").split("/")[0].strip()
        return q.get("fieldManager") or ua or "unknown"

    def server_side_apply(self, r, ns, name, q):
        applied = ssa.parse_body(self.raw_body())
        manager, force = q.get("fieldManager"), q.get("force") in ("true", "1")
        md = applied.setdefault("metadata", {})
        if md.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the URL")
        for _ in range(10):
            try:
                cur = self.api.store.get(r.key, ns, name)
            except ApiError as e:
                if e.code != 404:
                    raise
                cur = None
            want_uid = md.get("uid")
            if want_uid and (cur is None or cur["metadata"].get("uid") != want_uid):
                # a uid in the body acts as a precondition: the API server refuses to change it (422, its
                # object meta validation: kubernetes/kubernetes#127625 shows the words)
                raise ApiError(422, "Invalid", f'{r.kind} "{name}" is invalid: metadata.uid: Invalid value: '
                               f'"{want_uid}": field is immutable')
            new = ssa.apply(cur, applied, manager, force)
            new["metadata"]["name"] = name
            new.setdefault("kind", r.kind)
            new.setdefault("apiVersion", r.group_version)
            self.validate(r, new)
            try:
                if cur is None:
                    if r.plural == "customresourcedefinitions":
                        new["status"] = crd_status(new)
                    out, code = self.api.store.create(r.key, ns, new), 201
                else:
                    new["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
                    out, code = self.api.store.update(r.key, ns, name, new, None, "status" in r.subresources), 200
                if r.plural == "customresourcedefinitions":  # its schema, columns and rules serve at once
                    self.api.crd_changed(out)
                return self.send_json(code, out)
            except ApiError as e:
                if e.code != 409 or "Conflict" != e.reason:
                    raise
        raise ApiError(409, "Conflict", "too many concurrent writers")

    def do_patch_obj(self, route, q):
        r, ns, name, sub = self.scope(route)
        ctype = self.headers.get("Content-Type", "").split(";")[0]
        if ctype == "application/apply-patch+yaml":
            return self.server_side_apply(r, ns, name, q)
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json",
                         "application/json-patch+json"):
            raise ApiError(415, "UnsupportedMediaType", f"patch type {ctype} is not supported yet")
        patch = self.body()
        for _ in range(10):  # retry on concurrent writers, as the real server does for patches
            cur = self.api.store.get(r.key, ns, name)
            if sub == "scale":
                try:
                    return self.send_json(200, self.write_scale(r, ns, name, merge_patch(self.to_scale(r, cur), patch)))
                except ApiError as e:
                    if e.code != 409:
                        raise
                    continue
            if ctype == "application/json-patch+json":
                new = json_patch(cur, patch)
            elif ctype.startswith("application/strategic") and not r.schema:
                new = strategic_merge(cur, patch)
            else:
                new = merge_patch(cur, patch)
            # a resourceVersion in the patch is a precondition (409 when the object moved on), as on the
            # API server; without one the patch applies to whatever is current
            asked = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
            new.setdefault("metadata", {})["resourceVersion"] = asked or cur["metadata"]["resourceVersion"]
            self.validate(r, new)
            ssa.record_update(cur, new, self.field_manager(q))
            try:
                out = self.api.store.update(r.key, ns, name, new, sub, "status" in r.subresources)
                if r.plural == "customresourcedefinitions":
                    self.api.crd_changed(out)
                return self.send_json(200, out)
            except ApiError as e:
                if e.code != 409 or (isinstance(patch, dict) and (patch.get("metadata") or {}).get("resourceVersion")):
                    raise
        raise ApiError(409, "Conflict", "too many concurrent writers")

    def do_delete_obj(self, route, q):
        opts = self.body() or {}  # DeleteOptions
        r, ns, name, sub = self.scope(route)
        if name is None:
            raise ApiError(405, "MethodNotAllowed", "deletecollection is not supported yet")
        policy = opts.get("propagationPolicy") or q.get("propagationPolicy") or "Background"
        if opts.get("orphanDependents") is True:
            policy = "Orphan"
        if policy not in ("Background", "Foreground", "Orphan"):
            raise ApiError(400, "BadRequest", f"propagationPolicy {policy!r} is not Background, Foreground or Orphan")
        obj = self.api.gc.delete(r.key, ns, name, policy, opts.get("preconditions"))
        if r.plural == "customresourcedefinitions":
            self.api.crd_changed(obj, deleted=True)
        self.send_json(200, obj)

    # ---- watch -------------------------------------------------------------
    def watch(self, r, ns, q):
        store = self.api.store
        rv = int(q.get("resourceVersion") or 0)
        timeout = min(float(q.get("timeoutSeconds") or 1800), 1800)
        deadline = time.monotonic() + timeout
        match = matcher(q)
        bookmarks = q.get("allowWatchBookmarks") in ("1", "true")
        next_bookmark = time.monotonic() + BOOKMARK_PERIOD
        events = []
        table = self.wants_table()  # kubectl get -w: each event's object a Table of one row, as kube-apiserver sends
        if rv == 0:  # no resume point: the current state as ADDED, then changes
            items, cur = store.list(r.key, ns)
            events = [(int(o["metadata"]["resourceVersion"]), "ADDED", o) for o in items]
            rv = int(cur)
        else:
            events = store.events_since(r.key, ns, rv)  # may raise 410
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while True:
                for erv, etype, obj in events:
                    if match(obj):
                        shown = self.as_table([obj], r, str(erv)) if table else obj
                        self.chunk(json.dumps({"type": etype, "object": shown}).encode() + b"\n")
                    rv = max(rv, erv)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if bookmarks and time.monotonic() >= next_bookmark:
                    mark = {"kind": r.kind, "apiVersion": r.group_version,
                            "metadata": {"resourceVersion": str(max(rv, int(store.rv)))}}
                    self.chunk(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
                    next_bookmark = time.monotonic() + BOOKMARK_PERIOD
                with store.lock:
                    store.lock.wait(min(left, 1.0))
                if self.epoch != self.api.epoch:  # restarted: the stream breaks without an end
                    self.close_connection = True
                    return
                try:
                    events = store.events_since(r.key, ns, rv)
                except ApiError as e:
                    self.chunk(json.dumps({"type": "ERROR", "object": e.status()}).encode() + b"\n")
                    break
            self.chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def pod_columns(o):
    st = o.get("status") or {}
    cs = st.get("containerStatuses") or []
    n = len((o.get("spec") or {}).get("containers") or [])
    waiting = [c["state"]["waiting"].get("reason") for c in cs if "waiting" in (c.get("state") or {})]
    status = "Terminating" if o["metadata"].get("deletionTimestamp") else (waiting[0] if waiting else st.get("phase", ""))
    return [f"{sum(1 for c in cs if c.get('ready'))}/{n}", status, sum(c.get("restartCount", 0) for c in cs),
            st.get("podIP", "<none>")]


def deploy_columns(o):
    st, want = o.get("status") or {}, (o.get("spec") or {}).get("replicas", 1)
    return [f"{st.get('readyReplicas', 0)}/{want}", st.get("updatedReplicas", 0), st.get("availableReplicas", 0)]


def service_columns(o):
    spec = o.get("spec") or {}
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or [])
    return [spec.get("type", "ClusterIP"), spec.get("clusterIP", "<none>"), ports or "<none>"]


# kubectl's columns for the built-in kinds people look at (priority 1: -o wide only)
BUILTIN_COLUMNS = {
    "pods": ([("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "integer", 0), ("IP", "string", 1)],
             pod_columns),
    "deployments": ([("Ready", "string", 0), ("Up-to-date", "integer", 0), ("Available", "integer", 0)],
                    deploy_columns),
    "services": ([("Type", "string", 0), ("Cluster-IP", "string", 0), ("Port(s)", "string", 0)], service_columns),
}


def builtin_table(items, plural, rv):
    cols, fn = BUILTIN_COLUMNS[plural]
    defs = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    defs += [{"name": n, "type": t, "format": "", "description": n, "priority": pr} for n, t, pr in cols]
    age_at = 1 + sum(1 for _, _, pr in cols if pr == 0)
    defs.insert(age_at, {"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0})
    rows = []
    for o in items:
        cells = [o["metadata"]["name"]] + fn(o)
        cells.insert(age_at, age(o["metadata"].get("creationTimestamp")))
        rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                                 "metadata": o["metadata"]}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
            "columnDefinitions": defs, "rows": rows}


def paginate(items, rv, q):
    """limit/continue over items sorted by (namespace, name). The continue
    token carries the last key and the list's resourceVersion; a token
    whose version left the watch window would be 410 on the real server,
    here pages simply continue from the current state."""
    meta = {"resourceVersion": rv}
    token = q.get("continue")
    if token:
        try:
            last_ns, last_name, rv = json.loads(base64.urlsafe_b64decode(token.encode()).decode())
        except (ValueError, TypeError):
            raise ApiError(400, "BadRequest", "invalid continue token")
        meta["resourceVersion"] = rv
        items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > (last_ns, last_name)]
    limit = int(q.get("limit") or 0)
    if 0 < limit < len(items):
        last = items[limit - 1]["metadata"]
        meta["continue"] = base64.urlsafe_b64encode(
            json.dumps([last.get("namespace", ""), last["name"], meta["resourceVersion"]]).encode()).decode()
        meta["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    return items, meta


def crd_status(crd):
    names = crd.get("spec", {}).get("names", {})
    conds = [{"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now_ts()}
             for t, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                             ("Established", "InitialNamesAccepted", "the initial names have been accepted"))]
    return {"conditions": conds, "acceptedNames": names, "storedVersions": [
        v["name"] for v in crd.get("spec", {}).get("versions", []) if v.get("storage")]}


def now_ts():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def age(ts):
    if not ts:
        return "<unknown>"
    t = datetime.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    s = int((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds())
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


class Httpd(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A client that hung up (a closed watch, a killed kubectl, a fault's restart) is not an error of the
        server's: only other exceptions are printed, and tests fail on them (harness.stop_sim)."""
        if isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def serve(host, port, token, window, tls=None, image_map=None, data_dir=None, ca_file=None):
    """Starts serving in a thread. token None: no authentication; tls: an
    ssl.SSLContext for HTTPS; image_map: image -> command for pods; data_dir:
    where pods' service-account files go (in-cluster configuration)."""
    def listen(p):
        h = Httpd((host, p), Handler)
        if tls is not None:
            h.socket = tls.wrap_socket(h.socket, server_side=True)
        threading.Thread(target=h.serve_forever, daemon=True).start()
        return h

    httpd = listen(port)
    port = httpd.server_address[1]
    incluster = {"dir": str(data_dir), "host": host, "port": port, "ca": ca_file} if data_dir else None
    Handler.api = api = Api(token, window, image_map, incluster)
    current = [httpd]

    def restart(down, hold=None):
        """Stops listening, breaks every connection, compacts the watch
        history, and listens again on the same port after down seconds
        (and once the hold file, if any, is gone); the objects themselves
        survive (they live in etcd)."""
        time.sleep(0.2)  # let the fault request's answer go out
        api.epoch += 1
        api.store.compact()
        current[0].shutdown()
        current[0].server_close()
        time.sleep(down)
        while hold and os.path.exists(hold):
            time.sleep(0.05)
        current[0] = listen(port)

    api.restart = restart
    return httpd
