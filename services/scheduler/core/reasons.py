"""Why a job waits, in words a person can act on.

A reason is a key and a text builder. The key says what kind of wait it is, in
which VC, for which sku and how many cells; a Wait decision is sent when it
changes. The builder makes the text from the current counts (free cells, jobs
ahead in the queue), so `waiting_reason()` is always up to date without a Wait
decision for every change of a count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.scheduler.core.jobs import JobRecord
    from services.scheduler.core.state import ClusterState, VcRecord

# A wait's key (what it is, for telling a change apart) and its text, given the jobs ahead.
Reason = tuple[tuple[object, ...], Callable[[int], str]]

# A guaranteed job placed outside its VC's quota (shape fallback), as its attempt's history says.
BORROWED = ("placed on borrowed idle cells: VC {vc}'s cells have no room for its shape though its quota has "
            "enough left; it runs as opportunistic work (preemptible) and, if preempted, waits again as guaranteed")


def sku_words(skus: list[str]) -> str:
    return skus[0] if len(skus) == 1 else " or ".join(skus)


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def with_hint(words: str, hint: str) -> str:
    """A wait's text, and what explains it further when there is something to say."""
    return f"{words}; {hint}" if hint else words


def in_vc(vc: str, cells: int, skus: list[str], counts: Callable[[], tuple[int, int, str]]) -> Reason:
    """counts() -> (free, guaranteed, hint)."""

    def text(ahead: int) -> str:
        free, guaranteed, hint = counts()
        words = (f"waiting in VC {vc} for {cells} {sku_words(skus)} cells ({free} free of {guaranteed} guaranteed); "
                 f"{plural(ahead, 'job')} ahead")
        return with_hint(words, hint)

    return ("vc", vc, tuple(skus), cells), text


def idle_anywhere(cells: int, skus: list[str], counts: Callable[[], tuple[int, int, str]]) -> Reason:
    """counts() -> (idle, total, hint)."""

    def text(ahead: int) -> str:
        idle, total, hint = counts()
        words = (f"waiting for {cells} idle {sku_words(skus)} cells anywhere in the cluster "
                 f"(opportunistic job; {idle} idle of {total}); {plural(ahead, 'opportunistic job')} ahead")
        return with_hint(words, hint)

    return ("idle", tuple(skus), cells), text


def reserve_hint(reserved: int) -> str:
    """Why idle cells no VC holds are left idle (SchedulerCore's adaptive reserve); "" when none are."""
    if not reserved:
        return ""
    return (f"{reserved} idle cells that no VC holds are kept for VCs' guaranteed jobs while the overload lasts "
            f"(taking cells back from borrowed work lately threw away long runs)")


def unheld_only(cells: int, skus: list[str], preemptions: int, counts: Callable[[], tuple[int, int, int]]) -> Reason:
    """An opportunistic job preempted too often: it waits for cells no VC holds. counts() -> (unheld, idle, reserved)."""

    def text(ahead: int) -> str:
        unheld, idle, reserved = counts()
        return with_hint(f"waiting for {cells} {sku_words(skus)} cells that no VC holds (opportunistic job preempted "
                         f"{plural(preemptions, 'time')}: it is no longer placed on idle cells of a VC's quota, where "
                         f"it would likely be preempted again; {unheld} such cells idle, {idle} idle in all); "
                         f"{plural(ahead, 'opportunistic job')} ahead", reserve_hint(reserved))

    return ("unheld", tuple(skus), cells), text


def unheld_large(cells: int, skus: list[str], counts: Callable[[], tuple[int, int, int]]) -> Reason:
    """An opportunistic job of half a node or more: it waits for cells no VC holds. counts() -> (unheld, idle, reserved)."""

    def text(ahead: int) -> str:
        unheld, idle, reserved = counts()
        return with_hint(f"waiting for {cells} idle {sku_words(skus)} cells that no VC holds (opportunistic work of "
                         f"half a node or more is not placed in the idle part of a VC's cells, which the VC takes back "
                         f"first; {unheld} such cells idle, {idle} idle in all); "
                         f"{plural(ahead, 'opportunistic job')} ahead", reserve_hint(reserved))

    return ("idle", tuple(skus), cells), text


