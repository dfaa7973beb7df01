"""Shape coverage (paper §6.2): the dominance rule and the minimum cover, against brute force."""

from __future__ import annotations

import itertools
import random

import pytest

from scout_core.moe.coverage import Cover, Profile, covers, minimum_cover, verify_cover

PATHS2 = ("interior", "tail")


def prof(fp: str | None, *counts: int) -> Profile:
    if fp is None or not counts:
        return Profile(fp, note="uncertain")
    return Profile(fp, tuple(f"p{i}" for i in range(len(counts))), tuple(counts))


def brute_force_min(profiles: list[Profile]) -> int:
    """Size of the smallest subset S with: every shape is in S or covered by a member of S."""
    n = len(profiles)
    for size in range(1, n + 1):
        for subset in itertools.combinations(range(n), size):
            if all(
                i in subset or any(covers(profiles[j], profiles[i]) for j in subset)
                for i in range(n)
            ):
                return size
    raise AssertionError("unreachable: the full set is a cover")


def test_paper_example_10_1_covers_6_1() -> None:
    a = Profile("F", PATHS2, (10, 1))
    b = Profile("F", PATHS2, (6, 1))
    assert covers(a, b)
    assert not covers(b, a)
    assert covers(a, a)  # the rule is reflexive on certain profiles
    cover = minimum_cover([b, a])
    assert cover == Cover(representatives=(1,), covered_by=(1, 1))


def test_other_fingerprint_or_a_smaller_component_does_not_cover() -> None:
    assert not covers(Profile("F", PATHS2, (10, 1)), Profile("G", PATHS2, (6, 1)))
    assert not covers(Profile("F", PATHS2, (10, 0)), Profile("F", PATHS2, (6, 1)))
    assert minimum_cover([prof("F", 10, 0), prof("F", 6, 1)]).representatives == (0, 1)


def test_same_fingerprint_with_different_paths_is_a_profiler_bug() -> None:
    with pytest.raises(ValueError, match="different paths"):
        covers(Profile("F", ("a", "b"), (1, 1)), Profile("F", ("a", "c"), (1, 1)))
    with pytest.raises(ValueError, match="different paths"):
        minimum_cover([Profile("F", ("a",), (1,)), Profile("F", ("b",), (1,))])


def test_uncertain_fingerprint_keeps_its_shape() -> None:
    big = prof("F", 100, 100)
    small = prof("F", 1, 1)
    unknown_fp = Profile(None, note="kernel changed across repeats")
    unknown_counts = Profile("F", note="grid does not match the tile")
    profiles = [big, small, unknown_fp, unknown_counts]
    cover = minimum_cover(profiles)
    assert cover.representatives == (0, 2, 3)
    assert cover.covered_by == (0, 0, 2, 3)
    assert not covers(big, unknown_counts) and not covers(unknown_fp, unknown_fp)
    assert verify_cover(profiles, cover) == []
    # Claiming the uncertain shape is covered is caught when a cover is checked.
    bad = Cover(representatives=(0,), covered_by=(0, 0, 0, 0))
    assert any("uncertain" in p for p in verify_cover(profiles, bad))


def test_ties_keep_the_preferred_shape() -> None:
    profiles = [prof("F", 0, 2), prof("F", 0, 2), prof("F", 0, 2)]
    assert minimum_cover(profiles).representatives == (0,)
    assert minimum_cover(profiles, prefer=[1, 15, 7]).representatives == (1,)


def test_verify_cover_finds_an_uncovered_shape() -> None:
    profiles = [prof("F", 3, 0), prof("F", 1, 1)]
    assert verify_cover(profiles, Cover((0,), (0, 0)))[0].startswith("shape 1 is not covered")
    assert verify_cover(profiles, Cover((0, 1), (0, 1))) == []


def test_cover_is_minimal_on_every_small_single_class_case() -> None:
    """All 4-shape multisets of vectors in {0,1,2}^2 under one fingerprint (exhaustive)."""
    vectors = list(itertools.product(range(3), repeat=2))
    checked = 0
    for combo in itertools.combinations_with_replacement(vectors, 4):
        profiles = [prof("F", *v) for v in combo]
        cover = minimum_cover(profiles)
        assert verify_cover(profiles, cover) == [], combo
        assert len(cover.representatives) == brute_force_min(profiles), combo
        checked += 1
    assert checked == 495


def test_cover_is_minimal_on_random_mixed_cases() -> None:
    """Several fingerprints, three paths, uncertain shapes: minimum cover == brute force."""
    rng = random.Random(20260813)
    for _ in range(400):
        n = rng.randint(1, 8)
        profiles = []
        for _ in range(n):
            roll = rng.random()
            if roll < 0.1:
                profiles.append(Profile(None, note="?"))
            elif roll < 0.15:
                profiles.append(Profile(rng.choice("AB"), note="counts unknown"))
            else:
                profiles.append(prof(rng.choice("AB"), *(rng.randint(0, 2) for _ in range(3))))
        cover = minimum_cover(profiles, prefer=[rng.random() for _ in range(n)])
        assert verify_cover(profiles, cover) == [], profiles
        assert len(cover.representatives) == brute_force_min(profiles), profiles
        # Maximal elements are exactly the representatives (one per maximal vector).
        for r in cover.representatives:
            p = profiles[r]
            if p.certain:
                assert not any(covers(q, p) and not covers(p, q) for q in profiles), (
                    "a representative is strictly dominated"
                )


def test_profile_validates_counts() -> None:
    with pytest.raises(ValueError, match="2 path counts for 1 paths"):
        Profile("F", ("a",), (1, 2))
    with pytest.raises(ValueError, match="non-negative"):
        Profile("F", ("a",), (-1,))
    assert not Profile("F").certain and Profile("F", (), ()).certain
