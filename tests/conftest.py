"""Suite-wide settings."""

from hypothesis import HealthCheck, settings

# The suite shares 2 cores with a running tritonserver: judge properties, not speed.
settings.register_profile(
    "shared-machine",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("shared-machine")
