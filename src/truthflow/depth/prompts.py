"""DepthQA's prompts as small YAML files a user can swap (METHOD B3), each with the sha256 of its bytes,
which the report states. The answer prompt (`depth.prompt`) holds `system` ("" for none), `user` (with
`{question}`), `no_system_role` (for a chat template without a system role: `fold`, the system text opens the
user turn followed by a blank line, or `drop`) and `base` (the whole prompt of a model without a chat
template). The judge prompt (`depth.judge.prompt`) holds `system`, `task` (the user turn: `{instruction}`,
`{response}`, `{reference}`, `{rubric}`) and `rubric`; literal braces are written twice ({{ }}). A relative
path is looked up in the working directory, then in the checkout (shipped files: prompts/).
The layout (`depth.prompt_layout`) places a file's text: `truthflow` (above), or `authors`, exactly as the
DepthQA authors' code did (docs/depthqa_authors.md): the system text folded into the user turn after ONE
newline whenever the literal string "system" is not in the tokenizer's chat template (a template holding it
gets a system turn, even an empty one), the rendered prompt stripped, and its text tokenized as their vLLM
did, with the tokenizer's special tokens (a BOS the template writes is then doubled)."""

import hashlib
import string
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import TruthflowError

CHECKOUT = Path(__file__).resolve().parents[3]
# a prompt kind's text fields, each with the placeholders it must hold (None: plain text)
ANSWER_KEYS = {"system": None, "user": {"question"}, "no_system_role": None, "base": {"question"}}
JUDGE_KEYS = {"system": None, "task": {"instruction", "response", "reference", "rubric"}, "rubric": None}
NO_SYSTEM_ROLE = ("fold", "drop")
LAYOUTS = ("truthflow", "authors")
# a system text no template writes by itself: its absence from the rendered prompt means the role was dropped
_PROBE = "truthflow-system-role-probe"


@dataclass(frozen=True)
class AnswerPrompt:
    system: str
    user: str
    no_system_role: str
    base: str
    path: str
    sha256: str

    def messages(self, question: str, system_role: bool) -> list[dict]:
        """The chat turns for `question`; `system_role`: whether the model's chat template has one."""
        user = self.user.format(question=question)
        if self.system and system_role:
            return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]
        if self.system and self.no_system_role == "fold":
            user = f"{self.system}\n\n{user}"
        return [{"role": "user", "content": user}]

    def authors_messages(self, question: str, template: str | dict) -> list[dict]:
        """The authors' turns (their single_turn.apply_template_chat): a system turn, even an empty one,
        unless the chat template's text lacks the string "system"; then one user turn, joined by a newline."""
        user = self.user.format(question=question)
        if "system" not in template:  # a dict of named templates: its names, as in their `in` test
            return [{"role": "user", "content": self.system + "\n" + user}]
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

    def render(
        self,
        tokenizer,
        question: str,
        chat: bool,
        chat_template_kwargs: dict | None = None,
        layout: str = "truthflow",
    ) -> str:
        """The whole prompt: the chat template over the layout's turns for a chat model with one, else
        `base`; the authors' layout strips it, as their model wrapper did before vLLM read it."""
        if layout not in LAYOUTS:
            raise TruthflowError(f"depth.prompt_layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if not (chat and getattr(tokenizer, "chat_template", None)):
            text = self.base.format(question=question)
            return text.strip() if layout == "authors" else text
        kwargs = chat_template_kwargs or {}
        if layout == "truthflow":
            messages = self.messages(question, not self.system or has_system_role(tokenizer, kwargs))
        else:
            messages = self.authors_messages(question, tokenizer.chat_template)
        try:
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **kwargs
            )
        except Exception as exc:  # jinja2's TemplateError, or whatever raise_exception() a template calls
            roles = " + ".join(m["role"] for m in messages)
            # Gemma's template names "system" yet refuses a system turn: the authors' code failed there too
            raise TruthflowError(
                f"depth.prompt_layout '{layout}': the chat template refuses the turns {roles}: {exc}"
            ) from None
        return text.strip() if layout == "authors" else text


def vllm_encode(tokenizer, prompt: str) -> list[int]:
    """A text prompt's ids as vLLM 0.4-0.5 made them (the authors' layout): `tokenizer.encode(prompt)`, whose
    add_special_tokens defaults to True, so a BOS the chat template already wrote is doubled."""
    return tokenizer.encode(prompt)


