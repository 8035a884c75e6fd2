"""One retry policy for downloads (the hub's, and pinned files by URL): transient failures (network, HTTP 429
and 5xx) are retried with exponential waits; deterministic ones (unknown repo, gated, bad revision, offline)
fail at once. A hub source's revision (a commit, a branch or tag, a date, or none) is resolved to its commit,
which a run records (`resolve_revision`)."""

import hashlib
import logging
import os
import re
from datetime import UTC, date, datetime, time, timedelta
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


COMMIT = re.compile(r"[0-9a-f]{40}")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# meant as a date, even where not written as one (a tag such as 10.1.0 is not)
LIKE_A_DATE = re.compile(r"\d{4}[-/]\d{1,2}[-/]\d{1,2}|\d{1,2}[-/]\d{1,2}[-/]\d{4}")
# what git check-ref-format refuses in a branch or tag name (the hub's revisions are git refs)
BAD_REF = re.compile(r"\.\.|@\{|//|/\.|^[./-]|[./]$|\.lock(/|$)|^@$|[\x00-\x20\x7f~^:?*\[\\]")


def revision_date(revision: str | None) -> date | None:
    """The day a revision names (YYYY-MM-DD), or None for a commit, a branch or tag, or no revision."""
    if not (revision and DATE.fullmatch(revision)):
        return None
    try:
        return date.fromisoformat(revision)
    except ValueError:
        return None


def revision_problem(revision: str) -> str | None:
    """Why `revision` is neither a commit (40 hex digits), a date (YYYY-MM-DD) nor a branch or tag name; None
    where it is one of them."""
    if not revision:
        return "it is empty (null: the default branch)"
    if LIKE_A_DATE.fullmatch(revision) and revision_date(revision) is None:
        return "a date is written YYYY-MM-DD, and must exist"
    if bad := BAD_REF.search(revision):
        return f"a branch or tag name cannot hold {bad.group()!r} there (git check-ref-format)"
    return None


def pinned_revision(revision: str | None) -> bool:
    """A revision that names one commit for good: a full hex sha, or a date (its last commit, resolved once
    and recorded), not a branch or tag that can move."""
    return bool(revision and COMMIT.fullmatch(revision)) or revision_date(revision) is not None


def end_of(day: date) -> datetime:
    """The end of `day`, UTC: a date revision stands for the commits made before it."""
    return datetime.combine(day + timedelta(days=1), time.min, tzinfo=UTC)


def last_commit_on(commits, day: date):
    """The GitCommitInfo among `commits` made last on or before `day` (up to its end, UTC), or None."""
    return max((c for c in commits if c.created_at < end_of(day)), key=lambda c: c.created_at, default=None)


def commit_on(repo_id: str, repo_type: str, day: date, label: str):
    """The last commit made on or before `day` (UTC) in the hub's commit history of `repo_id`'s default
    branch (HfApi.list_repo_commits)."""
    from huggingface_hub import HfApi

    if end_of(day) > datetime.now(UTC):  # commits may still come that day: the date would move
        raise TruthflowError(
            f"{label}: revision {day} has not ended yet (UTC), so its last commit of '{repo_id}' may still "
            "change; give a past date, a commit or null"
        )
    commits = retrying(label, repo_id)(HfApi().list_repo_commits, repo_id, repo_type=repo_type)
    if (found := last_commit_on(commits, day)) is None:
        first = min((c.created_at for c in commits), default=None)
        since = f" (its first commit is of {first:%Y-%m-%d})" if first else ""
        raise TruthflowError(
            f"{label}: '{repo_id}' has no commit on or before {day}{since}; set source.revision to a later "
            "date, a commit or null"
        )
    return found


def resolve_revision(repo_id: str, repo_type: str, revision: str | None, label: str) -> dict:
    """The commit `revision` (None: the default branch; a date: its last commit) names now, with the hub's
    sha256 of each LFS file there (the weights and data files; small text files have no sha256 on the hub):
    {revision, files}, and for a date the time of its commit (`committed`)."""
    from huggingface_hub import HfApi

    extra = {}
    if (day := revision_date(revision)) is not None:
        found = commit_on(repo_id, repo_type, day, label)
        revision, extra = found.commit_id, {"committed": found.created_at.isoformat()}
    info = getattr(HfApi(), f"{repo_type}_info")
    found = retrying(label, repo_id)(info, repo_id, revision=revision, files_metadata=True)
    files = {s.rfilename: s.lfs.sha256 for s in found.siblings or [] if getattr(s, "lfs", None)}
    return {"revision": found.sha, "files": dict(sorted(files.items()))} | extra


def check_offline_revision(revision: str | None, label: str) -> None:
    """Offline the local cache serves a revision as given; a date, which only the hub's commit history
    resolves (the cache keeps commits by branch and tag, not by date), is refused in one line."""
    if revision_date(revision) is not None:
        raise TruthflowError(
            f"{label}: revision {revision} is a date, which only the hub's commit history resolves, and "
            "HF_HUB_OFFLINE is set; run once online (the commit is then recorded), or set source.revision to "
            "the commit"
        )


def changed_revisions(records: list[dict]) -> list[str]:
    """For each recorded hub source whose revision was not pinned to a commit or a date: a line where it now
    resolves to another commit than the recorded one (or cannot be checked). Offline: nothing is checked."""
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
