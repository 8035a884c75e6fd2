"""`redact` masks secrets with `***`: secret variables (read per call), `add_secret`'s, credential shapes."""

import os
import re
from collections.abc import Mapping

SECRET_ENV = ("OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
MASK = "***"
# shorter values ("x", "none": placeholders for local servers that take no key) would mask ordinary words
MIN_SECRET_LEN = 8

_PATTERNS = (
    (re.compile(r"\b(bearer)(\s+)[A-Za-z0-9._~+/=-]{4,}", re.IGNORECASE), rf"\1\2{MASK}"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"), f"sk-{MASK}"),
    (re.compile(r"\bhf_[A-Za-z0-9]{8,}"), f"hf_{MASK}"),
)
_registered: set[str] = set()


def add_secret(value: str | None) -> None:
    if value and len(value) >= MIN_SECRET_LEN:
        _registered.add(value)


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    found = {environ.get(name) or "" for name in SECRET_ENV} | _registered
    secrets = [s for s in found if len(s) >= MIN_SECRET_LEN]
    # longest first, so a secret that contains another is masked whole
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    for pattern, mask in _PATTERNS:
        text = pattern.sub(mask, text)
    return text
