"""Captioning metrics as the COCO caption evaluation (``coco-caption``/``pycocoevalcap``, Chen et al. 2015) computes
them: the PTB tokenization, BLEU-1..4, ROUGE-L and CIDEr-D in Python; METEOR and SPICE through ``pycocoevalcap``'s
Java jars where Java and the package are present, else reported as skipped with the reason.

* **Tokenization** (:func:`ptb_tokenize`): coco-caption runs Stanford's PTBTokenizer (CoreNLP 3.4.1,
  ``-preserveLines -lowerCase``) and drops the punctuation tokens ``'' ' `` ` -LRB- -RRB- -LCB- -RCB- . ? ! , : - --
  ... ;``. The rules written here are those that decide COCO-style captions: lower case; ``. , ; : ? ! ( ) [ ] { }
  "`` split from words (a period stays in a number, ``3.5``, and in an abbreviation, ``u.s.``, ``mr.``); ``...`` and
  ``--`` one token each; a comma stays inside a number (``1,000``); hyphens and slashes stay inside words
  (``t-shirt``); ``$`` and ``#`` split from what follows; the clitics ``n't 's 're 've 'll 'd 'm`` and a plural
  possessive's ``'`` split off (``don't`` -> ``do n't``, ``can't`` -> ``ca n't``, ``won't`` -> ``wo n't``);
  ``cannot gonna gotta wanna lemme gimme`` split as the tokenizer splits them (``can not``, ``gon na``, ...).
  Then the punctuation tokens are dropped; brackets and braces go too (the jar's escapes of them vary with its
  case option: see docs/captioning.md).
* **BLEU** (:func:`bleu`; Papineni et al. 2002, coco-caption's ``bleu_scorer.py``): corpus-level. Each hypothesis
  adds its length, its n-gram counts ``max(0, len - n + 1)`` and its clipped matches (each n-gram counted at most
  as often as in the reference where it occurs most) to corpus totals; its reference length is the closest
  reference length (a tie goes to the shorter). ``BLEU-n = (prod_{k<=n} (correct_k + 1e-15) / (guess_k + 1e-9))
  ^ (1/n)``, times the brevity penalty ``exp(1 - r / c)`` when the corpus hypothesis length ``c`` is below the
  reference length ``r``.
* **ROUGE-L** (:func:`rouge_l`; Lin 2004, coco-caption's ``rouge.py``): per image, the longest common subsequence
  with each reference gives a precision and a recall; the maxima over references make
  ``F = (1 + b^2) P R / (R + b^2 P)`` with ``b = 1.2``; the mean over images.
* **CIDEr-D** (:class:`CiderD`; Vedantam et al. 2015, coco-caption's ``cider_scorer.py``): n-grams 1..4 as tf-idf
  vectors, ``tf * (log(#reference sets) - log(max(1, df)))``, the document frequency ``df`` counting the reference
  sets (images) whose references hold the n-gram; per n the clipped cosine ``sum min(h, r) r / (|h| |r|)`` with each
  reference, times the Gaussian length penalty ``exp(-(l_h - l_r)^2 / (2 * 6^2))`` (the lengths are coco-caption's,
  the number of bigrams); the mean over n, summed over the references, divided by their number, times 10; the
  corpus score is the mean over images. The document frequencies come from the references being scored, as
  coco-caption computes them; SCST's rewards use the training references' (Rennie et al. 2017).

Every score is reported times 100, as the papers print them (CIDEr-D 131.0 means 1.310).
"""
from __future__ import annotations

import importlib.util
import math
import re
import shutil
from collections import Counter
from typing import Any, Mapping, Optional, Sequence

Ngram = tuple[str, ...]
ORDER = 4  # n-grams 1..4 for BLEU and CIDEr-D
SIGMA = 6.0  # CIDEr-D's length penalty (coco-caption: sigma = 6)
ROUGE_BETA = 1.2  # coco-caption's rouge.py
# The tokens coco-caption's ptbtokenizer.py drops after tokenizing
PUNCTUATION = frozenset({"''", "'", "``", "`", "-lrb-", "-rrb-", "-lcb-", "-rcb-", ".", "?", "!", ",", ":", "-", "--",
                         "...", ";"})
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "{": "-lcb-", "}": "-rcb-", "[": "-lsb-", "]": "-rsb-"}
_ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "vs.", "etc.", "inc.", "co.", "ltd.",
                            "no.", "ft.", "mt.", "ave.", "rd."})
