"""Tests of ringtree.settings: every RINGTREE_* variable is declared once and documented
in one table, values are validated, unknown names are warned about."""

from __future__ import annotations

import pathlib
import re
import warnings

import pytest

from ringtree import settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ringtree"
NAME = re.compile(r"\bRINGTREE_[A-Z0-9_]*[A-Z0-9]\b")


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def test_every_variable_the_package_names_is_declared():
    used = {m for p in _sources() for m in NAME.findall(p.read_text())}
    missing = sorted(used - set(settings.VARS))
    assert not missing, f"declare these in ringtree/settings.py: {missing}"


def test_the_documented_table_is_the_declared_one():
    doc = (ROOT / "docs" / "environment.md").read_text()
    assert settings.table() in doc, "regenerate with: python -m ringtree.settings"


def test_only_settings_reads_the_tuning_knobs():
    tuning = [v.name for v in settings.VARS.values() if v.scope == "tuning"]
    names = "|".join(tuning)
    read = re.compile(rf"(environ\.get|getenv)\(\s*[\"']({names})[\"']"
                      rf"|environ\[\s*[\"']({names})[\"']\s*\](?!\s*=)")
    readers = [str(p.relative_to(ROOT)) for p in _sources()
               if p.name != "settings.py" and read.search(p.read_text())]
    assert not readers, f"read these through ringtree.settings: {readers}"


def test_values_parse_and_defaults_apply():
    s = settings.load({"RINGTREE_NCHANNELS": "2", "RINGTREE_TRANSPORT": " TCP ",
                       "RINGTREE_DOCTOR": "off", "RINGTREE_BUFFSIZE": ""})
    assert s.nchannels == 2 and s.transport == "tcp" and s.doctor is False
    assert s.buffsize == 4 << 20 and s.timeout == 300.0
    assert s.explicit("RINGTREE_NCHANNELS") and not s.explicit("RINGTREE_BUFFSIZE")
    with pytest.raises(AttributeError):
        s.nchannels = 3


@pytest.mark.parametrize("name, value", [("RINGTREE_NCHANNELS", "two"),
                                         ("RINGTREE_TIMEOUT", "-1"),
                                         ("RINGTREE_TRANSPORT", "ib"),
                                         ("RINGTREE_DOCTOR", "maybe")])
def test_a_bad_value_names_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        settings.load({name: value})


def test_an_unknown_name_is_warned_with_the_closest_one():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        settings.load({"RINGTREE_TIMOUT": "5"})
    assert any("RINGTREE_TIMOUT; did you mean RINGTREE_TIMEOUT?" in str(w.message)
               for w in caught)


def test_current_follows_the_environment(monkeypatch):
    monkeypatch.setenv("RINGTREE_NCHANNELS", "3")
    assert settings.current().nchannels == 3
    monkeypatch.setenv("RINGTREE_NCHANNELS", "4")
    assert settings.current().nchannels == 4
