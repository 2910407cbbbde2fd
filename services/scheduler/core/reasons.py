"""Why a job waits, in words a person can act on.

Each reason has a key (what kind of wait, in which VC, for which sku and how many
cells) and a text that also carries current counts (free cells, jobs ahead). A
Wait decision is sent when the key changes; `waiting_reason()` always gives the
latest text.
"""

from __future__ import annotations


def sku_words(skus: list[str]) -> str:
    if len(skus) == 1:
        return skus[0]
    return " or ".join(skus)


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def in_vc(vc: str, cells: int, skus: list[str], free: int, guaranteed: int, ahead: int, hint: str) -> tuple[tuple, str]:
    text = (f"waiting in VC {vc} for {cells} {sku_words(skus)} cells ({free} free of {guaranteed} guaranteed); "
            f"{plural(ahead, 'job')} ahead")
    return ("vc", vc, tuple(skus), cells), text + (f"; {hint}" if hint else "")


def idle_anywhere(cells: int, skus: list[str], idle: int, total: int, ahead: int, hint: str) -> tuple[tuple, str]:
    text = (f"waiting for {cells} idle {sku_words(skus)} cells anywhere in the cluster "
            f"(opportunistic job; {idle} idle of {total}); {plural(ahead, 'opportunistic job')} ahead")
    return ("idle", tuple(skus), cells), text + (f"; {hint}" if hint else "")


def behind_gang(blocker: str, vc: str | None, waited_s: float, cells: int) -> tuple[tuple, str]:
    where = f"VC {vc}" if vc else "the opportunistic queue"
    return ("behind", blocker), (
        f"waiting behind gang job {blocker} in {where}, which has waited {waited_s / 60:.0f} min for {cells} cells; "
        f"smaller jobs no longer go before it so it is not starved")


def for_victims(victims: list[str]) -> tuple[tuple, str]:
    return ("victims", tuple(victims)), (
        f"waiting for {plural(len(victims), 'preempted job')} to release their cells: {', '.join(victims)}")


def never(text: str) -> tuple[tuple, str]:
    return ("never", text), f"cannot be placed as submitted: {text}"
