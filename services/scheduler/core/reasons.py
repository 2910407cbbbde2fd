"""Why a job waits, in words a person can act on.

A reason is a key and a text builder. The key says what kind of wait it is, in
which VC, for which sku and how many cells; a Wait decision is sent when it
changes. The builder makes the text from the current counts (free cells, jobs
ahead in the queue), so `waiting_reason()` is always up to date without a Wait
decision for every change of a count.
"""

from __future__ import annotations

from typing import Callable

Reason = tuple[tuple, Callable[[int], str]]


def sku_words(skus: list[str]) -> str:
    return skus[0] if len(skus) == 1 else " or ".join(skus)


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def in_vc(vc: str, cells: int, skus: list[str], counts: Callable[[], tuple[int, int, str]]) -> Reason:
    """counts() -> (free, guaranteed, hint)."""

    def text(ahead: int) -> str:
        free, guaranteed, hint = counts()
        words = (f"waiting in VC {vc} for {cells} {sku_words(skus)} cells ({free} free of {guaranteed} guaranteed); "
                 f"{plural(ahead, 'job')} ahead")
        return words + (f"; {hint}" if hint else "")

    return ("vc", vc, tuple(skus), cells), text


def idle_anywhere(cells: int, skus: list[str], counts: Callable[[], tuple[int, int, str]]) -> Reason:
    """counts() -> (idle, total, hint)."""

    def text(ahead: int) -> str:
        idle, total, hint = counts()
        words = (f"waiting for {cells} idle {sku_words(skus)} cells anywhere in the cluster "
                 f"(opportunistic job; {idle} idle of {total}); {plural(ahead, 'opportunistic job')} ahead")
        return words + (f"; {hint}" if hint else "")

    return ("idle", tuple(skus), cells), text


def behind_gang(blocker: str, vc: str | None, since: float, cells: int, clock: Callable[[], float]) -> Reason:
    where = f"VC {vc}" if vc else "the opportunistic queue"

    def text(ahead: int) -> str:
        return (f"waiting behind gang job {blocker} in {where}, which has waited {(clock() - since) / 60:.0f} min "
                f"for {cells} cells; smaller jobs no longer go before it so it is not starved")

    return ("behind", blocker), text


def for_victims(victims: list[str]) -> Reason:
    words = f"waiting for {plural(len(victims), 'preempted job')} to release their cells: {', '.join(victims)}"
    return ("victims", tuple(victims)), lambda ahead: words


def never(problem: str) -> Reason:
    words = f"cannot be placed as submitted: {problem}"
    return ("never", problem), lambda ahead: words
