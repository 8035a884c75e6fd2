"""Text normalization shared by the stages: stop words, and the normalized words answers are matched on."""

import re
import string

STOPWORDS = set(
    """a an the of in on at to for from by with about as into like through after over between out against
during without before under around among is are was were be been being am do does did has have had what which
who whom whose when where why how that this these those it its it's he she they them his her their there here
and or but if then than so not no nor too very can will just should would could may might must shall name
named called one first last many much most more some any each other another same such own only also doing done
i you we us our your my me""".split()
)

ARTICLES = {"a", "an", "the"}
# lowercase words inside a name ("Leonardo da Vinci", "Statue of Liberty"): they join the words of an E_A run
# (pathways.spans) and of a choice option (pathways.labels). Not "al": "Al" is a given name ("Al Pacino")
NAME_CONNECTORS = set("of the de da di del der van von du la le y for on en bin".split())
PUNCT = set(string.punctuation) | {"“", "”", "‘", "’", "–", "—", "…", "«", "»"}

Word = tuple[str, int, int]


def normalized_words(text: str) -> list[Word]:
    """Words of the normalized text (METHOD A2: "U.S." -> "us"), each with its [start, end) span in `text`."""
    words: list[Word] = []
    for m in re.finditer(r"\S+", text):
        kept = [i for i, ch in enumerate(m.group(0)) if ch not in PUNCT]
        word = "".join(m.group(0)[i].lower() for i in kept)  # per character, as "Σ" has no final form here
        if kept and word not in ARTICLES:
            words.append((word, m.start() + kept[0], m.start() + kept[-1] + 1))
    return words


def normalize_text(text: str) -> str:
    return " ".join(w for w, _, _ in normalized_words(text))
