"""What judging DepthQA's answers costs, priced before a run (`truthflow.bill` prints it).

Calls: one per verdict: the run's DepthQA questions x the judged models (rule judge_answers runs once for each
model of depth.models, whose answers the run generates, and of depth.released_answers, read from a file) x
depth.judge.judgments. The reference judge scores token-F1 on the machine: no call.
Tokens, estimated: a call sends the judge prompt's system turn and its user turn filled with a question, an
answer and a reference (`JudgePrompt.user`). Its characters: the prompt's own (its file, or, before rule
authors_prompts writes the DepthQA authors' file, that file's measured length) plus each text's mean length on
the DepthQA authors' released answers (benchmarks/judge_lengths.tsv, written by judge_lengths.py), turned into
tokens at the characters per token measured there on the filled messages under SmolLM2's tokenizer
(requirements.lock ships no GPT-4 tokenizer), plus CHAT_TOKENS. The answers a run generates come from other
models than the released ones, so their length is an estimate too. A verdict: the mean tokens of the authors'
5 released GPT-4 verdicts under that tokenizer, at most depth.judge.max_new_tokens, which bounds it.
Dollars: the tokens at depth.judge_price (USD per million input and output tokens, and the price's date); a
config without a price gets tokens only.
The hf judge holds a GPU: per verdict, max_new_tokens decode steps at depth.judge.batch_size after its
prompt, on the judge model's dimensions (`diskplan.model_dims`), as `pricing.price` prices the answers
(`decoding_cost.answers_seconds`, which reads the prompt's KV cache at every step): every verdict runs to the
cap, an upper bound that covers the prefill it leaves out (a released verdict is a fraction of the cap:
judge_lengths.tsv); each judge job's load of its weights (`weights_cost`); and, for a hub model the config
does not prepare, its weights on disk (`diskplan.weights_bytes`, in the hub's cache)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import diskplan, registry, sizing, weights_cost
from .cost_lines import Cost, Figure
from .depth import authors
from .depth.prompts import load_judge_prompt
from .errors import TruthflowError
from .memplan import Dims

LENGTHS = Path(__file__).resolve().parents[2] / "benchmarks" / "judge_lengths.tsv"
LENGTH_COLUMNS = ["text", "file", "sha256", "n", "mean_chars", "mean_tokens", "chars_per_token"]
LENGTH_COLUMNS += ["tokenizer", "date", "source"]
# a chat request's tokens beside its texts, as OpenAI counts them: 3 and the role's token per message (system,
# user) and 3 that prime the reply
CHAT_TOKENS = 11


@dataclass(frozen=True)
class Lengths:
    """Mean characters of the judged texts, characters per token of a judge message, a verdict's tokens, the
    prompts measured."""

    question: float
    reference: float
    answer: float
    verdict_tokens: float
    chars_per_token: float
    templates: dict[str, tuple[float, str]]  # a prompt file -> (its own characters, its source's sha256)
    where: str

    @classmethod
    def load(cls, path: Path = LENGTHS) -> Lengths | None:
        """The committed measurement: each text's row over the most answers; None where the file is absent."""
        rows = sizing.read_rows(path, LENGTH_COLUMNS)
        if not rows:
            return None

        def widest(text: str) -> dict:
            found = [r for r in rows if r["text"] == text]
            if not found:
                raise TruthflowError(f"{path}: no '{text}' row (benchmarks/judge_lengths.py writes it)")
            return max(found, key=lambda r: int(r["n"]))

        got = {t: widest(t) for t in ("question", "reference", "answer", "verdict", "message")}
        templates = {
            r["file"]: (float(r["mean_chars"]), r["sha256"]) for r in rows if r["text"] == "template"
        }
        message = got["message"]
        where = (
            f"{int(got['answer']['n']):,} released answers ({got['answer']['file']}), "
            f"{int(got['verdict']['n'])} released verdicts, {message['tokenizer']} tokenizer: "
            f"{float(message['chars_per_token']):.2f} chars/token; {path.name}, {message['date']}"
        )
        return cls(
            *(float(got[t]["mean_chars"]) for t in ("question", "reference", "answer")),
            float(got["verdict"]["mean_tokens"]),
            float(message["chars_per_token"]),
            templates,
            where,
        )


def judged_models(config: dict) -> list[str]:
    """The models rule judge_answers runs for: generated answers (depth.models) and released ones."""
    depth = config["depth"]
    return list(dict.fromkeys([*depth["models"], *depth["released_answers"]]))


