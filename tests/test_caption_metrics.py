"""The captioning scorers against values computed by hand on small examples (coco-caption's definitions: BLEU's
clipped counts, closest reference length and brevity penalty; ROUGE-L's LCS F with beta 1.2; CIDEr-D's tf-idf over
the reference sets, clipping and Gaussian length penalty), and the PTB tokenization against the rules it implements."""
from __future__ import annotations

import math

import pytest

from interlayer.tasks.caption_metrics import (
    CiderD,
    bleu,
    caption_scores,
    java_scores,
    lcs,
    ptb_tokenize,
    ptb_tokens,
    rouge_l,
    rouge_l_one,
)

CAT = "the cat sat on the mat"
CAT_REFS = ["the cat is on the mat", "there is a cat on the mat"]


def test_bleu_counts_clipped_ngrams_per_order() -> None:
    # unigrams: the x2 (clipped to 2), cat, on, mat = 5 of 6; bigrams: the cat, on the, the mat = 3 of 5;
    # trigrams: on the mat = 1 of 4; 4-grams: 0 of 3; reference length 6 (closest) = hypothesis length: no penalty
    scores = bleu({0: CAT}, {0: CAT_REFS})
    assert scores[0] == pytest.approx(5 / 6)
    assert scores[1] == pytest.approx(math.sqrt(5 / 6 * 3 / 5))
    assert scores[2] == pytest.approx((5 / 6 * 3 / 5 * 1 / 4) ** (1 / 3))
    assert scores[3] == pytest.approx((5 / 6 * 3 / 5 * 1 / 4 * 1e-15 / 3) ** (1 / 4), rel=1e-6)


def test_bleu_clips_a_repeated_word_to_its_reference_count() -> None:
    # one "the" in the reference: 1 of 4 matches; c = 4 >= r = 2, no penalty
    assert bleu({0: "the the the the"}, {0: ["the cat"]})[0] == pytest.approx(1 / 4)


def test_bleu_brevity_penalty_uses_the_closest_reference_length() -> None:
    # c = 2 against the closest reference (4 words): exp(1 - 4/2)
    scores = bleu({0: "the cat"}, {0: ["the cat sat down", "the cat is on the mat"]})
    assert scores[0] == pytest.approx(math.exp(-1))
    assert scores[1] == pytest.approx(math.exp(-1))


def test_bleu_breaks_a_length_tie_towards_the_shorter_reference() -> None:
    # 5 words between references of 4 and 6: the shorter (4) is taken, so no penalty (with 6 it would be exp(-0.2))
    assert bleu({0: "a b c d e"}, {0: ["a b c d", "a b c d x y"]})[0] == pytest.approx(4 / 5)


def test_bleu_is_corpus_level_not_a_mean_of_sentences() -> None:
    scores = bleu({0: CAT, 1: "the cat"}, {0: CAT_REFS, 1: ["the cat sat down", "the cat is on the mat"]})
    # corpus counts: 7 of 8 unigrams; lengths c = 8, r = 6 + 4
    assert scores[0] == pytest.approx(7 / 8 * math.exp(1 - 10 / 8))


def test_rouge_l_takes_the_best_precision_and_recall_over_references() -> None:
    assert lcs("the cat is on the mat".split(), CAT.split()) == 5
    assert rouge_l_one(CAT, CAT_REFS) == pytest.approx(5 / 6)
    p, r, b2 = 1 / 2, 1 / 6, 1.2 ** 2  # "a cat" against one reference: LCS 1
    assert rouge_l_one("a cat", [CAT]) == pytest.approx((1 + b2) * p * r / (r + b2 * p))
    assert rouge_l({0: "a cat", 1: "x"}, {0: [CAT], 1: ["y"]}) == pytest.approx((1 + b2) * p * r / (r + b2 * p) / 2)


LOG2 = math.log(2.0)
# two images; df: a 1, b 2, c 2, "a b" 1, "a c" 1, "b c" 1; idf = log(2) - log(df): log 2 for df 1, 0 for df 2
CIDER_REFS = {"A": ["a b", "a c"], "B": ["b c"]}


