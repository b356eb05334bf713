"""The chat template a served model renders its chat prompts with, and where it came from.

A checkpoint keeps its template where ``transformers`` wrote it:

- ``chat_template.jinja`` beside the tokenizer (what ``save_pretrained`` of current transformers
  writes, 5.x included; with several named templates this file is the ``default`` one and the
  others sit in ``additional_chat_templates/``). It wins over the config, as in ``transformers``;
- ``tokenizer_config.json``'s ``chat_template``: a string, or the named-templates list
  ``[{"name": "default", "template": ...}, {"name": "tool_use", ...}]``, of which ``default`` is used.

``helix serve --chat-template VALUE`` replaces it (:func:`load_chat_template`, resolved as vLLM's flag
is): the contents of the file ``VALUE`` when there is one, else :data:`BUILTIN_NAME` for
:data:`DEFAULT_CHAT_TEMPLATE`, else ``VALUE`` itself when it looks like Jinja (has ``{``, ``}`` or a
newline); anything else is a path that does not exist, a one-line error. A model without any
template serves completions, and its chat requests are refused (HTTP 400 naming the flag), as vLLM
refuses them: a guessed template would give wrong answers without a word.

Templates are compiled once, in the environment ``transformers`` renders them in (a sandbox with
``trim_blocks``, ``lstrip_blocks``, loop controls, a ``tojson`` that writes UTF-8 as is,
``raise_exception`` and ``strftime_now``), so one that does not parse fails at start.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from helix.core.errors import HelixUserError

CHAT_TEMPLATE_FILE = "chat_template.jinja"
FLAG = "--chat-template"

BUILTIN_NAME = "builtin"
"""``--chat-template builtin``: :data:`DEFAULT_CHAT_TEMPLATE`, for checkpoints made without one (the
random-weight demo models)."""

DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
"""Helix's plain template: a ``<|role|>`` line then the content per message, and an open assistant
turn at the end."""

_JINJA_CHARS = "{}\n"


@dataclass(frozen=True)
class ChatTemplate:
    """One Jinja chat template and where it came from."""

    text: str
    source: str
    """Where it came from, for the start log: a file path, ``tokenizer_config.json``, the flag."""
    add_special_tokens: bool = False
    """Whether the tokenizer's post-processor adds its special tokens to the rendered text. False
    for a model's own template, which writes BOS itself where the model wants it (as
    ``apply_chat_template(..., tokenize=True)`` and vLLM encode); True for
    :data:`DEFAULT_CHAT_TEMPLATE`, plain text that leaves them to the tokenizer, as a completion."""

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True,
               special_tokens: dict[str, str] | None = None) -> str:
        """The prompt text for ``messages``; a template that raises on them (``raise_exception``
        on a role order it refuses, a type error on a message it did not expect) is a
        :class:`HelixUserError`: the request's or the template's fault, not the server's."""
        from jinja2 import TemplateError
        try:
            return self._compiled.render(messages=list(messages),
                                         add_generation_prompt=add_generation_prompt,
                                         **(special_tokens or {}))
        except TemplateError as exc:
            raise HelixUserError(f"chat template: {exc}") from None
        except (TypeError, ValueError, LookupError, AttributeError) as exc:
            raise HelixUserError(f"chat template: {type(exc).__name__}: {exc}") from None

    def check(self) -> "ChatTemplate":
        """Compile it now; a template that does not parse is a :class:`HelixUserError` naming its
        source and line."""
        self._compiled   # noqa: B018 (compiles and caches)
        return self

    @functools.cached_property
    def _compiled(self):
        from jinja2 import TemplateSyntaxError
        try:
            return _environment().from_string(self.text)
        except TemplateSyntaxError as exc:
            raise HelixUserError(f"chat template ({self.source}): line {exc.lineno}: {exc.message}") \
                from None


def builtin_template() -> ChatTemplate:
    return ChatTemplate(DEFAULT_CHAT_TEMPLATE, f"built-in ({FLAG} {BUILTIN_NAME})",
                        add_special_tokens=True)


def load_chat_template(value: str) -> ChatTemplate:
    """The template ``--chat-template VALUE`` names (see the module doc), compiled."""
    if not value.strip():
        raise HelixUserError(f"{FLAG} must not be empty")
    try:
        text = Path(value).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:   # no such file (a template names none), or unreadable
        if any(c in value for c in _JINJA_CHARS):
            return ChatTemplate(value, f"{FLAG} (the template given)").check()
        if value == BUILTIN_NAME:
            return builtin_template()
        reason = "no such file" if isinstance(exc, FileNotFoundError) else \
            getattr(exc, "strerror", None) or str(exc)
        raise HelixUserError(f"{FLAG} {value!r}: {reason}, and not a template (no '{{', '}}' or "
                             f"newline); give a template file, a Jinja string, or "
                             f"'{BUILTIN_NAME}' for Helix's plain <|role|> template") from None
    if not text.strip():
        raise HelixUserError(f"{FLAG} {value}: the file is empty")
    return ChatTemplate(text, f"{FLAG} {Path(value).resolve()}").check()


def checkpoint_chat_template(ckpt_dir: str | Path, tokenizer_config: dict) -> ChatTemplate | None:
    """The checkpoint's own template (see the module doc), compiled; None when it has none (or only
    named templates without a ``default``)."""
    path = Path(ckpt_dir)
    jinja_file = path / CHAT_TEMPLATE_FILE
    if jinja_file.is_file():
        try:
            text = jinja_file.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise HelixUserError(f"{jinja_file}: cannot read the chat template: {exc}") from None
        return ChatTemplate(text, str(jinja_file)).check()
    value = tokenizer_config.get("chat_template")
    where = str(path / "tokenizer_config.json")
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return ChatTemplate(value, where).check()
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                       and isinstance(t.get("template"), str) for t in value):
        named = {t["name"]: t["template"] for t in value}
        if "default" not in named:
            return None
        return ChatTemplate(named["default"], f"{where} ('default' of {len(named)} named "
                                              f"templates)").check()
    raise HelixUserError(f"{where}: 'chat_template' must be a string or a list of "
                         f"{{\"name\", \"template\"}} objects, got {json.dumps(value)[:80]}")


def missing_template_message(ckpt_dir: str | Path) -> str:
    """What a chat request to a model without a template is told (HTTP 400)."""
    return (f"the model has no chat template (no {CHAT_TEMPLATE_FILE} and no 'default' "
            f"chat_template in tokenizer_config.json of {Path(ckpt_dir).name}); start helix serve "
            f"with {FLAG} FILE|STRING to serve chat requests ('{FLAG} {BUILTIN_NAME}' for Helix's "
            f"plain <|role|> template)")


@functools.lru_cache(maxsize=1)
def _environment():
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env