def prompt_chars(settings: dict, lengths: Lengths) -> tuple[float, str] | None:
    """Characters of the judge prompt's own text (its system turn and its user turn with empty texts) and
    where from; None where neither its file nor a measurement of it is here."""
    value = settings["prompt"]
    if authors.pending(value):
        chars, sha = lengths.templates.get(str(Path(value)), (0.0, ""))
        if sha != authors.PROMPTS_SHA256:
            return None
        return (
            chars,
            f"the DepthQA authors' judge prompt (their pinned prompts.py, measured in {LENGTHS.name})",
        )
    try:
        prompt = load_judge_prompt(value)
    except TruthflowError:
        return None
    return len(prompt.system) + len(prompt.user("", "", "")), f"the judge prompt {value}"


@dataclass(frozen=True)
class JudgeBill:
    backend: str
    model: str
    judged: list[str]
    questions: int
    judgments: int
    input_per_call: float | None  # tokens; None: the prompt's length is unknown
    output_per_call: float | None
    max_new_tokens: int
    price: tuple[float, float, str] | None  # USD per million input and output tokens, and its date
    basis: str
    unknown: str = ""  # what could not be priced, and why

    @property
    def calls(self) -> int:
        return 0 if self.backend == "reference" else self.questions * len(self.judged) * self.judgments

    @property
    def input_tokens(self) -> float | None:
        return None if self.input_per_call is None else self.input_per_call * self.calls

    @property
    def output_tokens(self) -> float | None:
        return None if self.output_per_call is None else self.output_per_call * self.calls

    def dollars(self, output_tokens: float | None = None) -> float | None:
        """USD of the calls at the configured price; the verdicts at their estimated length, or at
        `output_tokens` in all."""
        if self.price is None or self.input_tokens is None:
            return None
        out = self.output_tokens if output_tokens is None else output_tokens
        return (self.input_tokens * self.price[0] + out * self.price[1]) / 1e6


def judge_model(config: dict) -> tuple[str, dict, bool]:
    """(name, model entry, prepared by the run) of an hf judge: a configured model's dir (resources/models/
    <name>, as rule judge_answers takes it), else a directory, else a hub id; loaded in depth.judge.dtype."""
    settings = config["depth"]["judge"]
    value = str(settings["model"])
    path = Path(value)
    if path.parent == Path("resources/models") and path.name in config["models"]:
        return path.name, {**config["models"][path.name], "dtype": settings["dtype"]}, True
    source = {"local": value} if path.is_dir() else {"hub": value}
    return value, {"source": source, "dtype": settings["dtype"]}, False


@dataclass(frozen=True)
class HFWork:
    """What an hf judge decodes: per judged model, `verdicts` of up to `new` tokens at `batch` rows after a
    `prompt`-token prompt, on the judge model's dims."""

    name: str
    spec: dict
    prepared: bool  # by rule prepare_model (a configured model), else read by the judge from its hub cache
    billed: bool  # its weights are a line of the bill already (a model of the run's analyses)
    dims: Dims
    batch: int
    prompt: float
    new: int
    judged: list[str]
    verdicts: int

    @property
    def dtype(self) -> str:
        """depth.judge.dtype, in the model entry `judge_model` gives."""
        return self.spec["dtype"]


def hf_work(config: dict) -> HFWork | None:
    """An hf judge's work, None for another backend, or where its dims or its prompt's length are unknown
    (the bill's judge line says which)."""
    bill = judge_bill(config)
    if bill is None or bill.backend != "hf" or bill.input_per_call is None:
        return None
    settings = config["depth"]["judge"]
    name, spec, prepared = judge_model(config)
    billed = prepared and name in {*config["pathways"]["models"], *config["depth"]["models"]}
    dims = diskplan.model_dims(name, spec)
    if dims is None:
        return None
    return HFWork(
        name,
        spec,
        prepared,
        billed,
        dims,
        batch=int(settings["batch_size"]),
        prompt=bill.input_per_call,
        new=int(settings["max_new_tokens"]),
        judged=bill.judged,
        verdicts=bill.questions * bill.judgments,
    )


