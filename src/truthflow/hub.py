"""One retry policy for downloads (the hub's, and pinned files by URL): transient failures (network, HTTP 429
and 5xx) are retried with exponential waits; deterministic ones (unknown repo, gated, bad revision, offline)
fail at once. A hub source's revision is resolved to its commit, which a run records (`resolve_revision`)."""

import hashlib
import logging
import os
import re
from pathlib import Path

from .errors import TruthflowError

HUB_ATTEMPTS = 4
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
HUB_WAIT = None  # None: tenacity.wait_exponential(multiplier=2, max=60); tests set tenacity.wait_none()

# builtin, requests, httpx, urllib3/http.client errors, matched anywhere in the class hierarchy (ReadTimeout)
_TRANSIENT_NAMES = {"ConnectionError", "TimeoutError", "Timeout", "ChunkedEncodingError", "TransportError"}
_TRANSIENT_NAMES |= {"ProtocolError", "IncompleteRead"}


# the hub clients do not say which of their errors are transient
def offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARIABLES)


def is_transient(exc: BaseException) -> bool:
    """A network error or an HTTP 429/5xx (anywhere in the exception chain); never in offline mode."""
    if offline():
        return False
    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        names = {c.__name__ for c in type(cur).__mro__}
        if "OfflineModeIsEnabled" in names:
            return False
        status = getattr(getattr(cur, "response", None), "status_code", None)
        if status is None and "HTTPError" in names:  # urllib's HTTPError carries its status as `code`
            status = getattr(cur, "code", None)
        if isinstance(status, int):
            return status == 429 or status >= 500
        if names & _TRANSIENT_NAMES:
            return True
        reason = getattr(cur, "reason", None)  # urllib's URLError wraps the socket error as `reason`
        cur = cur.__cause__ or cur.__context__ or (reason if isinstance(reason, BaseException) else None)
    return False


# huggingface_hub retries a file GET on HTTP 408/429 only, datasets.load_dataset nothing
def retrying(label: str, what: str):
    """A tenacity.Retrying to call a hub download with: retrying(label, what)(func, *args, **kwargs)."""
    import tenacity

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception()
        logging.getLogger(__name__).warning(
            f"{label}: hub download of '{what}' failed (attempt {state.attempt_number}/{HUB_ATTEMPTS}, "
            f"transient: {type(exc).__name__}: {str(exc)[:200]}); retrying"
        )

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_after_attempt(HUB_ATTEMPTS),
        wait=HUB_WAIT if HUB_WAIT is not None else tenacity.wait_exponential(multiplier=2, max=60),
        before_sleep=before_sleep,
        reraise=True,
    )


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# urllib: the one client here that reads both https:// and file:// (a local copy, the tests' stand-ins)
def download_pinned(url: str, sha256: str, dest: str | Path, label: str) -> Path:
    """The file at `url` written to `dest`, retried as a hub download, kept only if its sha256 is `sha256`."""
    import urllib.request

    def fetch() -> bytes:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.read()

    try:
        data = retrying(label, url)(fetch)
    except Exception as exc:  # noqa: BLE001 - URLError, HTTPError, timeouts: one line
        tried = f"failed {HUB_ATTEMPTS} times (transient)" if is_transient(exc) else "failed"
        raise TruthflowError(f"{label}: download of {url} {tried}: {type(exc).__name__}: {exc}") from None
    if (got := hashlib.sha256(data).hexdigest()) != sha256:
        raise TruthflowError(f"{label}: {url} has sha256 {got}, but {sha256} is pinned; refused")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part")
    part.write_bytes(data)
    part.replace(dest)
    return dest


def pinned_revision(revision: str | None) -> bool:
    """A revision that names one commit (a full hex sha), not a branch or tag that can move."""
    return bool(revision and re.fullmatch(r"[0-9a-f]{40}", revision))


def resolve_revision(repo_id: str, repo_type: str, revision: str | None, label: str) -> dict:
    """The commit `revision` (None: the default branch) names now, with the hub's sha256 of each LFS file
    there (the weights and data files; small text files have no sha256 on the hub): {revision, files}."""
    from huggingface_hub import HfApi

    info = getattr(HfApi(), f"{repo_type}_info")
    found = retrying(label, repo_id)(info, repo_id, revision=revision, files_metadata=True)
    files = {s.rfilename: s.lfs.sha256 for s in found.siblings or [] if getattr(s, "lfs", None)}
    return {"revision": found.sha, "files": dict(sorted(files.items()))}


def changed_revisions(records: list[dict]) -> list[str]:
    """For each recorded hub source whose revision was not pinned to a commit: a line where it now resolves
    to another commit than the recorded one (or cannot be checked). Offline: nothing is checked."""
    lines = []
    for r in records:
        if offline() or not r.get("revision") or pinned_revision(r.get("requested")):
            continue
        kind = r.get("kind", "model")
        try:
            now = resolve_revision(r["source"], kind, r.get("requested"), f"{kind} '{r['name']}'")["revision"]
        except Exception as exc:  # noqa: BLE001 - network, auth: a check that cannot run says so, no more
            lines.append(
                f"{kind} '{r['name']}': could not check the revision of '{r['source']}' ({exc})"[:300]
            )
            continue
        if now != r["revision"]:
            lines.append(
                f"{kind} '{r['name']}': '{r['source']}' at {r.get('requested') or 'main'} now resolves "
                f"to {now}, but this run recorded {r['revision']} and keeps using it; pin source.revision "
                f"({r['revision']} to keep it, {now} to move, deleting the recorded copy) to silence this"
            )
    return lines
