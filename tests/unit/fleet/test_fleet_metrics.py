"""The fleet's /metrics: each pair's samples labelled, sums as pair="all", still valid Prometheus text."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from sparkfold.fleet.pairs import relabel

PAIR = """# HELP sparkfold_requests_total Requests answered, by route and status
# TYPE sparkfold_requests_total counter
sparkfold_requests_total{route="/v1/chat/completions",status="200"} %d
# HELP sparkfold_lanes_busy Busy lanes
# TYPE sparkfold_lanes_busy gauge
sparkfold_lanes_busy %d
# HELP sparkfold_ttft_seconds Time to first token
# TYPE sparkfold_ttft_seconds histogram
sparkfold_ttft_seconds_bucket{le="0.5"} %d
sparkfold_ttft_seconds_bucket{le="+Inf"} %d
sparkfold_ttft_seconds_count %d
sparkfold_ttft_seconds_sum 1.5
"""


def test_pairs_are_labelled_and_summed() -> None:
    text = "\n".join(relabel({"a": PAIR % (3, 1, 2, 3, 3), "b": PAIR % (4, 0, 1, 4, 4)})) + "\n"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    route = ("route", "/v1/chat/completions")
    assert samples[("sparkfold_requests_total", (("pair", "a"), route, ("status", "200")))] == 3
    assert samples[("sparkfold_requests_total", (("pair", "all"), route, ("status", "200")))] == 7
    assert samples[("sparkfold_lanes_busy", (("pair", "all"),))] == 1
    assert samples[("sparkfold_ttft_seconds_bucket", (("le", "+Inf"), ("pair", "all")))] == 7
    assert text.count("# TYPE sparkfold_requests_total counter") == 1
