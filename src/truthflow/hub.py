"""One retry policy for hub downloads: transient failures (network, HTTP 429 and 5xx) are retried with
exponential waits; deterministic ones (unknown repo, gated, bad revision, offline) fail at once."""

import logging
import os

HUB_ATTEMPTS = 4
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
HUB_WAIT = None  # None: tenacity.wait_exponential(multiplier=2, max=60); tests set tenacity.wait_none()

# builtin, requests, httpx, urllib3/http.client errors, matched anywhere in the class hierarchy (ReadTimeout)
_TRANSIENT_NAMES = {"ConnectionError", "TimeoutError", "Timeout", "ChunkedEncodingError", "TransportError"}
_TRANSIENT_NAMES |= {"ProtocolError", "IncompleteRead"}


# the hub clients do not say which of their errors are transient
def is_transient(exc: BaseException) -> bool:
    """A network error or an HTTP 429/5xx (anywhere in the exception chain); never in offline mode."""
    if any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in OFFLINE_VARIABLES):
        return False
    seen, cur = set(), exc
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
