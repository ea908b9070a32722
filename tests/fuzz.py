"""The hypothesis settings of the decoders' fuzz tests: many examples, no
deadline (a loaded CI core), the same examples every run (a failure
reproduces), nothing kept between runs."""

from hypothesis import HealthCheck, settings

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
