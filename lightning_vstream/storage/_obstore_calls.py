"""obstore calls shared by the in-process transport and the helper process.

Self-contained on purpose (standard library and obstore only): the helper process runs
``_obstore_helper.py`` as a script, with this folder on its path, so that it starts in a tenth of a
second without importing torch or the rest of the package.
"""

from __future__ import annotations

import time
from typing import Any

if __package__:  # imported as lightning_vstream.storage._obstore_calls
    from lightning_vstream.storage import _egress
else:  # in the helper process, as a sibling of its script (which imports nothing of the package)
    import _egress  # type: ignore[no-redef,import-not-found]


class CallError(Exception):
    """A request spec this module cannot serve (a bug in the caller, reported back as a message)."""


class RedirectRefused(Exception):
    """A request failed because the egress guard refused a redirect to another host."""


#: Hosts the clients of guarded stores reach directly: the cloud providers' credential services,
#: which obstore asks for credentials nobody configured (never a redirect target a store chooses).
CREDENTIAL_HOSTS = (
    "169.254.169.254,169.254.170.2,fd00:ec2::254,.amazonaws.com,.amazonaws.com.cn,"
    "metadata.google.internal,.googleapis.com,.microsoftonline.com"
)


def build_store(spec: dict[str, Any]) -> Any:
    """An obstore store from a JSON spec: ``{"kind", "root", "config", "client_options", "profile"}``.

    Retries are off (``max_retries=0``): the caller retries, so that it can count every attempt.
    """
    from obstore.store import AzureStore, GCSStore, HTTPStore, S3Store

    kind = spec["kind"]
    config: Any = dict(spec.get("config") or {})
    client_options: Any = dict(spec.get("client_options") or {})
    if spec.get("egress"):
        # Every request goes through this process's guard, which refuses hosts other than the store's.
        client_options["proxy_url"] = _egress.guard_for(frozenset(spec["egress"])).url
        client_options["proxy_excludes"] = CREDENTIAL_HOSTS
    retry: Any = {"max_retries": 0}
    if kind == "s3":
        provider = None
        profile = spec.get("profile")
        if profile:
            import boto3
            from obstore.auth.boto3 import Boto3CredentialProvider

            provider = Boto3CredentialProvider(boto3.Session(profile_name=profile))
        return S3Store(
            spec["root"], config=config, client_options=client_options, retry_config=retry, credential_provider=provider
        )
    if kind == "gcs":
        return GCSStore(spec["root"], config=config, client_options=client_options, retry_config=retry)
    if kind == "azure":
        return AzureStore(spec["root"], config=config, client_options=client_options, retry_config=retry)
    if kind == "http":
        return HTTPStore.from_url(spec["root"], client_options=client_options, retry_config=retry)
    raise CallError(f"unknown store kind {kind!r}")


def _meta(meta: Any) -> dict[str, Any]:
    modified = meta.get("last_modified")
    return {
        "size": int(meta["size"]),
        "etag": meta.get("e_tag"),
        "mtime_ns": int(modified.timestamp() * 1e9) if modified is not None else None,
        "key": meta.get("path"),
    }


def call(store: Any, op: str, params: dict[str, Any]) -> tuple[Any, Any]:
    """Make one request; returns ``(payload, meta)`` (payload: bytes-like or None; meta: a dict or a list).

    Raises:
        RedirectRefused: The store redirected the request to another host (see ``_egress``).
        Exception: obstore's error for any other failure.
    """
    started = time.monotonic()
    try:
        return _call(store, op, params)
    except Exception as err:
        target = _egress.refused_since(started)
        if target is not None:
            raise RedirectRefused(f"{_egress.MARKER}: {target} ({type(err).__name__})") from None
        raise


def _call(store: Any, op: str, params: dict[str, Any]) -> tuple[Any, Any]:
    import obstore

    key = params.get("key", "")
    if op == "get":
        options: Any = {}
        if params.get("start") is not None:
            options["range"] = (int(params["start"]), int(params["end"]))
        if params.get("if_match"):
            options["if_match"] = params["if_match"]
        result = obstore.get(store, key, options=options or None)
        return result.bytes(), _meta(result.meta)
    if op == "head":
        return None, _meta(obstore.head(store, key))
    if op == "put":
        data = params["data"]
        written = obstore.put(store, key, data)
        return None, {"size": len(data), "etag": written.get("e_tag"), "mtime_ns": None, "key": key}
    if op == "list":
        found: list[dict[str, Any]] = []
        for batch in obstore.list(store, prefix=key or None, chunk_size=1000):
            found.extend(_meta(m) for m in batch)
        return None, found
    raise CallError(f"unknown op {op!r}")


def describe(err: BaseException) -> tuple[str, str]:
    """``(error class name, message)`` of a failed call, for :func:`classify_message` in the caller."""
    return type(err).__name__, str(err)