_SPLIT_WORDS = {"cannot": "can not", "gonna": "gon na", "gotta": "got ta", "wanna": "wan na", "lemme": "lem me",
                "gimme": "gim me"}
_CLITICS = ("n't", "'s", "'re", "'ve", "'ll", "'d", "'m")
_CLITIC = re.compile(r"^(.+?)(n't|'s|'re|'ve|'ll|'d|'m)$")
_INITIALS = re.compile(r"^([a-z]\.)+$")
# one chunk: "..." or "--", a bracket or quote, sentence punctuation, or a run of anything else but spaces
_CHUNK = re.compile(r"\.\.\.|--|[()\[\]{}\"]|[,;:?!]|[^\s()\[\]{}\",;:?!]+")


def _split_word(word: str) -> list[str]:
    """One chunk without spaces, brackets or ``, ; : ? !``: a final period (not of an abbreviation), the clitics,
    closing and opening single quotes, and the words the tokenizer splits."""
    if word in _CLITICS:  # already split (a tokenized text tokenizes to itself)
        return [word]
    tail: list[str] = []
    if word.endswith(".") and word != "." and word not in _ABBREVIATIONS and not _INITIALS.match(word):
        word, tail = word[:-1], ["."]
    if word in _SPLIT_WORDS:
        return _SPLIT_WORDS[word].split() + tail
    match = _CLITIC.match(word)
    if match:
        return [*match.groups(), *tail]
    if len(word) > 1 and word.endswith("'"):  # dogs' -> dogs ', and a closing quote
        return [word[:-1], "'", *tail]
    if len(word) > 1 and word[0] in "'$#":  # an opening quote, a currency or number sign
        return [word[0], *_split_word(word[1:]), *tail]
    return ([word] if word else []) + tail


def ptb_tokens(text: str) -> list[str]:
    """The PTB tokens of ``text`` (module docstring), lower-cased, punctuation still in."""
    text = text.replace("\n", " ").lower().replace("...", " ... ").replace("--", " -- ")
    # a comma inside a number stays: hide it from the chunker
    text = re.sub(r"(?<=\d),(?=\d)", "\x00", text)
    tokens: list[str] = []
    quote_open = False
    for chunk in _CHUNK.findall(text):
        chunk = chunk.replace("\x00", ",")
        if chunk == '"':
            tokens.append("``" if not quote_open else "''")
            quote_open = not quote_open
        elif chunk in _BRACKETS:
            tokens.append(_BRACKETS[chunk])
        elif chunk in ("...", "--") or chunk in ",;:?!":
            tokens.append(chunk)
        else:
            tokens.extend(_split_word(chunk))
    return tokens


def ptb_tokenize(text: str) -> str:
    """``text`` as coco-caption scores it: PTB tokens joined by spaces, the punctuation tokens (and brackets)
    dropped."""
    return " ".join(t for t in ptb_tokens(text) if t not in PUNCTUATION and t not in ("-lsb-", "-rsb-"))


# -- n-grams --------------------------------------------------------------------------------------------------
def ngrams(words: Sequence[str], order: int = ORDER) -> Counter[Ngram]:
    """Counts of the n-grams of ``words`` for n = 1..order."""
    counts: Counter[Ngram] = Counter()
    for n in range(1, order + 1):
        for i in range(len(words) - n + 1):
            counts[tuple(words[i:i + n])] += 1
    return counts


def _check(hypotheses: Mapping[Any, str], references: Mapping[Any, Sequence[str]]) -> list[Any]:
    """The image keys, in order; every hypothesis has references and every image a non-empty reference list."""
    missing = [key for key in hypotheses if key not in references or not references[key]]
    if missing:
        raise ValueError(f"{len(missing)} hypotheses have no references (first: image {missing[0]!r})")
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    return list(hypotheses)


