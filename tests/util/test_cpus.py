import pytest

from blink.util.cpus import format_cpu_list, parse_cpu_list


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("3,1-2,2") == [1, 2, 3]
    for bad in ("", "3-1", "a", "-1", ","):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_format_cpu_list_round_trips():
    assert format_cpu_list([1, 2]) == "1,2"
    assert format_cpu_list(None) == "" and format_cpu_list([]) == ""
    assert parse_cpu_list(format_cpu_list([0, 4, 5])) == [0, 4, 5]
