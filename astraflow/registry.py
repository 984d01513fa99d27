"""One registry of named things (envs, workflows, dataflow policies, task sets) with plugins.

Why one class: each of those registries needs the same four things, and four copies had drifted
apart (different did-you-mean rules, duplicate names an error in two of them and silently replaced
in the other two, plugin errors formatted two ways). A :class:`Registry` holds items by name and

* refuses a second, different item under a taken name (:class:`DuplicateNameError`), so a plugin
  cannot silently replace a built-in or another plugin's item;
* answers an unknown name with one error naming the kind, the name, close names (``difflib``,
  case-insensitive, with or without a ``namespace/``) and every known name, plus the plugins that
  failed to load (the name may be theirs);
* discovers its entry-point group lazily, on first use; a plugin that fails to load, returns
  something else or reuses a taken name is recorded in :attr:`Registry.errors` with its group,
  entry point and reason, never raised (one broken plugin must not hide the others or stop a CLI).

What differs per registry is passed in, not subclassed away: how an item is named, what one entry
point provides (``unpack``), how one provided object becomes an item (``accept``: type check,
``source`` set to the plugin's distribution), how an item's origin is described in a clash, and
the exception type callers already catch for an unknown name.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any, Generic, Self, TypeVar

from astraflow.errors import AstraFlowError
from astraflow.plugins import LoadedEntryPoint, discover, plugin_error

T = TypeVar("T")


class UnknownNameError(AstraFlowError, KeyError):
    """A name no item is registered under (a ``KeyError`` whose message is shown unquoted)."""

    def __str__(self) -> str:  # KeyError repr()s its argument; the message is meant to be read
        return str(self.args[0])


class DuplicateNameError(AstraFlowError, ValueError):
    """A second, different item registered under a taken name."""


def close_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Known names that look like ``name``: case-insensitive, with or without a ``namespace/``."""
    known = list(known)
    by_lower = {k.lower(): k for k in known}
    by_tail = {k.lower().rpartition("/")[2]: k for k in known}
    wanted = name.lower()
    close = [by_lower[h] for h in difflib.get_close_matches(wanted, list(by_lower), n, 0.5)]
    for h in difflib.get_close_matches(wanted.rpartition("/")[2], list(by_tail), n, 0.6):
        if by_tail[h] not in close:
            close.append(by_tail[h])
    return close[:n]


def call_or_take(ep: LoadedEntryPoint, item_type: type | None = None) -> Iterable[Any]:
    """The usual plugin shape: the entry point names an item, or a callable taking nothing that
    returns one item or an iterable of them (None for none)."""
    obj = ep.obj
    if item_type is None or not isinstance(obj, item_type):
        obj = obj()
    if obj is None:
        return []
    if item_type is not None and isinstance(obj, item_type):
        return [obj]
    return list(obj)


def expect_type(obj: Any, item_type: type) -> None:
    """Raise the ``TypeError`` a plugin gets for returning something that is not an item."""
    if not isinstance(obj, item_type):
        raise TypeError(
            f"expected {item_type.__name__} objects ({item_type.__module__}), "
            f"got {type(obj).__name__}"
        )


class Registry(Generic[T]):
    """Items of one kind by name, from code and from the entry-point group ``group``.

    ``kind`` words the errors ("env id", "task set", ...). ``builtins`` (called once, at
    discovery) provides the items that ship with AstraFlow when they are not themselves published
    through ``group``. Without ``group`` and ``builtins`` the registry holds only what is
    registered by hand and :meth:`discover` does nothing.
    """

    def __init__(
        self,
        kind: str,
        name_of: Callable[[T], str],
        *,
        group: str | None = None,
        builtins: Callable[[], Iterable[T]] | None = None,
        unpack: Callable[[LoadedEntryPoint], Iterable[Any]] = call_or_take,
        accept: Callable[[Any, LoadedEntryPoint], T] | None = None,
        origin: Callable[[T], str] | None = None,
        unknown_error: Callable[[str], Exception] = UnknownNameError,
    ) -> None:
        self.kind = kind
        self.group = group
        self._name_of = name_of
        self._builtins = builtins
        self._unpack = unpack
        self._accept = accept or (lambda obj, _ep: obj)
        self._origin = origin or (lambda item: repr(item))
        self._unknown_error = unknown_error
        self._items: dict[str, T] = {}
        self._discovered = group is None and builtins is None
        #: Plugins that failed to load or register, by entry-point name (shown by the CLIs).
        self.errors: dict[str, str] = {}

    # -- registration -----------------------------------------------------------------------

    def register(self, item: T) -> T:
        """Add ``item``; registering an equal item again is a no-op, a different one an error."""
        name = self._name_of(item)
        if not name:
            raise ValueError(f"{self.kind} {item!r} has no name")
        known = self._items.get(name)
        if known is not None and known != item:
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: by {self._origin(known)} "
                f"and by {self._origin(item)}"
            )
        self._items[name] = item
        return item

    def replace(self, item: T) -> T:
        """Register ``item`` over whatever has its name (tests wrapping a built-in, say)."""
        self._items.pop(self._name_of(item), None)
        return self.register(item)

    def discover(self) -> Self:
        """Register the built-ins, then every plugin of :attr:`group` (once; later calls return)."""
        if self._discovered:
            return self
        self._discovered = True
        if self._builtins is not None:
            for item in self._builtins():
                self.register(item)
        if self.group is not None:
            self.add_entry_points(self.group)
        return self

    def add_entry_points(self, group: str) -> None:
        """Register what every entry point of ``group`` provides; failures go to :attr:`errors`.

        One bad item does not hide the plugin's other items, nor one bad plugin the others."""
        found = discover(group)
        self.errors.update(found.errors)
        for ep in found.loaded:
            try:
                provided = list(self._unpack(ep))
            except Exception as exc:
                self._plugin_failed(group, ep, exc)
                continue
            for obj in provided:
                try:
                    self.register(self._accept(obj, ep))
                except Exception as exc:
                    self._plugin_failed(group, ep, exc)

    def _plugin_failed(self, group: str, ep: LoadedEntryPoint, exc: Exception) -> None:
        message = plugin_error(group, ep.name, ep.value, exc)
        previous = self.errors.get(ep.name)
        self.errors[ep.name] = f"{previous}; {message}" if previous else message

    # -- lookup -----------------------------------------------------------------------------

    def get(self, name: str) -> T:
        """The item named ``name``, or the kind's unknown-name error with close and known names."""
        self.discover()
        try:
            return self._items[name]
        except KeyError:
            raise self._unknown_error(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = close_names(name, self._items)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        message = f"unknown {self.kind} {name!r}{hint} (known: {', '.join(self.names())})"
        if self.errors:
            failed = "; ".join(self.errors[k] for k in sorted(self.errors))
            message += f"; plugins that failed to load: {failed}"
        return message

    def names(self) -> list[str]:
        self.discover()
        return sorted(self._items)

    def items(self) -> list[T]:
        """Every item, sorted by name."""
        return [self._items[n] for n in self.names()]

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._items