# -- BLEU -----------------------------------------------------------------------------------------------------
def bleu(hypotheses: Mapping[Any, str], references: Mapping[Any, Sequence[str]], order: int = ORDER
         ) -> list[float]:
    """Corpus BLEU-1..``order`` (0..1), coco-caption's ``Bleu(4)`` with its ``closest`` reference length (module
    docstring). Texts are tokenized already (space-separated)."""
    keys = _check(hypotheses, references)
    correct, guess = [0] * order, [0] * order
    test_length = reference_length = 0
    for key in keys:
        words = hypotheses[key].split()
        refs = [ref.split() for ref in references[key]]
        max_counts: dict[Ngram, int] = {}
        for ref in refs:
            for gram, count in ngrams(ref, order).items():
                max_counts[gram] = max(max_counts.get(gram, 0), count)
        test_length += len(words)
        reference_length += min((abs(len(ref) - len(words)), len(ref)) for ref in refs)[1]
        for gram, count in ngrams(words, order).items():
            correct[len(gram) - 1] += min(max_counts.get(gram, 0), count)
        for n in range(order):
            guess[n] += max(0, len(words) - n)
    scores, product = [], 1.0
    for n in range(order):
        product *= (correct[n] + 1e-15) / (guess[n] + 1e-9)
        scores.append(product ** (1.0 / (n + 1)))
    ratio = (test_length + 1e-15) / (reference_length + 1e-9)
    if ratio < 1:
        scores = [score * math.exp(1 - 1 / ratio) for score in scores]
    return scores


