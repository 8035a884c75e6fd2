"""The DepthQA authors' own inputs (Ko et al., EMNLP 2024; github.com/kaistAI/knowledge-reasoning), downloaded
at a pinned commit and checked by sha256, never copied into truthflow (docs/depthqa_authors.md): their prompt
text, read from `src/utils/prompts.py` without running it and written as truthflow prompt files; and their
released answers (`outputs/inference/<model>_zero-shot.json`) as the answers of a model the run judges."""

import ast
import string
from pathlib import Path

import polars as pl
import yaml

from ..errors import TruthflowError
from ..hub import download_pinned
from .prompts import load_answer_prompt, load_judge_prompt

COMMIT = "c8f9b6afe93602fbaab5c95dde28d46fb3c8b35a"
PROMPTS_URL = f"https://raw.githubusercontent.com/kaistAI/knowledge-reasoning/{COMMIT}/src/utils/prompts.py"
PROMPTS_SHA256 = "6f6895e1ef59b76141c321f74136b35c4bfda634f04ca5941f2f19f4b313cfe1"
# rule authors_prompts writes these; a config value naming one before it exists waits for the rule (pending)
PROMPT_FILES = {"answer": Path("resources/depthqa_authors/answer.yaml")}
PROMPT_FILES["judge"] = Path("resources/depthqa_authors/judge.yaml")
# their constants (zero-shot answers, the judge) and the placeholders each holds
ANSWER_CONSTANTS = {"SYSTEM_PROMPT_ZERO_SHOT": set(), "USER_PROMPT_TEMPLATE_ZERO_SHOT": {"question"}}
JUDGE_CONSTANTS = {"SYSTEM_PROMPT_EVAL": set()}
JUDGE_CONSTANTS["USER_PROMPT_TEMPLATE_EVAL"] = {"instruction", "response", "reference_answer"}
# their judge template holds its rubric inline, between these lines; truthflow's holds {rubric}
RUBRIC_OPEN, RUBRIC_CLOSE = "###Score Rubrics:\n", "\n\n###Feedback:"
# a released answer's fields: theirs, and what truthflow's answers and questions tables call them
RELEASED_FIELDS = {"qid": "qid", "depth": "depth", "question": "question", "answer": "reference"}
RELEASED_FIELDS["predicted_answer"] = "answer"


def pending(value: str | Path) -> bool:
    """Whether a prompt config value names a file rule authors_prompts makes and has not made yet."""
    return Path(value) in PROMPT_FILES.values() and not Path(value).exists()


def read_constants(path: str | Path, wanted: dict[str, set]) -> dict[str, str]:
    """The module-level string constants `wanted` of a Python file, read with `ast`, never executed."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise TruthflowError(f"'{path}': not readable Python ({exc})") from None
    found = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }
    if missing := [name for name in wanted if name not in found]:
        raise TruthflowError(f"'{path}' has no string constant {missing[0]} (it has {sorted(found)})")
    return {name: found[name] for name in wanted}


def as_template(text: str, fields: set, rename: dict[str, str], where: str) -> str:
    """`text`, a str.format template holding `fields`, as a truthflow template: its literal braces doubled,
    its fields renamed by `rename`; it formats to the same string."""
    out = []
    for literal, name, spec, conversion in string.Formatter().parse(text):
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is not None:
            if name not in fields or spec or conversion:
                raise TruthflowError(
                    f"{where}: unexpected placeholder {{{name}}} (expected {sorted(fields)})"
                )
            out.append("{" + rename.get(name, name) + "}")
    return "".join(out)


def answer_prompt(constants: dict[str, str]) -> dict:
    """Their zero-shot system prompt and user template as an answer prompt file's fields."""
    system, user = constants["SYSTEM_PROMPT_ZERO_SHOT"], constants["USER_PROMPT_TEMPLATE_ZERO_SHOT"]
    user = as_template(user, {"question"}, {}, "USER_PROMPT_TEMPLATE_ZERO_SHOT")
    # their models are all chat models; `base` folds as their code folds a system turn (one newline)
    base = system.replace("{", "{{").replace("}", "}}") + "\n" + user
    return {"kind": "answer", "system": system, "user": user, "no_system_role": "fold", "base": base}


