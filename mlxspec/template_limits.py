"""A chat template rendered with a time and a size limit, before the tokenizer renders it for real.

A chat template is code from the model's files (a GGUF's metadata, a repo's tokenizer_config.json): Jinja in
transformers' sandbox, which stops escapes but not work. `{{ 'x' * 1000000000 }}` made a gigabyte string that the
tokenizer panicked on after 71 s; two nested `range(100000)` loops hung `generate --chat` and tied up a server
worker. So each template first renders here, in the same environment (transformers' filters, globals and
extensions) with every place that can make work or memory checked: ranges iterate under a deadline, `*`, `+` and
`**` and every call refuse results past the size limit, filters are refused sizes past it, and the output is
counted as it streams. Only a template that finishes here is rendered again by the tokenizer, so the text stays
transformers' own.
"""

from __future__ import annotations

import functools
import math
import numbers
import time
from dataclasses import dataclass
from typing import Any

from mlxspec.errors import UserError

RENDER_SECONDS = 5.0  # a real template renders in milliseconds
MIN_OUTPUT_CHARS = 1 << 20  # the output limit, beyond what the messages themselves bring
OUTPUT_PER_INPUT_CHAR = 8


class TemplateLimit(Exception):
    """A template went past its time or size limit."""


@dataclass
class Budget:
    deadline: float
    max_chars: int

    def tick(self) -> None:
        if time.perf_counter() > self.deadline:
            raise TemplateLimit(f"it ran past {RENDER_SECONDS:g} s")

    def check_size(self, value: Any) -> Any:
        if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > self.max_chars:
            raise TemplateLimit(f"it built a value of {len(value):,} items (the limit is {self.max_chars:,})")
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4096:
            raise TemplateLimit("it built a number of more than 4096 bits")
        return value

    def check_args(self, args: tuple, kwargs: dict) -> None:
        self.tick()
        for value in (*args, *kwargs.values()):
            if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(value) > self.max_chars:
                raise TemplateLimit(f"it asked for a size of {value:,} (the limit is {self.max_chars:,})")
            self.check_size(value)


class DeadlineRange:
    """range() as the sandbox gives it (at most MAX_RANGE items), iterated under the render's deadline."""

    def __init__(self, budget: Budget, items: range):
        self.budget, self.items = budget, items

    def __iter__(self):
        for item in self.items:
            self.budget.tick()
            yield item

    def __reversed__(self):
        return DeadlineRange(self.budget, self.items[::-1]).__iter__()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):
        found = self.items[index]
        return DeadlineRange(self.budget, found) if isinstance(found, range) else found

    def __contains__(self, item) -> bool:
        return item in self.items


def limited_filter(budget: Budget, function):
    """A filter that refuses a size argument past the limit (center(10**10)) and checks what it returns."""

    @functools.wraps(function)  # keeps jinja's pass_context / pass_eval_context marks
    def wrapper(*args, **kwargs):
        budget.check_args(args[1:], kwargs)
        return budget.check_size(function(*args, **kwargs))

    return wrapper


def limited_environment(base: Any, budget: Budget):
    """A sandbox like `base` (transformers' ImmutableSandboxedEnvironment) whose work is bounded by `budget`."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

    class LimitedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "**"})

        def call_binop(self, context, operator, left, right):
            budget.tick()
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and count > 0:
                        if len(seq) * count > budget.max_chars:
                            raise TemplateLimit(f"it repeated a value {count:,} times")
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                if right * math.log2(abs(left)) > 4096:
                    raise TemplateLimit("it raised a number to a power of more than 4096 bits")
            return budget.check_size(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
            budget.check_args(args, kwargs)
            return budget.check_size(super().call(__context, __obj, *args, **kwargs))

        def getattr(self, obj, attribute):
            budget.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            budget.tick()
            return super().getitem(obj, argument)

    env = LimitedSandbox(
        trim_blocks=base.trim_blocks,
        lstrip_blocks=base.lstrip_blocks,
        extensions=[type(extension) for extension in base.extensions.values()],
    )
    env.filters.update({name: limited_filter(budget, f) for name, f in base.filters.items()})
    env.globals.update(base.globals)
    env.globals["range"] = lambda *args: DeadlineRange(budget, safe_range(*args))
    env.globals["namespace"] = limited_namespace(budget, base.globals["namespace"])
    return env


def limited_namespace(budget: Budget, base: type) -> type:
    """The template's namespace(), whose attributes are checked as they are set: `{% set ns.x = ns.x ~ ns.x %}` in
    a loop doubles a string each pass."""

    class LimitedNamespace(base):
        def __setitem__(self, name, value):
            budget.tick()
            super().__setitem__(name, budget.check_size(value))

    return LimitedNamespace


def input_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(input_chars(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(input_chars(v) for v in value)
    return 0


def check_template_limits(template: str, messages: list[dict], variables: dict) -> None:
    """Render `template` under the limits, or refuse it in one line (a UserError)."""
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    # transformers' environment, from an empty template: compiling this one there would fold its constants
    # ('x' * 10**9) at compile time, unbounded
    base = _compile_jinja_template("").environment
    budget = Budget(
        time.perf_counter() + RENDER_SECONDS,
        MIN_OUTPUT_CHARS + OUTPUT_PER_INPUT_CHAR * (input_chars(messages) + input_chars(variables)),
    )
    env = limited_environment(base, budget)
    written = 0
    try:
        compiled = env.from_string(template)
    except TemplateError as error:
        raise UserError(f"the model's chat template does not parse: {' '.join(str(error).split())}") from None
    except TemplateLimit as limit:
        raise UserError(f"the model's chat template was stopped: {limit}; fix the template") from None
    try:
        for piece in compiled.generate(messages=messages, **variables):
            written += len(piece)
            if written > budget.max_chars:
                raise TemplateLimit(f"its output passed {budget.max_chars:,} characters")
            budget.tick()
    except TemplateLimit as limit:
        raise UserError(
            f"the model's chat template was stopped: {limit}; a chat template renders in milliseconds, so this "
            "one is broken or hostile: fix the template (tokenizer_config.json or the GGUF's tokenizer.chat_template)"
        ) from None
    except (MemoryError, RecursionError):
        raise UserError("the model's chat template ran out of memory or recursed without end; fix the template")
    except Exception:  # noqa: BLE001 (the tokenizer's own render reports the template's errors in its words)
        return
