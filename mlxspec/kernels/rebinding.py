"""Stand-ins for the module-level functions mlx-lm's model files call by their global names.

mlx-lm's model files call `scaled_dot_product_attention` (mlx_lm.models.base), `swiglu`
(mlx_lm.models.activations) and `mx.fast.rms_norm` by the names they import. The routed view of a target
(verify.routed_view) gives each module whose methods call one of them a subclass whose methods are the same code
over a copy of their module's globals, in which that name means the kernel's stand-in. Nothing shared is patched:
the model itself, and mlx-lm's own generate on it, still call mlx-lm's functions. No model file is forked.
"""

from __future__ import annotations

import functools
import types
from typing import Any, NamedTuple


class StandIn(NamedTuple):
    """`replacement` for the global `name` wherever a method's globals hold `original` under that name (and its code
    names every one of `also_names`: `mx` only in the methods that call `mx.fast.rms_norm`)."""

    name: str
    original: Any
    replacement: Any
    also_names: tuple[str, ...] = ()


@functools.lru_cache(maxsize=None)
def routed_class(cls: type, stand_ins: tuple[StandIn, ...]) -> type:
    """A subclass of `cls` whose methods that call an original by its global name call its stand-in instead; `cls`
    itself when none does. Its `routed` attribute names the stand-ins it took."""
    methods: dict[str, Any] = {}
    taken: set[str] = set()
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name, member in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            calls = [s for s in stand_ins if _calls(member, s)]
            if calls:
                methods[name] = _rebound(member, calls)
                taken.update(s.name for s in calls)
    if not methods:
        return cls
    return type(cls.__name__, (cls,), {**methods, "__module__": cls.__module__, "routed": frozenset(taken)})


def _calls(function: Any, stand_in: StandIn) -> bool:
    """Whether `function` calls `stand_in.original` by its global name."""
    return (
        isinstance(function, types.FunctionType)
        and stand_in.name in function.__code__.co_names
        and all(name in function.__code__.co_names for name in stand_in.also_names)
        and function.__globals__.get(stand_in.name) is stand_in.original
    )


def _rebound(function: types.FunctionType, stand_ins: list[StandIn]) -> types.FunctionType:
    """`function`'s code over a copy of its globals in which each stand-in's name means its replacement."""
    namespace = dict(function.__globals__)
    namespace.update({s.name: s.replacement for s in stand_ins})
    rebound = types.FunctionType(
        function.__code__, namespace, function.__name__, function.__defaults__, function.__closure__
    )
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__qualname__ = function.__qualname__
    return rebound
