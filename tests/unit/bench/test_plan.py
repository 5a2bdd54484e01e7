"""``sparkfold bench``'s sizing by a first measured request (``sparkfold.bench.plan``)."""

from __future__ import annotations

from sparkfold.bench.plan import Plan, plan
from sparkfold.bench.suites import prefill_lengths


def test_a_fast_endpoint_keeps_the_recipes_sizes() -> None:
    chosen = plan(100.0, 480, Plan(), frozenset(), exact_requests=4)
    assert (chosen.levels, chosen.rounds, chosen.warmup, chosen.max_tokens, chosen.exact_tokens) == (
        (1, 4, 8),
        2,
        1,
        256,
        64,
    )
    assert chosen.decode_s == chosen.decode_tokens() / 100.0 <= 240


def test_a_slow_endpoint_gives_up_defaults_in_order_until_decode_fits_half_the_budget() -> None:
    chosen = plan(1.6, 480, Plan(), frozenset(), exact_requests=4)  # the demo model on a loaded 2-core box
    assert (chosen.levels, chosen.rounds, chosen.warmup, chosen.max_tokens) == ((1, 4), 1, 0, 32)
    assert chosen.decode_s <= 240 and chosen.exact_tokens == 16
    medium = plan(20.0, 480, Plan(), frozenset(), exact_requests=4)
    assert (medium.levels, medium.warmup, medium.max_tokens) == ((1, 4, 8), 0, 64)


def test_knobs_the_user_set_are_kept_even_when_they_do_not_fit() -> None:
    chosen = plan(1.6, 480, Plan(), frozenset({"max_tokens", "levels"}), exact_requests=4)
    assert chosen.max_tokens == 256 and chosen.levels == (1, 4, 8)
    assert chosen.rounds == 1 and chosen.warmup == 0


def test_no_measured_rate_leaves_the_defaults() -> None:
    assert plan(0.0, 480, Plan(), frozenset(), exact_requests=4) == Plan()


def test_long_prompts_keep_every_length_and_shrink_only_the_first_two_to_fit() -> None:
    from sparkfold.bench.plan import long_prompts

    roomy = long_prompts(10_000.0, 480, [8192, 16384, 32768], 65_536, 7_900)
    assert roomy.prefill_lengths == (8192, 16384, 32768) and (roomy.reuse_tokens, roomy.system_tokens) == (
        65_536,
        7_900,
    )
    slow = long_prompts(75.0, 480, [1984, 3968, 7936], 65_536, 7_900)  # 96 s of prefill: 7,200 tokens
    assert slow.prefill_lengths == (1984, 3968, 7936)  # the suite skips 7,936 once it has measured
    assert (slow.reuse_tokens, slow.system_tokens) == (2000, 1000)
    window = prefill_lengths(1_048_576, None)  # a lent H100's probe: ~4k tok/s, 60-80k on long prompts
    assert long_prompts(4_000.0, 480, window, 65_536, 7_900).prefill_lengths == tuple(window)
    crawl = long_prompts(5.0, 480, [1984, 3968, 7936], 65_536, 7_900)
    assert len(crawl.prefill_lengths) == 2 and sum(crawl.prefill_lengths) <= 480