def behind_gang(blocker: str, vc: str | None, since: float, cells: int, clock: Callable[[], float]) -> Reason:
    """Held back so an aged gang gets the cells that free up (the key is the kind only: which gang
    is ahead may change often; the text names the current one)."""
    where = f"VC {vc}" if vc else "the opportunistic queue"

    def text(ahead: int) -> str:
        return (f"waiting behind gang job {blocker} in {where}, which has waited {(clock() - since) / 60:.0f} min "
                f"for {cells} cells; smaller jobs no longer go before it so it is not starved")

    return ("behind",), text


def for_victims(record: JobRecord) -> Reason:
    """Waiting for preempted jobs to give their cells back (the text lists those still running)."""

    def text(ahead: int) -> str:
        victims = sorted(record.victims)
        return f"waiting for {plural(len(victims), 'preempted job')} to release their cells: {', '.join(victims)}"

    return ("victims",), text


def never(problem: str) -> Reason:
    words = f"cannot be placed as submitted: {problem}"
    return ("never", problem), lambda ahead: words


def waiting_for_room(state: ClusterState, record: JobRecord, vc: VcRecord, skus: list[str], cells: int,
                     reserved: Callable[[], int] = lambda: 0, pin: str | None = None) -> Reason:
    """The job fits in principle but not now: free versus needed cells, read when the text is asked for.
    reserved(): idle cells no VC holds that opportunistic work leaves alone now (the adaptive reserve);
    `pin`: the pinned cell the waiting tasks must go to (its cells are counted instead of the VC's)."""
    tree = state.tree

    def unhealthy() -> int:
        return sum(state.unhealthy_leaves.get(sku, 0) for sku in skus)

    def why_unhealthy() -> str:
        """Which nodes are out and why (a cordon's reason, a lost agent), so a person
        reading the wait knows whom to ask; at most three named."""
        bad = [node for node in tree.nodes.values()
               if not node.healthy and any(cell.sku in skus for cell in node.cells)]
        named = "; ".join(f"{node.name}: {node.reason or 'unhealthy'}" for node in sorted(bad, key=lambda n: n.name)[:3])
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        return f" ({named}{more})" if named else ""

    if record.opportunistic:
        def idle_counts() -> tuple[int, int, str]:
            idle = sum(tree.sku_totals[sku].free for sku in skus if sku in tree.sku_totals)
            total = sum(tree.sku_leaves.get(sku, 0) for sku in skus)
            bad = unhealthy()
            hint = f"{bad} of them on unhealthy nodes{why_unhealthy()}" if bad else reserve_hint(reserved())
            if idle >= cells and not hint:
                hint = "enough cells are idle but not on few enough nodes (each task needs its cells on one node)"
            return idle, total, hint

        return idle_anywhere(cells, skus, idle_counts)

    pinned = vc.pinned.get(pin) if pin is not None else None

    def vc_counts() -> tuple[int, int, str]:
        if pinned is not None:
            guaranteed, held = pinned.leaf_count, pinned.held
        else:
            guaranteed = sum(vc.sku_virtual.get(sku, 0) for sku in skus)
            held = sum(vc.held.get(sku, 0) for sku in skus)
        free = guaranteed - held
        bad = unhealthy()
        hint = f"{bad} {sku_words(skus)} cells of the cluster are on unhealthy nodes{why_unhealthy()}" if bad else ""
        if free >= cells and not hint:
            hint = "enough cells are free but not on few enough nodes (each task needs its cells on one node)"
        return free, guaranteed, hint

    return in_vc(vc.name, cells, skus, vc_counts)
