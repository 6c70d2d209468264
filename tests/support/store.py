"""API-server semantics kmock's emulator leaves out, over kmock's own object store.

kmock's `KubernetesEmulator` keeps objects (with their history) and serves discovery; a
real API server also stamps uid/resourceVersion/generation/creationTimestamp, applies the
patch content types, keeps status and scale subresources apart from the spec, honours
finalizers and deletionTimestamp, garbage-collects dependents through ownerReferences,
registers CustomResourceDefinitions and enforces their schema (defaults, validation,
CEL), and keeps a change log that watches resume from. That is this module: synchronous
methods (atomic inside one event loop) used by the HTTP layer (emulator.py) and by the
fake kubelet alike.
"""

from __future__ import annotations

import collections
import copy
import datetime
import re
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kmock
from llmservice.operator import admission

from tests.support import patches
from tests.support.selectors import fields_match, labels_match

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CRD_RESOURCE = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
STANDARD_VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
HISTORY = 5000  # change-log entries kept per resource; older resourceVersions get 410 Gone


class ApiError(kmock.KubernetesError):
    """A Kubernetes `Status` failure (kmock renders it as the response)."""


def not_found(res: kmock.resource, name: str) -> ApiError:
    what = f"{res.plural}.{res.group}" if res.group else res.plural
    return ApiError(
        404, "NotFound", f'{what} "{name}" not found', {"name": name, "kind": res.plural}
    )


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ScalePaths:
    spec: str = ".spec.replicas"
    status: str = ".status.replicas"
    selector: str | None = ".status.selector"  # None: derive from .spec.selector


@dataclass
class Kind:
    resource: kmock.resource
    kind: str
    namespaced: bool
    status_subresource: bool
    scale: ScalePaths | None = None
    schema: dict[str, Any] | None = None  # openAPIV3Schema of a custom resource

    @property
    def api_version(self) -> str:
        r = self.resource
        return f"{r.group}/{r.version}" if r.group else r.version


@dataclass(frozen=True)
class Change:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


