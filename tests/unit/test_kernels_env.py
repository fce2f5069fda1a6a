"""The native kernels' switches, ``$MNISTFLOW_KERNELS`` and ``$MNISTFLOW_AMX``: the on/off
spellings work, and anything else is a one-line error naming the variable and the values it
takes (a typo such as ``MNISTFLOW_KERNELS=of`` used to leave the kernels silently on)."""
from __future__ import annotations

import pytest

from mnistflow import kernels
from mnistflow.core.errors import MnistflowError

VARIABLES = ("MNISTFLOW_KERNELS", "MNISTFLOW_AMX")


@pytest.mark.parametrize("value,on", [("", True), ("1", True), (" on ", True), ("TRUE", True), ("yes", True),
                                      ("0", False), ("off", False), ("False", False), (" no", False)])
def test_the_kernels_switch_reads_every_spelling(value, on, monkeypatch):
    monkeypatch.setenv("MNISTFLOW_KERNELS", value)
    kernels.check_environment()
    assert kernels.enabled() is on


@pytest.mark.parametrize("value", ["0", "off", "NO"])
def test_the_amx_switch_turns_the_amx_kernels_off(value, monkeypatch):
    monkeypatch.setenv("MNISTFLOW_AMX", value)
    kernels.check_environment()
    assert not kernels.amx_available()
    assert kernels.amx_reason() == "off (MNISTFLOW_AMX=0)"


def _assert_one_line_naming(err: MnistflowError, name: str, value: str) -> None:
    msg = str(err)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{name} must be "), msg
    for allowed in ("1", "0", "on/off", "true/false", "yes/no", "unset"):
        assert allowed in msg, (allowed, msg)
    assert repr(value) in msg, msg


@pytest.mark.parametrize("name", VARIABLES)
@pytest.mark.parametrize("value", ["of", "2", "enabled", "0 1"])
def test_an_unknown_value_is_a_one_line_error_before_any_work(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(MnistflowError) as e:
        kernels.check_environment()
    _assert_one_line_naming(e.value, name, value)


def test_an_unknown_value_is_not_a_silent_fallback_when_the_kernels_are_asked_for(monkeypatch):
    """Reached without ``check_environment`` (a library caller): the same error, not the
    "unavailable; using PyTorch's ops" warning, and not the AMX kernels quietly on."""
    monkeypatch.setenv("MNISTFLOW_KERNELS", "of")
    with pytest.raises(MnistflowError) as e:
        kernels.library()
    _assert_one_line_naming(e.value, "MNISTFLOW_KERNELS", "of")
    monkeypatch.setenv("MNISTFLOW_KERNELS", "0")
    monkeypatch.setenv("MNISTFLOW_AMX", "maybe")
    with pytest.raises(MnistflowError) as e:
        kernels.amx_available()
    _assert_one_line_naming(e.value, "MNISTFLOW_AMX", "maybe")
