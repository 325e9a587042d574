"""The one map from a drafter kind to the code that builds it.

Each pipeline registers its own kinds under its task (``"transcribe"``: :mod:`specli.asr.drafters.kinds`;
``"synthesize"``: :mod:`specli.tts.drafters`), one builder a kind, and builds through :meth:`DrafterRegistry.build`.
A builder takes the pipeline's loaded model, the preset's :class:`specli.presets.draft.DraftSpec` and the run's
context as keywords (the task's registrant module says which), and returns a :class:`Drafter`; the same kind name
may mean another drafter in another task (``"pool"``: the n-gram pool over earlier windows or earlier requests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specli.core.drafters.base import Drafter

Builder = Callable[..., Drafter]  # (model, spec, **context) -> Drafter


class UnknownDrafterError(ValueError):
    """No builder is registered for a (task, kind)."""


@dataclass(frozen=True)
class DrafterRegistry:
    """Builders by ``(task, kind)``; a kind is registered once a task."""

    builders: dict[tuple[str, str], Builder] = field(default_factory=dict)  # (task, kind) -> its builder

    def register(self, task: str, kind: str) -> Callable[[Builder], Builder]:
        """A decorator registering its function as the builder of ``kind`` in ``task``."""

        def add(builder: Builder) -> Builder:
            if (task, kind) in self.builders:
                raise ValueError(f"{task} drafter kind {kind!r} is registered twice")
            self.builders[(task, kind)] = builder
            return builder

        return add

    def kinds(self, task: str) -> tuple[str, ...]:
        """The kinds registered for ``task``, sorted."""
        return tuple(sorted(k for t, k in self.builders if t == task))

    def build(self, task: str, kind: str, model: object, spec: object, **context: object) -> Drafter:
        """The ``kind`` drafter of ``task`` for ``model`` as ``spec`` says; :class:`UnknownDrafterError` lists the
        task's kinds when ``kind`` is none of them."""
        builder = self.builders.get((task, kind))
        if builder is None:
            raise UnknownDrafterError(f"unknown {task} drafter kind {kind!r}; registered kinds: "
                                      f"{', '.join(self.kinds(task)) or 'none'}")
        return builder(model, spec, **context)


DRAFTERS = DrafterRegistry()  # every pipeline's drafter kinds
