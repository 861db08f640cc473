"""rbac.py - authentication by bearer token (the admin's, and service
account tokens minted through the TokenRequest API) and authorization by
the RBAC objects in the store, as kube-apiserver's RBAC authorizer decides:
ClusterRoleBindings grant everywhere, RoleBindings in their namespace, a
rule matches on verb, API group, resource (or resource/subresource) and
optional resource names. Discovery and health paths are open to any
authenticated user."""
import secrets

from store import ApiError

RBAC = "rbac.authorization.k8s.io"


class User:
    def __init__(self, name, groups):
        self.name, self.groups = name, set(groups) | {"system:authenticated"}


class Authorizer:
    def __init__(self, store, admin_token):
        self.store = store
        self.tokens = {}
        if admin_token:
            self.tokens[admin_token] = User("admin", ["system:masters"])

    def mint(self, ns, sa):
        token = secrets.token_hex(24)
        self.tokens[token] = User(f"system:serviceaccount:{ns}:{sa}",
                                  ["system:serviceaccounts", f"system:serviceaccounts:{ns}"])
        return token

    def authenticate(self, header):
        """User for an Authorization header; None means anonymous (HTTP mode: admin)."""
        if header.startswith("Bearer "):
            return self.tokens.get(header[7:])
        return None

    def _objs(self, plural, ns=None):
        return [o for (k, n, _), o in self.store.objects.items()
                if k[0] == RBAC and k[1] == plural and (ns is None or n == ns)]

    def _subject_ok(self, user, s):
        kind, name = s.get("kind"), s.get("name")
        if kind == "User":
            return name == user.name
        if kind == "Group":
            return name in user.groups
        if kind == "ServiceAccount":
            return user.name == f"system:serviceaccount:{s.get('namespace')}:{name}"
        return False

    def _rules(self, ref, ns):
        kind, name = ref.get("kind"), ref.get("name")
        plural = "clusterroles" if kind == "ClusterRole" else "roles"
        for o in self._objs(plural, None if kind == "ClusterRole" else ns):
            if o["metadata"]["name"] == name:
                return o.get("rules") or []
        return []

    @staticmethod
    def _rule_ok(rule, verb, group, resource, name):
        def has(lst, v):
            return "*" in (lst or []) or v in (lst or [])
        return (has(rule.get("verbs"), verb) and has(rule.get("apiGroups"), group)
                and has(rule.get("resources"), resource)
                and (not rule.get("resourceNames") or name in rule["resourceNames"]))

    def allowed(self, user, verb, group, resource, ns, name):
        if "system:masters" in user.groups:
            return True
        bindings = [(b, None) for b in self._objs("clusterrolebindings")]
        if ns is not None:
            bindings += [(b, ns) for b in self._objs("rolebindings", ns)]
        for b, bns in bindings:
            if not any(self._subject_ok(user, s) for s in b.get("subjects") or []):
                continue
            if any(self._rule_ok(r, verb, group, resource, name) for r in self._rules(b.get("roleRef", {}), bns)):
                return True
        return False

    def check(self, user, verb, group, resource, ns, name):
        if self.allowed(user, verb, group, resource, ns, name):
            return
        where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
        head = f'{resource} "{name}" is forbidden: ' if name else f"{resource} is forbidden: "
        raise ApiError(403, "Forbidden",
                       head + f'User "{user.name}" cannot {verb} resource "{resource}" in API group "{group}"{where}',
                       {"kind": resource, **({"name": name} if name else {})})