def test_cider_d_tf_idf_and_cosine_by_hand() -> None:
    scorer = CiderD(CIDER_REFS)
    assert scorer.log_sets == pytest.approx(LOG2)
    assert scorer.document_frequency[("b",)] == 2 and scorer.document_frequency[("a", "b")] == 1
    # "a b" against "a b": unigram cosine 1 (b weighs 0), bigram 1, no trigrams -> mean 2/4;
    # against "a c": unigram 1, bigram 0 -> 1/4; (0.5 + 0.25) / 2 references x 10
    assert scorer.score_one("A", "a b") == pytest.approx(3.75)
    # "b c" against "b c": the unigrams weigh 0 (df 2 of 2), the bigram 1 -> 1/4 x 10
    assert scorer.score_one("B", "b c") == pytest.approx(2.5)
    corpus, per_image = scorer.score({"A": "a b", "B": "b c"})
    assert corpus == pytest.approx((3.75 + 2.5) / 2)
    assert per_image == {"A": pytest.approx(3.75), "B": pytest.approx(2.5)}


def test_cider_d_clips_and_applies_the_length_penalty() -> None:
    # "b c b c" against "b c": the bigram "b c" has tf 2 (2 log 2), clipped to the reference's log 2; "c b" is
    # absent; hypothesis bigram norm sqrt((2 log2)^2 + log2^2); 3 bigrams against 1: penalty exp(-4 / 72)
    cosine = LOG2 * LOG2 / (math.sqrt(5) * LOG2 * LOG2)
    expected = 10 * cosine * math.exp(-(3 - 1) ** 2 / (2 * 6.0 ** 2)) / 4
    assert CiderD(CIDER_REFS).score_one("B", "b c b c") == pytest.approx(expected)
    unclipped = 10 * 2 * cosine * math.exp(-4 / 72) / 4
    assert CiderD(CIDER_REFS).score_one("B", "b c b c") != pytest.approx(unclipped)


def test_scorers_refuse_hypotheses_without_references() -> None:
    with pytest.raises(ValueError, match="no references"):
        bleu({0: "a"}, {1: ["a"]})
    with pytest.raises(ValueError, match="no references"):
        CiderD({1: ["a"]}).score({0: "a"})


@pytest.mark.parametrize("text, tokens", [
    ("A man riding a wave on top of a surfboard.", "a man riding a wave on top of a surfboard"),
    ("Don't stop: it's the dogs' ball, can't you see?", "do n't stop it 's the dogs ball ca n't you see"),
    ("A 1,000-piece puzzle (unfinished)... costs $3.50 -- wow!", "a 1,000-piece puzzle unfinished costs $ 3.50 wow"),
    ('He said "hello" to Mr. Smith in the U.S.', "he said hello to mr. smith in the u.s."),
    ("I cannot; I'm gonna WIN", "i can not i 'm gon na win"),
    ("They're here, we've won, he'll go, she'd stay.", "they 're here we 've won he 'll go she 'd stay"),
])
def test_ptb_tokenize_follows_the_rules(text: str, tokens: str) -> None:
    assert ptb_tokenize(text) == tokens


def test_ptb_tokens_keep_the_punctuation_coco_caption_then_drops() -> None:
    assert ptb_tokens('A "big" (red) dog...') == ["a", "``", "big", "''", "-lrb-", "red", "-rrb-", "dog", "..."]


def test_caption_scores_tokenize_both_sides_and_report_times_100() -> None:
    scores = caption_scores({0: "The cat sat on the mat."},
                            {0: ["The cat is on the mat!", "There is a cat on the mat"]}, java=False)
    assert scores["bleu_1"] == pytest.approx(100 * 5 / 6)
    assert scores["cider"] == pytest.approx(100 * CiderD({0: ["the cat is on the mat", "there is a cat on the mat"]})
                                            .score_one(0, CAT))
    assert "meteor" not in scores and "meteor_skipped" not in scores


def test_meteor_and_spice_are_skipped_with_a_reason_without_java_or_the_package(monkeypatch) -> None:
    import interlayer.tasks.caption_metrics as metrics

    monkeypatch.setattr(metrics.importlib.util, "find_spec", lambda name: None)
    out = java_scores({0: "a"}, {0: ["a"]})
    assert "pycocoevalcap is not installed" in out["meteor_skipped"] and out["spice_skipped"] == out["meteor_skipped"]


@pytest.mark.parametrize("text", ["Don't stop: it's the dogs' ball, can't you see?", "They're here, we've won.",
                                  'A 1,000-piece puzzle (unfinished)... costs $3.50 -- wow!'])
def test_ptb_tokenize_of_its_own_output_is_the_same(text: str) -> None:
    once = ptb_tokenize(text)
    assert ptb_tokenize(once) == once
