"""VQA metrics against hand-computed values: the official VQA accuracy, the t-test behind PAvPU, PAvPU itself."""
import math

import numpy as np
import pytest

from interlayer.tasks.vqa_metrics import (
    PAvPU,
    by_type,
    certainty,
    soft_scores,
    student_t_two_sided,
    t_test_p_values,
    vqa_accuracy,
)


@pytest.mark.parametrize("agreeing,expected", [(0, 0.0), (1, 0.3), (2, 0.6), (3, 0.9), (4, 1.0), (10, 1.0)])
def test_vqa_accuracy_leave_one_out(agreeing, expected):
    """min(#humans / 3, 1) averaged over the 10 subsets of 9: with 3 agreeing, 3 subsets hold 2 (2/3) and 7 hold 3
    (1): (3 * 2/3 + 7) / 10 = 0.9, the official value (not min(3/3, 1) = 1)."""
    answers = ["yes"] * agreeing + ["no"] * (10 - agreeing)
    assert vqa_accuracy("yes", answers) == pytest.approx(expected)


def test_vqa_accuracy_normalises_as_the_official_evaluation():
    # the humans disagree: their answers lose punctuation, the prediction is fully normalised
    assert vqa_accuracy("Two", ["2", "2", "2", "2"] + ["dog"] * 6) == pytest.approx(1.0)
    assert vqa_accuracy("a dog.", ["dog"] * 3 + ["cat"] * 7) == pytest.approx(0.9)
    assert vqa_accuracy("dont know", ["don't know"] * 2 + ["no"] * 8) == pytest.approx(0.6)
    # the humans agree: nothing is normalised (the official code's shortcut), so "two" does not match "2"
    assert vqa_accuracy("two", ["2"] * 10) == 0.0
    assert vqa_accuracy(" 2\n", ["2"] * 10) == 1.0


def test_soft_scores_are_the_accuracy_of_each_answer():
    vocab = {"2": 0, "dog": 1, "cat": 2}
    answers = ["Two", "2", "two", "dog"] + ["mouse"] * 6
    assert soft_scores(answers, vocab) == {0: pytest.approx(0.9), 1: pytest.approx(0.3)}
    assert soft_scores(["cat"], vocab) == {2: 1.0}
    assert soft_scores(["horse"], vocab) == {}


def test_by_type():
    assert by_type([1.0, 0.0, 1.0, 0.5], ["a", "a", "b", ""]) == {"a": 50.0, "b": 100.0}


# -- the t-test -------------------------------------------------------------------------------------------------
def test_student_t_p_values_against_closed_forms():
    t = np.array([0.0, 0.3, 1.0, 2.5, 12.0])
    # 1 degree of freedom (Cauchy): 1 - 2 atan|t| / pi; 2: 1 - |t| / sqrt(2 + t^2)
    np.testing.assert_allclose(student_t_two_sided(t, 1), 1 - 2 * np.arctan(t) / math.pi, rtol=1e-10)
    np.testing.assert_allclose(student_t_two_sided(t, 2), 1 - t / np.sqrt(2 + t * t), rtol=1e-10, atol=1e-15)
    # the 97.5% quantile of t(38) is 2.024394 (tables): p = 0.05 at 2 x 20 samples
    assert student_t_two_sided(np.array([2.024394]), 38)[0] == pytest.approx(0.05, abs=1e-6)
    assert student_t_two_sided(np.array([np.inf]), 38)[0] == 0.0


def test_two_sample_t_test_by_hand():
    """[1,2,3] vs [4,5,6]: pooled variance 1, t = -3 / sqrt(2/3) = -3.674, 4 degrees of freedom, whose two-sided
    p-value in closed form is 1 - (3/2) s (1 - s^2 / 3) with s = |t| / sqrt(4 + t^2)."""
    t = 3 / math.sqrt(2 / 3)
    s = t / math.sqrt(4 + t * t)
    expected = 1 - 1.5 * s * (1 - s * s / 3)
    p = t_test_p_values(np.array([[1.0], [2.0], [3.0]]), np.array([[4.0], [5.0], [6.0]]))
    assert p[0] == pytest.approx(expected, rel=1e-9) and p[0] == pytest.approx(0.02131, abs=1e-5)
    # zero variance: unequal means are certain, equal means are not
    same = np.full((20, 2), 0.4)
    np.testing.assert_array_equal(t_test_p_values(same, np.array([[0.1, 0.4]] * 20)), [0.0, 1.0])


def test_certainty_picks_the_top_two_answers():
    rng = np.random.RandomState(0)
    samples = np.zeros((20, 3, 4))
    samples[:, 0] = [0.9, 0.1, 0.0, 0.0]  # settled
    samples[:, 1, 1] = 0.5 + 0.3 * rng.randn(20)  # answers 1 and 3 overlap: uncertain
    samples[:, 1, 3] = 0.48 + 0.3 * rng.randn(20)
    samples[:, 2, 2] = 0.6 + 0.01 * rng.randn(20)  # answer 2 clearly over answer 0
    samples[:, 2, 0] = 0.3 + 0.01 * rng.randn(20)
    predicted, certain = certainty(samples)
    assert predicted.tolist()[0] == 0 and predicted.tolist()[2] == 2
    assert certain.tolist() == [True, False, True]


def test_pavpu_counts():
    score = PAvPU()
    score.add(np.array([True, True, False, False, True]), np.array([True, False, True, False, True]))
    score.add(np.array([False]), np.array([False]))
    assert (score.accurate_certain, score.accurate_uncertain, score.inaccurate_certain,
            score.inaccurate_uncertain) == (2, 1, 1, 2)
    assert score.value == pytest.approx(100 * (2 + 2) / 6)  # (n_ac + n_iu) / N
