"""One retry policy for every hub download (models and datasets): only transient failures (network errors,
HTTP 429 and 5xx) are retried, with exponential waits; anything deterministic (unknown repo, gated, bad
revision, offline mode) fails at once."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("truthflow.hub")

HUB_ATTEMPTS = 4
HUB_WAIT = None  # None: tenacity.wait_exponential(multiplier=2, max=60); tests set tenacity.wait_none()

_TRANSIENT_NAMES = {
    "ConnectionError",  # builtin, requests
    "ConnectTimeout",
    "ReadTimeout",
    "Timeout",
    "TimeoutError",
    "TimeoutException",
    "TransportError",  # httpx: network, protocol, proxy, timeouts
    "NetworkError",
    "RemoteProtocolError",
    "ChunkedEncodingError",
    "IncompleteRead",
    "ProtocolError",
}


def offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


# hub clients do not tell: test_hostile_models::test_hub_download_fails_at_once_on_deterministic_errors
def is_transient(exc: BaseException) -> bool:
    """A network error or an HTTP 429/5xx (anywhere in the exception chain); never in offline mode."""
    if offline():
        return False
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        names = {c.__name__ for c in type(cur).__mro__}
        if "OfflineModeIsEnabled" in names:
            return False
        status = getattr(getattr(cur, "response", None), "status_code", None)
        if isinstance(status, int):
            return status == 429 or status >= 500
        if names & _TRANSIENT_NAMES:
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def retrying(label: str, what: str):
    """A tenacity.Retrying to call a hub download with: retrying(label, what)(func, *args, **kwargs)."""
    import tenacity

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning(
            "%s: hub download of '%s' failed (attempt %d/%d, transient: %s: %s); retrying",
            label,
            what,
            state.attempt_number,
            HUB_ATTEMPTS,
            type(exc).__name__,
            str(exc)[:200],
        )

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_after_attempt(HUB_ATTEMPTS),
        wait=HUB_WAIT if HUB_WAIT is not None else tenacity.wait_exponential(multiplier=2, max=60),
        before_sleep=before_sleep,
        reraise=True,
    )
