"""`Via`: a read-only attribute that reads the same-named one (or another) of one of the
instance's own attributes, for the classes that hand a few facts on from what they wrap
(a drafter from its loaded model, a draft source from its cache stream)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Via(Generic[T]):
    """`calls = Via[int]("stream")` reads `self.stream.calls`; `Via[str]("info", "spec")`
    reads `self.info.spec`."""

    def __init__(self, holder: str, attr: str | None = None) -> None:
        self.holder = holder
        self.attr = attr or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = self.attr or name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Via[T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.holder), self.attr)
