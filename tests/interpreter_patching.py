"""The Triton interpreter patches triton.language once per kernel launch, then again on every
call of a nested @triton.jit function inside it, in every program of the grid. Those nested
patches are never undone (the launch's own restore puts the originals back) and each wraps
the builtins already wrapped by the launch, so a helper called in a loop pays for a walk over
the language's members (inspect.getmembers) and a deeper chain of wrappers each time: about
40 % of an interpreted launch in the kernel tests.

`skip_nested_patches()` makes a nested call whose language modules the running launch has
patched already skip its own patching; a call that sees a module the launch did not patch
still patches as before, once a launch. The kernels then run on the same patched builtins
(one wrapper instead of a growing chain), so their results are unchanged:
tests/test_interpreter_patching.py checks it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_installed = False


def _langs_of(fn: Callable[..., Any], interpreter: Any) -> frozenset[int]:
    """The ids of the triton.language modules fn's globals hold: what _patch_lang patches."""
    tl = interpreter.tl
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


def skip_nested_patches() -> bool:
    """Install the skip in triton.runtime.interpreter (idempotent). False where this Triton's
    interpreter lacks the function it wraps, so a test run on another version keeps its
    behaviour."""
    global _installed
    if _installed:
        return True
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if original is None or scope_type is None:
        return False
    active = threading.local()  # the launch's patched modules, per thread as launches run

    def patch_lang(fn: Callable[..., Any]) -> Any:
        patched: frozenset[int] | None = getattr(active, "langs", None)
        langs = _langs_of(fn, interpreter)
        if patched is not None and langs <= patched:
            return scope_type()  # nothing to patch, nothing to restore
        scope = original(fn)
        if patched is not None:
            # A nested call that saw another module (triton.language's own jit functions
            # see triton.language.core): patched as before, and its patches are never
            # undone, so they hold for the rest of the launch.
            active.langs = patched | langs
            return scope
        active.langs = langs
        restore = scope.restore

        def restore_and_forget() -> None:
            active.langs = None
            restore()

        scope.restore = restore_and_forget
        return scope

    interpreter._patch_lang = patch_lang
    _installed = True
    return True
