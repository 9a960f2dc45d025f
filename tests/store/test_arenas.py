"""store.arenas: glibc's arenas capped once per process, unless the operator set MALLOC_ARENA_MAX."""

import ctypes

from store import arenas


def test_the_cap_is_applied_on_glibc(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    assert arenas.limit_arenas() and calls == [(arenas.M_ARENA_MAX, arenas.ARENAS)]


def test_an_operators_setting_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: (_ for _ in ()).throw(AssertionError("mallopt called")))
    assert arenas.limit_arenas()


def test_a_refusal_is_reported(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: type("Libc", (), {"mallopt": lambda self, p, v: 0})())
    assert not arenas.limit_arenas()