def judge_prompt(constants: dict[str, str]) -> dict:
    """Their judge system prompt and template as a judge prompt file's fields, the inline rubric cut out."""
    where = "USER_PROMPT_TEMPLATE_EVAL"
    fields = JUDGE_CONSTANTS[where]
    task = as_template(constants[where], fields, {"reference_answer": "reference"}, where)
    start = task.find(RUBRIC_OPEN)
    end = task.find(RUBRIC_CLOSE, start + 1)
    if start < 0 or end < 0:
        raise TruthflowError(f"{where}: no rubric between {RUBRIC_OPEN!r} and {RUBRIC_CLOSE!r}")
    start += len(RUBRIC_OPEN)
    rubric = task[start:end].format()  # no field inside (a KeyError otherwise): its doubled braces undone
    task = task[:start] + "{rubric}" + task[end:]
    return {"kind": "judge", "system": constants["SYSTEM_PROMPT_EVAL"], "task": task, "rubric": rubric}


def _check_same_text(constants: dict[str, str], answer_path: Path, judge_path: Path) -> None:
    """The written files fill in to their strings exactly (a probe question, answer and reference)."""
    answer, judge = load_answer_prompt(answer_path), load_judge_prompt(judge_path)
    q, a, r = "probe {question} }{", "probe response", "probe reference"
    theirs = constants["USER_PROMPT_TEMPLATE_EVAL"].format(instruction=q, response=a, reference_answer=r)
    same = {
        "answer system": answer.system == constants["SYSTEM_PROMPT_ZERO_SHOT"],
        "answer user": answer.user.format(question=q)
        == constants["USER_PROMPT_TEMPLATE_ZERO_SHOT"].format(question=q),
        "judge system": judge.system == constants["SYSTEM_PROMPT_EVAL"],
        "judge task": judge.user(q, a, r) == theirs,
    }
    if differ := [what for what, ok in same.items() if not ok]:
        raise TruthflowError(f"the authors' prompts written to {answer_path.parent}: {differ[0]} differs")


def _write(fields: dict, path: Path, url: str, sha256: str) -> None:
    head = (
        f"# The DepthQA authors' {fields['kind']} prompt, written by rule authors_prompts from\n# {url}\n"
        f"# (sha256 {sha256}), their text, not truthflow's. Rewritten when deleted.\n"
    )
    # double-quoted scalars: leading newlines and trailing spaces come back as written
    body = yaml.safe_dump(fields, default_style='"', sort_keys=False, allow_unicode=True, width=100)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + body, encoding="utf-8")


def make_prompt_files(
    url: str, sha256: str, source: str | Path, answer: str | Path, judge: str | Path
) -> None:
    """Download their prompts.py to `source` (pinned by sha256), and write its answer and judge prompts."""
    download_pinned(url, sha256, source, "the DepthQA authors' prompts")
    constants = read_constants(source, ANSWER_CONSTANTS | JUDGE_CONSTANTS)
    answer, judge = Path(answer), Path(judge)
    _write(answer_prompt(constants), answer, url, sha256)
    _write(judge_prompt(constants), judge, url, sha256)
    _check_same_text(constants, answer, judge)


def released_answers(path: str | Path, questions: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A released answers file (a JSON object keyed by qid: qid, depth, question, answer = the reference,
    predicted_answer) as an answers table (qid, answer, depth) and the judge's questions table (id, question,
    reference_answer), texts as read (the judge strips them, judge.judge_all, as theirs does); over the run's
    DepthQA questions (its `n`), each of which needs an answer of its depth."""
    from ..data import read_local_records

    records = read_local_records(path, "json")
    if bad := next((r for r in records if any(k not in r for k in RELEASED_FIELDS)), None):
        raise TruthflowError(
            f"'{path}': answer '{bad.get('_key')}' lacks {sorted(set(RELEASED_FIELDS) - set(bad))}"
        )
    rows = {str(r["qid"]): {name: r[field] for field, name in RELEASED_FIELDS.items()} for r in records}
    depth_of = dict(questions.select("id", "depth").iter_rows())
    if missing := [qid for qid in depth_of if qid not in rows]:
        raise TruthflowError(
            f"'{path}' has no answer to {len(missing)} DepthQA question(s) of this run, e.g. '{missing[0]}'"
        )
    if wrong := [q for q, d in depth_of.items() if str(rows[q]["depth"]) != str(d)]:
        q = wrong[0]
        raise TruthflowError(
            f"'{path}': question '{q}' has depth {rows[q]['depth']}, DepthQA's {depth_of[q]}"
        )
    kept = [{**{k: str(v) for k, v in rows[q].items()}, "qid": q, "depth": depth_of[q]} for q in depth_of]
    table = pl.DataFrame(
        kept, schema=dict.fromkeys(["qid", "question", "reference", "answer"], pl.Utf8) | {"depth": pl.Int64}
    )
    answers = table.select("qid", "answer", "depth")
    judged = table.select(
        pl.col("qid").alias("id"), "question", pl.col("reference").alias("reference_answer")
    )
    return answers, judged