def judge_bill(config: dict, lengths: Lengths | None = None) -> JudgeBill | None:
    """The judge's calls, tokens and dollars of a prepared config; None where no model is judged."""
    settings = config["depth"]["judge"]
    judged = judged_models(config)
    if not judged:
        return None
    backend = settings["backend"]
    price = config["depth"]["judge_price"]
    usd = (price["input_usd_per_mtok"], price["output_usd_per_mtok"], price["date"]) if price else None
    head = dict(
        backend=backend,
        model=str(settings["model"]) if backend != "reference" else "token-F1",
        judged=judged,
        questions=diskplan.dataset_rows(config, registry.DEPTHQA),
        judgments=int(settings["judgments"]),
        max_new_tokens=int(settings["max_new_tokens"]),
        price=usd,
    )
    if backend == "reference":
        return JudgeBill(**head, input_per_call=0.0, output_per_call=0.0, basis="token-F1 on the machine")
    lengths = lengths or Lengths.load()
    own = prompt_chars(settings, lengths) if lengths else None
    if own is None:
        why = (
            "no measured lengths"
            if lengths is None
            else f"the judge prompt '{settings['prompt']}' is not here"
        )
        return JudgeBill(
            **head, input_per_call=None, output_per_call=None, basis="", unknown=f"tokens: {why}"
        )
    chars, where = own
    texts = lengths.question + lengths.answer + lengths.reference
    text = (
        f"{chars:,.0f} chars of {where} + {texts:,.0f} of question, answer and reference, "
        f"{lengths.verdict_tokens:,.0f} tokens a verdict, measured on {lengths.where}"
    )
    return JudgeBill(
        **head,
        input_per_call=(chars + texts) / lengths.chars_per_token + CHAT_TOKENS,
        output_per_call=min(lengths.verdict_tokens, head["max_new_tokens"]),
        basis=text,
    )


def hf_costs(work: HFWork, seconds: float, measured: dict | None = None) -> list[Cost]:
    """An hf judge's lines, given a verdict's GPU-seconds: per judged model its judge job's GPU-seconds and
    its load of the judge's weights (the job's key: rule judge_answers), and the judge's weights where no
    other line holds them (prepared and hashed by prepare_model, or in the hub's cache)."""
    size = diskplan.weights_bytes(work.name, work.spec)
    rates = weights_cost.rates() if measured is None else measured
    load = weights_cost.load_seconds(size, 1, rates)
    text = (
        f"{work.new} decode steps a verdict at batch {work.batch} after a {work.prompt:,.0f}-token prompt on "
        f"{work.name}'s dims (the answers' decode model; every verdict at the cap)"
    )
    gpu = Figure(seconds * work.verdicts, False, text)
    out = []
    for model in work.judged:
        out.append(Cost(model, registry.DEPTHQA, "judge (hf)", "judge_answers", gpu_seconds=gpu))
        if load:
            out.append(Cost(model, registry.DEPTHQA, "load judge", "judge_answers", gpu_seconds=load))
    if size and not work.billed and "hub" in work.spec["source"]:
        rule = "prepare_model" if work.prepared else "judge_answers"
        out.append(weights_cost.weights_line(work.name, work.spec, size, rates, "judge weights", rule))
    return out


def line(bill: JudgeBill, card: str, costs: list[Cost]) -> str:
    """The bill's judge line; an hf judge's GPU-hours are its lines among `costs`."""
    if bill.backend == "reference":
        return f"  judge: reference (token-F1 on the machine): no calls, {len(bill.judged)} judged models"
    calls = "calls" if bill.backend == "openai" else "verdicts"
    head = (
        f"  judge {bill.backend} {bill.model}: {bill.calls:,} {calls} ({bill.questions:,} questions x "
        f"{len(bill.judged)} judged models x {bill.judgments} judgment{'s' if bill.judgments > 1 else ''})"
    )
    if bill.input_tokens is None:
        return f"{head}; not priced: {bill.unknown}"
    cap = bill.calls * bill.max_new_tokens
    text = (
        f"{head}; estimated {bill.input_tokens / 1e6:,.2f} M input tokens, {bill.output_tokens / 1e6:,.2f} M "
        f"output tokens (at most {cap / 1e6:,.2f} M at max_new_tokens {bill.max_new_tokens})"
    )
    if bill.price is None:
        text += "; no price in the config (depth.judge_price): tokens only"
    else:
        usd_in, usd_out, date = bill.price
        text += (
            f"; ${bill.dollars():,.2f} (at most ${bill.dollars(cap):,.2f}) at ${usd_in:g} / ${usd_out:g} "
            f"per M input / output tokens, the price of {date}"
        )
    if bill.backend == "hf":
        gpu = [c.gpu_seconds.value for c in costs if c.rule == "judge_answers" and c.gpu_seconds]
        text += (
            f"; {sum(gpu) / 3600:,.1f} GPU-hours on {card} (estimated, loads included)"
            if gpu
            else f"; GPU time not priced: the dimensions of '{bill.model}' are unknown until it is prepared"
        )
    return f"{text}\n   basis: {bill.basis}"
