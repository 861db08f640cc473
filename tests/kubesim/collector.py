"""collector.py - deletion the way kube-apiserver and the garbage collector do it:
finalizers hold an object in a deleting state (deletionTimestamp set) until
they are removed; ownerReferences make dependents follow their owners
(Background: owner first, then dependents; Foreground: dependents first,
the owner kept with the foregroundDeletion finalizer until they are gone;
Orphan: dependents keep living without the reference)."""
import copy
import threading

from store import ApiError, now

FOREGROUND = "foregroundDeletion"


class Collector:
    def __init__(self, store):
        self.store = store
        self.stop = threading.Event()
        threading.Thread(target=self.loop, daemon=True).start()

    # ---- deletion entry point ------------------------------------------------
    def delete(self, rkey, ns, name, policy="Background", preconditions=None):
        store = self.store
        with store.lock:
            obj = store.get(rkey, ns, name)
            md = obj["metadata"]
            pre = preconditions or {}
            if pre.get("uid") and pre["uid"] != md["uid"] or \
                    pre.get("resourceVersion") and pre["resourceVersion"] != md["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Precondition failed for {rkey[1]} "{name}"')
            if policy == "Orphan":
                self.orphan(md["uid"])
            fins = list(md.get("finalizers") or [])
            if policy == "Foreground" and self.dependents(md["uid"]) and FOREGROUND not in fins:
                fins.append(FOREGROUND)
            if not fins:
                return store.delete(rkey, ns, name)
            if md.get("deletionTimestamp") and fins == md.get("finalizers"):
                return obj
            md["finalizers"] = fins
            md.setdefault("deletionTimestamp", now())
            md["deletionGracePeriodSeconds"] = 0
            return store.update(rkey, ns, name, obj, status_sub=False, internal=True)

    # ---- the collector ---------------------------------------------------------
    def dependents(self, uid):
        return [(k, o) for k, o in self.store.objects.items()
                if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]

    def orphan(self, uid):
        for (rkey, ns, name), o in self.dependents(uid):
            o = copy.deepcopy(o)
            o["metadata"]["ownerReferences"] = [r for r in o["metadata"]["ownerReferences"] if r.get("uid") != uid]
            self.store.update(rkey, ns, name, o, internal=True)

    def sweep(self):
        """One pass: dependents of vanished owners go; foreground owners finish."""
        store = self.store
        with store.lock:
            live = {o["metadata"]["uid"]: o for o in store.objects.values()}
            for (rkey, ns, name), o in list(store.objects.items()):
                md = o["metadata"]
                refs = md.get("ownerReferences") or []
                owners = [live.get(r.get("uid")) for r in refs]
                gone = refs and all(w is None for w in owners)
                fg = refs and all(w is not None and FOREGROUND in (w["metadata"].get("finalizers") or [])
                                  for w in owners)
                if (gone or fg) and not md.get("deletionTimestamp"):
                    self.delete(rkey, ns, name, "Foreground" if fg else "Background")
            for (rkey, ns, name), o in list(store.objects.items()):
                md = o["metadata"]
                if FOREGROUND in (md.get("finalizers") or []) and not self.dependents(md["uid"]):
                    o = copy.deepcopy(o)
                    o["metadata"]["finalizers"] = [f for f in md["finalizers"] if f != FOREGROUND]
                    store.update(rkey, ns, name, o, internal=True)

    def loop(self):
        while not self.stop.wait(0.2):
            self.sweep()