@dataclass
class Watcher:
    resource: kmock.resource
    namespace: str | None
    label_selector: str | None
    field_selector: str | None
    push: Callable[[Change], None]

    def sees(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        return labels_match(self.label_selector, meta.get("labels")) and fields_match(
            self.field_selector, obj
        )

    def translate(self, change: Change) -> dict[str, Any] | None:
        """The watch event this watcher should get, if any (selector moves become ADD/DEL)."""
        new_in = change.type != "DELETED" and self.sees(change.obj)
        old_in = (
            self.sees(change.old)
            if change.type == "MODIFIED"
            else change.type == "DELETED" and self.sees(change.obj)
        )
        if change.type == "MODIFIED":
            if new_in and old_in:
                return {"type": "MODIFIED", "object": change.obj}
            if new_in:
                return {"type": "ADDED", "object": change.obj}
            if old_in:
                return {"type": "DELETED", "object": change.obj}
            return None
        if change.type == "ADDED" and new_in:
            return {"type": "ADDED", "object": change.obj}
        if change.type == "DELETED" and old_in:
            return {"type": "DELETED", "object": change.obj}
        return None


def _get_path(obj: dict[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.strip(".").split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.strip(".").split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    """What bumps metadata.generation: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def selector_string(selector: dict[str, Any] | None) -> str:
    parts = [f"{k}={v}" for k, v in sorted(((selector or {}).get("matchLabels") or {}).items())]
    for e in (selector or {}).get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin"}.get(e["operator"])
        if op:
            parts.append(f"{e['key']} {op} ({','.join(e.get('values', []))})")
        else:
            parts.append(e["key"] if e["operator"] == "Exists" else f"!{e['key']}")
    return ",".join(parts)


@dataclass
class Store:
    """Object semantics over `kmock.KubernetesEmulator.objects`."""

    emulator: kmock.KubernetesEmulator
    rv: int = 0
    kinds: dict[kmock.resource, Kind] = field(default_factory=dict)
    log: dict[kmock.resource, collections.deque[Change]] = field(
        default_factory=lambda: collections.defaultdict(lambda: collections.deque(maxlen=HISTORY))
    )
    compacted: dict[kmock.resource, int] = field(default_factory=dict)
    _watchers: dict[int, Watcher] = field(default_factory=dict)
    listeners: list[Callable[[kmock.resource, Change], None]] = field(default_factory=list)
    keys: dict[kmock.resource, set[Any]] = field(default_factory=dict)  # live objects by resource
    uids: set[str] = field(default_factory=set)  # of live objects, for the garbage collector

    # ------------------------------------------------------------ kinds

    def kind(self, res: kmock.resource) -> Kind:
        if res in self.kinds:
            return self.kinds[res]
        if res not in self.emulator.resources:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({res.plural})"
            )
        info = self.emulator.resources[res]
        scale = None
        if "scale" in info.subresources:
            scale = ScalePaths(selector=None)
        kind = Kind(
            res,
            info.kind or res.plural.capitalize(),
            bool(info.namespaced),
            "status" in info.subresources,
            scale,
        )
        self.kinds[res] = kind
        return kind

    def register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = kmock.resource(spec["group"], version["name"], names["plural"])
            subs = version.get("subresources") or {}
            scale = subs.get("scale")
            self.kinds[res] = Kind(
                res,
                names["kind"],
                spec.get("scope", "Namespaced") == "Namespaced",
                "status" in subs,
                ScalePaths(
                    scale["specReplicasPath"],
                    scale["statusReplicasPath"],
                    scale.get("labelSelectorPath"),
                )
                if scale
                else None,
                (version.get("schema") or {}).get("openAPIV3Schema"),
            )
            self.emulator.resources[res] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=STANDARD_VERBS,
                shortnames=set(names.get("shortNames", [])),
                categories=set(names.get("categories", [])),
                subresources={s for s in ("status", "scale") if s in subs},
            )

    def unregister_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            res = kmock.resource(spec["group"], version["name"], spec["names"]["plural"])
            for key in list(self.keys.get(res, ())):
                self._remove(res, key, {})
            self.kinds.pop(res, None)
            if res in self.emulator.resources:
                del self.emulator.resources[res]

    # ------------------------------------------------------------ reads

    def _key(
        self, res: kmock.resource, namespace: str | None, name: str
    ) -> tuple[kmock.resource, str | None, str]:
        return (res, namespace if self.kind(res).namespaced else None, name)

    def find(self, res: kmock.resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = self._key(res, namespace, name)
        if key not in self.emulator.objects or self.emulator.objects[key].deleted:
            return None
        return copy.deepcopy(self.emulator.objects[key].raw)

    def get(self, res: kmock.resource, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.find(res, namespace, name)
        if obj is None:
            raise not_found(res, name)
        return obj

    def items(self, res: kmock.resource, *, copied: bool = True) -> Iterator[dict[str, Any]]:
        """Live objects of one resource; `copied=False` for read-only callers (cheaper)."""
        for key in list(self.keys.get(res, ())):
            obj = self.emulator.objects[key]
            if not obj.deleted:
                yield copy.deepcopy(obj.raw) if copied else obj.raw

    def list(
        self,
        res: kmock.resource,
        namespace: str | None,
        labels: str | None = None,
        fields: str | None = None,
    ) -> dict[str, Any]:
        kind = self.kind(res)
        items = [
            o
            for o in self.items(res, copied=False)  # serialized at once, never mutated
            if (not namespace or o["metadata"].get("namespace") == namespace)
            and labels_match(labels, o["metadata"].get("labels"))
            and fields_match(fields, o)
        ]
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    # ------------------------------------------------------------ the change log

    def _commit(
        self,
        res: kmock.resource,
        key: Any,
        obj: dict[str, Any],
        type_: str,
        old: dict[str, Any] | None,
    ) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if type_ == "DELETED":
            self.emulator.objects[key].delete()
            self.keys.get(res, set()).discard(key)
            self.uids.discard(obj["metadata"].get("uid", ""))
        elif key in self.emulator.objects:
            self.emulator.objects[key].create(copy.deepcopy(obj))
        else:
            self.emulator.objects[key] = copy.deepcopy(obj)
        if type_ != "DELETED":
            self.keys.setdefault(res, set()).add(key)
            self.uids.add(obj["metadata"].get("uid", ""))
        change = Change(self.rv, type_, copy.deepcopy(obj), old)
        log = self.log[res]
        if len(log) == log.maxlen:
            self.compacted[res] = log[0].rv
        log.append(change)
        for watcher in list(self._watchers.values()):
            if watcher.resource == res:
                watcher.push(change)
        for listener in list(self.listeners):
            listener(res, change)
        return obj

    def watch(self, watcher: Watcher) -> int:
        token = id(watcher)
        self._watchers[token] = watcher
        return token

    def unwatch(self, token: int) -> None:
        self._watchers.pop(token, None)

    def changes_since(self, res: kmock.resource, rv: int) -> list[Change] | None:
        """Changes after `rv`, or None if the log no longer reaches back that far (410)."""
        if rv < self.compacted.get(res, 0):
            return None
        return [c for c in self.log[res] if c.rv > rv]

    # ------------------------------------------------------------ writes

    def _admit(self, kind: Kind, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        name = obj["metadata"].get("name", "")
        if not name or len(name) > 253 or not NAME_RE.match(name):
            raise self._invalid(
                kind,
                name,
                [
                    f"metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
                ],
            )
        if kind.schema is None:
            return obj
        stored, errors = admission.admit(kind.schema, obj, old)
        if errors:
            raise self._invalid(kind, name, [str(e) for e in errors], errors)
        return stored

    @staticmethod
    def _invalid(
        kind: Kind, name: str, messages: list[str], errors: list[admission.FieldError] | None = None
    ) -> ApiError:
        group = kind.resource.group
        what = f"{kind.kind}.{group}" if group else kind.kind
        joined = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
        causes = [
            {"reason": "FieldValueInvalid", "message": e.detail, "field": e.path}
            for e in errors or []
        ]
        return ApiError(
            422,
            "Invalid",
            f'{what} "{name}" is invalid: {joined}',
            {"name": name, "group": group, "kind": kind.kind, "causes": causes},
        )

    def create(
        self,
        res: kmock.resource,
        namespace: str | None,
        body: dict[str, Any],
        dry_run: bool = False,
    ) -> dict[str, Any]:
        kind = self.kind(res)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if kind.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        key = self._key(res, meta.get("namespace"), meta.get("name", ""))
        if self.find(res, meta.get("namespace"), meta.get("name", "")) is not None:
            what = f"{res.plural}.{res.group}" if res.group else res.plural
            raise ApiError(
                409,
                "AlreadyExists",
                f'{what} "{meta["name"]}" already exists',
                {"name": meta["name"], "kind": res.plural},
            )
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        if kind.status_subresource and res != CRD_RESOURCE:
            obj.pop("status", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(k, None)
        obj = self._admit(kind, obj, None)
        if dry_run:
            return obj
        if res == CRD_RESOURCE:
            self.register_crd(obj)
            obj["status"] = {
                "acceptedNames": obj["spec"]["names"],
                "conditions": [
                    {
                        "type": "NamesAccepted",
                        "status": "True",
                        "reason": "NoConflicts",
                        "lastTransitionTime": now(),
                    },
                    {
                        "type": "Established",
                        "status": "True",
                        "reason": "InitialNamesAccepted",
                        "lastTransitionTime": now(),
                    },
                ],
                "storedVersions": [v["name"] for v in obj["spec"]["versions"] if v.get("storage")],
            }
        created = self._commit(res, key, obj, "ADDED", None)
        self._collect_orphan(res, created)
        return created

    def _collect_orphan(self, res: kmock.resource, obj: dict[str, Any]) -> None:
        """The garbage collector deletes dependents whose owner no longer exists."""
        refs = obj["metadata"].get("ownerReferences") or []
        if refs and not any(self._uid_exists(ref.get("uid", "")) for ref in refs):
            meta = obj["metadata"]
            self.delete(res, meta.get("namespace"), meta["name"], grace=0)

    def _uid_exists(self, uid: str) -> bool:
        return uid in self.uids

    def update(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Write `change(current)` to the object or one of its subresources."""
        kind = self.kind(res)
        old = self.get(res, namespace, name)
        key = self._key(res, namespace, name)
        if subresource == "scale":
            return self._update_scale(kind, old, change, dry_run)
        proposed = change(copy.deepcopy(old))
        expected_rv = (proposed.get("metadata") or {}).get("resourceVersion")
        if expected_rv and expected_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {res.plural} "{name}": the object has been modified; please apply your changes to the latest version and try again',
            )
        if subresource == "status":
            new = copy.deepcopy(old)
            new["status"] = proposed.get("status")
            if new["status"] is None:
                new.pop("status")
        elif subresource is None:
            new = proposed
            new["metadata"] = self._merge_meta(old["metadata"], proposed.get("metadata") or {})
            if kind.status_subresource:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
        else:
            raise ApiError(404, "NotFound", f"subresource {subresource} is not served here")
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        if old["metadata"].get("deletionTimestamp") and subresource is None:
            added = set(new["metadata"].get("finalizers", [])) - set(
                old["metadata"].get("finalizers", [])
            )
            if added:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{kind.kind} "{name}" is being deleted: no new finalizers can be added',
                )
        new = self._admit(kind, new, old)
        if _spec_part(new) != _spec_part(old):
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if dry_run:
            return new
        if new == old:
            return old  # a no-op write does not bump resourceVersion (as the real server)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            if res != kmock.resource("", "v1", "pods") or not (new.get("spec") or {}).get(
                "nodeName"
            ):
                self._commit(res, key, new, "MODIFIED", old)
                return self._remove(res, key, {})
        committed = self._commit(res, key, new, "MODIFIED", old)
        if res == CRD_RESOURCE:
            self.register_crd(committed)
        return committed

    @staticmethod
    def _merge_meta(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        """Clients cannot change identity or system fields of metadata."""
        merged = dict(new)
        for k in (
            "uid",
            "creationTimestamp",
            "generation",
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "name",
            "namespace",
        ):
            if k in old:
                merged[k] = old[k]
            else:
                merged.pop(k, None)
        return merged

    def _update_scale(
        self,
        kind: Kind,
        old: dict[str, Any],
        change: Callable[[dict[str, Any]], dict[str, Any]],
        dry_run: bool,
    ) -> dict[str, Any]:
        if kind.scale is None:
            raise ApiError(404, "NotFound", f"{kind.resource.plural} have no scale subresource")
        scale = change(self.scale_of(kind, old))
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise self._invalid(kind, old["metadata"]["name"], ["spec.replicas: Required value"])
        meta = old["metadata"]

        def set_replicas(obj: dict[str, Any]) -> dict[str, Any]:
            _set_path(obj, kind.scale.spec, replicas)  # type: ignore[union-attr]
            return obj

        new = self.update(
            kind.resource, meta.get("namespace"), meta["name"], set_replicas, dry_run=dry_run
        )
        return self.scale_of(kind, new)

    def scale_of(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        if kind.scale is None:
            raise ApiError(404, "NotFound", f"{kind.resource.plural} have no scale subresource")
        paths = kind.scale
        meta = obj["metadata"]
        selector = (
            _get_path(obj, paths.selector)
            if paths.selector
            else selector_string(_get_path(obj, ".spec.selector"))
        )
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": _get_path(obj, paths.spec) or 0},
            "status": {"replicas": _get_path(obj, paths.status) or 0, "selector": selector or ""},
        }

    def patch(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        body: Any,
        content_type: str,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        def change(current: dict[str, Any]) -> dict[str, Any]:
            try:
                return patches.apply_patch(current, body, content_type)
            except patches.PatchError as exc:
                raise ApiError(422, "Invalid", str(exc)) from exc

        return self.update(res, namespace, name, change, subresource, dry_run)

    def replace(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        return self.update(res, namespace, name, lambda _: copy.deepcopy(body), subresource)

    def delete(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        options: dict[str, Any] | None = None,
        grace: int | None = None,
    ) -> dict[str, Any]:
        options = options or {}
        kind = self.kind(res)
        old = self.get(res, namespace, name)
        key = self._key(res, namespace, name)
        meta = old["metadata"]
        if grace is None:
            grace = options.get("gracePeriodSeconds")
        graceful = (
            res == kmock.resource("", "v1", "pods")
            and (old.get("spec") or {}).get("nodeName")
            and grace != 0
        )
        if meta.get("finalizers") or graceful:
            if meta.get("deletionTimestamp"):
                return old
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = now()
            if graceful:
                pod_grace = (old.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
                new["metadata"]["deletionGracePeriodSeconds"] = (
                    pod_grace if grace is None else grace
                )
            return self._commit(res, key, new, "MODIFIED", old)
        if kind.resource == CRD_RESOURCE:
            self.unregister_crd(old)
        return self._remove(res, key, options)

    def _remove(self, res: kmock.resource, key: Any, options: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(self.emulator.objects[key].raw)
        self._commit(res, key, obj, "DELETED", None)
        self._collect_garbage(
            obj["metadata"]["uid"], options.get("propagationPolicy", "Background")
        )
        return obj

    def _collect_garbage(self, owner_uid: str, policy: str) -> None:
        """Delete (or orphan) every object whose ownerReferences name the deleted owner."""
        for r, keys in list(self.keys.items()):
            for key in list(keys):
                self._collect_one(r, key, owner_uid, policy)

    def _collect_one(self, r: kmock.resource, key: Any, owner_uid: str, policy: str) -> None:
        _, ns, name = key
        stored = self.emulator.objects[key]
        if not stored.deleted:
            refs = stored.raw.get("metadata", {}).get("ownerReferences") or []
            if not any(ref.get("uid") == owner_uid for ref in refs):
                return
            if policy == "Orphan":
                remaining = [ref for ref in refs if ref.get("uid") != owner_uid]
                self.update(
                    r,
                    ns,
                    name,
                    lambda o, rs=remaining: {
                        **o,
                        "metadata": {**o["metadata"], "ownerReferences": rs},
                    },
                )
            elif self.find(r, ns, name) is not None:
                self.delete(r, ns, name, {"propagationPolicy": "Background"})
