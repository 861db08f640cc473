"""resources.py - the built-in kinds kubesim serves, with what discovery
and kubectl need to know of each (group, version, kind, plural, scope,
short names, subresources)."""

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


class Resource:
    def __init__(self, group, version, kind, plural, namespaced=True, short=(), subresources=(), schema=None,
                 columns=(), scale=None):
        self.group, self.version, self.kind, self.plural = group, version, kind, plural
        self.namespaced, self.short, self.subresources = namespaced, list(short), list(subresources)
        self.schema = schema          # openAPIV3Schema of a custom resource, or None
        self.columns = list(columns)  # additionalPrinterColumns
        self.scale = scale            # scale paths: specReplicasPath, statusReplicasPath, labelSelectorPath

    @property
    def key(self):
        return (self.group, self.plural, self.kind)

    @property
    def group_version(self):
        return f"{self.group}/{self.version}" if self.group else self.version

    def discovery(self):
        out = [{"name": self.plural, "singularName": self.kind.lower(), "namespaced": self.namespaced,
                "kind": self.kind, "verbs": VERBS, "shortNames": self.short}]
        for sub in self.subresources:
            kind = {"scale": "Scale", "token": "TokenRequest", "eviction": "Eviction"}.get(sub, self.kind)
            verbs = ["create"] if sub in ("token", "eviction") else ["get", "patch", "update"]
            entry = {"name": f"{self.plural}/{sub}", "singularName": "", "namespaced": self.namespaced,
                     "kind": kind, "verbs": verbs}
            if sub == "token":
                entry.update(group="authentication.k8s.io", version="v1")
            if sub == "eviction":  # kubectl drain looks for this entry, then posts policy/v1 Evictions
                entry.update(group="policy", version="v1")
            out.append(entry)
        return out


BUILTIN = [
    Resource("", "v1", "Namespace", "namespaces", False, ["ns"], ["status"]),
    Resource("", "v1", "Pod", "pods", True, ["po"], ["status", "eviction"]),
    Resource("", "v1", "Service", "services", True, ["svc"], ["status"]),
    Resource("", "v1", "Endpoints", "endpoints", True, ["ep"]),
    Resource("", "v1", "ConfigMap", "configmaps", True, ["cm"]),
    Resource("", "v1", "Secret", "secrets", True),
    Resource("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, ["pvc"], ["status"]),
    Resource("", "v1", "ServiceAccount", "serviceaccounts", True, ["sa"], ["token"]),
    Resource("", "v1", "Event", "events", True, ["ev"]),
    Resource("apps", "v1", "Deployment", "deployments", True, ["deploy"], ["status", "scale"],
             scale={"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                    "labelSelectorPath": ".status.selector"}),
    Resource("apps", "v1", "ReplicaSet", "replicasets", True, ["rs"], ["status"]),
    Resource("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True, ["hpa"], ["status"]),
    Resource("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", True, ["pdb"], ["status"]),
    Resource("coordination.k8s.io", "v1", "Lease", "leases", True),
    Resource("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True),
    Resource("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    Resource("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    Resource("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    Resource("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    Resource("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False,
             ["crd", "crds"], ["status"]),
]


def crd_resources(crd):
    """The Resources a CustomResourceDefinition object defines (served versions)."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    out = []
    for v in spec.get("versions", []):
        if not v.get("served", True):
            continue
        subs = v.get("subresources") or {}
        out.append(Resource(spec.get("group", ""), v["name"], names.get("kind", ""), names.get("plural", ""),
                            spec.get("scope", "Namespaced") == "Namespaced", names.get("shortNames", []),
                            [k for k in ("status", "scale") if k in subs],
                            (v.get("schema") or {}).get("openAPIV3Schema"),
                            v.get("additionalPrinterColumns", []), subs.get("scale")))
    return out
