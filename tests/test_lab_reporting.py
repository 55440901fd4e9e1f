"""gwdet_lab.reporting: durations in the lab's reports and progress lines."""
import math

from gwdet_lab.reporting import format_duration


def test_format_duration():
    assert [format_duration(s) for s in (7, 65, 3725, 59.6)] == ["7s", "1m05s", "1h02m05s", "1m00s"]
    assert format_duration(None) == format_duration(math.inf) == format_duration(math.nan) == "?"
    assert format_duration(-3) == "0s"