@dataclass(frozen=True)
class JudgePrompt:
    system: str
    task: str
    rubric: str
    path: str
    sha256: str

    def user(self, question: str, answer: str, reference: str) -> str:
        return self.task.format(
            instruction=question, response=answer, reference=reference, rubric=self.rubric
        )


def has_system_role(tokenizer, chat_template_kwargs: dict | None = None) -> bool:
    """Whether the template writes a system turn (Gemma raises on one, Mistral-Instruct v0.2 drops it)."""
    messages = [{"role": "system", "content": _PROBE}, {"role": "user", "content": "?"}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, **(chat_template_kwargs or {}))
    except Exception:  # jinja2's TemplateError, or whatever raise_exception() a template calls
        return False
    return _PROBE in text


def resolve(value: str | Path, key: str) -> Path:
    """The prompt file a config value names: as given if absolute, else in the cwd, else in the checkout."""
    path = Path(value)
    for candidate in [path] if path.is_absolute() else [path, CHECKOUT / path]:
        if candidate.is_file():
            return candidate
    where = "" if path.is_absolute() else f" (looked in {Path.cwd()} and in the checkout {CHECKOUT})"
    raise TruthflowError(f"config key '{key}': prompt file '{value}' does not exist{where}")


def digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _read(value: str | Path, key: str, kind: str, keys: dict[str, set | None]) -> tuple[dict, str]:
    """The file's text fields with its path and digest (of the bytes parsed), and its message prefix."""
    path = resolve(value, key)
    where = f"prompt file '{path}' (config key '{key}')"
    try:
        raw = path.read_bytes()
    except OSError as exc:  # no read permission, or the file vanished since resolve()
        raise TruthflowError(f"{where} cannot be read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TruthflowError(f"{where} is not readable YAML: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(data, dict):
        raise TruthflowError(f"{where} must be a mapping with the keys {', '.join(['kind', *keys])}")
    if data.get("kind") != kind:
        raise TruthflowError(f"{where}: kind must be '{kind}', got {data.get('kind')!r}")
    problems = {"unknown": sorted(set(data) - {"kind", *keys}), "missing": [k for k in keys if k not in data]}
    if any(problems.values()):
        listed = "; ".join(f"{what} key(s) {names}" for what, names in problems.items() if names)
        raise TruthflowError(f"{where}: {listed} (a {kind} prompt has {', '.join(keys)})")
    for k in keys:
        if not isinstance(data[k], str):
            raise TruthflowError(f"{where}: '{k}' must be text, got {type(data[k]).__name__}")
    for k, wanted in keys.items():
        if wanted is not None:
            _check_template(data[k], wanted, f"{where}: '{k}'")
    return {k: data[k] for k in keys} | {"path": str(path), "sha256": hashlib.sha256(raw).hexdigest()}, where


def _check_template(template: str, wanted: set[str], where: str) -> None:
    try:
        found = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:  # a single { or }
        raise TruthflowError(f"{where}: {exc} (write a literal brace twice: {{{{ or }}}})") from None
    if found != wanted:
        raise TruthflowError(
            f"{where} must hold {', '.join('{' + f + '}' for f in sorted(wanted))} and no other "
            f"placeholder, has {', '.join('{' + f + '}' for f in sorted(found)) or 'none'}"
        )


def load_answer_prompt(value: str | Path, key: str = "depth.prompt") -> AnswerPrompt:
    fields, where = _read(value, key, "answer", ANSWER_KEYS)
    if fields["no_system_role"] not in NO_SYSTEM_ROLE:
        raise TruthflowError(
            f"{where}: 'no_system_role' must be one of {', '.join(NO_SYSTEM_ROLE)}, "
            f"got {fields['no_system_role']!r}"
        )
    return AnswerPrompt(**fields)


def load_judge_prompt(value: str | Path, key: str = "depth.judge.prompt") -> JudgePrompt:
    return JudgePrompt(**_read(value, key, "judge", JUDGE_KEYS)[0])


def digest_rows(files: dict[str, tuple[str, str]], judge_backend: str) -> list[dict]:
    """The report's prompt table per stage of `files` (stage -> (config key, path)): file, sha256, note."""
    unread = "not read: the reference judge scores token-F1 and sends no prompt"
    notes = {
        "answer": "the answers' prompt (chat models: its turns in their template; base models: `base`)",
        "judge": unread if judge_backend == "reference" else "read by the judge",
    }
    return [
        {"stage": stage, "config_key": key, "file": str(path), "sha256": digest(path), "note": notes[stage]}
        for stage, (key, path) in files.items()
    ]