# -- ROUGE-L --------------------------------------------------------------------------------------------------
def lcs(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists."""
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l_one(hypothesis: str, references: Sequence[str], beta: float = ROUGE_BETA) -> float:
    """ROUGE-L F of one hypothesis (0..1); tokens split on single spaces, as coco-caption splits them."""
    words = hypothesis.split(" ")
    precision = recall = 0.0
    for reference in references:
        ref = reference.split(" ")
        common = lcs(ref, words)
        precision = max(precision, common / len(words))
        recall = max(recall, common / len(ref))
    if precision == 0 or recall == 0:
        return 0.0
    return (1 + beta ** 2) * precision * recall / (recall + beta ** 2 * precision)


def rouge_l(hypotheses: Mapping[Any, str], references: Mapping[Any, Sequence[str]]) -> float:
    """Mean ROUGE-L over the images (0..1)."""
    keys = _check(hypotheses, references)
    return sum(rouge_l_one(hypotheses[k], references[k]) for k in keys) / len(keys)


# -- CIDEr-D --------------------------------------------------------------------------------------------------
class CiderD:
    """CIDEr-D over a reference corpus (module docstring): ``CiderD(references)`` counts the document frequencies of
    the references' n-grams and keeps each reference's tf-idf vector, so that scoring many candidates against the
    same references (SCST's rewards, step after step) builds them once. Texts are tokenized already."""

    def __init__(self, references: Mapping[Any, Sequence[str]], sigma: float = SIGMA, order: int = ORDER) -> None:
        if not references:
            raise ValueError("CIDEr-D needs at least one reference set")
        self.sigma, self.order = sigma, order
        self.document_frequency: Counter[Ngram] = Counter()
        counted = {key: [ngrams(ref.split(), order) for ref in refs] for key, refs in references.items()}
        for refs in counted.values():
            self.document_frequency.update({gram for ref in refs for gram in ref})
        self.log_sets = math.log(float(len(counted)))
        self.references = {key: [self.vector(ref) for ref in refs] for key, refs in counted.items()}

    def vector(self, counts: Counter[Ngram]) -> tuple[list[dict[Ngram, float]], list[float], int]:
        """(tf-idf by n, the norms by n, coco-caption's length: the number of bigrams)."""
        vec: list[dict[Ngram, float]] = [{} for _ in range(self.order)]
        norm = [0.0] * self.order
        length = 0
        for gram, tf in counts.items():
            n = len(gram) - 1
            value = tf * (self.log_sets - math.log(max(1.0, self.document_frequency[gram])))
            vec[n][gram] = value
            norm[n] += value * value
            if n == 1:
                length += tf
        return vec, [math.sqrt(x) for x in norm], length

    def similarity(self, hyp: tuple[list[dict[Ngram, float]], list[float], int],
                   ref: tuple[list[dict[Ngram, float]], list[float], int]) -> float:
        """The mean over n of the clipped cosine times the length penalty."""
        (h_vec, h_norm, h_len), (r_vec, r_norm, r_len) = hyp, ref
        penalty = math.exp(-((h_len - r_len) ** 2) / (2 * self.sigma ** 2))
        total = 0.0
        for n in range(self.order):
            value = sum(min(v, r_vec[n].get(g, 0.0)) * r_vec[n].get(g, 0.0) for g, v in h_vec[n].items())
            if h_norm[n] != 0 and r_norm[n] != 0:
                value /= h_norm[n] * r_norm[n]
            total += value * penalty
        return total / self.order

    def score_one(self, key: Any, hypothesis: str) -> float:
        """CIDEr-D of one tokenized hypothesis against the references of image ``key`` (0..10, not times 100)."""
        refs = self.references[key]
        hyp = self.vector(ngrams(hypothesis.split(), self.order))
        return 10.0 * sum(self.similarity(hyp, ref) for ref in refs) / len(refs)

    def consensus(self, key: Any) -> int:
        """The index of the reference of image ``key`` most similar to its others (summed CIDEr-D similarity): the
        consensus caption of a nearest-neighbour captioner."""
        refs = self.references[key]
        totals = [sum(self.similarity(ref, other) for j, other in enumerate(refs) if j != i)
                  for i, ref in enumerate(refs)]
        return max(range(len(refs)), key=lambda i: totals[i])

    def score(self, hypotheses: Mapping[Any, str]) -> tuple[float, dict[Any, float]]:
        """(corpus CIDEr-D, per image), 0..10 (coco-caption's scale)."""
        missing = [key for key in hypotheses if key not in self.references]
        if missing:
            raise ValueError(f"{len(missing)} hypotheses have no references (first: image {missing[0]!r})")
        if not hypotheses:
            raise ValueError("no hypotheses to score")
        per_image = {key: self.score_one(key, text) for key, text in hypotheses.items()}
        return sum(per_image.values()) / len(per_image), per_image


# -- METEOR and SPICE -----------------------------------------------------------------------------------------
def java_scorers_missing() -> Optional[str]:
    """Why METEOR and SPICE cannot run here, or None: they are ``pycocoevalcap``'s Java jars."""
    if importlib.util.find_spec("pycocoevalcap") is None:
        return "pycocoevalcap is not installed (pip install pycocoevalcap: its METEOR 1.5 and SPICE 1.0 jars)"
    if shutil.which("java") is None:
        return "no java on PATH (METEOR 1.5 and SPICE 1.0 are Java programs)"
    return None


def java_scores(hypotheses: Mapping[Any, str], references: Mapping[Any, Sequence[str]]) -> dict[str, Any]:
    """METEOR and SPICE (times 100) from ``pycocoevalcap`` where it and Java are present; else
    ``{"meteor_skipped": reason, "spice_skipped": reason}``."""
    reason = java_scorers_missing()
    if reason is not None:
        return {"meteor_skipped": reason, "spice_skipped": reason}
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.spice.spice import Spice

    gts = {key: list(references[key]) for key in hypotheses}
    res = {key: [hypotheses[key]] for key in hypotheses}
    out: dict[str, Any] = {}
    for name, scorer in (("meteor", Meteor), ("spice", Spice)):
        try:
            out[name] = 100.0 * float(scorer().compute_score(gts, res)[0])
        except Exception as err:  # noqa: BLE001 (a Java failure is reported, not fatal to the other scores)
            out[f"{name}_skipped"] = f"{type(err).__name__}: {err}"
    return out


def caption_scores(hypotheses: Mapping[Any, str], references: Mapping[Any, Sequence[str]], *,
                   java: bool = True) -> dict[str, Any]:
    """Every metric, times 100: ``bleu_1``..``bleu_4``, ``rouge_l``, ``cider`` (CIDEr-D), and ``meteor``/``spice``
    where they can run (``java=False``: not tried, e.g. at each validation). Raw texts are PTB-tokenized first, the
    hypotheses and the references alike."""
    hyps = {key: ptb_tokenize(text) for key, text in hypotheses.items()}
    refs = {key: [ptb_tokenize(text) for text in references[key]] for key in hypotheses}
    out: dict[str, Any] = {f"bleu_{n + 1}": 100.0 * s for n, s in enumerate(bleu(hyps, refs))}
    out["rouge_l"] = 100.0 * rouge_l(hyps, refs)
    out["cider"] = 100.0 * CiderD(refs).score(hyps)[0]
    if java:
        out.update(java_scores(hyps, refs))
    return out
